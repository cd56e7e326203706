"""GPTQ (quant_method "gptq"), as AutoGPTQ / GPTQModel write it:

    qweight (K * bits / 32, N) int32   32 / bits codes along the inputs, the first lowest
    qzeros  (G, N * bits / 32) int32   zero points packed along the outputs the same way
    scales  (G, N) fp16                g_idx (K,) int32: each input's group (act-order)

    W[n, k] = (q[k, n] - z[g_idx[k], n]) * s[g_idx[k], n]

checkpoint_format "gptq" (v1) stores z - 1: each field decodes as (field + 1) mod 2^bits, as
GPTQModel's checkpoint dequantizer does (a zero point of 0 is stored as a field of all ones);
"gptq_v2" stores z. 4 and 8 bits (MatMulNBits' widths); 2 and 3 bits refuse.
"""
from __future__ import annotations

import numpy as np

from ...errors import UsageError
from .base import IntGroups, QuantFormat, numpy_of, require, unpack_fields

BITS = (4, 8)
FORMATS = ("gptq", "gptq_v2")


def check(qcfg: dict) -> None:
    bits = qcfg.get("bits", 4)
    if bits not in BITS:
        raise UsageError(f"GPTQ int{bits} is not kept (int4 and int8 have an exact "
                         "MatMulNBits form)")
    fmt = qcfg.get("checkpoint_format", "gptq")
    if fmt not in FORMATS:
        raise UsageError(f"GPTQ checkpoint_format {fmt!r} is not read ({', '.join(FORMATS)})")


def decode(parts: dict, qcfg: dict, module: str) -> IntGroups:
    require(parts, ("qweight", "qzeros", "scales"), module, "GPTQ")
    bits = int(qcfg.get("bits", 4))
    scales = numpy_of(parts["scales"])  # (G, N)
    if scales.ndim != 2:
        raise UsageError(f"{module}.scales has shape {tuple(scales.shape)}: GPTQ's is (groups, "
                         "outputs)")
    g, n = scales.shape
    codes = unpack_fields(numpy_of(parts["qweight"]), bits, axis=0)  # (K, N)
    zeros = unpack_fields(numpy_of(parts["qzeros"]), bits, axis=1)[:, :n]  # (G, N)
    if qcfg.get("checkpoint_format", "gptq") == "gptq":  # v1 stores zero - 1
        zeros = ((zeros.astype(np.int16) + 1) % (1 << bits)).astype(np.uint8)
    k = codes.shape[0]
    group = int(qcfg.get("group_size") or 0)
    group = group if group > 0 else (k if g == 1 else -(-k // g))  # -1: one group a row
    groups = (numpy_of(parts["g_idx"]).astype(np.int64) if "g_idx" in parts
              else np.arange(k) // group)
    if codes.shape[1] != n or zeros.shape != (g, n) or groups.shape != (k,) or \
            groups.min(initial=0) < 0 or groups.max(initial=0) >= g:
        raise UsageError(f"{module}: GPTQ tensors of inconsistent shapes (qweight "
                         f"{tuple(parts['qweight'].shape)}, qzeros {tuple(parts['qzeros'].shape)}, "
                         f"scales {tuple(scales.shape)}, g_idx {groups.shape})")
    return IntGroups("GPTQ", bits, group, codes.T.copy(), zeros.T.copy(), scales.T.copy(), groups)


FORMAT = QuantFormat("gptq", "GPTQ", ("qweight",), ("qweight", "qzeros", "scales", "g_idx"),
                     decode, check)
