"""RMSNorm in plain ONNX ops (opset 17+, the reference evaluator runs it), over the last axis:
x / sqrt(mean(x^2) + eps) * (offset + w), with (offset + w) folded into one initializer."""
from __future__ import annotations

import numpy as np
import torch

from .builder import GraphBuilder
from .ops import Ops


def rms_norm(g: GraphBuilder, x: str, weight: torch.Tensor, eps: float, offset: float,
             name: str) -> str:
    """(..., W) -> (..., W); nodes named ``<name>_*`` (``_square`` and ``_scaled``: the first
    and last, which tests look up)."""
    op = Ops(g).named(name)
    width = int(weight.numel())
    square = op.Mul(x, x, name="square")
    # the mean over the last axis as a MatMul with a (W, 1) column of 1/W: one form for every
    # opset (ReduceMean takes its axes as an input only from opset 18)
    mean = op.MatMul(square, g.const(f"{name}.mean", np.full((width, 1), 1.0 / width)))  # (.., 1)
    rms = op.Sqrt(op.Add(mean, g.const(f"{name}.eps", np.array(eps))))  # (..., 1)
    scale = weight.detach().double() + offset  # (W,)
    return op.Mul(op.Div(x, rms), g.const(f"{name}.weight", scale), name="scaled")


def heads_rms_norm(g: GraphBuilder, x: str, heads: int, head_dim: int, weight: torch.Tensor,
                   eps: float, offset: float, name: str) -> str:
    """(B, T, heads*H) normalised over each head's H features (the last node ``<name>_flat``)."""
    op = Ops(g).named(name)
    x = op.Reshape(x, g.ints("heads_shape", [0, 0, heads, head_dim]))  # (B, T, heads, H)
    x = rms_norm(g, x, weight, eps, offset, name)  # (B, T, heads, H)
    return op.Reshape(x, g.ints("flat_shape", [0, 0, heads * head_dim]),
                      name="flat")  # (B, T, heads*H)
