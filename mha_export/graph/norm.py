"""RMSNorm in plain ONNX ops (opset 17+, the reference evaluator runs it), over the last axis:
x / sqrt(mean(x^2) + eps) * (offset + w), with (offset + w) folded into one initializer."""
from __future__ import annotations

import numpy as np
import torch

from .builder import GraphBuilder


def rms_norm(g: GraphBuilder, x: str, weight: torch.Tensor, eps: float, offset: float,
             name: str) -> str:
    """(..., W) -> (..., W)."""
    width = int(weight.numel())
    square = g.op("Mul", [x, x], name=f"{name}_square")
    # the mean over the last axis as a MatMul with a (W, 1) column of 1/W: one form for every
    # opset (ReduceMean takes its axes as an input only from opset 18)
    mean = g.op("MatMul", [square, g.const(f"{name}.mean", np.full((width, 1), 1.0 / width))],
                name=f"{name}_mean_square")  # (..., 1)
    rms = g.op("Sqrt", [g.op("Add", [mean, g.const(f"{name}.eps", np.array(eps))],
                             name=f"{name}_plus_eps")], name=f"{name}_rms")  # (..., 1)
    normed = g.op("Div", [x, rms], name=f"{name}_normed")
    scale = g.const(f"{name}.weight", weight.detach().double() + offset)  # (W,)
    return g.op("Mul", [normed, scale], name=f"{name}_scaled")


def heads_rms_norm(g: GraphBuilder, x: str, heads: int, head_dim: int, weight: torch.Tensor,
                   eps: float, offset: float, name: str) -> str:
    """(B, T, heads*H) normalised over each head's H features."""
    x = g.op("Reshape", [x, g.ints("heads_shape", [0, 0, heads, head_dim])],
             name=f"{name}_heads")  # (B, T, heads, H)
    x = rms_norm(g, x, weight, eps, offset, name)  # (B, T, heads, H)
    return g.op("Reshape", [x, g.ints("flat_shape", [0, 0, heads * head_dim])],
                name=f"{name}_flat")  # (B, T, heads*H)
