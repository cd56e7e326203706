"""DeepSeek-V4's sliding_attention layer, eager (docs/deepseek-v4.md): a full-sequence call with
a padding mask. Its parameters carry transformers' names (``self_attn.*`` of
DeepseekV4Attention), so its state dict and transformers' are the same."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from ...layer.rotary import cos_sin, rotate
from .settings import DSV4Shape


def rms(x: Tensor, eps: float) -> Tensor:
    """x / sqrt(mean(x^2) + eps) over the last axis, the mean in float32."""
    return x * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps).to(x.dtype)


class WeightedRMSNorm(nn.Module):
    """RMSNorm with a weight, in float32 (transformers' DeepseekV4RMSNorm)."""

    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return (self.weight * rms(x.float(), self.eps)).to(x.dtype)


def rotate_tail(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (B, heads, T, d): its trailing 2 * cos.size(-1) channels rotated in interleaved pairs
    (V4 lays a head out [nope | rope])."""
    rd = 2 * cos.size(-1)
    if rd == 0:
        return x
    nope, tail = x[..., : x.size(-1) - rd], x[..., x.size(-1) - rd:]
    return torch.cat([nope, rotate(tail, cos, sin, interleaved=True)], dim=-1)


def unrotate_output(o: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """o (B, H, T, d): the value's rotation undone, each query's rows rotated back by its own
    position (cos, -sin)."""
    return rotate_tail(o, cos, -sin)


def sliding_mask(positions: Tensor, keep: Optional[Tensor], window: int) -> Tensor:
    """(B, 1, T, T) additive mask: query i sees key j iff i - window < j <= i (positions) and j
    is kept (``keep`` (B, T): 1 for tokens, 0 for padding)."""
    qp, kp = positions.unsqueeze(-1), positions.unsqueeze(-2)  # (B, T, 1), (B, 1, T)
    seen = (kp <= qp) & (kp > qp - window)  # (B, T, T)
    if keep is not None:
        seen = seen & keep.bool().unsqueeze(1)
    zero = torch.zeros((), dtype=torch.float32, device=positions.device)
    return torch.where(seen, zero, torch.finfo(torch.float32).min).unsqueeze(1)


def attend_with_sinks(q: Tensor, kv: Tensor, mask: Tensor, sinks: Tensor, scale: float
                      ) -> Tensor:
    """q (B, H, T, d), kv (B, 1, Tk, d) the key and the value, mask (B, 1, T, Tk), sinks (H,):
    softmax over [logits | sink_h], the sink's column dropped -> (B, H, T, d)."""
    logits = torch.matmul(q, kv.transpose(-1, -2)) * scale + mask  # (B, H, T, Tk)
    sink = sinks.reshape(1, -1, 1, 1).expand(q.size(0), -1, q.size(2), 1)  # (B, H, T, 1)
    both = torch.cat([logits, sink.to(logits.dtype)], dim=-1)
    both = both - both.amax(dim=-1, keepdim=True)
    probs = torch.softmax(both, dim=-1)[..., :-1]
    return torch.matmul(probs.to(kv.dtype), kv)


class DSV4SlidingAttention(nn.Module):
    """y = o_b(grouped o_a(inverse-rotary(attention(q, kv, kv)))) for one sliding layer."""

    def __init__(self, shape: DSV4Shape):
        super().__init__()
        s = self.shape = shape
        self.q_a_proj = nn.Linear(s.dim, s.q_lora_rank, bias=False)
        self.q_a_norm = WeightedRMSNorm(s.q_lora_rank, s.eps)
        self.q_b_proj = nn.Linear(s.q_lora_rank, s.heads * s.head_dim, bias=False)
        self.kv_proj = nn.Linear(s.dim, s.head_dim, bias=False)
        self.kv_norm = WeightedRMSNorm(s.head_dim, s.eps)
        # (G * Ro, H * d / G): group g's rows [g * Ro, (g + 1) * Ro)
        self.o_a_proj = nn.Linear(s.group_width, s.o_groups * s.o_lora_rank, bias=False)
        self.o_b_proj = nn.Linear(s.o_groups * s.o_lora_rank, s.dim, bias=False)
        self.sinks = nn.Parameter(torch.zeros(s.heads))
        inv_freq = 1.0 / s.rope_theta ** (torch.arange(0, s.rope_dim, 2).float() / s.rope_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # (rd/2,)

    def grouped_output(self, o: Tensor) -> Tensor:
        """o (B, T, H, d) -> (B, T, D): each group of H / G heads through its own o_a rows."""
        s = self.shape
        b, t = o.shape[:2]
        grouped = o.reshape(b, t, s.o_groups, s.group_width).transpose(0, 2)  # (G, T, B, Hd/G)
        w = self.o_a_proj.weight.view(s.o_groups, s.o_lora_rank, s.group_width)  # (G, Ro, Hd/G)
        low = torch.matmul(grouped.reshape(s.o_groups, t * b, -1), w.transpose(1, 2))  # G,TB,Ro
        low = low.reshape(s.o_groups, t, b, s.o_lora_rank).transpose(0, 2)  # (B, T, G, Ro)
        return self.o_b_proj(low.reshape(b, t, s.o_groups * s.o_lora_rank))

    def forward(self, x: Tensor, keep: Optional[Tensor] = None,
                positions: Optional[Tensor] = None) -> Tensor:
        """x (B, T, D); keep (B, T) 1 for tokens, 0 for padding; positions (B, T) (default
        0..T-1, as transformers' model gives a left-padded prompt) -> y (B, T, D)."""
        s = self.shape
        b, t, _ = x.shape
        if positions is None:
            positions = torch.arange(t, device=x.device).unsqueeze(0).expand(b, t)
        cos, sin = cos_sin(positions, self.inv_freq, torch.float32)  # (B, 1, T, rd/2)
        q = self.q_b_proj(self.q_a_norm(self.q_a_proj(x)))
        q = rms(q.view(b, t, s.heads, s.head_dim).transpose(1, 2), s.eps)  # (B, H, T, d)
        q = rotate_tail(q.float(), cos, sin).to(x.dtype)
        kv = self.kv_norm(self.kv_proj(x)).unsqueeze(1)  # (B, 1, T, d)
        kv = rotate_tail(kv.float(), cos, sin).to(x.dtype)
        mask = sliding_mask(positions, keep, s.window).to(x.dtype)
        o = attend_with_sinks(q, kv, mask, self.sinks, s.head_dim ** -0.5)  # (B, H, T, d)
        o = unrotate_output(o.float(), cos, sin).to(x.dtype)
        return self.grouped_output(o.transpose(1, 2))  # (B, T, H, d) -> (B, T, D)
