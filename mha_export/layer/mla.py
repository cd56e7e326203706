"""Multi-head Latent Attention (MLA: DeepSeek-V2/V3, Kimi K2), the eager layer — transformers'
``DeepseekV2Attention`` / ``DeepseekV3Attention``, with the checkpoints' tensor names — in its
two forms:

    queries   q = q_proj(x), or q_b_proj(RMSNorm(q_a_proj(x))) with q_lora_rank
              -> per head [q_nope (Hn) | q_rot (Hr)], q_rot rotated
    cache     kv_a_proj_with_mqa(x) = [latent (R) | k_rot (Hr)]: the latent RMS-normalised, k_rot
              one shared head, rotated. Per token the cache holds R + Hr numbers (transformers'
              layout: "keys" = latent (B, 1, S, R), "values" = k_rot (B, 1, S, Hr))
    expanded  kv_b_proj(latent) = per head [k_nope (Hn) | v (Hv)]; key = [k_nope | k_rot]
              (every head's copy of k_rot), query = [q_nope | q_rot]: attention, o_proj
    absorbed  W_UK, W_UV (each head's slices of kv_b_proj) move the query into latent space and
              the context out of it: scores = (q_nope W_UK) . latent + q_rot . k_rot, context =
              (p @ latent) W_UV^T — multi-query attention with one key of width R + Hr and one
              value of width R, reading the cache as it is stored (never expanded)

The softmax scale is (Hn + Hr)^-0.5, times yarn's mscale(factor, mscale_all_dim)^2 where the
rope parameters set mscale_all_dim (transformers' ``yarn_apply_mscale``). Rotary layouts
(``ROPE_LAYOUTS``), which decide what the cache holds: V2's complex-number form rotates pairs
(2i, 2i+1) in place ("interleaved"); V3's ``rope_interleave`` reads those pairs and writes the
halves [rotated evens | rotated odds] ("deinterleaving"); V3 without it rotates halves ("half").

Foundation of issue 23: the layer and its two forms, proven equal to transformers
(tests/test_mla.py); not yet exported (no graph form, checkpoint family or CLI reads it).

Shape legend: B = batch, T = this call, S = cached + this call, N = heads, R = kv_lora_rank,
Hn = qk_nope_head_dim, Hr = qk_rope_head_dim, Hv = v_head_dim.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor, nn

from .. import rope_types
from ..errors import UsageError
from .attention import attention, merge_heads
from .base import valid_end
from .norm import RMSNorm
from .rotary import cos_sin, rope_tables, rotate


ROPE_LAYOUTS = ("deinterleaving", "interleaved", "half")


@dataclass(frozen=True)
class MLAConfig:
    """An MLA layer, as a DeepSeek-V2/V3 config.json states it: x (B, T, dim) -> y (B, T, dim)."""

    dim: int  # hidden_size
    heads: int  # num_attention_heads
    kv_lora_rank: int  # R: the cached latent's width
    qk_nope_head_dim: int  # Hn
    qk_rope_head_dim: int  # Hr: the shared rotated key's width
    v_head_dim: int  # Hv
    q_lora_rank: Optional[int] = None  # queries through a low-rank bottleneck (V3, V2 full)
    bias: bool = False  # attention_bias: q_a_proj / q_proj?, kv_a_proj_with_mqa, o_proj
    rope_layout: str = "deinterleaving"  # ROPE_LAYOUTS (V3's rope_interleave: the default)
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None  # yarn with mscale / mscale_all_dim, or None
    norm_eps: float = 1e-6  # the q_a / kv_a RMSNorms

    def __post_init__(self) -> None:
        for name in ("dim", "heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                     "v_head_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise UsageError(f"{name} must be a positive integer, got {value!r}")
        if self.q_lora_rank is not None and not self.q_lora_rank > 0:
            raise UsageError(f"q_lora_rank must be a positive integer, got {self.q_lora_rank!r}")
        if self.qk_rope_head_dim % 2:
            raise UsageError(f"qk_rope_head_dim must be even, got {self.qk_rope_head_dim}")
        if self.rope_layout not in ROPE_LAYOUTS:
            raise UsageError(f"unknown rope layout {self.rope_layout!r}: choose one of "
                             f"{', '.join(ROPE_LAYOUTS)}")
        object.__setattr__(self, "rope_scaling", rope_types.normalized_scaling(
            self.rope_scaling, self.qk_rope_head_dim))

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def scale(self) -> float:
        """(Hn + Hr)^-0.5, times yarn's mscale(factor, mscale_all_dim)^2 where it is set."""
        s, scaling = self.qk_head_dim ** -0.5, self.rope_scaling or {}
        if scaling.get("rope_type") not in (None, "default") and scaling.get("mscale_all_dim"):
            m = _yarn_mscale(scaling["factor"], scaling["mscale_all_dim"])
            s = s * m * m
        return s

    def cache_widths(self) -> Tuple[int, int]:
        """Numbers cached per token: (latent R, shared rotated key Hr)."""
        return self.kv_lora_rank, self.qk_rope_head_dim


