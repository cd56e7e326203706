"""AWQ (quant_method "awq", version "gemm"), as AutoAWQ writes it:

    qweight (K, N / 8) int32   8 codes of 4 bits along the outputs: field i of word c holds
                               output 8c + [0, 2, 4, 6, 1, 3, 5, 7][i]
    qzeros  (G, N / 8) int32   zero points packed the same way, stored as they are
    scales  (G, N) fp16

    W[n, k] = (q[k, n] - z[k // group, n]) * s[k // group, n]   (AutoAWQ's dequantize_gemm)
"""
from __future__ import annotations

import numpy as np

from ...errors import UsageError
from .base import IntGroups, QuantFormat, numpy_of, require, unpack_fields

ORDER = np.array([0, 2, 4, 6, 1, 3, 5, 7])  # field i of a word holds output ORDER[i]


def check(qcfg: dict) -> None:
    version = str(qcfg.get("version", "gemm")).lower()
    if version != "gemm":
        raise UsageError(f"AWQ version {version!r} is not read (its GEMM packing is)")
    bits = qcfg.get("bits", qcfg.get("w_bit", 4))
    if bits != 4:
        raise UsageError(f"AWQ int{bits} is not read (AWQ's GEMM packing is int4)")


def _in_order(fields: np.ndarray) -> np.ndarray:
    """(rows, N) fields in the words' order -> (rows, N) by output: output 8c + ORDER[i] is
    field 8c + i."""
    n = fields.shape[1]
    where = np.empty(n, np.int64)
    where[(np.arange(n) // 8) * 8 + ORDER[np.arange(n) % 8]] = np.arange(n)
    return fields[:, where]


def decode(parts: dict, qcfg: dict, module: str) -> IntGroups:
    require(parts, ("qweight", "qzeros", "scales"), module, "AWQ")
    scales = numpy_of(parts["scales"])  # (G, N)
    codes = _in_order(unpack_fields(numpy_of(parts["qweight"]), 4, axis=1))  # (K, N)
    zeros = _in_order(unpack_fields(numpy_of(parts["qzeros"]), 4, axis=1))  # (G, N)
    k, n = codes.shape
    group = int(qcfg.get("group_size", qcfg.get("q_group_size", 128)))
    group = k if group <= 0 else group
    if scales.shape != zeros.shape or scales.shape[1] != n or scales.shape[0] != -(-k // group):
        raise UsageError(f"{module}: AWQ tensors of inconsistent shapes (qweight "
                         f"{tuple(parts['qweight'].shape)}, qzeros {tuple(parts['qzeros'].shape)}, "
                         f"scales {tuple(scales.shape)}, group {group})")
    return IntGroups("AWQ", 4, group, codes.T.copy(), zeros.T.copy(), scales.T.copy(),
                     np.arange(k) // group)


FORMAT = QuantFormat("awq", "AWQ", ("qweight",), ("qweight", "qzeros", "scales"), decode, check)
