"""The eager QSA layer (transformers' ``Qwen4ExpTextAttention``): the split layout's gated
attention (q/k norms, rotary, output gate) whose queries attend only the keys the indexer keeps
(indexer.py). Its cache: keys (B, K, S, H) as the standard layer's; values (B, K, S, Hv + Di),
each head's value then the raw index key (one head, repeated in each).

A block's key is rotated at its first key's position. The layer sees positions of this call's
queries only; a row's positions run on by one over its real tokens, so a real query's first
visible key sits at the query's position less its count of visible keys less 1 (a padded
query's blocks rotate wherever: its output is padding's).

Shape legend: B = batch, T = this call's queries, S = keys, N = heads, K = kv heads, H = head
size, Hv = value head size, Di = index head size, NB = blocks.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor

from ...config import MHAConfig
from ...layer.attention import attention_probs, score_mask
from ...layer.base import AttentionWeights, valid_end
from ...layer.layouts import SplitHeadsAttention
from ...layer.rotary import cos_sin, rotate
from .indexer import QSAIndexer, block_keys, block_layout


@dataclass
class QSAWeights(AttentionWeights):
    """The split layout's weights and the indexer's (the graph layer reads them, graph.py)."""

    index_qk: Optional[Tensor] = None  # ((Hi + 1) * Di, d_in): [Hi query heads | one key]
    index_q_norm: Optional[Tensor] = None  # (Di,) q_layernorm's w (read as offset + w)
    index_k_norm: Optional[Tensor] = None  # (Di,) k_layernorm's w


class QSAttention(SplitHeadsAttention):
    def __init__(self, config: MHAConfig):
        super().__init__(config)
        c = config
        self.indexer = QSAIndexer(c.qsa, c.d_in, c.qk_norm_eps, c.norm_offset or 0.0)

    def to_weights(self) -> QSAWeights:
        base = super().to_weights()
        return QSAWeights(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)},
                          index_qk=self.indexer.index_qk_proj.weight.detach(),
                          index_q_norm=self.indexer.q_layernorm.weight.detach(),
                          index_k_norm=self.indexer.k_layernorm.weight.detach())

    def _cos_sin(self, position_ids: Tensor, dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
        return cos_sin(position_ids, self.inv_freq, dtype, self.long_inv_freq,
                       self.rope_switch, self.rope_factor, self.rope_long_factor)

    def _rotate(self, x: Tensor, position_ids: Tensor) -> Tensor:
        if not self.rotary:
            return x
        cos, sin = self._cos_sin(position_ids, x.dtype)  # (B, 1, T, rd/2)
        return rotate(x, cos, sin, self.interleaved)

    def _dropped(self, x: Tensor, position_ids: Tensor, index_keys: Tensor,
                 masked: Tensor) -> Tensor:
        """(B, 1, T, S) bool: the keys the indexer drops for each query; index_keys
        (B, 1, S, Di) raw, masked (B|1, 1, T, S) the causal and padding mask."""
        c = self.indexer.ratio
        block, complete, count = block_layout(~masked.squeeze(1), c)  # (B',S) (B',T) (B',T)
        pooled = self.indexer.k_layernorm(block_keys(index_keys, block, c))  # (B, NB, Di)
        b, t, blocks = x.size(0), x.size(1), pooled.size(1)
        first = position_ids - (count - 1)  # (B, T): the row's first real position
        starts = torch.arange(blocks, device=x.device) * c  # (NB,)
        at = first.unsqueeze(-1) + starts  # (B, T, NB)
        pooled = pooled.unsqueeze(1).expand(b, t, blocks, pooled.size(-1))  # (B, T, NB, Di)
        if self.rotary:
            cos, sin = self._cos_sin(at, pooled.dtype)  # (B, 1, T, NB, rd/2)
            pooled = rotate(pooled, cos.squeeze(1), sin.squeeze(1),
                            self.interleaved)  # (B, T, NB, Di)
        q, _ = self.indexer.project(x)  # (B, Hi, T, Di)
        return self.indexer.dropped(self._rotate(q, position_ids), pooled, block, complete)

    def _sparse(self, x: Tensor, q: Tensor, keys: Tensor, values: Tensor,
                masked: Tensor, position_ids: Tensor) -> Tuple[Tensor, Tensor]:
        """(y (B, T, dim), probs (B, N, T, S)) of queries q over keys (B, K, S, H) and values
        (B, K, S, Hv + Di), each query's unkept keys hidden too."""
        hv = self.value_dim
        hidden = masked | self._dropped(x, position_ids, values[:, :1, :, hv:], masked)
        probs = attention_probs(q, keys.to(q.dtype), self.scale, hidden)  # (B, N, T, S)
        v = values[..., :hv].to(q.dtype)
        v = v.repeat_interleave(q.size(1) // v.size(1), dim=1)  # (B, N, S, Hv)
        return self._output(x, probs @ v), probs

    def _entries(self, x: Tensor, v: Tensor) -> Tensor:
        """The value cache's entries of this call (B, K, T, Hv + Di): [value | index key]."""
        _, k = self.indexer.project(x)  # (B, 1, T, Di)
        return torch.cat([v, k.expand(v.size(0), v.size(1), v.size(2), k.size(-1))], dim=-1)

    def _attend(self, x: Tensor, attention_mask: Optional[Tensor], past_key: Optional[Tensor],
                past_value: Optional[Tensor], need_weights: bool,
                position_ids: Optional[Tensor] = None
                ) -> Tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
        q, k, v, position_ids = self._call_qkv(x, past_key, position_ids)
        v = self._entries(x, v)  # (B, K, T, Hv + Di)
        if past_key is not None and past_value is not None:
            k = torch.cat([past_key, k], dim=2)  # (B, K, P+T, H)
            v = torch.cat([past_value, v], dim=2)
        masked = score_mask(x.size(1), k.size(2), True, attention_mask, x.device)
        assert masked is not None  # causal: never None
        y, probs = self._sparse(x, q, k, v, masked, position_ids)
        return y, k, v, probs

    def forward_static(self, x: Tensor, past_key: Tensor, past_value: Tensor,
                       past_lengths: Tensor, position_ids: Optional[Tensor] = None
                       ) -> Tuple[Tensor, Tensor, Tensor]:
        b, t = x.size(0), x.size(1)
        slots = past_lengths.view(b, 1) + torch.arange(t, device=x.device)  # (B, T)
        if position_ids is None:
            position_ids = slots
        q, k, v = self._queries_keys_values(x, position_ids, slots)
        rows = torch.arange(b, device=x.device).view(b, 1)  # (B, 1)
        past_key[rows, :, slots] = k.transpose(1, 2).to(past_key.dtype)  # (B, T, K, H)
        past_value[rows, :, slots] = self._entries(x, v).transpose(1, 2).to(past_value.dtype)
        y = self._static_at(x, q, past_key, past_value, past_lengths, position_ids)
        return y, past_key, past_value

    def read_static(self, x: Tensor, past_key: Tensor, past_value: Tensor,
                    past_lengths: Tensor, position_ids: Optional[Tensor] = None) -> Tensor:
        if position_ids is None:  # (B, T): the cache slots
            position_ids = past_lengths.view(-1, 1) + torch.arange(x.size(1), device=x.device)
        q = self.static_queries(x, past_lengths, position_ids)
        return self._static_at(x, q, past_key, past_value, past_lengths, position_ids)

    def _attend_static(self, x: Tensor, q: Tensor, past_key: Tensor, past_value: Tensor,
                       past_lengths: Tensor) -> Tensor:
        """The base's entry (read_static_with): positions default to the cache slots."""
        slots = past_lengths.view(-1, 1) + torch.arange(x.size(1), device=x.device)  # (B, T)
        return self._static_at(x, q, past_key, past_value, past_lengths, slots)

    def _static_at(self, x: Tensor, q: Tensor, past_key: Tensor, past_value: Tensor,
                   past_lengths: Tensor, position_ids: Tensor) -> Tensor:
        """Queries q (B, N, T, H) over the buffers' valid prefix, row b's from
        past_lengths[b]."""
        end = valid_end(past_lengths, q.size(2), past_key.size(2), self.whole_buffer)
        b = q.size(0)
        masked = score_mask(q.size(2), end, True, None, x.device, 0, past_lengths)
        assert masked is not None
        y, _ = self._sparse(x, q, past_key[:b, :, :end], past_value[:b, :, :end], masked,
                            position_ids)
        return y
