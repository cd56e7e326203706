"""The lightning indexer as ONNX graph code (indexer.py's function): the index keys a call
caches, and the keys each query drops (all but its top-k visible ones), built per block of
queries inside MLA's mask builder (kinds/mla/graph.py). Standard ops: MatMul, Relu, TopK,
ScatterElements (opset 17). The scores in float32, as transformers computes them. A GLM-5
shared-top-k layer runs no indexer: ``given_dropped`` scatters its input ``topk_indices``; the
layer it reads outputs its own selection (``kept_keys``).

Shape legend: B = batch, T = this call, t = a block of queries, S = keys, Hi = index heads,
Di = their width, Hr = the rotated part.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
from onnx import TensorProto
from torch import Tensor

from ...graph.builder import GraphBuilder, as_1d
from ...graph.ops import Ops
from ...graph.rotary import rotate_heads
from .settings import SparseIndex


def _rotate(g: GraphBuilder, x: str, index: SparseIndex, heads: int, rope_dim: int, cos: str,
            sin: str, name: str) -> str:
    """(B, T, heads*Di): each head's first Hr features rotated in the indexer's rope layout."""
    pairs = index.rope != "half"
    return rotate_heads(g, x, heads, index.head_dim, rope_dim, pairs, cos, sin, name,
                        halves_out=pairs)


def _float32(g: GraphBuilder, x: str) -> str:
    return x if g.dtype == "float32" else Ops(g).Cast(x, to=TensorProto.FLOAT)


def index_keys(g: GraphBuilder, index: SparseIndex, w: Mapping[str, Tensor], rope_dim: int,
               cos: str, sin: str) -> str:
    """This call's rotated index keys (B, 1, T, Di): LayerNorm(x @ wk) (with its bias)."""
    op = Ops(g).named("index_key")
    k = g.linear("x", "indexer.wk", w["indexer.wk.weight"], None)  # (B, T, Di)
    k = op.LayerNormalization(k, g.const("indexer.k_norm.weight", w["indexer.k_norm.weight"]),
                              g.const("indexer.k_norm.bias", w["indexer.k_norm.bias"]),
                              axis=-1, epsilon=1e-6)  # (B, T, Di)
    k = _rotate(g, k, index, 1, rope_dim, cos, sin, "index_key_rot")  # (B, T, Di)
    return op.Unsqueeze(k, g.ints("axes1", [1]))  # (B, 1, T, Di)


@dataclass(frozen=True)
class IndexQueries:
    """A call's index queries (B, T, Hi, Di), rotated, and head weights (B, T, 1, Hi), both
    float32: each block of queries slices its rows."""

    queries: str
    weights: str
    keys_t: str  # (B, 1, Di, S) float32: the index keys read
    topk: int
    scale: float


def index_queries(g: GraphBuilder, index: SparseIndex, w: Mapping[str, Tensor], q_resid: str,
                  keys: str, rope_dim: int, cos: str, sin: str) -> IndexQueries:
    """q_resid (B, T, q_lora_rank) -> wq_b -> rotated (B, T, Hi, Di); x -> weights_proj /
    sqrt(Hi) (B, T, 1, Hi); keys (B, 1, S, Di) transposed once."""
    op = Ops(g).named("index_query")
    q = g.linear(q_resid, "indexer.wq_b", w["indexer.wq_b.weight"], None)  # (B, T, Hi*Di)
    q = _rotate(g, q, index, index.heads, rope_dim, cos, sin, "index_query_rot")
    q = op.Reshape(_float32(g, q), g.ints("index_q_shape", [0, 0, index.heads,
                                                          index.head_dim]))  # (B, T, Hi, Di)
    weights = g.linear("x", "indexer.weights_proj", w["indexer.weights_proj.weight"], None)
    weights = op.Mul(_float32(g, weights), g.const("index_weight_scale", np.array(
        index.heads ** -0.5, np.float32), float_dtype=False))  # (B, T, Hi)
    weights = op.Unsqueeze(weights, g.ints("axes2", [2]))  # (B, T, 1, Hi)
    keys_t = op.Transpose(_float32(g, keys), perm=[0, 1, 3, 2])  # (B, 1, Di, S)
    return IndexQueries(q, weights, keys_t, index.topk, index.head_dim ** -0.5)


def _index_scores(b: GraphBuilder, iq: IndexQueries, start: str, t: str, masked: str,
                  stem: str) -> str:
    """(B, 1, t, S) float32 index scores of queries [start, start + t), -inf at the keys
    ``masked`` (broadcastable to (B, 1, t, S)) hides. Nodes and constants named ``<stem>_*``
    (``<stem>_scores``: a test's fault edits it)."""
    op = Ops(b).named(stem)
    rows = [as_1d(b, start, f"{stem}_start_1d"), as_1d(b, op.Add(start, t), f"{stem}_end_1d"),
            b.ints("axes1_1d", [1])]
    q, w = (op.Slice(v, *rows) for v in (iq.queries, iq.weights))  # (B, t, Hi, Di), (B,t,1,Hi)
    scale = b.const(f"{stem}_score_scale", np.array(iq.scale, np.float32), float_dtype=False)
    scores = op.Relu(op.Mul(op.MatMul(q, iq.keys_t), scale))  # (B, t, Hi, S)
    index = op.Transpose(op.MatMul(w, scores), perm=[0, 2, 1, 3],
                         name="scores")  # (B, 1, t', S): summed over heads
    # a Loop's last block is padded past T (t' < t rows): rows of 0 to the block's size
    missing = op.Sub(as_1d(b, t, f"{stem}_rows_1d"), op.Shape(q, start=1, end=2))  # (1,)
    pads = op.Concat(b.ints(f"{stem}_pads_head", [0] * 6), missing,
                     b.ints(f"{stem}_pads_tail", [0]), axis=0)  # [0, 0, 0, 0, 0, 0, t - t', 0]
    index = op.Pad(index, pads)  # (B, 1, t, S)
    hidden = b.const(f"{stem}_hidden", np.array(-np.inf, np.float32), float_dtype=False)
    return op.Where(masked, hidden, index)  # (B, 1, t, S)


