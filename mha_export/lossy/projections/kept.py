"""Kept weights: a checkpoint's own quantized projection weight, kept as it ships (``--quantize
source``), as one small protocol. The graph writer (graph.py), config.json's record (source.py),
weight_bytes (step.py) and the check that the kept weight is the function the file holds
(step.py) read these fields, never the class. Numpy only (the ONNX Runtime runners' imports reach
this package without torch).

    kind          how the graph keeps it: BLOCKS (integer codes, a scale and zero point per
                  block: MatMulNBits) or FLOAT8 (e4m3 codes, a scale per block of inputs:
                  DequantizeLinear)
    type_name     as records name it: "Q4_K" (a GGUF's), "GPTQ-int4-g128", "FP8-e4m3-128x128"
    bits, block_size
    take_rows     the rows chosen, whole (a fused q/k/v split, llama.cpp's row order)
    parts         the weights whose sum it is, one graph node each: itself, or two where the
                  kernel cannot take it whole
    stored_bytes  what the graph stores for it, every part's
    dequantized   (N, K) float32: the function the checkpoint stores

Implemented by SourceBlocks (gguf_blocks.py: a GGUF's blocks, and a quantized checkpoint's
integer groups as checkpoint_blocks.py converts them) and Float8Blocks (weights/quantized).
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np

BLOCKS = "blocks"  # integer codes, one scale and zero point per block: MatMulNBits
FLOAT8 = "float8"  # e4m3 codes, a scale per block: weights/quantized's Float8Blocks, as it is
KINDS = (BLOCKS, FLOAT8)
LEGACY_FLOAT8 = "FP8-"  # a float8 record's type before records named their kind (0.5)


@runtime_checkable
class KeptWeight(Protocol):
    """One kept projection weight (N, K), whatever format stored it."""

    @property
    def kind(self) -> str: ...  # BLOCKS | FLOAT8

    @property
    def type_name(self) -> str: ...

    @property
    def bits(self) -> int: ...

    @property
    def block_size(self) -> int: ...

    def take_rows(self, indices: Any) -> "KeptWeight": ...

    def parts(self) -> Sequence["KeptWeight"]: ...

    def stored_bytes(self) -> int: ...

    def dequantized(self) -> np.ndarray: ...


def record(weight: KeptWeight) -> dict:
    """A kept weight's entry in config.json's quantize record."""
    return {"type": weight.type_name, "kind": weight.kind, "bits": weight.bits,
            "block_size": weight.block_size, "bytes": weight.stored_bytes()}


def record_kind(entry: dict) -> str:
    """The kind of a recorded kept weight; a record written before the kind was (0.5) names
    only its type, a float8 one's "FP8-e4m3-RxC"."""
    if "kind" in entry:
        return entry["kind"]
    return FLOAT8 if entry["type"].startswith(LEGACY_FLOAT8) else BLOCKS
