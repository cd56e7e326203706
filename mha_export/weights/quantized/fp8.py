"""Block-scaled FP8 (quant_method "fp8": DeepSeek-V3, Kimi K2, Qwen3-FP8):

    weight            (N, K) float8_e4m3fn
    weight_scale_inv  (ceil(N / 128), ceil(K / 128)) float32   (weight_block_size [128, 128])

    W[i, j] = weight[i, j] * weight_scale_inv[i // 128, j // 128]   (DeepSeek-V3's weight_dequant)

Shapes that 128 does not divide are the format's too (the last blocks are partial). The
activation quantization the scheme names ("dynamic") is not reproduced.
"""
from __future__ import annotations

import numpy as np

from ...errors import UsageError
from .base import Float8Blocks, QuantFormat, float8_codes, numpy_of, require


def check(qcfg: dict) -> None:
    fmt = qcfg.get("fmt", "e4m3")
    if fmt not in ("e4m3", "float8_e4m3fn"):
        raise UsageError(f"FP8 fmt {fmt!r} is not kept (e4m3 is)")
    block = qcfg.get("weight_block_size")
    if not (isinstance(block, (list, tuple)) and len(block) == 2):
        raise UsageError("FP8 quantization_config without weight_block_size [rows, cols] is "
                         "not read")


def decode(parts: dict, qcfg: dict, module: str) -> Float8Blocks:
    scale = "weight_scale_inv" if "weight_scale_inv" in parts else "weight_scale"
    require(parts, ("weight", scale), module, "FP8")
    codes = float8_codes(parts["weight"], module)
    rows, cols = (int(v) for v in qcfg["weight_block_size"])
    scales = numpy_of(parts[scale])
    shape = (-(-codes.shape[0] // rows), -(-codes.shape[1] // cols))
    if scales.shape != shape:
        raise UsageError(f"{module}.{scale} has shape {tuple(scales.shape)}: a {codes.shape} "
                         f"weight in {rows} x {cols} blocks needs {shape}")
    return Float8Blocks("FP8 blocks", codes, scales.astype(np.float32), (rows, cols))


def activations(qcfg: dict) -> str:
    """The activations' quantization the config names (DeepSeek-V3: "dynamic" float8)."""
    scheme = qcfg.get("activation_scheme", "dynamic")
    return f"float8 {scheme}" if scheme else ""


FORMAT = QuantFormat("fp8", "FP8 blocks", ("weight_scale_inv", "weight_scale"),
                     ("weight", "weight_scale_inv", "weight_scale"), decode, check, activations)