def _yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


class MLAttention(nn.Module):
    """The eager MLA layer; parameter names are the checkpoints' (``load_state_dict`` of a
    transformers attention module's state dict works as it is)."""

    def __init__(self, config: MLAConfig):
        super().__init__()
        c = self.config = config
        q_width = c.heads * c.qk_head_dim
        if c.q_lora_rank is None:
            self.q_proj = nn.Linear(c.dim, q_width, bias=False)
        else:
            self.q_a_proj = nn.Linear(c.dim, c.q_lora_rank, bias=c.bias)
            self.q_a_layernorm = RMSNorm(c.q_lora_rank, c.norm_eps)
            self.q_b_proj = nn.Linear(c.q_lora_rank, q_width, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(c.dim, c.kv_lora_rank + c.qk_rope_head_dim,
                                            bias=c.bias)
        self.kv_a_layernorm = RMSNorm(c.kv_lora_rank, c.norm_eps)
        self.kv_b_proj = nn.Linear(c.kv_lora_rank, c.heads * (c.qk_nope_head_dim + c.v_head_dim),
                                   bias=False)
        self.o_proj = nn.Linear(c.heads * c.v_head_dim, c.dim, bias=c.bias)
        rope = rope_tables(c.qk_rope_head_dim, c.rope_theta, c.rope_scaling)
        self.register_buffer("inv_freq", rope.inv_freq, persistent=False)  # (Hr/2,)
        self.rope_factor = rope.attention_factor

    def forward(self, x: Tensor, attention_mask: Optional[Tensor] = None,
                past_latent: Optional[Tensor] = None, past_rope: Optional[Tensor] = None,
                position_ids: Optional[Tensor] = None, absorbed: bool = False
                ) -> Tuple[Tensor, Tensor, Tensor]:
        """y (B, T, dim), and the cache after this call: latent (B, 1, S, R), k_rot
        (B, 1, S, Hr) (the past's, if given, followed by this call's). attention_mask (B, S):
        1 = token; rotary positions default to P + i. ``absorbed``: the decode form (the cache
        read as stored), else the expanded one (transformers' computation)."""
        past = 0 if past_latent is None else past_latent.size(2)
        if position_ids is None:
            position_ids = torch.arange(past, past + x.size(1), device=x.device).expand(
                x.size(0), x.size(1))  # (B, T)
        q_nope, q_rot = self.queries(x, position_ids)  # (B, N, T, Hn), (B, N, T, Hr)
        latent, k_rot = self.cache_entries(x, position_ids)  # (B, 1, T, R), (B, 1, T, Hr)
        if past_latent is not None and past_rope is not None:
            latent = torch.cat([past_latent, latent], dim=2)  # (B, 1, S, R)
            k_rot = torch.cat([past_rope, k_rot], dim=2)  # (B, 1, S, Hr)
        core = self._absorbed if absorbed else self._expanded
        ctx = core(q_nope, q_rot, latent, k_rot, attention_mask)  # (B, N, T, Hv)
        return self.o_proj(merge_heads(ctx)), latent, k_rot

    def forward_static(self, x: Tensor, past_latent: Tensor, past_rope: Tensor,
                       past_lengths: Tensor, position_ids: Optional[Tensor] = None
                       ) -> Tuple[Tensor, Tensor, Tensor]:
        """The static-cache call over app-owned buffers (B, 1, C, R) and (B, 1, C, Hr): this
        call's latent and rotated key written in place at past_lengths[b] + i of row b, then
        the absorbed form over each row's valid prefix (query i of row b sees cached positions
        <= past_lengths[b] + i). Returns y and the buffers themselves."""
        b, t = x.size(0), x.size(1)
        steps = torch.arange(t, device=x.device)
        if position_ids is None:
            position_ids = past_lengths.view(b, 1) + steps  # (B, T)
        q_nope, q_rot = self.queries(x, position_ids)  # (B, N, T, Hn), (B, N, T, Hr)
        latent, k_rot = self.cache_entries(x, position_ids)  # (B, 1, T, R), (B, 1, T, Hr)
        rows, slots = torch.arange(b, device=x.device).view(b, 1), past_lengths.view(b, 1) + steps
        past_latent[rows, :, slots] = latent.transpose(1, 2)  # (B, T, 1, R)
        past_rope[rows, :, slots] = k_rot.transpose(1, 2)
        end = valid_end(past_lengths, t, past_latent.size(2))  # the longest row's prefix
        ctx = self._absorbed(q_nope, q_rot, past_latent[:, :, :end], past_rope[:, :, :end], None,
                             query_start=past_lengths)  # (B, N, T, Hv)
        return self.o_proj(merge_heads(ctx)), past_latent, past_rope

    def queries(self, x: Tensor, position_ids: Tensor) -> Tuple[Tensor, Tensor]:
        """q_nope (B, N, T, Hn) and the rotated q_rot (B, N, T, Hr)."""
        c = self.config
        q = self.q_proj(x) if c.q_lora_rank is None else self.q_b_proj(
            self.q_a_layernorm(self.q_a_proj(x)))  # (B, T, N*(Hn+Hr))
        b, t, _ = q.shape
        q = q.view(b, t, c.heads, c.qk_head_dim).transpose(1, 2)  # (B, N, T, Hn+Hr)
        q_nope, q_rot = q.split([c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)
        return q_nope, self._rotate(q_rot, position_ids)

    def cache_entries(self, x: Tensor, position_ids: Tensor) -> Tuple[Tensor, Tensor]:
        """What a call caches: the normalised latent (B, 1, T, R) and the rotated shared key
        (B, 1, T, Hr)."""
        c = self.config
        b, t, _ = x.shape
        latent, k_rot = self.kv_a_proj_with_mqa(x).split([c.kv_lora_rank, c.qk_rope_head_dim],
                                                         dim=-1)  # (B, T, R), (B, T, Hr)
        latent = self.kv_a_layernorm(latent).view(b, 1, t, c.kv_lora_rank)  # (B, 1, T, R)
        k_rot = k_rot.view(b, 1, t, c.qk_rope_head_dim)  # (B, 1, T, Hr)
        return latent, self._rotate(k_rot, position_ids)

    def _rotate(self, x: Tensor, position_ids: Tensor) -> Tensor:
        """x (B, heads, T, Hr) rotated at position_ids, in the config's rope layout."""
        cos, sin = cos_sin(position_ids, self.inv_freq, x.dtype,
                           attention_factor=self.rope_factor)  # (B, 1, T, Hr/2)
        layout = self.config.rope_layout
        if layout != "deinterleaving":
            return rotate(x, cos, sin, layout == "interleaved")
        evens, odds = x[..., 0::2], x[..., 1::2]  # (B, heads, T, Hr/2): the pairs
        return torch.cat([evens * cos - odds * sin, odds * cos + evens * sin], dim=-1)

    def kv_b_heads(self) -> Tuple[Tensor, Tensor]:
        """kv_b_proj's weight per head: W_UK (N, Hn, R) and W_UV (N, Hv, R)."""
        c = self.config
        w = self.kv_b_proj.weight.view(c.heads, c.qk_nope_head_dim + c.v_head_dim,
                                       c.kv_lora_rank)  # (N, Hn+Hv, R)
        return w[:, :c.qk_nope_head_dim], w[:, c.qk_nope_head_dim:]

    def _expanded(self, q_nope: Tensor, q_rot: Tensor, latent: Tensor, k_rot: Tensor,
                  attention_mask: Optional[Tensor]) -> Tensor:
        """Every head's keys and values made from the latent (transformers' computation)."""
        c = self.config
        b, _, s, _ = latent.shape
        kv = self.kv_b_proj(latent.squeeze(1)).view(b, s, c.heads, -1).transpose(1, 2)
        k_nope, v = kv.split([c.qk_nope_head_dim, c.v_head_dim], dim=-1)  # (B, N, S, Hn|Hv)
        keys = torch.cat([k_nope, k_rot.expand(-1, c.heads, -1, -1)], dim=-1)  # (B, N, S, Hn+Hr)
        query = torch.cat([q_nope, q_rot], dim=-1)  # (B, N, T, Hn+Hr)
        ctx, _ = attention(query, keys, v, c.scale, True, 0.0, False, attention_mask)
        return ctx  # (B, N, T, Hv)

    def _absorbed(self, q_nope: Tensor, q_rot: Tensor, latent: Tensor, k_rot: Tensor,
                  attention_mask: Optional[Tensor], query_start: Optional[Tensor] = None
                  ) -> Tensor:
        """Multi-query attention in latent space: one key [latent | k_rot], one value latent.
        ``query_start`` (B,): a static cache's rows (queries at query_start[b] + i)."""
        w_uk, w_uv = self.kv_b_heads()  # (N, Hn, R), (N, Hv, R)
        q_latent = q_nope @ w_uk  # (B, N, T, R)
        query = torch.cat([q_latent, q_rot], dim=-1)  # (B, N, T, R+Hr)
        key = torch.cat([latent, k_rot], dim=-1)  # (B, 1, S, R+Hr)
        ctx, _ = attention(query, key, latent, self.config.scale, True, 0.0, False,
                           attention_mask, query_start=query_start)  # (B, N, T, R)
        return ctx @ w_uv.transpose(1, 2)  # (B, N, T, Hv)
