"""Quantized projections as a lossy step (lossy/base.py): weight-only MatMulNBits, round to
nearest (rtn.py) or a GGUF's own blocks (source.py). Its hooks: the CLI's --quantize options,
the export's spec (a GGUF's kept blocks read once the source is loaded), the graph's MatMulNBits
(graph.py's writer, graph/builder.py's ``projections``), the record in config.json, the
function the file holds."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import click
import numpy as np

from ...errors import UsageError
from ...kinds.registry import kind_of
from ..base import LossyStep
from .graph import MatMulNBitsProjections
from .records import quant_spec_from_record
from .reference import reference_module
from .rtn import ACCURACY_LEVELS, BLOCK_SIZES, NAMES, QuantSpec, quantized_projections
from .source import (GRAPH_NAMES, SOURCE, SourceQuantSpec, kept_checkpoint_quantization,
                     kept_quantization)

MODULE_WEIGHTS = {graph: ours for ours, graph in GRAPH_NAMES.items()}  # q_proj -> W_query.weight

FIELDS = ("block_size", "symmetric", "accuracy_level")  # the CLI's, gathered into the spec
# quantized_projections' names -> the graph's (the names a kept quantization records)
GRAPH_NAME = {"out_proj": "out", "gate_proj": "gate"}


class QuantizedProjections(LossyStep):
    name = "quantize"
    record_key = "quantize"
    # torch's weight-only int4/int8 (torchao) is not a dependency: its int8 path runs mm(x,
    # W.to(float)) in eager/TorchScript (dequantized every call, no fewer bytes), its CPU int4
    # is a prototype, and AOTInductor on CPU with it is unproven. The refusal says so rather
    # than export float weights under a quantized name.
    unbuilt = ("--quantize is ONNX-only: torch 2.13 has no CPU weight-only int4/int8 kernel that "
               "{title} compiles (torchao's int8 dequantizes every call, its CPU int4 is a "
               "prototype); use `mha-export onnx --quantize`")

    def from_record(self, record: dict) -> Any:
        return quant_spec_from_record(dict(record))

    def reference(self, module: Any, spec: Any, export: dict) -> Any:
        """Round to nearest: the dequantized weights re-derived from the source weights with
        the recorded spec; a GGUF's kept blocks: the stored weights themselves."""
        return reference_module(module, spec, export.get("dtype", "float32"))

    def tag(self, spec: Any) -> str:
        return spec.tag

    def options(self) -> list[Callable]:
        default = QuantSpec()
        return [
            click.option("--quantize", type=click.Choice((*NAMES, SOURCE)), default=None,
                         help="Weight-only quantized projections (q/k/v, output, gate) as ONNX "
                              "Runtime's MatMulNBits, round to nearest per block; norms, biases "
                              "and sinks stay float (ONNX; model.pte: int4 as XNNPACK's 8da4w, "
                              "int8 activations); source: a checkpoint's own "
                              "quantized weights, kept as they are: a .gguf file's blocks (Q4_0, "
                              "Q4_1, Q5_0, Q5_1, Q8_0, Q2_K-Q6_K) or a Hugging Face folder's "
                              "(GPTQ, AWQ, compressed-tensors, FP8 blocks) [default: float "
                              "weights]."),
            click.option("--block-size", type=click.Choice([str(b) for b in BLOCK_SIZES]),
                         default=str(default.block_size), show_default=True,
                         help="Input features per quantization block (one scale each)."),
            click.option("--symmetric/--asymmetric", default=default.symmetric,
                         show_default=True, help="Symmetric blocks, or a zero point per block."),
            click.option("--accuracy-level", type=click.Choice([str(a) for a in ACCURACY_LEVELS]),
                         default=None,
                         help="MatMulNBits' arithmetic: " + ", ".join(
                             f"{a} = {c}" for a, c in ACCURACY_LEVELS.items())
                         + f" (faster, looser) [default: {default.accuracy_level}; "
                         f"{SourceQuantSpec().accuracy_level} for --quantize source]."),
        ]

    def from_cli(self, kw: dict) -> dict:
        """The options gathered into ``quantize=QuantSpec`` (given without --quantize: an
        error)."""
        fields = {name: kw.pop(name) for name in FIELDS if name in kw}
        if fields.get("accuracy_level") is None:  # each quantizer's own default
            fields.pop("accuracy_level", None)
        name = kw.pop("quantize", None)
        if name is None:
            if fields:
                raise UsageError(f"--{next(iter(fields)).replace('_', '-')} needs --quantize")
            return kw
        for key in ("block_size", "accuracy_level"):
            if key in fields:
                fields[key] = int(fields[key])
        if name == SOURCE:  # the file's own blocks: only the kernel's arithmetic is a choice
            other = next((f for f in fields if f != "accuracy_level"), None)
            if other:
                raise UsageError(f"--{other.replace('_', '-')} does not apply to --quantize "
                                 "source (the checkpoint's own quantization decides it)")
            return {**kw, "quantize": SourceQuantSpec(**fields)}
        return {**kw, "quantize": QuantSpec.named(name, **fields)}

    def request(self, kw: dict, target: Any, kind: str, dtype: str) -> Any:
        spec = kw.pop("quantize", None)
        if spec is not None:
            target.refuse_lossy(self.name, spec, self.unbuilt)
        return spec

    def prepare(self, source: Any, spec: Any, held: Any, seed: int, dtype: str) -> Any:
        return kept_blocks(source, spec, dtype) if spec.quantizer == SOURCE else spec

    def graph_args(self, spec: Any) -> dict:
        return {"projections": MatMulNBitsProjections(spec)}

    def record(self, spec: Any, config: Any) -> dict:
        return {"format": "com.microsoft.MatMulNBits",
                "projections": quantized_projections(config), **spec.to_dict()}

    def api_keys(self) -> tuple[str, ...]:
        return ("quantize",)

    def attribution(self, options: dict, plain: dict, runner: str) -> list[tuple[str, dict]]:
        """The weights at fp32 compute, and at level 4 the kernel's int8 activations on top:
        split by ONNX Runtime's accuracy level, so on ort-cpu only."""
        spec = options["quantize"]
        if runner != "ort-cpu":
            raise UsageError("--attribute splits quantized weights from the kernel's int8 "
                             "activations by ONNX Runtime's accuracy level: use --runner "
                             f"ort-cpu (with {runner} the steps would not be what they are "
                             "named)")
        exact = spec if spec.accuracy_level == 1 else replace(spec, accuracy_level=1)
        runs = [(f"weights {spec.name} (fp32 compute)", {**plain, "quantize": exact})]
        if spec.accuracy_level == 4:
            runs.append((f"weights {spec.name} + int8 activations (level 4)",
                         {**plain, "quantize": spec}))
        return runs

    def weight_bytes(self, config: Any, spec: Any) -> int:
        """Quantized projections as ``spec`` stores them (those the attention kind does not
        quantize stay fp32: an MLA layer's kv_b_proj); a kept weight counts what the graph
        stores for it (kept.py's stored_bytes), per projection as recorded (one kept float
        counts fp32)."""
        shape = kind_of(config).projections(config)
        if spec.quantizer == SOURCE:
            kept = {p: spec.stored_bytes(GRAPH_NAME.get(p, p)) for p in shape}
            return sum(4 * s[0] * s[1] if kept[p] is None else kept[p] for p, s in shape.items())
        quantized = set(quantized_projections(config))
        return sum(spec.stored_bytes(*s) if p in quantized else 4 * s[0] * s[1]
                   for p, s in shape.items())