def _top_keys(b: GraphBuilder, iq: IndexQueries, index: str, stem: str, best_first: int
              ) -> str:
    """(B, 1, t, k) int64: each query's top k = min(topk, S) keys by ``index`` (B, 1, t, S);
    equal scores keep the earlier key (ONNX TopK's rule)."""
    op = Ops(b).named(stem)
    k = op.Min(op.Shape(index, start=3, end=4), b.ints(f"{stem}_topk", [iq.topk]))  # (1,)
    _, kept = op.TopK(index, k, axis=-1, largest=1, sorted=best_first, n_out=2)
    return kept  # (B, 1, t, k)


def dropped_keys(b: GraphBuilder, iq: IndexQueries, start: str, t: str, masked: str) -> str:
    """(B, 1, t, S) bool, True at the keys queries [start, start + t) drop: all but each one's
    top-k by index score among those ``masked`` (broadcastable to (B, 1, t, S)) leaves
    visible. Nodes named ``index_*`` (``index_scores``: a test's fault edits it)."""
    op = Ops(b).named("index")
    index = _index_scores(b, iq, start, t, masked, "index")  # (B, 1, t, S)
    kept = _top_keys(b, iq, index, "index", 0)  # (B, 1, t, k)
    true = op.Expand(b.const("index_true", np.array(True), float_dtype=False), op.Shape(index))
    false = op.Expand(b.const("index_false", np.array(False), float_dtype=False),
                      op.Shape(kept))
    return op.ScatterElements(true, kept, false, axis=-1)  # (B, 1, t, S)


def kept_keys(g: GraphBuilder, iq: IndexQueries, queries: str, masked: str) -> str:
    """The output topk_indices (B, T, K) int64 of a layer whose selection later shared layers
    read: each query's kept key positions, best first, K = min(topk, S) (as transformers'
    top-k; a query seeing fewer than K keys fills its row with hidden positions, the earliest
    first). Over the whole call (``queries``: () T, ``masked`` (.., T, S)), in nodes of its
    own named ``selection_*``: the same arithmetic as the blocks' ``dropped_keys``."""
    index = _index_scores(g, iq, g.ints("selection_start", 0), queries, masked,
                          "selection")  # (B, 1, T, S)
    kept = _top_keys(g, iq, index, "selection", 1)  # (B, 1, T, K)
    return Ops(g).Squeeze(kept, g.ints("selection_axes1", [1]), name="topk")  # (B, T, K)


def given_dropped(b: GraphBuilder, start: str, t: str, masked: str) -> str:
    """(B, 1, t, S) bool, True at the keys that queries [start, start + t) do not keep by the
    input ``topk_indices`` (B, T, K) (a shared layer's: its source layer's selection); a
    position at S or beyond keeps nothing (clamped to a column past the keys, then cut).
    ``masked`` (.., t, S): the block's mask, read for S. Nodes named ``given_*``."""
    op = Ops(b).named("given")
    rows = [as_1d(b, start, "given_start_1d"), as_1d(b, op.Add(start, t), "given_end_1d"),
            b.ints("axes1_1d", [1])]
    kept = op.Slice("topk_indices", *rows)  # (B, t', K)
    # a Loop's last block is padded past T (t' < t rows): rows of position 0 to its size
    missing = op.Sub(as_1d(b, t, "given_rows_1d"), op.Shape(kept, start=1, end=2))  # (1,)
    pads = op.Concat(b.ints("given_pads_head", [0, 0, 0, 0]), missing,
                     b.ints("given_pads_tail", [0]), axis=0)  # [0, 0, 0, 0, t - t', 0]
    keys = op.Shape(masked, start=-1)  # (1,) S
    kept = op.Min(op.Pad(kept, pads), keys, name="clamped")  # (B, t, K): positions <= S
    wide = op.Concat(op.Shape(kept, start=0, end=2), op.Add(keys, b.ints("given_one", [1])),
                     axis=0)  # [B, t, S + 1]
    true = op.Expand(b.const("given_true", np.array(True), float_dtype=False), wide)
    false = op.Expand(b.const("given_false", np.array(False), float_dtype=False),
                      op.Shape(kept))
    dropped = op.ScatterElements(true, kept, false, axis=-1)  # (B, t, S + 1)
    dropped = op.Slice(dropped, b.ints("given_zero", [0]), keys,
                       b.ints("given_axes2", [2]))  # (B, t, S)
    return op.Unsqueeze(dropped, b.ints("axes1", [1]))  # (B, 1, t, S)
