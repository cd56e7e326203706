"""An int8 KV cache's arithmetic, exactly as ONNX Runtime 1.31.1's CPU ``GroupQueryAttention``
applies it (``kv_cache_bit_width=8``, ``k_quant_type`` / ``v_quant_type``), measured on the bare
node (tests/test_kv_quant.py): written as

    code = clip(round_half_to_even(x / scale), -128, 127)    int8
    read = code * scale                                       float32

with one scale per tensor ("tensor", shape (1,)) or per key/value channel ("channel", shape
(1, K, 1, H)), static: calibrated once from keys after rotary and values. Torch-free: the graph
and the check's reference both read it. ``KVCacheSpec`` is what an artifact records
(config.json export.kv_cache) for ``--kv-cache-dtype int8``.

Shape legend: B = batch, K = key/value heads, S = cached positions, H = head size.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import UsageError

GRANULARITIES = {"tensor": "PER_TENSOR", "channel": "PER_CHANNEL"}  # -> the node's attribute
LOWEST, HIGHEST = -128, 127
CACHE_DTYPES = ("float", "int8")  # --kv-cache-dtype: "float" is the model's dtype
INT8_CACHE_TAG = "kv8"  # in default folder names and bench variants: ...-static-int4-kv8-onnx
KEY_GRANULARITY = "channel"  # keys: always per channel (rotary pairs, q/k norm: uneven ranges)
# the default for values: per tensor clipped less and cost less than per channel on the layers
# measured (benchmarks/kv_error.py, docs/kv-cache.md)
VALUE_SCALE = "tensor"


@dataclass(frozen=True)
class KVScale:
    """The static scale of one cache (keys or values) and how it is laid out."""

    granularity: str  # GRANULARITIES
    scale: np.ndarray  # (1,) | (1, K, 1, H) float32, > 0

    def __post_init__(self) -> None:
        if self.granularity not in GRANULARITIES:
            raise UsageError(f"unknown KV scale granularity {self.granularity!r}: choose one of "
                             f"{', '.join(GRANULARITIES)}")
        if not (np.isfinite(self.scale).all() and (self.scale > 0).all()):
            raise UsageError("KV cache scales must be finite and > 0")
        shape = self.scale.shape
        if shape != (1,) if self.granularity == "tensor" else (
                len(shape) != 4 or shape[0] != 1 or shape[2] != 1):
            raise UsageError(f"a per-{self.granularity} KV scale cannot have shape {list(shape)} "
                             "(per tensor: [1]; per channel: [1, kv_heads, 1, head_dim])")

    def per_channel(self, kv_heads: int, head_dim: int) -> "KVScale":
        """The same scale laid out per channel (every channel one per-tensor scale): the same
        codes and reads. ONNX Runtime 1.31.1's CPU GroupQueryAttention requires
        k_quant_type == v_quant_type, so per-tensor values beside per-channel keys go in this
        form."""
        if self.granularity == "channel":
            return self
        return KVScale("channel", np.full((1, kv_heads, 1, head_dim), self.scale[0], np.float32))

    def fits(self, kv_heads: int, head_dim: int) -> bool:
        """Whether it can scale a cache of kv_heads x head_dim channels."""
        return self.granularity == "tensor" or self.scale.shape == (1, kv_heads, 1, head_dim)

    @property
    def quant_type(self) -> str:
        """GroupQueryAttention's k_quant_type / v_quant_type."""
        return GRANULARITIES[self.granularity]

    def quantize(self, x: np.ndarray) -> np.ndarray:
        """(B, K, S, H) float -> int8 codes: round half to even, values beyond the scale's range
        clipped (never wrapped around)."""
        return np.clip(np.rint(x / self.scale), LOWEST, HIGHEST).astype(np.int8)

    def dequantize(self, codes: np.ndarray) -> np.ndarray:
        return codes.astype(np.float32) * self.scale

    def clipped_count(self, x: np.ndarray) -> int:
        """How many of x's elements lie beyond what the codes can hold."""
        q = np.rint(x / self.scale)
        return int(((q < LOWEST) | (q > HIGHEST)).sum())

    def clipped(self, x: np.ndarray) -> float:
        """The fraction of x's elements beyond what the codes can hold."""
        return self.clipped_count(x) / x.size if x.size else 0.0


