"""A GGUF weight's own quantization as ONNX Runtime's ``com.microsoft.MatMulNBits`` inputs, exactly:
the file's integer codes, one scale and one zero point per block, no requantization.

    raw (N, bytes_per_row) uint8, ggml type, K  ->  codes (N, n_blocks, block) uint8,
                                                    scales (N, n_blocks) float32,
                                                    zero points (N, n_blocks) uint8 | float32
    (code - zero point) * scale  ==  gguf.quants.dequantize(raw)   (up to fp32 rounding)

======  =================================  ====  =====  ==============================
type    llama.cpp's value (per sub-block)  bits  block  code, zero point
======  =================================  ====  =====  ==============================
Q4_0    d * (q - 8)                        4     32     q, 8                    (exact)
Q4_1    d * q + m                          4     32     q, float -m / d
Q5_0    d * (q - 16)                       8     32     q + 112, 128            (exact)
Q5_1    d * q + m                          8     32     q, float -m / d         (*)
Q8_0    d * q            (q int8)          8     32     q + 128, 128            (exact)
Q2_K    d*sc * q - dmin*mn                 2     16     q, float dmin*mn / (d*sc)
Q3_K    d*(sc-32) * (q3 - 4 + 4*hbit)      4     16     q3 + 4*hbit + 4, 8      (exact)
Q4_K    d*sc * q - dmin*mn                 4     32     q, float dmin*mn / (d*sc)
Q5_K    d*sc * q - dmin*mn                 8     32     q, float dmin*mn / (d*sc)   (*)
Q6_K    d*sc * (q - 32)  (sc int8)         8     16     q + 96, 128             (exact)
======  =================================  ====  =====  ==============================

d, m, dmin are the file's fp16 fields, sc/mn its small integer sub-block scales (K-quants:
super-blocks of 256 values); the scale is d (d*sc), computed in fp32 as gguf does (exact: an fp16
times a small integer). Types marked (exact) reproduce gguf's float32 values bit for bit, and use
MatMulNBits' default zero point 2^(bits-1), so their ``zero_points`` input may be left out
(``needs_zero_points``). The others carry one float zero point per block (the kernel computes
(q - zp) * scale): a few fp32 roundings from gguf's d*q + m. A block whose scale is 0 holds one
constant value c: its codes become 0, scale 1 and zero point -c (float) — exact.

(*) ONNX Runtime 1.31 on CPU refuses float zero points with bits=8 ("Only 2b and 4b quantization
is supported for unpacked compute"): ``split_high_bit`` turns such a weight into two whose sum it
is (4-bit low nibbles with the float zero points, plus 2- or 4-bit codes of 16 * d * high bit),
i.e. two MatMulNBits nodes and an Add.

F32, F16 and BF16 tensors are not quantized (``is_float_type``): export them as float weights.
Every other type (IQ*, TQ*, MXFP4, NVFP4, ...) has no exact MatMulNBits form: ``UsageError``.
``take_rows`` moves whole rows (llama.cpp's q/k permutation), blocks intact. Numpy only: the
``gguf`` package is not needed here.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, ClassVar, NamedTuple, Optional

import numpy as np

from ...errors import UsageError
from .kept import BLOCKS
from .rtn import _pack

QK_K = 256  # a K-quant super-block's values
FLOAT_TYPES = ("F32", "F16", "BF16", "F64")  # stored as floats: no blocks to keep

# (codes (n, sub-blocks, sub-block) uint8, scales (n, sub-blocks) float32,
#  zero points (n, sub-blocks) uint8 | float32) from one block per row of `blocks` (n, type_size)
Unpacked = tuple[np.ndarray, np.ndarray, np.ndarray]


class Converter(NamedTuple):
    bits: int  # MatMulNBits' bits
    block: int  # MatMulNBits' block_size (a llama.cpp (sub-)block)
    qk: int  # values per llama.cpp block (its ``GGML_QUANT_SIZES`` block size)
    type_size: int  # bytes per llama.cpp block
    unpack: Callable[[np.ndarray], Unpacked]


# Field readers ----------------------------------------------------------------------------------

def _f16(b: np.ndarray) -> np.ndarray:
    """(n, 2) uint8 -> (n, 1) float32: an fp16 field, exactly."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, group: int) -> np.ndarray:
    """(n, bytes) -> (n, 2 * bytes): each run of ``group`` bytes gives its low nibbles, then its
    high nibbles (llama.cpp's order)."""
    n = qs.shape[0]
    q = qs.reshape(n, -1, 1, group) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (q & 0x0F).reshape(n, -1)


