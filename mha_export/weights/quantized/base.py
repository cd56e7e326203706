"""What a quantized checkpoint's projection is, whatever format stored it: the format's codes,
scales and zero points, unpacked, and the format's own dequantization of them.

    IntGroups      W[n, k] = (codes[n, k] - zeros[n, g(k)]) * scales[n, g(k)],  g(k) = groups[k]
    Float8Blocks   W[n, k] = e4m3(codes[n, k]) * scales[n // rows, k // cols]

Shapes: N = output features, K = input features, G = groups. ``dequantized`` is evaluated in
float32, where it is exact for integer codes (a code below 2^8 times an fp16 / bf16 scale fits
fp32's 24 bits) and one rounding for float8 (as ONNX's DequantizeLinear rounds): the function
the checkpoint stores, which the check's reference module holds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar

import numpy as np
import torch

from ...errors import UsageError

# what a decoded weight is (its ``kind``), which decides how --quantize source keeps it
INT_GROUPS = "int groups"  # as MatMulNBits blocks (lossy/projections/checkpoint_blocks.py)
FLOAT8 = "float8"  # as it is (lossy/projections/kept.py's protocol, the same kind there)


@dataclass(frozen=True)
class IntGroups:
    """A weight of integer codes with one scale and zero point per (row, group of inputs)."""

    kind: ClassVar[str] = INT_GROUPS
    format: str  # "GPTQ", "AWQ", "compressed-tensors"
    bits: int  # 4 | 8
    group_size: int  # inputs per group (K: one group, per channel)
    codes: np.ndarray  # (N, K) uint8 in [0, 2^bits)
    zeros: np.ndarray  # (N, G) uint8 in [0, 2^bits)
    scales: np.ndarray  # (N, G) float32
    groups: np.ndarray  # (K,) int64: the group of each input feature (GPTQ's g_idx)

    @property
    def act_order(self) -> bool:
        """Groups that are not runs of consecutive inputs (GPTQ's desc_act): a g_idx that is
        just k // group_size is no act-order."""
        k = np.arange(self.codes.shape[1])
        return not np.array_equal(self.groups, k // self.group_size)

    def dequantized(self) -> np.ndarray:
        """(N, K) float32: the format's definition, exactly."""
        z = self.zeros[:, self.groups].astype(np.float32)  # (N, K)
        return (self.codes.astype(np.float32) - z) * self.scales[:, self.groups]

    def describe(self) -> str:
        group = "per channel" if self.group_size >= self.codes.shape[1] else \
            f"group {self.group_size}"
        return f"{self.format} int{self.bits}, {group}" + (", act-order" if self.act_order else "")


@dataclass(frozen=True)
class Float8Blocks:
    """A weight of float8 e4m3 codes with one scale per block of (rows, cols) (per tensor:
    the whole weight; per channel: (1, K)). A kept weight as it is (lossy/projections/kept.py's
    protocol)."""

    kind: ClassVar[str] = FLOAT8
    format: str  # "FP8 blocks", "compressed-tensors"
    codes: np.ndarray  # (N, K) uint8: the e4m3fn bytes
    scales: np.ndarray  # (ceil(N / rows), ceil(K / cols)) float32
    block: tuple[int, int]  # (rows, cols)

    def values(self) -> np.ndarray:
        """(N, K) float32: the codes' own values."""
        return torch.from_numpy(self.codes).view(torch.float8_e4m3fn).float().numpy()

    def row_scales(self) -> np.ndarray:
        """(N, ceil(K / cols)) float32: each row's scales (block rows expanded)."""
        return np.repeat(self.scales, self.block[0], axis=0)[: self.codes.shape[0]]

    def dequantized(self) -> np.ndarray:
        cols = np.repeat(self.row_scales(), self.block[1], axis=1)[:, : self.codes.shape[1]]
        return self.values() * cols

    @property
    def bits(self) -> int:
        return 8

    @property
    def type_name(self) -> str:
        """As records name it: FP8-e4m3-RxC."""
        return f"FP8-e4m3-{self.block[0]}x{self.block[1]}"

    @property
    def block_size(self) -> int:
        return self.block[1]

    def take_rows(self, indices: np.ndarray) -> "Float8Blocks":
        """Rows ``indices`` (a fused q/k/v split), each keeping its own scales."""
        idx = np.asarray(indices)
        return Float8Blocks(self.format, self.codes[idx], self.row_scales()[idx],
                            (1, self.block[1]))

    def parts(self) -> tuple["Float8Blocks"]:
        """One DequantizeLinear: itself."""
        return (self,)

    def stored_bytes(self) -> int:
        """The codes and the scales as the graph stores them (one per row and block of inputs,
        float32)."""
        return self.codes.nbytes + self.row_scales().nbytes

    def describe(self) -> str:
        n, k = self.codes.shape
        if self.block == (n, k):
            how = "per tensor"
        elif self.block == (1, k):
            how = "per channel"
        else:
            how = f"{self.block[0]} x {self.block[1]} blocks"
        return f"{self.format} float8 e4m3, {how}"


Decoded = IntGroups | Float8Blocks


def unpack_fields(words: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """int32 words holding 32 / bits fields each, the first in the lowest bits, unpacked along
    ``axis`` (GPTQ's qweight along the inputs, its qzeros along the outputs)."""
    w = np.ascontiguousarray(words).view(np.uint32)
    per_word = 32 // bits
    shifts = (np.arange(per_word, dtype=np.uint32) * bits)
    fields = (np.expand_dims(w, -1) >> shifts) & np.uint32((1 << bits) - 1)  # (..., per_word)
    fields = np.moveaxis(fields, -1, axis + 1) if axis == 0 else fields
    shape = list(w.shape)
    shape[axis] *= per_word
    return fields.reshape(shape).astype(np.uint8)


def numpy_of(tensor: torch.Tensor) -> np.ndarray:
    """A checkpoint tensor as numpy: float scales as float32 (exactly), integers as they are."""
    if tensor.dtype.is_floating_point:
        return tensor.float().numpy()
    return tensor.numpy()


def float8_codes(weight, module: str) -> np.ndarray:
    """(N, K) uint8: an e4m3fn weight's bytes; another float8 kind is refused in one line."""
    if weight.dtype != torch.float8_e4m3fn:
        raise UsageError(f"{module}.weight is {weight.dtype}: float8 e4m3fn weights are kept")
    return weight.view(torch.uint8).numpy()


def require(parts: dict, names: tuple[str, ...], module: str, fmt: str) -> None:
    """The tensors a format needs for one module, else one line naming the missing one."""
    missing = [n for n in names if n not in parts]
    if missing:
        raise UsageError(f"{module}.{missing[0]} is missing: the tensors do not match the "
                         f"folder's quantization_config ({fmt})")


@dataclass(frozen=True)
class QuantFormat:
    """One checkpoint format (a quantization_config's quant_method): which tensors mark a
    module as quantized, and how they decode."""

    method: str  # quantization_config.quant_method
    name: str  # as reports say it
    markers: tuple[str, ...]  # tensor names after the module that make it a quantized one
    parts: tuple[str, ...]  # every tensor name after the module the format reads
    # (the module's tensors by part name, quantization_config, the module's full name)
    decode: Callable[[dict, dict, str], "Decoded"]
    check: Callable[[dict], None]  # refusals of the config itself (one line)
    # the activation quantization the scheme applies at run time, in words ("" if none): not
    # reproduced by the export, so its cost is unknown and the report says so
    activations: Callable[[dict], str] = lambda qcfg: ""
