"""``--quantize source``: a checkpoint layer's projections keep the checkpoint's own quantized
weights — no requantization — a GGUF file's blocks (gguf_blocks.py: the exact MatMulNBits form
of each block type) or a quantized Hugging Face folder's (weights/quantized: GPTQ, AWQ,
compressed-tensors as MatMulNBits, checkpoint_blocks.py; float8 as DequantizeLinear). The
artifact's reference is the file's own function: weights.safetensors holds what
``gguf.quants.dequantize`` returns (weights/gguf.py; a Hugging Face folder: its format's own
dequantization), so the check judges the kernel against the checkpoint's dequantized weights,
and quantizing costs nothing more against that function. What the
GGUF's quantizer cost against the unquantized model is unknown: a GGUF file does not hold the
unquantized weights, and the reports say so rather than invent a figure. The same holds for a
Hugging Face folder: its weights.safetensors is the format's own dequantization.

    RawTensor (file blocks, llama.cpp's row order) -> SourceBlocks (codes, scales, zero points,
    rows in Hugging Face's order) -> one MatMulNBits per projection (two and an Add for Q5_1 /
    Q5_K: ONNX Runtime 1.31's CPU kernel takes float zero points at 2 and 4 bits only)

F16 / BF16 / F32 projections stay float MatMuls (nothing to keep); a type without an exact form
(IQ*, TQ*, ...) refuses in one line naming the tensor and its type. Whatever stored them, the kept
weights are read through kept.py's protocol (their record, parts, bytes), never by their class.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ...errors import UsageError
from ...kinds.registry import kind_of
from .checkpoint_blocks import kept_form
from .gguf_blocks import is_float_type, source_blocks
from .kept import FLOAT8, KeptWeight, record, record_kind
from .rtn import ACCURACY_LEVELS

SOURCE = "source"  # --quantize source
# our module's tensors -> the graph's projection names (graph/model.py's linear() calls)
GRAPH_NAMES = {"W_query.weight": "q_proj", "W_key.weight": "k_proj",
               "W_value.weight": "v_proj", "out_proj.weight": "out"}
FUSED_QKV = "qkv_proj.weight"  # Phi-3: query, key and value rows stacked


@dataclass(frozen=True)
class SourceQuantSpec:
    """The record of a kept quantization: per projection, the type it came from and the form
    it became; ``blocks`` (export time only, never serialized) holds them."""

    accuracy_level: int = 1
    # graph name -> kept.py's record: {"type", "kind", "bits", "block_size", "bytes" (what the
    # graph stores: its MatMulNBits inputs, both nodes' for Q5_1 / Q5_K; a float8 weight's
    # codes and scales)}
    projections: dict = field(default_factory=dict)
    blocks: dict = field(default_factory=dict, compare=False, repr=False)
    quantizer: str = SOURCE
    format: str = "GGUF"  # whose quantization: GGUF, GPTQ, AWQ, compressed-tensors, FP8 blocks
    activations: str = ""  # the checkpoint's run-time activation quantization (not reproduced)

    def __post_init__(self) -> None:
        if self.accuracy_level not in ACCURACY_LEVELS:
            raise UsageError(f"quantization accuracy level {self.accuracy_level!r}: choose one "
                             f"of {', '.join(map(str, ACCURACY_LEVELS))}")

    name = SOURCE

    @property
    def compute(self) -> str:
        return ACCURACY_LEVELS[self.accuracy_level]

    @property
    def tag(self) -> str:
        types = sorted({p["type"].lower() for p in self.projections.values()})
        prefix = "gguf-" if self.format == "GGUF" else ""
        return prefix + "-".join(types) + ("-l4" if self.accuracy_level == 4 else "")

    def label(self) -> str:
        kept = ", ".join(f"{n} {p['type']}" for n, p in self.projections.items()) or "none"
        what = "blocks" if self.format == "GGUF" else "weights"
        return (f"the {self.format}'s own {what} ({kept}), {self.compute} compute (accuracy "
                f"level {self.accuracy_level}); nothing re-quantized: 0 against the file's "
                f"function, and the {self.format}'s own cost is unknown (the file holds no "
                f"unquantized weights)" + _runtime_note(self.projections, self.activations))

    def to_dict(self) -> dict:
        return {"quantizer": SOURCE, "accuracy_level": self.accuracy_level,
                "projections": self.projections, "format": self.format,
                **({"activations": self.activations} if self.activations else {})}

    @classmethod
    def from_dict(cls, d: dict) -> "SourceQuantSpec":
        return cls(accuracy_level=d["accuracy_level"], projections=dict(d["projections"]),
                   format=d.get("format", "GGUF"), activations=d.get("activations", ""))

    def forms(self, name: str, weight: Any) -> list[KeptWeight]:
        """The graph nodes of projection ``name`` (summed when two); [] keeps it float."""
        blocks = self.blocks.get(name)
        if blocks is None:
            if name in self.projections:
                raise UsageError(f"{name}: its GGUF blocks are not loaded (export again)")
            return []
        return _forms(blocks)

    # the function the file holds is the stored weights themselves (the GGUF's dequantized
    # weights): nothing to re-derive (reference.py's reference_module)
    requantizes = False

    def stored_bytes(self, name: str) -> Optional[int]:
        """Bytes the graph stores for projection ``name`` (kept.py: its MatMulNBits inputs, both
        nodes' for Q5_1 / Q5_K; a float8 weight's codes and scales): from its kept weight, else
        from the record (a bench run's, an artifact's); None for a projection kept float (or a
        record that predates the field)."""
        blocks = self.blocks.get(name)
        if blocks is not None:
            return blocks.stored_bytes()
        return self.projections.get(name, {}).get("bytes")


def kept_quantization(path: str | Path, layer: int, config: Any,
                      accuracy_level: int) -> SourceQuantSpec:
    """The layer's projections as the file stores them, in Hugging Face's row order, by graph
    name; a projection of a type without an exact form is bad input (one line)."""
    from ...weights.gguf import layer_raw_tensors
    raw = layer_raw_tensors(path, layer)
    blocks: dict[str, KeptWeight] = {}
    for ours, tensor in raw.items():
        if not ours.endswith(".weight") or len(tensor.shape) != 2:
            continue
        if is_float_type(tensor.ggml_type):
            continue  # stored as floats: a float MatMul
        try:
            found = source_blocks(tensor.data, tensor.ggml_type, tensor.shape[1])
        except UsageError as e:
            raise UsageError(f"--quantize source: {tensor.name}: {e} (a float export works: "
                             "leave out --quantize)") from None
        if tensor.rows is not None:
            found = found.take_rows(tensor.rows)
        blocks.update(_by_graph_name(ours, found, config))
    return SourceQuantSpec(accuracy_level, {n: record(b) for n, b in blocks.items()}, blocks)


def _forms(blocks: KeptWeight) -> list[KeptWeight]:
    """The nodes of one kept weight: itself, or two summed (its ``parts``)."""
    return list(blocks.parts())


def _runtime_note(projections: dict, activations: str) -> str:
    """What the kept weights do not run as the checkpoint's scheme does, in the report."""
    note = ""
    if any(record_kind(p) == FLOAT8 for p in projections.values()):
        note += ("; float8 weights are dequantized at run time (DequantizeLinear: no FP8 matmul "
                 "on CPU)")
    if activations:
        note += (f"; the checkpoint's {activations} activation quantization is not reproduced "
                 "(its cost unknown)")
    return note


