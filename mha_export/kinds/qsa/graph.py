"""A QSA layer as an ONNX graph (layer.py's function) and its one form: the standard layer's
projections (q/k norms, rotary), the indexer's mask (index_graph.py) joined to the causal and
padding mask, the decomposed core (MatMul, Where, Softmax: standard ops, opset 17), the
output gate and projection.

    x -> q_proj, k_proj, v_proj -> q/k norm -> rotary -> q, k, v        (B, T, N*H), (B, T, K*H)
    x -> indexer.index_qk_proj -> [index queries (Hi*Di) | raw index key (Di)]
    this call's value entries: [v | index key] per kv head (B, K, T, Hv + Di)
      full / masked   this call's keys and entries; causal (+ padding) mask
      kv-cache        past_key / past_value + this call's = present_* (S = P + T)
      static-cache    written into the app's buffers at past_lengths (ScatterND), each row's
                      valid prefix read; row b's query i sees keys <= past_lengths[b] + i
    mask = causal/padding OR the indexer's dropped keys -> core -> gate -> o_proj -> y

Shape legend: B = batch, B' = B or 1, T = this call, S = keys read, C = buffer capacity,
N = heads, K = kv heads, H = head size, Hv = value head size, Hi = index heads, Di = their
width.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ...config import MHAConfig
from ...graph.builder import (GraphBuilder, dim, merge_heads, repeat_kv, row_masked_positions,
                              scale_queries, score_mask, split_heads)
from ...graph.forms import decomposed
from ...graph.forms.base import (QUADRATIC, Feature, GraphForm, probabilities, valid_prefixes,
                                 write_index)
from ...graph.model import layer_output, queries_keys_values
from ...graph.ops import Ops
from ...graph.rotary import rotary_cos_sin
from ...signature import Signature
from .index_graph import indexer_hides
from .layer import QSAWeights


@dataclass(frozen=True)
class SparseIO:
    """What the core reads: this call's queries and every key, entry and hidden score."""

    q: str  # (B, T, N*H), normed and rotated, not yet scaled
    keys: str  # (B, K, S, H)
    values: str  # (B, K, S, Hv + Di): [value | index key]
    hidden: str  # (B, 1, T, S) bool: masked, or dropped by the indexer


def build_qsa(g: GraphBuilder, c: MHAConfig, w: QSAWeights, form: GraphForm, sig: Signature,
              opset: int = 17, kv_cache: Any = None) -> dict[str, str]:
    """The layer's nodes; returns the graph values of y (and present_key / present_value)."""
    q, k, v = queries_keys_values(g, c, w, opset, sig)  # (B, T, N*H), (B, T, K*H), (B,T,K*Hv)
    index_q, index_k = _index_projection(g, c, w)  # (B, T, Hi*Di), (B, T, Di)
    k = split_heads(g, k, c.kv_heads, c.head_dim, "k")  # (B, K, T, H)
    keys, values, masked, present = _read(g, c, sig, k, _entries(g, c, v, index_k))
    cos, sin = rotary_cos_sin(g, "position_ids", c) if c.rotary != "none" else (None, None)
    dropped = indexer_hides(g, c, w, index_q, _index_keys_read(g, c, values), masked, cos,
                            sin)  # (B, 1, T, S)
    hidden = Ops(g).Or(masked, dropped, name="hidden")  # (B, 1, T, S)
    context = form.core(g, SparseIO(q, keys, values, hidden), c)  # (B, T, N*Hv)
    return {"y": layer_output(g, c, w, context), **present}


def _index_projection(g: GraphBuilder, c: MHAConfig, w: QSAWeights) -> list[str]:
    """x -> indexer.index_qk_proj -> [index queries (B, T, Hi*Di) | raw index key (B, T, Di)]."""
    index = c.qsa
    qk = g.linear("x", "indexer.index_qk_proj", w.index_qk, None)  # (B, T, (Hi + 1)*Di)
    sizes = g.ints("index_split", [index.heads * index.head_dim, index.head_dim])
    return Ops(g).named("index").Split(qk, sizes, axis=2, n_out=2)


def _index_keys_read(g: GraphBuilder, c: MHAConfig, values: str) -> str:
    """values (B, K, S, Hv + Di) -> the raw index keys (B, S, Di), kv head 0's."""
    op = Ops(g).named("index")
    read = op.Slice(values, g.ints("index_key_from", [0, c.value_dim]),
                    g.ints("index_key_to", [1, c.value_dim + c.qsa.head_dim]),
                    g.ints("index_key_axes", [1, 3]))  # (B, 1, S, Di)
    return op.Squeeze(read, g.ints("axes1", [1]), name="keys_read")  # (B, S, Di)