def _crumbs(qs: np.ndarray, group: int = 32) -> np.ndarray:
    """(n, bytes) -> (n, 4 * bytes): 2-bit fields, per run of ``group`` bytes shifts 0, 2, 4, 6."""
    n = qs.shape[0]
    q = qs.reshape(n, -1, 1, group) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    return (q & 0x03).reshape(n, -1)


def _bits(qh: np.ndarray, group: int = 32) -> np.ndarray:
    """(n, bytes) -> (n, 8 * bytes): bit i of each of a run of ``group`` bytes, i = 0..7."""
    n = qh.shape[0]
    q = qh.reshape(n, -1, 1, group) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)
    return (q & 0x01).reshape(n, -1)


def _scale_min_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes -> 8 six-bit scales and 8 six-bit mins (n, 8) uint8."""
    n = scales.shape[0]
    d, m, md = np.split(scales.reshape(n, 3, 4), 3, axis=-2)
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc.reshape(n, 8), mn.reshape(n, 8)


def _symmetric(q: np.ndarray, scales: np.ndarray, offset: int, bits: int) -> Unpacked:
    """Signed-offset codes ``q - offset`` -> codes + 2^(bits-1), zero point 2^(bits-1)."""
    half = 1 << (bits - 1)
    codes = (q.astype(np.int16) + (half - offset)).astype(np.uint8)
    return codes, scales, np.full(scales.shape, half, np.uint8)


def _affine(q: np.ndarray, scales: np.ndarray, offsets: np.ndarray) -> Unpacked:
    """w = scale * q - offset -> float zero point offset / scale; a block with scale 0 is the
    constant -offset: codes 0, scale 1, zero point offset."""
    dead = scales == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        zero = np.where(dead, offsets, offsets / np.where(dead, 1, scales)).astype(np.float32)
    codes = np.where(dead[..., None], 0, q).astype(np.uint8)
    return codes, np.where(dead, 1, scales).astype(np.float32), zero


# One converter per type (layouts: gguf-py's quants.py dequantize_blocks) ---------------------

def _q4_0(b: np.ndarray) -> Unpacked:
    d, q = _f16(b[:, :2]), _nibbles(b[:, 2:], 16)
    return _symmetric(q[:, None], d, 8, 4)


def _q4_1(b: np.ndarray) -> Unpacked:
    d, m, q = _f16(b[:, :2]), _f16(b[:, 2:4]), _nibbles(b[:, 4:], 16)
    return _affine(q[:, None], d, -m)


def _q5(qh: np.ndarray, qs: np.ndarray) -> np.ndarray:
    high = (np.ascontiguousarray(qh).view(np.uint32) >> np.arange(32, dtype=np.uint32)) & 1
    return _nibbles(qs, 16) | (high.astype(np.uint8) << 4)


def _q5_0(b: np.ndarray) -> Unpacked:
    return _symmetric(_q5(b[:, 2:6], b[:, 6:])[:, None], _f16(b[:, :2]), 16, 8)


def _q5_1(b: np.ndarray) -> Unpacked:
    d, m = _f16(b[:, :2]), _f16(b[:, 2:4])
    return _affine(_q5(b[:, 4:8], b[:, 8:])[:, None], d, -m)


def _q8_0(b: np.ndarray) -> Unpacked:
    q = np.ascontiguousarray(b[:, 2:]).view(np.int8)
    return _symmetric(q[:, None], _f16(b[:, :2]), 0, 8)


def _q2_k(b: np.ndarray) -> Unpacked:
    n = b.shape[0]
    sc, qs, d, dmin = b[:, :16], b[:, 16:80], _f16(b[:, 80:82]), _f16(b[:, 82:84])
    q = _crumbs(qs).reshape(n, 16, 16)
    return _affine(q, d * (sc & 0x0F).astype(np.float32), dmin * (sc >> 4).astype(np.float32))


def _q3_k(b: np.ndarray) -> Unpacked:
    n = b.shape[0]
    hmask, qs, packed, d = b[:, :32], b[:, 32:96], b[:, 96:108], _f16(b[:, 108:110])
    low = _nibbles(packed[:, :8], 8)  # scale j's low 4 bits: byte j % 8, nibble j // 8
    high = _crumbs(packed[:, 8:], 4)  # its high 2 bits: byte 8 + j % 4, bits 2 * (j // 4)
    sc = (low | (high << 4)).astype(np.float32) - 32
    q = _crumbs(qs) | (_bits(hmask) << 2)  # q3 - 4 + 4 * hbit == (q3 | hbit << 2) - 4
    return _symmetric(q.reshape(n, 16, 16), d * sc, 4, 4)


def _q4_k(b: np.ndarray) -> Unpacked:
    n = b.shape[0]
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    sc, mn = _scale_min_k4(b[:, 4:16])
    q = _nibbles(b[:, 16:], 32).reshape(n, 8, 32)
    return _affine(q, d * sc.astype(np.float32), dmin * mn.astype(np.float32))


def _q5_k(b: np.ndarray) -> Unpacked:
    n = b.shape[0]
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    sc, mn = _scale_min_k4(b[:, 4:16])
    q = (_nibbles(b[:, 48:], 32) | (_bits(b[:, 16:48]) << 4)).reshape(n, 8, 32)
    return _affine(q, d * sc.astype(np.float32), dmin * mn.astype(np.float32))


def _q6_k(b: np.ndarray) -> Unpacked:
    n = b.shape[0]
    ql, qh, sc, d = b[:, :128], b[:, 128:192], b[:, 192:208], _f16(b[:, 208:210])
    q = _nibbles(ql, 64) | (_crumbs(qh) << 4)
    scales = d * np.ascontiguousarray(sc).view(np.int8).astype(np.float32)
    return _symmetric(q.reshape(n, 16, 16), scales, 32, 8)


CONVERTERS: dict[str, Converter] = {
    "Q4_0": Converter(4, 32, 32, 18, _q4_0),
    "Q4_1": Converter(4, 32, 32, 20, _q4_1),
    "Q5_0": Converter(8, 32, 32, 22, _q5_0),
    "Q5_1": Converter(8, 32, 32, 24, _q5_1),
    "Q8_0": Converter(8, 32, 32, 34, _q8_0),
    "Q2_K": Converter(2, 16, QK_K, 84, _q2_k),
    "Q3_K": Converter(4, 16, QK_K, 110, _q3_k),
    "Q4_K": Converter(4, 32, QK_K, 144, _q4_k),
    "Q5_K": Converter(8, 32, QK_K, 176, _q5_k),
    "Q6_K": Converter(8, 16, QK_K, 210, _q6_k),
}
MATMUL_NBITS_TYPES: tuple[str, ...] = tuple(CONVERTERS)  # types with an exact MatMulNBits form


def _type_name(ggml_type: Any) -> str:
    """A GGMLQuantizationType or its name -> the name."""
    return str(getattr(ggml_type, "name", ggml_type))


def is_float_type(ggml_type: Any) -> bool:
    """F32/F16/BF16/F64: a plain float tensor, nothing to keep quantized."""
    return _type_name(ggml_type) in FLOAT_TYPES


def _pack_bits(codes: np.ndarray, bits: int) -> np.ndarray:
    """Codes along the last axis into bytes, the first in the lowest bits (MatMulNBits' order)."""
    if bits == 8:
        return codes.astype(np.uint8)
    if bits == 2:  # pairs into nibbles, then nibbles into bytes
        codes = codes[..., 0::2] | (codes[..., 1::2] << 2)
    return _pack(codes)


# The result -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SourceBlocks:
    """One kept weight (N, K) as MatMulNBits' codes, scales and zero points: a GGUF's, or a
    quantized Hugging Face checkpoint's (checkpoint_blocks.py); kept.py's protocol."""

    kind: ClassVar[str] = BLOCKS
    type_name: str  # the stored type: "Q4_K", ..., "GPTQ-int4-g128"
    bits: int  # 2 | 4 | 8
    block_size: int  # 16 .. 256
    k: int  # input features (the last block padded with codes that dequantize to 0)
    codes: np.ndarray  # (N, n_blocks, block_size) uint8 in [0, 2^bits)
    scales: np.ndarray  # (N, n_blocks) float32
    zero_points: np.ndarray  # (N, n_blocks) uint8 | float32
    # (K,) the kernel's input j is x[..., input_order[j]] (GPTQ's act-order: each group's
    # inputs made contiguous); None: the inputs in order
    input_order: Optional[np.ndarray] = field(default=None, compare=False)

    @property
    def ggml_type(self) -> str:
        """A GGUF's name for the type (type_name)."""
        return self.type_name

    @property
    def n(self) -> int:
        return self.codes.shape[0]

    @property
    def float_zero_points(self) -> bool:
        return self.zero_points.dtype != np.uint8

    @property
    def needs_zero_points(self) -> bool:
        """False where every zero point is MatMulNBits' default 2^(bits-1)."""
        return self.float_zero_points or bool((self.zero_points != 1 << (self.bits - 1)).any())

    def dequantized(self) -> np.ndarray:
        """(N, K) float32: (code - zero point) * scale, the kernel's arithmetic, in the
        checkpoint's input order."""
        w = (self.codes.astype(np.float32) - self.zero_points[..., None].astype(np.float32)
             ) * self.scales[..., None]
        w = w.reshape(self.n, -1)[:, : self.k]
        if self.input_order is None:
            return w
        unpermuted = np.empty_like(w)
        unpermuted[:, self.input_order] = w
        return unpermuted

    def packed(self) -> np.ndarray:
        """MatMulNBits' B: (N, n_blocks, block_size * bits / 8) uint8."""
        return _pack_bits(self.codes, self.bits)

    def packed_zero_points(self) -> np.ndarray:
        """MatMulNBits' zero_points: float32 (N * n_blocks,), or uint8 packed like the codes,
        each row's starting on a byte (N * ceil(n_blocks * bits / 8),)."""
        z = self.zero_points
        if not self.float_zero_points and self.bits < 8:
            per_byte = 8 // self.bits
            pad = -z.shape[1] % per_byte
            z = _pack_bits(np.pad(z, ((0, 0), (0, pad))), self.bits)
        return z.reshape(-1)

    def parts(self) -> tuple["SourceBlocks", ...]:
        """One MatMulNBits each: itself, or, with float zero points at 8 bits (Q5_1, Q5_K),
        the two of ``split_high_bit`` (ONNX Runtime 1.31's CPU kernel takes float zero points
        at 2 and 4 bits only)."""
        if self.float_zero_points and self.bits not in (2, 4):
            return self.split_high_bit()
        return (self,)

    def stored_bytes(self) -> int:
        """What the graph stores for it, every part's (``parts``)."""
        return sum(part._own_bytes() for part in self.parts())

    def _own_bytes(self) -> int:
        """Bytes of B, the fp32 scales and (when needed) the zero points — float ones as the
        graph stores them (graph/builder.py): packed zero points 0 and one fp32 min a block."""
        if self.float_zero_points:
            zeros = self.n * -(-self.scales.shape[1] * self.bits // 8)
            return self.packed().nbytes + 2 * self.scales.nbytes + zeros
        zero = self.packed_zero_points().nbytes if self.needs_zero_points else 0
        return self.packed().nbytes + self.scales.nbytes + zero

    def take_rows(self, indices: Any) -> "SourceBlocks":
        """Row i of the result is row ``indices[i]`` (whole rows move, blocks intact)."""
        idx = np.asarray(indices)
        return replace(self, codes=self.codes[idx], scales=self.scales[idx],
                       zero_points=self.zero_points[idx])

    def split_high_bit(self, high_bits: int = 4) -> tuple["SourceBlocks", "SourceBlocks"]:
        """A 5-bit affine weight (Q5_1, Q5_K: 8 bits, float zero points) as two whose sum it
        is: 4-bit low nibbles with its scales and zero points, plus ``high_bits`` (2 | 4) codes
        of the high bit with scale 16 * scale and the default zero point. ONNX Runtime 1.31's CPU
        kernel runs float zero points with 2 and 4 bits only."""
        if int(self.codes.max(initial=0)) > 31 or high_bits not in (2, 4):
            raise UsageError(f"{self.type_name}: split_high_bit needs 5-bit codes and 2 or 4 "
                             f"high bits, got codes up to {self.codes.max()}, {high_bits}")
        half = 1 << (high_bits - 1)
        low = replace(self, bits=4, codes=self.codes & 0x0F)
        high = replace(self, bits=high_bits, codes=(self.codes >> 4) + np.uint8(half),
                       scales=self.scales * np.float32(16),
                       zero_points=np.full(self.scales.shape, half, np.uint8))
        return low, high


def source_blocks(raw: np.ndarray, ggml_type: Any, k: int) -> SourceBlocks:
    """A GGUF 2-D weight's bytes (N, bytes_per_row) of type ``ggml_type`` (name or
    GGMLQuantizationType) with K input features -> its exact MatMulNBits form."""
    name = _type_name(ggml_type)
    if is_float_type(name):
        raise UsageError(f"{name} is a float type, not quantized: it has no blocks to keep "
                         f"(export it as a float weight)")
    conv = CONVERTERS.get(name)
    if conv is None:
        raise UsageError(f"GGUF type {name} has no exact MatMulNBits form (exact types: "
                         f"{', '.join(MATMUL_NBITS_TYPES)})")
    row = k // conv.qk * conv.type_size if k > 0 and k % conv.qk == 0 else 0
    data = np.ascontiguousarray(raw).view(np.uint8)
    if data.ndim != 2 and row and data.size % row == 0:  # flat bytes: rows of K values
        data = data.reshape(-1, row)
    if not row or data.ndim != 2 or data.shape[1] != row:
        raise UsageError(f"{name} weight of K={k}: expected uint8 rows of K/{conv.qk} blocks of "
                         f"{conv.type_size} bytes (K a multiple of {conv.qk}), got shape "
                         f"{data.shape}")
    n = data.shape[0]
    codes, scales, zero = conv.unpack(data.reshape(-1, conv.type_size))
    if not (np.isfinite(scales).all() and np.isfinite(zero).all()):
        raise UsageError(f"{name} weight holds NaN or Inf scales")
    n_blocks = k // conv.block
    return SourceBlocks(name, conv.bits, conv.block, k,
                        np.ascontiguousarray(codes.reshape(n, n_blocks, conv.block)),
                        np.ascontiguousarray(scales.reshape(n, n_blocks), np.float32),
                        np.ascontiguousarray(zero.reshape(n, n_blocks)))