def kept_checkpoint_quantization(path: str | Path, layer: int, config: Any,
                                 accuracy_level: int) -> SourceQuantSpec:
    """A quantized Hugging Face checkpoint's layer as it ships (GPTQ, AWQ, compressed-tensors,
    FP8 blocks), by graph name; a weight without an exact form is bad input (one line)."""
    from ...weights.huggingface import checkpoint_activations, kept_weights
    fmt, decoded = kept_weights(path, layer)
    blocks: dict[str, KeptWeight] = {}
    for ours, weight in decoded.items():
        try:
            form = kept_form(weight)
        except UsageError as e:
            raise UsageError(f"--quantize source: {ours}: {e}") from None
        blocks.update(_by_graph_name(ours, form, config))
    return SourceQuantSpec(accuracy_level, {n: record(b) for n, b in blocks.items()}, blocks,
                           format=fmt, activations=checkpoint_activations(path))


def _by_graph_name(ours: str, blocks: KeptWeight, config: Any) -> dict[str, KeptWeight]:
    if ours in GRAPH_NAMES:
        return {GRAPH_NAMES[ours]: blocks}
    if ours == FUSED_QKV:  # rows: query (N*H), key (K*H), value (K*H)
        q, kv = config.heads * config.head_dim, config.kv_heads * config.head_dim
        return {"q_proj": blocks.take_rows(np.arange(q)),
                "k_proj": blocks.take_rows(np.arange(q, q + kv)),
                "v_proj": blocks.take_rows(np.arange(q + kv, q + 2 * kv))}
    name = ours.removesuffix(".weight")
    kind = kind_of(config) if config is not None else None
    if kind is not None and name in kind.projections(config):  # MLA: graph names are the
        # checkpoint's; what the kind keeps float (kv_b_proj) stays its dequantized weight
        return {name: blocks} if name in kind.quantizable(config) else {}
    raise UsageError(f"--quantize source: no kept form for {ours} (keep it float: leave out "
                     "--quantize)")
