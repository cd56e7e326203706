"""Quantized projections inside a torch program (the ExecuTorch target): each projection's
weight becomes torchao's ``IntxUnpackedToInt8Tensor`` holding the very codes and scales that
round to nearest (rtn.py) gives the ONNX file, so the function the program holds is the same
dequantized layer the check's reference computes (reference.py). Its activations are quantized
per token to int8 at every call (torchao's INT8_ASYM_PER_TOKEN): the pattern XNNPACK lowers to
its int8 x int4 kernel ("8da4w").

    W (N, K) -> codes (N, K / block) blocks of int4, signed: code - 8 in [-8, 7]
                scales (N, K / block) float32, zero points 0 (symmetric)
    y = linear(dequant(quant_int8_per_token(x)), (codes - 8) * scale)

What ExecuTorch 1.5.1 cannot run is refused (``refusal``), each reason measured on it:
- zero points (asymmetric blocks): XNNPACK lowered them and computed 20-40% of max|y| off;
- int8 weights in blocks: "Only 4b group quantization is supported" (XNNPACK);
- blocks of 16: "Delegation to XNNPACK requires group_size to be a multiple of 32";
- weight-only (fp32 compute, accuracy level 1): XNNPACK delegates no weight-only linear and
  torchao's dequantize_affine has no ExecuTorch kernel ("Missing out variants").
"""
from __future__ import annotations

import copy
import logging
from typing import Any, Optional

import numpy as np
import torch
from torch import nn

from ...errors import UsageError
from ...lossy.projections.rtn import QuantSpec, quantize, quantized_projections

# the quantizable projections' modules in the split layout an ExecuTorch program holds (an
# attention kind whose names are its modules', e.g. MLA's, maps to itself)
SPLIT_MODULES = {"q_proj": "W_query", "k_proj": "W_key", "v_proj": "W_value",
                 "out_proj": "out_proj", "gate_proj": "W_gate"}
ARITHMETIC = "int8-activations"  # the check's tolerance of what the kernels compute
KERNEL = "torchao IntxUnpackedToInt8Tensor: int4 blocks, int8 activations per token (8da4w)"


def refusal(spec: Any) -> Optional[str]:
    """Why ExecuTorch cannot hold ``spec``'s projections, or None."""
    if not isinstance(spec, QuantSpec):
        return ("--quantize source for ExecuTorch is not built (a checkpoint's own blocks: "
                "only GGUF's Q4_0 has XNNPACK's form); use --quantize int4")
    if spec.bits != 4:
        return ("--quantize int8 for ExecuTorch: XNNPACK takes int8 weights per channel only "
                "(\"Only 4b group quantization is supported\"); use --quantize int4")
    if spec.block_size % 32:
        return (f"--block-size {spec.block_size} for ExecuTorch: XNNPACK delegates int4 blocks "
                "of a multiple of 32 only")
    if not spec.symmetric:
        return ("--asymmetric for ExecuTorch: XNNPACK's int4 kernel has no zero points "
                "(ExecuTorch 1.5.1 lowered them and computed 20-40% of max|y| off)")
    if spec.accuracy_level != 4:
        return ("--accuracy-level 1 for ExecuTorch: XNNPACK has no weight-only linear and "
                "torchao's dequantize has no ExecuTorch kernel; its int4 projections quantize "
                "their activations to int8 (level 4)")
    return None


def in_program(module: nn.Module, specs: dict[str, Any], config: Any
               ) -> tuple[nn.Module, dict[str, Any]]:
    """The module the program captures with the lossy steps built in (a copy; the steps the
    target ``builds``: quantized projections), and their records in config.json's export (its
    "arithmetic": what the kernels compute in, the check's tolerance)."""
    if "quantize" not in specs:
        return module, {}
    spec = specs["quantize"]
    names = quantized_projections(config)
    held = with_int4_projections(copy.deepcopy(module), spec, names)
    return held, {"quantize": {"format": KERNEL, "arithmetic": ARITHMETIC, "projections": names,
                               **spec.to_dict()}}


def with_int4_projections(module: nn.Module, spec: QuantSpec, names: list[str]) -> nn.Module:
    """``module`` (split layout) with projections ``names`` holding the program's int4 weights
    (in place; the caller's copy)."""
    for name in names:
        linear = module.get_submodule(SPLIT_MODULES.get(name, name))
        if not isinstance(linear, nn.Linear) or linear.in_features % spec.block_size:
            raise UsageError(f"--quantize for ExecuTorch: {name} has {linear.in_features} input "
                             f"features, not whole blocks of {spec.block_size}")
        linear.weight = nn.Parameter(int4_weight(linear.weight, spec), requires_grad=False)
    return module


def int4_weight(weight: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """torchao's tensor of ``weight`` (N, K) rounded as rtn.py rounds it for the ONNX file."""
    IntxUnpackedToInt8Tensor, IntxUnpackedToInt8TensorActivationQuantization = _torchao()
    q = quantize(weight.detach().float().numpy(), spec)
    n, blocks, block = q.codes.shape
    signed = (q.codes.astype(np.int16) - q.zero_points[..., None]).astype(np.int8)
    tensor = IntxUnpackedToInt8Tensor(
        torch.from_numpy(signed.reshape(n, blocks * block)), torch.from_numpy(q.scales),
        torch.zeros((n, blocks), dtype=torch.int8), torch.int4, (1, block), torch.float32,
        IntxUnpackedToInt8TensorActivationQuantization.INT8_ASYM_PER_TOKEN)
    if not torch.equal(tensor.dequantize(), torch.from_numpy(q.dequantized())):
        raise RuntimeError("torchao's int4 weight differs from the dequantized blocks")
    return tensor


def _torchao() -> tuple[Any, Any]:
    """torchao's int-x tensor and its activation quantization. Its import tries to load its
    CUDA-only kernels (mxfp8, CUTLASS sm90) and warns of each failure on a CPU machine: those
    warnings are quieted, nothing here uses them."""
    logger = logging.getLogger("torchao")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        from torchao.quantization.quantize_.workflows.intx import intx_unpacked_to_int8_tensor
    finally:
        logger.setLevel(level)
    return (intx_unpacked_to_int8_tensor.IntxUnpackedToInt8Tensor,
            intx_unpacked_to_int8_tensor.IntxUnpackedToInt8TensorActivationQuantization)
