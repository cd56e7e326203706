"""The QSA indexer as ONNX graph code (indexer.py's functions and layer.py's ``_dropped``):
each row's block layout, the blocks' mean keys (normed, rotated at their first key's
position), each query's top block_topk complete blocks by TopK, and the keys it drops; graph.py's
layer joins them to its causal and padding mask. Standard ops (opset 17): CumSum, MatMul,
Relu, ReduceSum, TopK, ScatterElements. Pooling and scores in float32, as transformers
computes them.

    layout   the row's last query's visible keys, in order, in blocks of c; each query's
             complete blocks = its visible count // c
    blocks   members (B', NB, S) @ raw index keys / c -> RMSNorm (offset + w) -> rotary at
             first + n*c (first: the query's position less its visible count less 1)
    score    sum_h relu(q[t, h] . k[n]) / sqrt(Di) over the query's complete blocks
    kept     the top k by TopK (ties to the earlier block), and the tail after the last
             complete block

Shape legend: B = batch, B' = B or 1 (no padding mask), T = this call's queries, S = keys,
Hi = index heads, Di = their width, NB = blocks (S // c), k = block_topk, c = compress_ratio,
rd = rotary_dim.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import TensorProto

from ...config import MHAConfig
from ...graph.builder import GraphBuilder, as_1d, dim
from ...graph.norm import heads_rms_norm, rms_norm
from ...graph.ops import Ops
from ...graph.rotary import cos_sin_at, rotate_heads
from .layer import QSAWeights

INF = np.array(np.inf, np.float32)


@dataclass(frozen=True)
class Layout:
    """indexer.py's block_layout in graph values (int64 unless said)."""

    block: str  # (B', S) each key's block among the row's last query's keys; -1: unseen
    complete: str  # (B', T) each query's complete blocks
    count: str  # (B', T) each query's visible keys
    blocks: str  # () NB = S // c
    ids: str  # (NB,) 0 .. NB - 1
    members: str  # (B', NB, S) float32: 1 where key s is in block n


def _float32(g: GraphBuilder, x: str) -> str:
    return x if g.dtype == "float32" else Ops(g).Cast(x, to=TensorProto.FLOAT)


def block_layout(g: GraphBuilder, visible: str, c: int) -> Layout:
    """visible (B', T, S) bool (the causal and padding mask's complement) -> its Layout.
    Nodes named ``block_*`` (``block_rank``: a test's fault shifts it)."""
    op = Ops(g).named("block")
    zero, one, ratio = g.ints("zero", 0), g.ints("one", 1), g.ints("block_ratio", c)
    last = op.Gather(visible, g.ints("block_last", -1), axis=1)  # (B', S): the last query's
    seen = op.Cast(last, to=TensorProto.INT64)  # (B', S) 1 | 0
    rank = op.Sub(op.CumSum(seen, g.ints("axis_last", -1)), one,
                  name="rank")  # (B', S): its visible keys counted from 0
    # (rank // c + 1) * seen - 1: the block, -1 where unseen (arithmetic, no Where: the
    # causal-mask fault of tests/faults.py bypasses every Where but the scores' own)
    block = op.Sub(op.Mul(op.Add(op.Div(rank, ratio), one), seen), one)  # (B', S)
    count = op.ReduceSum(op.Cast(visible, to=TensorProto.INT64), g.ints("axes_last_1d", [-1]),
                         keepdims=0, name="count")  # (B', T)
    blocks = op.Div(dim(g, visible, 2, "block_keys"), ratio, name="blocks")  # () NB
    ids = op.Range(zero, blocks, one)  # (NB,)
    members = op.Equal(op.Unsqueeze(block, g.ints("axes1", [1])),
                       op.Unsqueeze(ids, g.ints("axes1", [1])))  # (B', 1, S) vs (NB, 1)
    return Layout(block, op.Div(count, ratio, name="complete"), count, blocks, ids,
                  op.Cast(members, to=TensorProto.FLOAT))  # (B', NB, S)


