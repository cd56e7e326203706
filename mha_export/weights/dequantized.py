"""The function a quantized artifact holds, in torch: the eager module with each quantized
projection's weight replaced by its dequantized weight, (code - zero point) * scale, re-derived
from the source weights with the artifact's recorded QuantSpec (round to nearest is
deterministic). The check runs it as the eager (fp32) and reference (fp64) truth, so a runtime
is judged against what the file holds, and the quantization cost is measured apart against the
unquantized source module."""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
import torch

from ..layer.base import AttentionBase, AttentionWeights
from ..layer.layouts import build_module
from .quantize import QuantSpec, quantize

PROJECTION_FIELDS = ("wq", "wk", "wv", "wo", "wg")  # AttentionWeights' quantized matrices


def dequantized_weights(w: AttentionWeights, spec: QuantSpec,
                        dtype: str = "float32") -> AttentionWeights:
    """``dtype``: the model's, in which the file stores the scales."""
    def dequantized(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        if t is None:
            return None
        q = quantize(t.detach().to(torch.float32).numpy(), spec)
        return torch.from_numpy(q.dequantized(np.dtype(dtype).type)).to(t.dtype)

    return dataclasses.replace(w, **{f: dequantized(getattr(w, f)) for f in PROJECTION_FIELDS})


def dequantized_module(module: AttentionBase, spec: QuantSpec,
                       dtype: str = "float32") -> AttentionBase:
    """A new module of the same config whose projections hold the dequantized weights."""
    out = build_module(module.config)
    out.load_weights(dequantized_weights(module.to_weights(), spec, dtype))
    return out.train(module.training)
