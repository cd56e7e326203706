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
rope parameters set mscale_all_dim (transformers' ``yarn_apply_mscale``); the rotary layouts
(``settings.ROPE_LAYOUTS``) decide what the cache holds.

The module answers the calls every layout's does (forward, attend, forward_step,
forward_static: layer/entry.py's entry points script it for TorchScript): full sequences in the
expanded form (transformers' computation, fewer FLOPs for long calls), cached steps in the
absorbed one. Its settings: MHAConfig's latent section (``MLAConfig.of``, settings.py).

Shape legend: B = batch, T = this call, S = cached + this call, N = heads, R = kv_lora_rank,
Hn = qk_nope_head_dim, Hr = qk_rope_head_dim, Hv = v_head_dim.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
from torch import Tensor, nn

from ...config import MHAConfig
from ...layer.attention import Scoring, attention, lowest_value, merge_heads, score_mask
from ...layer.base import valid_end
from ...layer.norm import RMSNorm
from ...layer.rotary import cos_sin, rope_tables, rotate
from ..dsa.indexer import Indexer, NoIndexer, unselected_by
from .settings import UNROTATED, MLAConfig


class MLAttention(nn.Module):
    """The eager MLA layer; parameter names are the checkpoints' (``load_state_dict`` of a
    transformers attention module's state dict works as it is). Absent modules (q_proj with q
    LoRA, q_a_proj/q_a_layernorm/q_b_proj without) are parameter-free Identity stand-ins, so
    that torch.jit.script compiles both branches."""

    def __init__(self, config: MHAConfig):
        super().__init__()
        self.config = config
        self.whole_buffer = False  # static calls attend over the whole buffer (valid_end)
        c = self.mla = MLAConfig.of(config)
        q_width = c.heads * c.qk_head_dim
        self.q_lora = c.q_lora_rank is not None
        identity = nn.Identity
        self.q_proj = identity() if self.q_lora else nn.Linear(c.dim, q_width, bias=False)
        rank = c.q_lora_rank or 1
        self.q_a_proj = nn.Linear(c.dim, rank, bias=c.bias) if self.q_lora else identity()
        self.q_a_layernorm = RMSNorm(rank, c.norm_eps) if self.q_lora else identity()
        self.q_b_proj = nn.Linear(rank, q_width, bias=False) if self.q_lora else identity()
        self.kv_a_proj_with_mqa = nn.Linear(c.dim, c.kv_lora_rank + c.qk_rope_head_dim,
                                            bias=c.bias)
        self.kv_a_layernorm = RMSNorm(c.kv_lora_rank, c.norm_eps)
        self.kv_b_proj = nn.Linear(c.kv_lora_rank, c.heads * (c.qk_nope_head_dim + c.v_head_dim),
                                   bias=False)
        self.o_proj = nn.Linear(c.heads * c.v_head_dim, c.dim, bias=c.out_bias)
        rope = rope_tables(c.qk_rope_head_dim, c.rope_theta, c.rope_scaling)
        self.register_buffer("inv_freq", rope.inv_freq, persistent=False)  # (Hr/2,)
        self.rope_factor = rope.attention_factor
        # plain attributes: what TorchScript reads (it cannot read the config dataclasses)
        self.heads, self.rank, self.scale = c.heads, c.kv_lora_rank, c.scale
        self.nope, self.rope, self.v_dim = c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
        self.rope_layout = c.rope_layout
        self.rotates = c.rope_layout != UNROTATED
        # DeepSeek Sparse Attention: the indexer's keys sit after k_rot in the value cache; a
        # GLM-5 shared layer has none (its selection is an input: topk_indices)
        self.shares_topk = c.index is not None and c.index.shared
        self.sparse = c.index is not None and not self.shares_topk
        self.indexer: nn.Module = Indexer(c.index, c.dim, rank) if self.sparse else NoIndexer()

    def forward(self, x: Tensor) -> Tensor:
        return self.attend(x, None, None, None)[0]

    def forward_step(self, x: Tensor, attention_mask: Tensor, past_key: Tensor,
                     past_value: Tensor, position_ids: Optional[Tensor] = None,
                     topk_indices: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
        """The growing cache's call (absorbed): past_key = latents (B, 1, P, R), past_value =
        rotated keys (B, 1, P, Hr); attention_mask (B, P+T)."""
        return self.attend(x, attention_mask, past_key, past_value, position_ids, True,
                           topk_indices)

    def attend(self, x: Tensor, attention_mask: Optional[Tensor], past_key: Optional[Tensor],
               past_value: Optional[Tensor], position_ids: Optional[Tensor] = None,
               absorbed: bool = False, topk_indices: Optional[Tensor] = None
               ) -> Tuple[Tensor, Tensor, Tensor]:
        """y (B, T, dim), and the cache after this call: latent (B, 1, S, R), k_rot
        (B, 1, S, Hr) (the past's, if given, followed by this call's). attention_mask (B, S):
        1 = token; rotary positions default to P + i. ``absorbed``: the decode form (the cache
        read as stored), else the expanded one (transformers' computation). ``topk_indices``
        (B, T, K): a shared-top-k layer's selection (its source layer's)."""
        y, latent, k_rot, _ = self.attend_selecting(x, attention_mask, past_key, past_value,
                                                    position_ids, absorbed, topk_indices)
        return y, latent, k_rot

    def attend_selecting(self, x: Tensor, attention_mask: Optional[Tensor],
                         past_key: Optional[Tensor], past_value: Optional[Tensor],
                         position_ids: Optional[Tensor] = None, absorbed: bool = False,
                         topk_indices: Optional[Tensor] = None
                         ) -> Tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
        """``attend``'s outputs and DSA's selection (B, T, K): the key positions each query
        kept, best first (None: dense MLA)."""
        past = 0 if past_key is None else past_key.size(2)
        if position_ids is None:
            position_ids = torch.arange(past, past + x.size(1), device=x.device).expand(
                x.size(0), x.size(1))  # (B, T)
        q_nope, q_rot = self.queries(x, position_ids)  # (B, N, T, Hn), (B, N, T, Hr)
        latent, k_rot = self.cache_entries(x, position_ids)  # (B, 1, T, R), (B, 1, T, Hr[+Di])
        if past_key is not None and past_value is not None:
            latent = torch.cat([past_key, latent], dim=2)  # (B, 1, S, R)
            k_rot = torch.cat([past_value, k_rot], dim=2)  # (B, 1, S, Hr[+Di])
        masked = score_mask(x.size(1), latent.size(2), True, attention_mask, x.device)
        dropped, kept = self._dropped(x, position_ids, k_rot, masked,
                                      topk_indices)  # (B, 1, T, S), (B, T, K) | None
        rope = k_rot[..., :self.rope]  # (B, 1, S, Hr)
        if absorbed:
            ctx = self._absorbed(q_nope, q_rot, latent, rope, masked, dropped)  # (B, N, T, Hv)
        else:
            ctx = self._expanded(q_nope, q_rot, latent, rope, attention_mask, masked, dropped)
        return self.o_proj(merge_heads(ctx)), latent, k_rot, kept

    def forward_static(self, x: Tensor, past_key: Tensor, past_value: Tensor,
                       past_lengths: Tensor, position_ids: Optional[Tensor] = None,
                       topk_indices: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
        """The static-cache call over app-owned buffers: latents (B, 1, C, R) and rotated keys
        (B, 1, C, Hr); this call's entries written in place at past_lengths[b] + i of row b,
        then the absorbed form over each row's valid prefix (query i of row b sees cached
        positions <= past_lengths[b] + i). Returns y and the buffers themselves."""
        y, key, value, _ = self.static_selecting(x, past_key, past_value, past_lengths,
                                                 position_ids, topk_indices)
        return y, key, value

    def static_selecting(self, x: Tensor, past_key: Tensor, past_value: Tensor,
                         past_lengths: Tensor, position_ids: Optional[Tensor] = None,
                         topk_indices: Optional[Tensor] = None
                         ) -> Tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
        """``forward_static``'s outputs and DSA's selection (B, T, K): buffer slots, best
        first (None: dense MLA)."""
        b, t = x.size(0), x.size(1)
        steps = torch.arange(t, device=x.device)
        if position_ids is None:
            position_ids = past_lengths.view(b, 1) + steps  # (B, T)
        q_nope, q_rot = self.queries(x, position_ids)  # (B, N, T, Hn), (B, N, T, Hr)
        latent, k_rot = self.cache_entries(x, position_ids)  # (B, 1, T, R), (B, 1, T, Hr[+Di])
        rows, slots = torch.arange(b, device=x.device).view(b, 1), past_lengths.view(b, 1) + steps
        past_key[rows, :, slots] = latent.transpose(1, 2)  # (B, T, 1, R)
        past_value[rows, :, slots] = k_rot.transpose(1, 2)
        end = valid_end(past_lengths, t, past_key.size(2), self.whole_buffer)  # the longest
        # row's prefix
        values = past_value[:b, :, :end]  # (B, 1, S, Hr[+Di]): rows [0, B) of the buffer
        masked = score_mask(t, end, True, None, x.device, 0, past_lengths)  # (B, 1, T, S)
        dropped, kept = self._dropped(x, position_ids, values, masked, topk_indices)
        ctx = self._absorbed(q_nope, q_rot, past_key[:b, :, :end], values[..., :self.rope],
                             masked, dropped)  # (B, N, T, Hv)
        return self.o_proj(merge_heads(ctx)), past_key, past_value, kept

    def queries(self, x: Tensor, position_ids: Tensor) -> Tuple[Tensor, Tensor]:
        """q_nope (B, N, T, Hn) and the rotated q_rot (B, N, T, Hr)."""
        if self.q_lora:
            q = self.q_b_proj(self.q_resid(x))  # (B, T, N*(Hn+Hr))
        else:
            q = self.q_proj(x)
        b, t = x.size(0), x.size(1)
        q = q.view(b, t, self.heads, self.nope + self.rope).transpose(1, 2)  # (B, N, T, Hn+Hr)
        return q[..., :self.nope], self._rotate(q[..., self.nope:], position_ids)

    def q_resid(self, x: Tensor) -> Tensor:
        """q LoRA's bottleneck, normalised (B, T, q_lora_rank): q_b_proj's and the index
        queries' input."""
        return self.q_a_layernorm(self.q_a_proj(x))

    def cache_entries(self, x: Tensor, position_ids: Tensor) -> Tuple[Tensor, Tensor]:
        """What a call caches: the normalised latent (B, 1, T, R) and the rotated shared key
        (B, 1, T, Hr), DSA's rotated index key after it (B, 1, T, Hr + Di)."""
        b, t = x.size(0), x.size(1)
        kv = self.kv_a_proj_with_mqa(x)  # (B, T, R+Hr)
        latent = self.kv_a_layernorm(kv[..., :self.rank]).view(b, 1, t, self.rank)  # (B,1,T,R)
        k_rot = self._rotate(kv[..., self.rank:].reshape(b, 1, t, self.rope),
                             position_ids)  # (B, 1, T, Hr)
        if self.sparse:
            cos, sin = self._cos_sin(position_ids, x.dtype)
            k_rot = torch.cat([k_rot, self.indexer.keys(x, cos, sin)], dim=-1)
        return latent, k_rot

    def _cos_sin(self, position_ids: Tensor, dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
        return cos_sin(position_ids, self.inv_freq, dtype,
                       attention_factor=self.rope_factor)  # (B, 1, T, Hr/2)

    def _dropped(self, x: Tensor, position_ids: Tensor, values: Tensor,
                 masked: Optional[Tensor], topk_indices: Optional[Tensor] = None
                 ) -> Tuple[Optional[Tensor], Optional[Tensor]]:
        """DSA: (B, 1, T, S) True at the keys outside each query's top-k (values: the value
        cache read, (B, 1, S, Hr + Di)), and the kept positions (B, T, K) (a shared layer's
        given: topk_indices); (None, None) for dense MLA."""
        if self.shares_topk:
            if topk_indices is None:
                raise RuntimeError("a shared-top-k layer takes its source layer's topk_indices")
            return unselected_by(topk_indices, values.size(2)), topk_indices
        if not self.sparse:
            return None, None
        cos, sin = self._cos_sin(position_ids, x.dtype)
        return self.indexer.selected(x, self.q_resid(x), cos, sin, values[..., self.rope:],
                                     masked)

    def _rotate(self, x: Tensor, position_ids: Tensor) -> Tensor:
        """x (B, heads, T, Hr) rotated at position_ids, in the config's rope layout."""
        if not self.rotates:  # Kimi Linear: NoPE
            return x
        cos, sin = self._cos_sin(position_ids, x.dtype)  # (B, 1, T, Hr/2)
        if self.rope_layout != "deinterleaving":
            return rotate(x, cos, sin, self.rope_layout == "interleaved")
        evens, odds = x[..., 0::2], x[..., 1::2]  # (B, heads, T, Hr/2): the pairs
        return torch.cat([evens * cos - odds * sin, odds * cos + evens * sin], dim=-1)

    def to_weights(self) -> Dict[str, Tensor]:
        """The weights the ONNX graph reads (graph.py): the state dict, checkpoint names."""
        return {k: v.detach() for k, v in self.state_dict().items()}

    def load_weights(self, w: Dict[str, Tensor]) -> None:
        """The weights ``to_weights`` gives (its one layout: a copy)."""
        self.load_state_dict(w)

    def kv_b_heads(self) -> Tuple[Tensor, Tensor]:
        """kv_b_proj's weight per head: W_UK (N, Hn, R) and W_UV (N, Hv, R)."""
        w = self.kv_b_proj.weight.view(self.heads, self.nope + self.v_dim, self.rank)
        return w[:, :self.nope], w[:, self.nope:]  # (N, Hn, R), (N, Hv, R)

    def _expanded(self, q_nope: Tensor, q_rot: Tensor, latent: Tensor, k_rot: Tensor,
                  attention_mask: Optional[Tensor], masked: Optional[Tensor],
                  dropped: Optional[Tensor]) -> Tensor:
        """Every head's keys and values made from the latent (transformers' computation); DSA:
        the keys outside each query's top-k masked too (``dropped``)."""
        b, s = latent.size(0), latent.size(2)
        kv = self.kv_b_proj(latent.squeeze(1)).view(b, s, self.heads, -1).transpose(1, 2)
        k_nope, v = kv[..., :self.nope], kv[..., self.nope:]  # (B, N, S, Hn), (B, N, S, Hv)
        keys = torch.cat([k_nope, k_rot.expand(-1, self.heads, -1, -1)], dim=-1)  # (B,N,S,Hn+Hr)
        query = torch.cat([q_nope, q_rot], dim=-1)  # (B, N, T, Hn+Hr)
        if dropped is None:
            ctx, _ = attention(query, keys, v, Scoring(self.scale), attention_mask)
            return ctx  # (B, N, T, Hv)
        hidden = dropped if masked is None else masked | dropped  # (B, 1, T, S)
        scores = (query @ keys.transpose(-2, -1)) * self.scale  # (B, N, T, S)
        scores = scores.masked_fill(hidden, lowest_value(scores.dtype))
        return torch.softmax(scores, dim=-1) @ v  # (B, N, T, Hv)

    def _absorbed(self, q_nope: Tensor, q_rot: Tensor, latent: Tensor, k_rot: Tensor,
                  masked: Optional[Tensor], dropped: Optional[Tensor]) -> Tensor:
        """Multi-query attention in latent space: scores = q_latent . latent + q_rot . k_rot,
        context = p @ latent (the one cache head broadcast over the heads, never copied nor
        concatenated into one key). ``masked`` (B|1, 1, T, S): the causal (a static cache's
        rows: from each row's start) and padding mask; ``dropped``: DSA's unselected keys."""
        w_uk, w_uv = self.kv_b_heads()  # (N, Hn, R), (N, Hv, R)
        q_latent = q_nope @ w_uk  # (B, N, T, R)
        scores = (q_latent @ latent.transpose(-2, -1)
                  + q_rot @ k_rot.transpose(-2, -1)) * self.scale  # (B, N, T, S)
        if dropped is not None:
            masked = dropped if masked is None else masked | dropped  # (B, 1, T, S)
        if masked is not None:
            scores = scores.masked_fill(masked, lowest_value(scores.dtype))
        ctx = torch.softmax(scores, dim=-1) @ latent  # (B, N, T, R)
        return ctx @ w_uv.transpose(1, 2)  # (B, N, T, Hv)