def block_keys(g: GraphBuilder, c: MHAConfig, w: QSAWeights, keys: str, layout: Layout) -> str:
    """keys (B, S, Di) raw -> each block's key (B, NB, Di): the float32 mean of its keys, cast
    back, then k_layernorm."""
    op = Ops(g).named("block_key")
    mean = op.Div(op.MatMul(layout.members, _float32(g, keys)), g.const(
        "index_block_ratio", np.array(c.qsa.compress_ratio, np.float32), float_dtype=False),
        name="mean")  # (B, NB, Di) float32
    mean = mean if g.dtype == "float32" else op.Cast(mean, to=g.elem)
    return rms_norm(g, mean, w.index_k_norm, c.qk_norm_eps, c.norm_offset or 0.0,
                    "index_k_norm")  # (B, NB, Di)


def rotated_block_keys(g: GraphBuilder, c: MHAConfig, pooled: str, layout: Layout) -> str:
    """pooled (B, NB, Di) -> (B, T, NB, Di): block n rotated, for query t, at the position of
    its first key, first[t] + n*c (first[t] = position_ids[t] - (count[t] - 1)); (B, 1, NB, Di)
    unrotated for a layer without rotary."""
    op = Ops(g).named("block_rot")
    if c.rotary == "none":
        return op.Unsqueeze(pooled, g.ints("axes1", [1]))  # (B, 1, NB, Di)
    first = op.Sub("position_ids", op.Sub(layout.count, g.ints("one", 1)),
                   name="first")  # (B, T)
    starts = op.Mul(layout.ids, g.ints("block_ratio", c.qsa.compress_ratio))  # (NB,)
    at = op.Add(op.Unsqueeze(first, g.ints("axes_last", [2])), starts, name="at")  # (B, T, NB)
    # [B, T*NB] spelled out, allowzero: NB is 0 below c keys (no -1 to infer, no 0 to copy)
    rows = op.Concat(op.Shape(at, start=0, end=1), op.Mul(op.Shape(at, start=1, end=2),
                                                          op.Shape(at, start=2, end=3)), axis=0)
    cos, sin = cos_sin_at(g, op.Reshape(at, rows, allowzero=1), c.rotary_dim, c.rope_theta,
                          c.rope_scaling)  # (B, T*NB, rd/2)
    di = g.ints("block_rot_di", [c.qsa.head_dim])
    tiled = op.Concat(op.Shape(at), di, axis=0)  # [B, T, NB, Di]
    keys = op.Expand(op.Unsqueeze(pooled, g.ints("axes1", [1])), tiled)  # (B, T, NB, Di)
    keys = op.Reshape(keys, op.Concat(rows, di, axis=0), allowzero=1)  # (B, T*NB, Di)
    keys = rotate_heads(g, keys, 1, c.qsa.head_dim, c.rotary_dim, c.rotary == "interleaved",
                        cos, sin, "block_rot_rope")  # (B, T*NB, Di)
    return op.Reshape(keys, tiled, allowzero=1)  # (B, T, NB, Di)


def index_queries(g: GraphBuilder, c: MHAConfig, w: QSAWeights, q: str, cos: str | None,
                  sin: str | None) -> str:
    """q (B, T, Hi*Di) projected -> q_layernorm -> rotary at position_ids (cos, sin
    (B, T, rd/2); None: no rotary) -> (B, T, Hi, Di) float32."""
    index = c.qsa
    q = heads_rms_norm(g, q, index.heads, index.head_dim, w.index_q_norm, c.qk_norm_eps,
                       c.norm_offset or 0.0, "index_q_norm")  # (B, T, Hi*Di)
    if cos is not None and sin is not None:
        q = rotate_heads(g, q, index.heads, index.head_dim, c.rotary_dim,
                         c.rotary == "interleaved", cos, sin, "index_q_rope")  # (B, T, Hi*Di)
    return Ops(g).Reshape(_float32(g, q), g.ints("index_q_heads", [
        0, 0, index.heads, index.head_dim]), name="index_q")  # (B, T, Hi, Di)


def block_scores(g: GraphBuilder, c: MHAConfig, q: str, keys: str) -> str:
    """q (B, T, Hi, Di), keys (B, T|1, NB, Di) -> I (B, T, NB) float32: relu(q . k) summed over
    the index heads, / sqrt(Di) (the node ``index_scores``: a test's fault edits it)."""
    op = Ops(g).named("index")
    k_t = op.Transpose(_float32(g, keys), perm=[0, 1, 3, 2])  # (B, T|1, Di, NB)
    per_head = op.Relu(op.MatMul(q, k_t))  # (B, T, Hi, NB)
    summed = op.ReduceSum(per_head, g.ints("axes2_1d", [2]), keepdims=0)  # (B, T, NB)
    return op.Div(summed, g.const("index_score_div", np.array(
        c.qsa.head_dim ** 0.5, np.float32), float_dtype=False), name="scores")  # (B, T, NB)


