"""The q/k norms as transformers computes them: over the last axis, in float32, scaled by
(offset + weight) — offset 0 for Qwen3 and OLMo 2, 1 for Gemma 3 and Qwen3.5 (whose weights
start at 0: a norm that read (1 + w) as w would look right on fresh weights only). RMSNorm, or
LayerNorm (``centered``: Phi, StableLM, Cohere) with an optional bias; one weight shared by the
heads, or one per head (StableLM's and Cohere's (N, H))."""
from __future__ import annotations

import torch
from torch import Tensor, nn


class QKNorm(nn.Module):
    """shape: (W,) shared, or (N, H) per head against (B, N, T, H) inputs; ``learned`` False:
    weightless (Gemma 3n's value norm: its weight a constant 1, not in the state dict)."""

    def __init__(self, shape: tuple[int, ...], eps: float, offset: float = 0.0,
                 centered: bool = False, bias: bool = False, learned: bool = True):
        super().__init__()
        self.eps, self.offset, self.centered, self.has_bias = eps, offset, centered, bias
        if learned:
            self.weight = nn.Parameter(torch.full(shape, 1.0 - offset))  # identity
        else:
            self.register_buffer("weight", torch.full(shape, 1.0 - offset), persistent=False)
        if bias:
            self.bias = nn.Parameter(torch.zeros(shape))
        else:
            self.register_buffer("bias", torch.zeros(0), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        if self.centered:
            x32 = x32 - x32.mean(-1, keepdim=True)
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        out = normed * _over_heads(self.offset + self.weight.float())
        if self.has_bias:
            out = out + _over_heads(self.bias.float())
        return out.to(x.dtype)


def _over_heads(t: Tensor) -> Tensor:
    """A per-head (N, H) parameter as (N, 1, H), against (B, N, T, H); a shared one as is."""
    return t.unsqueeze(-2) if t.dim() == 2 else t


class RMSNorm(QKNorm):
    """RMSNorm over the last axis of width W (the MLA layer's latent norms)."""

    def __init__(self, width: int, eps: float, offset: float = 0.0):
        super().__init__((width,), eps, offset)
