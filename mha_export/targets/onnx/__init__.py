"""The ONNX target: model.onnx, one graph form's attention core (graph/) at an exact opset. Its
runners are the check's own (check/runners: ONNX Runtime's providers and OpenVINO, shared by
every graph form); it writes every lossy step. The record is read torch-free (export.py loads
at the first export)."""
from __future__ import annotations

from ..base import EVERY_STEP, ExportTarget, TargetOption, lazy

MODEL_FILE = "model.onnx"
_EXPORT = f"{__name__}.export"


def _forms() -> tuple[str, ...]:
    from ...kinds.registry import FORMS
    return tuple(FORMS)


def _dtypes() -> tuple[str, ...]:
    from ...graph.model import DTYPES
    return DTYPES


def _attention_help() -> str:
    from ...graph.forms import DEFAULT
    return (f"Graph form of the attention core (docs: graph-forms.md) [default: {DEFAULT}; "
            f"blocked-plain for layers {DEFAULT} cannot build: sinks].")


def _opset_help() -> str:
    from ...graph.forms import MAX_OPSET
    from ...kinds.registry import opset_summary
    return f"Exact ONNX opset, up to {MAX_OPSET} [default: the form's lowest: {opset_summary()}]."


OPTIONS = (
    TargetOption("attention", choices=_forms, help=_attention_help, in_eval=True),
    TargetOption("opset", type=int, help=_opset_help),
    TargetOption("dtype", default="float32", choices=_dtypes, show_default=True),
)

SUMMARY = """Export to ONNX: model.onnx with inputs x [batch, seq, d_in] -> y [batch, seq, dim]
(--attention-mask, --kv-cache, --static-cache: more named inputs/outputs, see
docs/artifacts.md).

\b
Examples:
  mha-export onnx --heads 12 --dim 768
  mha-export onnx --heads 12 --dim 768 --kv-cache      # -> models/split-h12-d768-kv-onnx/
  mha-export onnx --heads 12 --dim 768 --weights gpt2.safetensors --layer 3 -o out/gpt2-l3
  mha-export onnx --heads 8 --dim 512 --head-dim 80 --qkv-bias --opset 20 --no-check
  mha-export onnx --heads 12 --dim 768 --static-cache --quantize int4 --accuracy-level 4
  mha-export onnx --weights SmolLM2.gguf --layers all -o out/smollm2 --executor ray
"""

TARGET = ExportTarget(
    "onnx", MODEL_FILE, lazy(_EXPORT, "prepare"), lazy(_EXPORT, "check"),
    ("building the ONNX graph", "writing model.onnx"), folder_tag=lazy(_EXPORT, "folder_tag"),
    title="ONNX", summary=SUMMARY, options=OPTIONS,
    builds=EVERY_STEP)
