"""Causal multi-head attention in four weight layouts that compute one function: each projects x
to per-head q, k, v (B, heads, T, H), rotates them (rotary layers), runs the one eager attention
core (attention.py) and merges the heads back. Layouts differ only in how their weights are stored
(textbook single / stacked / split, GPT-2 fused); ``AttentionWeights`` is the layout-neutral form
used for conversions (kinds/registry.py's ``convert``) and by the ONNX graph builder. They are the
standard attention kind's layouts (kinds/standard.py)."""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor, nn

from ..config import MHAConfig
from ..errors import UsageError
from .base import AttentionBase, AttentionWeights, copy_linear


def _bias(linear: nn.Linear) -> Optional[Tensor]:
    return None if linear.bias is None else linear.bias.detach()


def _require_no_out_proj(w: AttentionWeights, layout: str) -> None:
    if w.wo is None:
        return
    eye = torch.eye(w.wo.shape[0], w.wo.shape[1], dtype=w.wo.dtype)
    if not torch.equal(w.wo, eye) or (w.bo is not None and bool(w.bo.any())):
        raise UsageError(f"layout {layout!r} has no output projection: these weights' "
                         "out projection is not the identity, so they cannot be converted")


class SingleHeadAttention(AttentionBase):
    """The textbook `CausalAttention`: one head, no output projection."""

    def __init__(self, config: MHAConfig):
        super().__init__(config)
        c = config
        self.W_query = nn.Linear(c.d_in, c.head_dim, bias=c.qkv_bias)
        self.W_key = nn.Linear(c.d_in, c.head_dim, bias=c.qkv_bias)
        self.W_value = nn.Linear(c.d_in, c.head_dim, bias=c.qkv_bias)

    def project_qkv(self, x: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        # (B, T, hs) -> (B, 1, T, hs)
        return (self.W_query(x).unsqueeze(1), self.W_key(x).unsqueeze(1),
                self.W_value(x).unsqueeze(1))

    def to_weights(self) -> AttentionWeights:
        return AttentionWeights(self.W_query.weight.detach(), self.W_key.weight.detach(),
                                self.W_value.weight.detach(), _bias(self.W_query),
                                _bias(self.W_key), _bias(self.W_value))

    def load_weights(self, w: AttentionWeights) -> None:
        _require_no_out_proj(w, "single")
        copy_linear(self.W_query, w.wq, w.bq)
        copy_linear(self.W_key, w.wk, w.bk)
        copy_linear(self.W_value, w.wv, w.bv)


class StackedHeadsAttention(AttentionBase):
    """The textbook `MultiHeadAttentionWrapper`: a list of single heads, outputs concatenated."""

    def __init__(self, config: MHAConfig):
        super().__init__(config)
        one = config.replace(layout="single", heads=1, kv_heads=1, dim=config.head_dim,
                             head_dim=config.head_dim)
        # A ModuleList (elsewhere `heads` is a count): the name is the textbook checkpoint's own,
        # heads.{i}.W_query.weight, which this layout loads unchanged.
        self.heads = nn.ModuleList([SingleHeadAttention(one) for _ in range(config.heads)])

    def project_qkv(self, x: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        qs: List[Tensor] = []
        ks: List[Tensor] = []
        vs: List[Tensor] = []
        for head in self.heads:
            qs.append(head.W_query(x))
            ks.append(head.W_key(x))
            vs.append(head.W_value(x))
        # nh x (B, T, hs) -> (B, nh, T, hs)
        return torch.stack(qs, 1), torch.stack(ks, 1), torch.stack(vs, 1)

    def to_weights(self) -> AttentionWeights:
        parts = [h.to_weights() for h in self.heads]

        def cat(name: str) -> Optional[Tensor]:
            ts = [getattr(p, name) for p in parts]
            return None if ts[0] is None else torch.cat(ts, 0)

        return AttentionWeights(cat("wq"), cat("wk"), cat("wv"), cat("bq"), cat("bk"), cat("bv"))

    def load_weights(self, w: AttentionWeights) -> None:
        _require_no_out_proj(w, "stacked")
        hs = self.head_dim
        for i, head in enumerate(self.heads):
            rows = slice(i * hs, (i + 1) * hs)

            def part(t: Optional[Tensor]) -> Optional[Tensor]:
                return None if t is None else t[rows]

            head.load_weights(AttentionWeights(w.wq[rows], w.wk[rows], w.wv[rows],
                                               part(w.bq), part(w.bk), part(w.bv)))


class SplitHeadsAttention(AttentionBase):
    """The textbook `MultiHeadAttention`: q/k/v projections viewed as heads, then out_proj."""

    def __init__(self, config: MHAConfig):
        super().__init__(config)
        c = config
        self.W_query = nn.Linear(c.d_in, c.inner, bias=c.qkv_bias)
        self.W_key = nn.Linear(c.d_in, c.kv_inner, bias=c.qkv_bias)
        self.W_value = nn.Linear(c.d_in, c.kv_v_inner, bias=c.qkv_bias)
        self.out_proj = nn.Linear(c.v_inner, c.dim, bias=c.out_bias)

    def project_qkv(self, x: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        return (self._split_heads(self.W_query(x), self.n_head),
                self._split_heads(self.W_key(x), self.kv_heads),
                self._split_heads(self.W_value(x), self.kv_heads, self.value_dim))

    def project_out(self, merged: Tensor) -> Tensor:
        return self.out_proj(merged)

    def to_weights(self) -> AttentionWeights:
        return AttentionWeights(self.W_query.weight.detach(), self.W_key.weight.detach(),
                                self.W_value.weight.detach(), _bias(self.W_query),
                                _bias(self.W_key), _bias(self.W_value),
                                self.out_proj.weight.detach(), _bias(self.out_proj),
                                **self.extra_weights())

    def load_weights(self, w: AttentionWeights) -> None:
        copy_linear(self.W_query, w.wq, w.bq)
        copy_linear(self.W_key, w.wk, w.bk)
        copy_linear(self.W_value, w.wv, w.bv)
        _copy_out(self.out_proj, w)
        self.load_extra_weights(w)


class FusedQKVAttention(AttentionBase):
    """GPT-2 style: one c_attn projection to [q | k | v], then c_proj (nn.Linear orientation)."""

    def __init__(self, config: MHAConfig):
        super().__init__(config)
        c = config
        self.c_attn = nn.Linear(c.d_in, c.inner + c.kv_inner + c.kv_v_inner, bias=c.qkv_bias)
        self.qkv_sizes = [c.inner, c.kv_inner, c.kv_v_inner]
        self.c_proj = nn.Linear(c.v_inner, c.dim, bias=c.out_bias)

    def project_qkv(self, x: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        q, k, v = self.c_attn(x).split(self.qkv_sizes, dim=2)  # (B, T, N*H), (B, T, K*H),
        # (B, T, K*Hv)
        return (self._split_heads(q, self.n_head), self._split_heads(k, self.kv_heads),
                self._split_heads(v, self.kv_heads, self.value_dim))

    def project_out(self, merged: Tensor) -> Tensor:
        return self.c_proj(merged)

    def to_weights(self) -> AttentionWeights:
        wq, wk, wv = self.c_attn.weight.detach().split(self.qkv_sizes, 0)
        b = _bias(self.c_attn)
        bq, bk, bv = (None, None, None) if b is None else b.split(self.qkv_sizes, 0)
        return AttentionWeights(wq, wk, wv, bq, bk, bv, self.c_proj.weight.detach(),
                                _bias(self.c_proj), **self.extra_weights())

    def load_weights(self, w: AttentionWeights) -> None:
        b = None if w.bq is None else torch.cat([w.bq, w.bk, w.bv])
        copy_linear(self.c_attn, torch.cat([w.wq, w.wk, w.wv]), b)
        _copy_out(self.c_proj, w)
        self.load_extra_weights(w)


def _copy_out(dst: nn.Linear, w: AttentionWeights) -> None:
    if w.wo is None:  # from a layout without output projection: identity
        copy_linear(dst, torch.eye(dst.out_features, dst.in_features), None)
    else:
        copy_linear(dst, w.wo, w.bo)


LAYOUT_CLASSES = {
    "single": SingleHeadAttention,
    "stacked": StackedHeadsAttention,
    "split": SplitHeadsAttention,
    "fused": FusedQKVAttention,
}