def calibrate(samples: np.ndarray, granularity: str, margin: float = 1.0,
              partners: np.ndarray | None = None) -> KVScale:
    """The scale that maps the largest |sample| (per tensor, or per (head, channel)) to 127,
    times ``margin``. ``samples``: (B, K, S, H) keys after rotary, or values, from a
    calibration run; ``partners``: see ``channel_max``."""
    return scale_from_max(channel_max(samples, partners), granularity, margin)


def channel_max(samples: np.ndarray, partners: np.ndarray | None = None) -> np.ndarray:
    """(1, K, 1, H): the largest |sample| of each (head, channel) of (B, K, S, H) samples.
    ``partners`` (H,): for rotary keys, the channel each one rotates with (-1: none): the bound
    is then the pair's norm sqrt(k_i^2 + k_j^2), which no rotation exceeds — a key's channel
    range depends on its position, and a calibration run sees few of them."""
    x = np.abs(np.asarray(samples, np.float64))
    if x.ndim != 4 or not x.size:
        raise UsageError(f"calibration samples must be (batch, kv_heads, seq, head_dim), got "
                         f"shape {list(x.shape)}")
    if partners is not None:
        rotated = partners >= 0
        x[..., rotated] = np.hypot(x[..., rotated], x[..., partners[rotated]])
    return x.max(axis=(0, 2), keepdims=True)


def scale_from_max(top: np.ndarray, granularity: str, margin: float = 1.0) -> KVScale:
    """The scale mapping each channel's maximum ``top`` (1, K, 1, H) (per tensor: their
    largest) to 127, times ``margin``; an all-zero channel gets a tiny valid scale."""
    if not margin > 0:
        raise UsageError(f"calibration margin must be > 0, got {margin}")
    if granularity not in GRANULARITIES:
        raise UsageError(f"unknown KV scale granularity {granularity!r}: choose one of "
                         f"{', '.join(GRANULARITIES)}")
    top = top.max().reshape(1) if granularity == "tensor" else top  # (1,) | (1, K, 1, H)
    scale = np.maximum(top * margin / HIGHEST, np.finfo(np.float32).tiny)
    return KVScale(granularity, scale.astype(np.float32))


@dataclass(frozen=True)
class KVCacheSpec:
    """An int8 cache: the static scales of its keys (after rotary) and values, and where they
    came from (a calibration file, or synthetic inputs: then the report says so)."""

    key: KVScale
    value: KVScale
    calibration: str  # e.g. "synthetic: 4 x 256 standard-normal tokens"
    synthetic: bool = True

    dtype = "int8"

    def label(self) -> str:
        return (f"int8 cache, keys per {self.key.granularity}, values per "
                f"{self.value.granularity}, scales from {self.calibration}")

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "symmetric": True, "rounding": "half to even",
                "clip": [LOWEST, HIGHEST], "key": _scale_dict(self.key),
                "value": _scale_dict(self.value), "calibration": self.calibration,
                "synthetic": self.synthetic}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "KVCacheSpec":
        if d.get("dtype") != cls.dtype:
            raise UsageError(f"unknown KV cache dtype {d.get('dtype')!r} (this version reads "
                             "int8)")
        return cls(_scale_of(d["key"]), _scale_of(d["value"]), str(d["calibration"]),
                   bool(d.get("synthetic", True)))


def _scale_dict(s: KVScale) -> dict[str, Any]:
    return {"granularity": s.granularity, "quant_type": s.quant_type,
            "shape": list(s.scale.shape), "scale": [float(v) for v in s.scale.reshape(-1)]}


def _scale_of(d: dict[str, Any]) -> KVScale:
    scale = np.asarray(d["scale"], np.float32).reshape(d["shape"])
    return KVScale(d["granularity"], scale)
