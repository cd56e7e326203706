"""Weight-only block quantization of a projection: round to nearest, int4 or int8, per block of
``block_size`` input features, symmetric or with a zero point — stored in the layout of ONNX
Runtime's ``com.microsoft.MatMulNBits`` (B packed per output row, low nibble first).

    W (N, K) float  -> codes (N, n_blocks, block) uint8 in [0, 2^bits), scales (N, n_blocks),
                       zero points (N, n_blocks) uint8
    dequantized W   =  (codes - zero_point) * scale     (float32, as the kernel computes it)

N = output features, K = input features (nn.Linear's weight layout), n_blocks = ceil(K / block);
the last block is padded with zeros. Torch-free: the ONNX graph pass and the check's reference
both read it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ...errors import UsageError
from .kept import BLOCKS

BITS = (4, 8)
NAMES = {f"int{b}": b for b in BITS}  # --quantize int4 | int8
BLOCK_SIZES = (16, 32, 64, 128)
QUANTIZERS = ("rtn",)
# ONNX Runtime's MatMulNBits accuracy_level: the precision its kernel computes in. 1: fp32, exact
# to the dequantized weights up to fp32 rounding. 4 (the default since 0.5): activations
# quantized to int8 per block — the fast kernel for int4 and the only packed one for int8 (ORT
# 1.31 dequantizes 8-bit weights at every call at level 1: 13-17x slower than fp32 on a
# Llama-3-8B-sized step). Measured on that step (cold, past 1024, AMD EPYC AVX2, 2026-11-25):
# fp32 9.2 ms, int4 level 1 7.3 ms, level 4 2.9 ms (3.2x fp32), int8 level 4 4.3 ms (2.1x).
# Its cost is never hidden: the check proves the file's weights at fp32 compute as well
# (ort-cpu-fp32-compute, fp32's tolerance) and reports level 4's own error apart; eval measures
# what it costs the model (docs/quantization.md: 0.4-3.5% of max|y| on SmolLM2's layers with
# real inputs; KL per checkpoint). Level 1 is one flag away: --accuracy-level 1.
DEFAULT_ACCURACY_LEVEL = 4
ACCURACY_LEVELS = {1: "fp32", 4: "int8-activation"}


@dataclass(frozen=True)
class QuantSpec:
    bits: int = 4
    block_size: int = 32
    symmetric: bool = True
    quantizer: str = "rtn"  # round to nearest
    accuracy_level: int = DEFAULT_ACCURACY_LEVEL  # how the runtime computes (ACCURACY_LEVELS)

    def __post_init__(self) -> None:
        for name, value, allowed in (("bits", self.bits, BITS),
                                     ("block size", self.block_size, BLOCK_SIZES),
                                     ("quantizer", self.quantizer, QUANTIZERS),
                                     ("accuracy level", self.accuracy_level, ACCURACY_LEVELS)):
            if value not in allowed:
                raise UsageError(f"quantization {name} {value!r}: choose one of "
                                 f"{', '.join(map(str, allowed))}")

    @property
    def levels(self) -> int:
        return 2 ** self.bits

    @property
    def name(self) -> str:
        """'int4' | 'int8': the --quantize value."""
        return f"int{self.bits}"

    @property
    def compute(self) -> str:
        """The kernel's arithmetic: 'fp32' | 'int8-activation'."""
        return ACCURACY_LEVELS[self.accuracy_level]

    @property
    def tag(self) -> str:
        """Short name of a variant: 'int4', 'int8-b64-asym', 'int4-fp32' (accuracy level 1)."""
        return self.name + (f"-b{self.block_size}" if self.block_size != 32 else "") + (
            "" if self.symmetric else "-asym") + ("-fp32" if self.accuracy_level == 1 else "")

    def stored_bytes(self, n: int, k: int) -> int:
        """Bytes an (N, K) weight occupies quantized: codes, fp32 scales, zero points."""
        blocks = -(-k // self.block_size)
        zero_points = 0 if self.symmetric else n * -(-blocks * self.bits // 8)
        return n * blocks * self.block_size * self.bits // 8 + 4 * n * blocks + zero_points

    def label(self) -> str:
        """'int4 block 32 symmetric, fp32 compute (accuracy level 1)'."""
        return (f"{self.name} block {self.block_size} "
                f"{'symmetric' if self.symmetric else 'zero point'}, {self.compute} compute "
                f"(accuracy level {self.accuracy_level})")

    def to_dict(self) -> dict:
        return {"bits": self.bits, "block_size": self.block_size, "symmetric": self.symmetric,
                "quantizer": self.quantizer, "accuracy_level": self.accuracy_level}

    # the function the file holds is re-derived from the source weights (reference.py)
    requantizes = True

    def forms(self, name: str, weight: np.ndarray) -> list["QuantizedWeight"]:
        """The MatMulNBits form of projection ``name``'s (N, K) weight: quantized here."""
        return [quantize(np.asarray(weight, np.float32), self)]

    @classmethod
    def from_dict(cls, d: dict) -> "QuantSpec":
        return cls(**d)

    @classmethod
    def named(cls, name: str, **fields) -> "QuantSpec":
        """--quantize int4|int8."""
        if name not in NAMES:
            raise UsageError(f"--quantize {name!r}: choose one of {', '.join(NAMES)}")
        return cls(bits=NAMES[name], **fields)


@dataclass(frozen=True)
class QuantizedWeight:
    kind: ClassVar[str] = BLOCKS  # written as MatMulNBits (graph.py)
    spec: QuantSpec
    k: int  # input features before padding
    codes: np.ndarray  # (N, n_blocks, block) uint8
    scales: np.ndarray  # (N, n_blocks) float32
    zero_points: np.ndarray  # (N, n_blocks) uint8

    @property
    def bits(self) -> int:
        return self.spec.bits

    @property
    def block_size(self) -> int:
        return self.spec.block_size

    @property
    def n(self) -> int:
        return self.codes.shape[0]

    @property
    def needs_zero_points(self) -> bool:
        return not self.spec.symmetric

    def dequantized(self, scale_dtype: type = np.float32) -> np.ndarray:
        """(N, K) float32: (code - zero point) * scale, the function the file holds; its scales
        as the file stores them (``scale_dtype``: float16 in a float16 model)."""
        scales = self.scales.astype(scale_dtype).astype(np.float32)
        centered = self.codes.astype(np.float32) - self.zero_points[..., None]
        w = centered * scales[..., None]  # (N, n_blocks, block)
        return w.reshape(w.shape[0], -1)[:, :self.k]

    def packed(self) -> np.ndarray:
        """MatMulNBits' B: (N, n_blocks, block * bits / 8) uint8, two int4 codes per byte."""
        return _pack(self.codes) if self.spec.bits == 4 else self.codes

    def packed_zero_points(self) -> np.ndarray:
        """MatMulNBits' zero_points: (N * ceil(n_blocks * bits / 8),) uint8."""
        z = self.zero_points
        if self.spec.bits == 4:
            if z.shape[1] % 2:  # each row's zero points start on a byte
                z = np.concatenate([z, np.zeros((z.shape[0], 1), np.uint8)], axis=1)
            z = _pack(z)
        return z.reshape(-1)


def quantized_projections(config) -> list[str]:
    """The projections --quantize turns into MatMulNBits: its attention kind's (kinds/)."""
    from ...kinds.registry import kind_of  # torch: not at import (the ORT bench worker reads specs)
    return kind_of(config).quantizable(config)


def quantize(weight: np.ndarray, spec: QuantSpec) -> QuantizedWeight:
    """Round to nearest per block; symmetric: zero point 2^(bits-1), scale max|w| / (2^(bits-1)
    - 1); asymmetric: the block's [min, max] (0 included) over 2^bits - 1 steps."""
    n, k = weight.shape
    if not np.isfinite(weight).all():
        raise UsageError("cannot quantize weights holding NaN or Inf")
    blocks = -(-k // spec.block_size)
    w = np.zeros((n, blocks * spec.block_size), np.float32)
    w[:, :k] = weight
    w = w.reshape(n, blocks, spec.block_size)  # (N, n_blocks, block)
    top = spec.levels - 1
    if spec.symmetric:
        scales = np.abs(w).max(axis=-1) / (spec.levels // 2 - 1)
        zero = np.full((n, blocks), spec.levels // 2, np.float32)
    else:
        low, high = np.minimum(w.min(axis=-1), 0), np.maximum(w.max(axis=-1), 0)
        scales = (high - low) / top
        zero = np.clip(np.round(-low / np.where(scales > 0, scales, 1)), 0, top)
    scales = np.where(scales > 0, scales, 1).astype(np.float32)  # an all-zero block: any scale
    codes = np.clip(np.round(w / scales[..., None]) + zero[..., None], 0, top)
    return QuantizedWeight(spec, k, codes.astype(np.uint8), scales, zero.astype(np.uint8))


def _pack(codes: np.ndarray) -> np.ndarray:
    """Pairs of 4-bit codes along the last axis into bytes, the first in the low nibble."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)