# where a source was read -> how its layer's own quantized weights are kept
KEEPERS = {"gguf": kept_quantization, "huggingface": kept_checkpoint_quantization}


def kept_blocks(source: Any, spec: SourceQuantSpec, dtype: str) -> SourceQuantSpec:
    """--quantize source: the checkpoint layer's own quantized weights (a GGUF file's blocks,
    a quantized Hugging Face folder's), for the projections of its own layout; each kept form
    must equal the weight the source module holds (the format's own dequantization)."""
    where = source.description
    keep = KEEPERS.get(where.get("kind"))
    if keep is None or (where["kind"] == "huggingface" and "quantization" not in where):
        raise UsageError("--quantize source keeps a checkpoint's own quantized weights: it needs "
                         "--weights FILE.gguf or a quantized Hugging Face folder (GPTQ, AWQ, "
                         "compressed-tensors, FP8)")
    own = where.get("layout", "split")  # the layout the checkpoint stores
    if source.config.layout != own:
        raise UsageError("--quantize source keeps the checkpoint's own projections: export "
                         f"them in its layout ({own})")
    if dtype != "float32":
        raise UsageError("--quantize source is float32 only (the checkpoint's scales as it "
                         "stores them, in float32 arithmetic)")
    kept = keep(where["path"], where["layer"], source.config, spec.accuracy_level)
    if not kept.projections:
        raise UsageError(f"--quantize source: {where['path']} stores layer {where['layer']}'s "
                         "projections as floats: nothing to keep (leave out --quantize)")
    _same_as_module(kept, source.module)
    return kept


def _same_as_module(kept: SourceQuantSpec, module: Any) -> None:
    """Each kept weight (kept.py) dequantizes to the module's weight, to fp32 rounding (GGUF's
    affine types are a few roundings from gguf's own; the others bit for bit): a family whose
    conversion changes a projection has no kept form for it."""
    state = module.state_dict()
    for graph_name, blocks in kept.blocks.items():
        ours = MODULE_WEIGHTS.get(graph_name, f"{graph_name}.weight")  # MLA: the same names
        want = state[ours].detach().float().numpy()
        if not np.allclose(blocks.dequantized(), want, rtol=1e-6,
                           atol=1e-6 * float(np.abs(want).max(initial=0))):
            raise UsageError(f"--quantize source: {graph_name}'s kept weights differ from the "
                             f"layer's {ours} (the checkpoint's conversion changes it): no kept "
                             "form (leave out --quantize)")


STEP = QuantizedProjections()
