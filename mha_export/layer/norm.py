"""RMSNorm as transformers' q/k norms compute it: over the last axis, in float32, scaled by
(offset + weight) — offset 0 for Qwen3 and OLMo 2, 1 for Gemma 3 and Qwen3.5 (whose weights
start at 0: a norm that read (1 + w) as w would look right on fresh weights only)."""
from __future__ import annotations

import torch
from torch import Tensor, nn


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float, offset: float = 0.0):
        super().__init__()
        self.eps = eps
        self.offset = offset
        self.weight = nn.Parameter(torch.full((width,), 1.0 - offset))  # (width,): identity

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (self.offset + self.weight.float())).to(x.dtype)
