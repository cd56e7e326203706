"""The q/k norms in plain ONNX ops (opset 17+, the reference evaluator runs it), over the last
axis: RMSNorm x / sqrt(mean(x^2) + eps) * (offset + w), with (offset + w) folded into one
initializer; LayerNorm (``centered``) subtracts the mean first and may add a bias."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from .builder import GraphBuilder
from .ops import Ops


def rms_norm(g: GraphBuilder, x: str, weight: torch.Tensor, eps: float, offset: float,
             name: str, centered: bool = False, bias: Optional[torch.Tensor] = None) -> str:
    """(..., W) -> (..., W); weight (W,), or (heads, W) against (..., heads, W); nodes named
    ``<name>_*`` (``_square`` and ``_scaled``: the first and last without a bias, which tests
    look up)."""
    op = Ops(g).named(name)
    width = int(weight.shape[-1])
    # the mean over the last axis as a MatMul with a (W, 1) column of 1/W: one form for every
    # opset (ReduceMean takes its axes as an input only from opset 18)
    column = g.const(f"{name}.mean", np.full((width, 1), 1.0 / width))
    if centered:
        x = op.Sub(x, op.MatMul(x, column), name="centered")  # (..., W)
    square = op.Mul(x, x, name="square")
    mean = op.MatMul(square, column)  # (..., 1)
    rms = op.Sqrt(op.Add(mean, g.const(f"{name}.eps", np.array(eps))))  # (..., 1)
    scale = weight.detach().double() + offset  # (W,) | (heads, W)
    y = op.Mul(op.Div(x, rms), g.const(f"{name}.weight", scale), name="scaled")
    return y if bias is None else op.Add(y, g.const(f"{name}.bias", bias.detach().double()))


def heads_rms_norm(g: GraphBuilder, x: str, heads: int, head_dim: int, weight: torch.Tensor,
                   eps: float, offset: float, name: str, centered: bool = False,
                   bias: Optional[torch.Tensor] = None) -> str:
    """(B, T, heads*H) normalised over each head's H features (the last node ``<name>_flat``)."""
    op = Ops(g).named(name)
    x = op.Reshape(x, g.ints("heads_shape", [0, 0, heads, head_dim]))  # (B, T, heads, H)
    x = rms_norm(g, x, weight, eps, offset, name, centered, bias)  # (B, T, heads, H)
    return op.Reshape(x, g.ints("flat_shape", [0, 0, heads * head_dim]),
                      name="flat")  # (B, T, heads*H)