def kept_blocks(g: GraphBuilder, scores: str, layout: Layout, topk: int) -> str:
    """scores (B, T, NB) -> (B, T, NB) float32, 1 at each query's top ``topk`` complete blocks
    (TopK: ties to the earlier block, as the eager stable sort); -inf columns after the blocks
    so that TopK always has k to pick, the blocks not complete pushed below every score (nodes
    ``kept_*``; the initializer ``kept_k``: a fault edits it)."""
    op = Ops(g).named("kept")
    wide = op.Add(layout.blocks, g.ints("kept_topk_count", topk))  # () NB + k
    ids = op.Range(g.ints("zero", 0), wide, g.ints("one", 1))  # (NB + k,)
    usable = op.Less(ids, op.Unsqueeze(layout.complete, g.ints("axes_last", [2])),
                     name="usable")  # (B', T, NB + k)
    lowest = g.const("index_lowest", -INF, float_dtype=False)
    padded = op.Pad(scores, g.ints("kept_pads", [0, 0, 0, 0, 0, topk]), lowest)  # (B,T,NB+k)
    unusable = op.Cast(op.Not(usable), to=TensorProto.FLOAT)  # (B', T, NB + k) 1 | 0
    padded = op.Sub(padded, op.Mul(unusable, g.const("index_far", np.array(
        3e38, np.float32), float_dtype=False)))  # below every usable score (>= 0)
    _, order = op.TopK(padded, g.ints("kept_k", [topk]), axis=-1, largest=1, sorted=1,
                       n_out=2, name="topk")  # (B, T, k)
    false = op.Expand(g.const("kept_false", np.array(False), float_dtype=False),
                      op.Shape(padded))  # (B, T, NB + k)
    true = op.Expand(g.const("kept_true", np.array(True), float_dtype=False), op.Shape(order))
    chosen = op.And(op.ScatterElements(false, order, true, axis=-1), usable)  # (B, T, NB + k)
    chosen = op.Slice(chosen, g.ints("zero_1d", [0]), as_1d(g, layout.blocks, "kept_nb_1d"),
                      g.ints("axes_last_1d", [-1]))  # (B, T, NB)
    return op.Cast(chosen, to=TensorProto.FLOAT)  # (B, T, NB)


def dropped_keys(g: GraphBuilder, chosen: str, layout: Layout) -> str:
    """chosen (B, T, NB) -> (B, 1, T, S) bool, True at the keys of the complete blocks a query
    does not keep (its tail, the keys after its last complete block, always kept)."""
    op = Ops(g).named("dropped")
    in_kept = op.Greater(op.MatMul(chosen, layout.members), g.const(
        "index_half", np.array(0.5, np.float32), float_dtype=False))  # (B, T, S)
    tail = op.GreaterOrEqual(op.Unsqueeze(layout.block, g.ints("axes1", [1])),
                             op.Unsqueeze(layout.complete, g.ints("axes_last", [2])),
                             name="tail")  # (B', T, S)
    kept = op.Or(in_kept, tail)  # (B, T, S)
    return op.Unsqueeze(op.Not(kept), g.ints("axes1", [1]))  # (B, 1, T, S)


def indexer_hides(g: GraphBuilder, c: MHAConfig, w: QSAWeights, q: str, keys: str,
                  masked: str, cos: str | None, sin: str | None) -> str:
    """The keys each query does not keep (B, 1, T, S) bool: q (B, T, Hi*Di) the index queries
    projected, keys (B, S, Di) the raw index keys read, masked (B', 1, T, S) the causal and
    padding mask."""
    op = Ops(g)
    visible = op.Not(op.Squeeze(masked, g.ints("axes1", [1])), name="visible")  # (B', T, S)
    layout = block_layout(g, visible, c.qsa.compress_ratio)
    pooled = block_keys(g, c, w, keys, layout)  # (B, NB, Di)
    scores = block_scores(g, c, index_queries(g, c, w, q, cos, sin),
                          rotated_block_keys(g, c, pooled, layout))  # (B, T, NB)
    return dropped_keys(g, kept_blocks(g, scores, layout, c.qsa.block_topk), layout)