def _entries(g: GraphBuilder, c: MHAConfig, v: str, index_k: str) -> str:
    """This call's value cache entries (B, K, T, Hv + Di): each head's value, then the raw
    index key (one head, repeated in each)."""
    op = Ops(g).named("entries")
    v = split_heads(g, v, c.kv_heads, c.value_dim, "v")  # (B, K, T, Hv)
    k = op.Unsqueeze(index_k, g.ints("axes1", [1]))  # (B, 1, T, Di)
    wide = op.Concat(op.Shape(v, start=0, end=3), g.ints("entries_di", [c.qsa.head_dim]),
                     axis=0)  # [B, K, T, Di]
    return op.Concat(v, op.Expand(k, wide), axis=3, name="all")  # (B, K, T, Hv + Di)


def _read(g: GraphBuilder, c: MHAConfig, sig: Signature, k: str, entries: str
          ) -> tuple[str, str, str, dict[str, str]]:
    """(keys (B, K, S, H), values (B, K, S, Hv + Di), the causal and padding mask
    (B', 1, T, S), the present outputs) of the call's signature."""
    op = Ops(g)
    seq_len = dim(g, "x", 1, "seq_len")  # () T
    if sig.static_cache:
        index = write_index(g, "past_lengths", k, seq_len)  # (B, K, T, 3)
        present = {"present_key": op.ScatterND("past_key", index, k, name="key_write"),
                   "present_value": op.ScatterND("past_value", index, entries,
                                                 name="value_write")}  # (B, K, C, .)
        keys, values = valid_prefixes(g, "past_lengths", seq_len,
                                      (present["present_key"], "valid_keys"),
                                      (present["present_value"], "valid_values"))  # (B, K, S, .)
        masked = row_masked_positions(g, "past_lengths", seq_len,
                                      dim(g, keys, 2, "key_len"))  # (B, 1, T, S)
        return keys, values, masked, present
    keys, values, present = k, entries, {}
    if sig.has_cache:  # all_keys / all_values: tests' faults edit them
        keys = op.Concat("past_key", k, axis=2, name="all_keys")  # (B, K, S, H)
        values = op.Concat("past_value", entries, axis=2, name="all_values")  # (B, K, S, Hv+Di)
        present = {"present_key": keys, "present_value": values}
    masked = score_mask(g, True, seq_len, dim(g, keys, 2, "key_len"),
                        "attention_mask" if sig.has_mask else None)  # (T, S) | (B, 1, T, S)
    if not sig.has_mask:
        masked = op.Unsqueeze(masked, g.ints("axes01", [0, 1]))  # (1, 1, T, S)
    return keys, values, masked, present


def sparse_core(g: GraphBuilder, io: SparseIO, c: MHAConfig) -> str:
    """The decomposed core over the keys and the entries' values, its scores hidden by the
    joined mask -> context (B, T, N*Hv)."""
    op = Ops(g)
    q = split_heads(g, scale_queries(g, io.q, c.scale), c.heads, c.head_dim, "q")  # (B,N,T,H)
    values = op.Slice(io.values, g.ints("zero_1d", [0]), g.ints("value_width", [c.value_dim]),
                      g.ints("axes_last_1d", [-1]), name="values")  # (B, K, S, Hv)
    k_t = op.Transpose(repeat_kv(g, io.keys, c.groups, "k"), perm=[0, 1, 3, 2])  # (B, N, H, S)
    probs = probabilities(g, op.MatMul(q, k_t), io.hidden, c, None)  # (B, N, T, S)
    context = op.MatMul(probs, repeat_kv(g, values, c.groups, "v"))  # (B, N, T, Hv)
    return merge_heads(g, context, c.v_inner)  # (B, T, N*Hv)


QSA_MASKED = dataclasses.replace(
    decomposed.FORM, name="qsa-masked", kind="qsa", layer=build_qsa, core=sparse_core,
    memory=QUADRATIC,
    supports=frozenset({Feature.KV_CACHE, Feature.STATIC_CACHE, Feature.ATTENTION_MASK,
                        Feature.GQA}),
    summary="a QSA layer (the only form for it): the indexer's block top-k selection as a mask "
            "(CumSum, MatMul, Relu, TopK, ScatterElements) joined to the causal and padding "
            "mask, then the decomposed core (MatMul, Where, Softmax: standard ops)")
FORMS = (QSA_MASKED,)
