"""The eager KV-shared layer: the standard layer's queries and output (q_proj, q norm, rotary,
o_proj, gate, output norm) over keys and values given as inputs, the source layer's.

Shape legend: B = batch, T = this call's queries, S = keys read, N = heads, K = kv heads,
H = head size, Hv = value head size.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from ...config import MHAConfig
from ...layer.attention import attention, merge_heads
from ...layer.base import AttentionBase, AttentionWeights, copy_linear
from ...layer.rotary import cos_sin, rotate


class SharedKVAttention(AttentionBase):
    """q_proj and o_proj (the split layout's names: W_query, out_proj); no key or value
    projection, no cache."""

    def __init__(self, config: MHAConfig):
        super().__init__(config)
        c = config
        self.k_norm = nn.Identity()  # the keys' norm is the source layer's
        self.W_query = nn.Linear(c.d_in, c.inner, bias=c.qkv_bias)
        self.out_proj = nn.Linear(c.v_inner, c.dim, bias=c.out_bias)

    def to_weights(self) -> AttentionWeights:
        """Layout-neutral weights without key or value projections (wk, wv None)."""
        def bias(m: nn.Linear) -> Optional[Tensor]:
            return None if m.bias is None else m.bias.detach()
        return AttentionWeights(self.W_query.weight.detach(), None, None, bias(self.W_query),
                                wo=self.out_proj.weight.detach(), bo=bias(self.out_proj),
                                **self.extra_weights())

    def load_weights(self, w: AttentionWeights) -> None:
        copy_linear(self.W_query, w.wq, w.bq)
        copy_linear(self.out_proj, w.wo, w.bo)
        self.load_extra_weights(w)

    def forward(self, x: Tensor) -> Tensor:
        raise RuntimeError("a KV-shared layer attends with another layer's keys: call read()")

    def project_out(self, merged: Tensor) -> Tensor:
        return self.out_proj(merged)

    def queries(self, x: Tensor, position_ids: Tensor) -> Tensor:
        """x (B, T, d_in) -> q_proj -> q norm -> rotary at position_ids (B, T): (B, N, T, H)."""
        q = self._split_heads(self.W_query(x), self.n_head)  # (B, N, T, H)
        if self.qk_norm == "head":
            q = self.q_norm(q)
        elif self.qk_norm == "full":
            q = self._split_heads(self.q_norm(merge_heads(q)), self.n_head)  # (B, N, T, H)
        if self.rotary:
            cos, sin = cos_sin(position_ids, self.inv_freq, q.dtype, self.long_inv_freq,
                               self.rope_switch, self.rope_factor,
                               self.rope_long_factor)  # (B, 1, T, rd/2)
            q = rotate(q, cos, sin, self.interleaved)
        return q

    def read(self, x: Tensor, attention_mask: Optional[Tensor], shared_key: Tensor,
             shared_value: Tensor, position_ids: Optional[Tensor] = None) -> Tensor:
        """y (B, T, dim) of queries at the last T of the S keys shared_key (B, K, S, H) /
        shared_value (B, K, S, Hv) (S = T: a call without cache); attention_mask (B, S);
        rotary default S - T + i."""
        t, s = x.size(1), shared_key.size(2)
        if position_ids is None:
            position_ids = torch.arange(s - t, s, device=x.device).view(1, -1).expand(
                x.size(0), t)  # (B, T)
        q = self.queries(x, position_ids)  # (B, N, T, H)
        ctx, _ = attention(q, shared_key.to(q.dtype), shared_value.to(q.dtype), self.scoring(),
                           attention_mask)  # (B, N, T, Hv)
        return self._output(x, ctx)

    def static_queries(self, x: Tensor, past_lengths: Tensor,
                       position_ids: Optional[Tensor] = None) -> Tensor:
        """A static call's queries (rotary default past_lengths[b] + i): ``read_static`` reads
        the source layer's buffers with them (AttentionBase)."""
        if position_ids is None:
            position_ids = past_lengths.view(-1, 1) + torch.arange(x.size(1), device=x.device)
        return self.queries(x, position_ids)
