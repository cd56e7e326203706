"""The function a quantized artifact holds, in torch: the eager module with each quantized
projection's weight replaced by its dequantized weight, (code - zero point) * scale, re-derived
from the source weights with the artifact's recorded QuantSpec (round to nearest is
deterministic). The check runs it as the eager (fp32) and reference (fp64) truth, so a runtime
is judged against what the file holds, and the quantization cost is measured apart against the
unquantized source module."""
from __future__ import annotations

import numpy as np
import torch

from ...kinds.registry import kind_of
from ...layer.base import AttentionBase
from .rtn import QuantSpec, quantize


def reference_module(module: AttentionBase, spec, dtype: str = "float32") -> AttentionBase:
    """The function a quantized file holds: round to nearest re-derives its dequantized weights
    from the source weights; a checkpoint's kept weights (kept.py) are the stored weights
    themselves: the module holds their dequantization, checked equal at export (step.py)."""
    return dequantized_module(module, spec, dtype) if spec.requantizes else module


def dequantized_module(module: AttentionBase, spec: QuantSpec,
                       dtype: str = "float32") -> AttentionBase:
    """A new module of the same config whose projections hold the dequantized weights
    (``dtype``: the model's, in which the file stores the scales)."""
    return kind_of(module.config).map_projections(
        module, lambda name, w: _dequantized(w, spec, dtype))


def _dequantized(t: torch.Tensor, spec: QuantSpec, dtype: str) -> torch.Tensor:
    """(code - zero point) * scale of t quantized with spec, scales stored in ``dtype``."""
    q = quantize(t.detach().to(torch.float32).numpy(), spec)
    return torch.from_numpy(q.dequantized(np.dtype(dtype).type)).to(t.dtype)
