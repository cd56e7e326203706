"""The registry of export targets: one ``ExportTarget`` record per file format an export writes.

Adding a target (say torch.export + AOTInductor): one package here holding its ``prepare`` (it
builds the model in memory and returns how to write it) and ``check`` (what prepare refuses,
before anything is built), its runner and one record (targets/base.py: its command's options
and help, the lossy steps it writes, its runners, its bench files, its optional dependency),
and one line below. The pipeline (staging, config.json, source weights, the lossy steps, the
parity check at export), the CLI's command, the check's runners, the bench and the fan-out
read the record.
"""
from __future__ import annotations

from .aoti import TARGET as AOTI
from .base import ExportTarget, TargetOption
from .executorch import TARGET as EXECUTORCH
from .onnx import TARGET as ONNX
from .torchscript import TARGET as TORCHSCRIPT

TARGETS: dict[str, ExportTarget] = {t.name: t for t in (ONNX, TORCHSCRIPT, AOTI, EXECUTORCH)}


def target_of_file(model_file: str) -> ExportTarget:
    """The target that writes ``model_file`` (model.onnx, model.pte, ...)."""
    return next(t for t in TARGETS.values() if t.model_file == model_file)


def eval_options() -> list[tuple[ExportTarget, TargetOption]]:
    """The target options `eval` takes (``in_eval``), each with its target."""
    return [(t, o) for t in TARGETS.values() for o in t.options if o.in_eval]
