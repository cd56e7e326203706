"""The registry of export targets: one ``ExportTarget`` record per file format an export writes.

Adding a target (say torch.export + AOTInductor): one module here whose ``prepare`` builds the
model in memory and returns how to write it, one record in ``_TARGETS``, and a runner for its file
in ``check/runners`` (the check finds runners by the file they run). The pipeline (staging,
config.json, source weights, the parity check at export) is shared.
"""
from __future__ import annotations

from . import to_aoti, to_onnx, to_torchscript
from .base import ExportTarget


# torch's weight-only int4/int8 (torchao) is not a dependency: its int8 path runs mm(x,
# W.to(float)) in eager/TorchScript (dequantized every call, no fewer bytes), its CPU int4 is a
# prototype, and AOTInductor on CPU with it is unproven. The refusal says so rather than export
# float weights under a quantized name.
_TORCH_QUANT = ("--quantize is ONNX-only: torch 2.13 has no CPU weight-only int4/int8 kernel "
                "that {} compiles (torchao's int8 dequantizes every call, its CPU int4 is a "
                "prototype); use `mha-export onnx --quantize`")
# The eager module holds the int8 cache's function (layer/base.py), but neither torch target is
# proven to write the codes in place and read them dequantized at speed: refused, not guessed.
_TORCH_INT8_CACHE = ("--kv-cache-dtype int8 is ONNX-only (ONNX Runtime's GroupQueryAttention "
                     "and standard ops); {} exports the float cache: use `mha-export onnx "
                     "--static-cache --kv-cache-dtype int8`")
_TARGETS = (
    ExportTarget("onnx", to_onnx.MODEL_FILE, to_onnx.prepare),
    ExportTarget("torchscript", to_torchscript.MODEL_FILE, to_torchscript.prepare,
                 quantize_refusal=_TORCH_QUANT.format("TorchScript"),
                 int8_cache_refusal=_TORCH_INT8_CACHE.format("TorchScript")),
    ExportTarget("aoti", to_aoti.MODEL_FILE, to_aoti.prepare,
                 quantize_refusal=_TORCH_QUANT.format("AOTInductor"),
                 int8_cache_refusal=_TORCH_INT8_CACHE.format("AOTInductor")),
)
TARGETS: dict[str, ExportTarget] = {t.name: t for t in _TARGETS}
