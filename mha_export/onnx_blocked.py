"""Query-block causal attention: an ONNX ``Loop`` over blocks of queries, memory linear in T.

Every ORT CPU attention kernel materialises the (heads, T, T) scores. Here a ``Loop`` runs one block
of ``bs`` queries per iteration; block i (queries [i*bs, (i+1)*bs)) attends only to keys
[0, min((i+1)*bs, T)), so the scores of one block are (heads, bs, end) and nothing is computed on
the masked upper triangle beyond the diagonal block.

- The block count is ``nb = ceil(T / block)`` and the block size ``bs = ceil(T / nb)`` (<= block),
  both from the runtime T: the queries are padded by fewer than ``nb`` rows (none when T < block).
  The ragged last block's keys come from Slice clamping at T; padded query rows see every key, so
  they stay finite, and are sliced off at the end.
- The causal mask is one additive (bs, bs) float tile for the diagonal block, built once from
  Range/Greater; each iteration pads it on the left with ``start`` zero columns -> (bs, end). No
  max_seq buffer, no (T, T) mask.
- Queries are scaled by 1/sqrt(head_dim) once, before the loop (never the scores).

Two bodies (``use_attention_op``):

- True (opset 23+): one standard ``Attention`` node per block on 3-D (B, len, nh*hs) slices. ORT's
  CPU kernel reads 3-D inputs with strided GEMMs, so no transposes at all.
- False (opset 17+): MatMul / Add / Softmax / MatMul on (B, nh, len, hs) tensors transposed once
  outside the loop.

``auto_core`` (opset 23+) wraps the single fused ``Attention`` node and the blocked loop in an
``If`` on the runtime T: the fused node for T < threshold, the loop above.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from onnx import TensorProto, helper

from .config import MHAConfig
from .onnx_graph import ONNX_DTYPES, GraphBuilder, finite_lowest, fused_core

# Lowest opset of each body (the plain body's Pad, Slice, Squeeze with axes input, Softmax-13: 17).
MIN_OPSET_ATTENTION_OP = 23
MIN_OPSET_PLAIN = 17
# auto_core: below this many tokens one fused Attention node is as fast or faster (its (h, T, T)
# scores are small); from 512 up the loop measured faster (benchmarks/blocked_sweep.py, 2-core
# Xeon, noisy: T=128 fused 3.8-4.2 ms vs loop 3.9-4.3; T=300 9.1 vs 10.6; T=512 23.0 vs 18.9;
# T=2048 176 vs 91-98).
AUTO_THRESHOLD = 512
BLOCK = 256


@dataclass
class _Sub(GraphBuilder):
    """GraphBuilder for a subgraph: every name carries a prefix, so none shadows the outer scope."""

    prefix: str = "sub/"

    def name(self, base: str) -> str:
        return super().name(self.prefix + base)


# --- small shape helpers ----------------------------------------------------------------------

def _scalar_dim(g: GraphBuilder, x: str, axis: int, name: str) -> str:
    """int64 scalar: x.shape[axis] at runtime."""
    d = g.op("Shape", [x], start=axis, end=axis + 1, name=f"{name}_1d")  # (1,)
    return g.op("Squeeze", [d, g.ints("axes0", [0])], name=name)  # ()


def _ceil_div(g: GraphBuilder, a: str, b: str, name: str) -> str:
    """int64 scalars: ceil(a / b) for a, b > 0."""
    num = g.op("Sub", [g.op("Add", [a, b], name=f"{name}_sum"), g.ints("one", 1)],
               name=f"{name}_num")
    return g.op("Div", [num, b], name=name)  # integer Div truncates; operands are positive


def _as_1d(g: GraphBuilder, s: str, name: str) -> str:
    return g.op("Unsqueeze", [s, g.ints("axes0", [0])], name=name)  # (1,)


def _diag_mask(g: GraphBuilder, bs: str) -> str:
    """(bs, bs) additive tile: 0 where key <= query, lowest finite value above the diagonal."""
    pos = g.op("Range", [g.ints("zero", 0), bs, g.ints("one", 1)], name="block_pos")  # (bs,)
    rows = g.op("Unsqueeze", [pos, g.ints("axes1", [1])], name="block_query_pos")  # (bs, 1)
    cols = g.op("Unsqueeze", [pos, g.ints("axes0", [0])], name="block_key_pos")  # (1, bs)
    above = g.op("Greater", [cols, rows], name="block_above_diag")  # (bs, bs) bool
    return g.op("Where", [above, g.const("mask_fill", np.array(finite_lowest(g.dtype))),
                          g.const("mask_zero", np.array(0.0))], name="diag_bias")  # (bs, bs)


def _block_bias(b: GraphBuilder, diag: str, start: str, t: str) -> str:
    """(bs, end) additive mask of the block starting at ``start``: zeros for keys [0, start), the
    diagonal tile for keys [start, end); the ragged last block keeps only T - start tile columns."""
    left = b.op("Sub", [t, start], name="keys_left")  # () keys from start to T
    tile = b.op("Slice", [diag, b.ints("zero_1d", [0]), _as_1d(b, left, "keys_left_1d"),
                          b.ints("axes1_1d", [1])], name="diag_tile")  # (bs, min(bs, T - start))
    pads = b.op("Concat", [b.ints("zero_1d_", [0]), _as_1d(b, start, "start_1d"),
                           b.ints("zeros2", [0, 0])], axis=0, name="bias_pads")  # (4,)
    return b.op("Pad", [tile, pads], mode="constant", name="block_bias")  # (bs, end)


# --- the core ---------------------------------------------------------------------------------

def blocked_core(g: GraphBuilder, q: str, k: str, v: str, c: MHAConfig, block: int = BLOCK,
                 use_attention_op: bool = True) -> str:
    """(B, T, inner) q, k, v -> (B, T, inner) causal context, one Loop iteration per query block.

    ``use_attention_op``: True needs opset 23+ (one standard Attention node per block); False
    needs opset 17+ (MatMul/Add/Softmax/MatMul).
    """
    if block < 1:
        raise ValueError(f"block must be positive, got {block}")
    t = _scalar_dim(g, q, 1, "blk_seq_len")  # ()
    nb = _ceil_div(g, t, g.ints("blk_block", block), "blk_count")  # () number of blocks
    bs = _ceil_div(g, t, nb, "blk_size")  # () queries per block, <= block
    pad = g.op("Sub", [g.op("Mul", [nb, bs], name="blk_padded_len"), t], name="blk_pad")  # () < nb
    q = g.op("Mul", [q, g.const("attn.scale", np.array(1.0 / math.sqrt(c.head_dim)))],
             name="q_scaled")  # (B, T, inner): scale the queries, not the scores
    diag = _diag_mask(g, bs) if c.causal else None  # (bs, bs)

    b = _Sub(dtype=g.dtype, prefix="blk/")
    it, cond = b.name("iter"), b.name("cond_in")
    start = b.op("Mul", [it, bs], name="start")  # ()
    qend_1d = _as_1d(b, b.op("Add", [start, bs], name="q_end"), "q_end_1d")  # (1,)
    start_1d = _as_1d(b, start, "start_1d_q")  # (1,)
    bias = _block_bias(b, diag, start, t) if c.causal else None  # (bs, end)
    # Keys [0, end): Slice clamps qend to T, so the ragged last block needs no special case.
    kend = qend_1d if c.causal else g.ints("blk_all_keys", [np.iinfo(np.int64).max])

    if use_attention_op:
        qp = g.op("Pad", [q, g.op("Concat", [g.ints("blk_pads_head", [0, 0, 0, 0]), _as_1d(
            g, pad, "blk_pad_1d"), g.ints("blk_pads_tail", [0])], axis=0, name="blk_q_pads")],
            mode="constant", name="q_padded")  # (B, nb*bs, inner)
        ctx_b = _attention_op_body(b, c, qp, k, v, start_1d, qend_1d, kend, bias)  # (B, bs, inner)
        ctx = _run_loop(g, b, nb, it, cond, ctx_b, q, [-1, c.inner])  # (nb, B, bs, inner)
        ctx = g.op("Transpose", [ctx], perm=[1, 0, 2, 3], name="blk_ctx_bnsd")  # (B, nb, bs, inner)
    else:
        heads4 = g.ints("blk_heads_shape", [0, 0, c.heads, c.head_dim])
        q4 = g.op("Transpose", [g.op("Reshape", [q, heads4], name="blk_q_heads")],  # (B, T, nh, hs)
                  perm=[0, 2, 1, 3], name="blk_q_bhtd")  # (B, nh, T, hs)
        q4 = g.op("Pad", [q4, g.op("Concat", [g.ints("blk_pads4_head", [0, 0, 0, 0, 0, 0]), _as_1d(
            g, pad, "blk_pad4_1d"), g.ints("blk_pads4_tail", [0])], axis=0, name="blk_q4_pads")],
            mode="constant", name="q4_padded")  # (B, nh, nb*bs, hs)
        k4 = g.op("Transpose", [g.op("Reshape", [k, heads4], name="blk_k_heads")],  # (B, T, nh, hs)
                  perm=[0, 2, 3, 1], name="blk_k_bhdt")  # (B, nh, hs, T)
        v4 = g.op("Transpose", [g.op("Reshape", [v, heads4], name="blk_v_heads")],  # (B, T, nh, hs)
                  perm=[0, 2, 1, 3], name="blk_v_bhtd")  # (B, nh, T, hs)
        ctx_b = _plain_body(b, q4, k4, v4, start_1d, qend_1d, kend, bias)  # (B, nh, bs, hs)
        ctx = _run_loop(g, b, nb, it, cond, ctx_b, q,
                        [c.heads, -1, c.head_dim])  # (nb, B, nh, bs, hs)
        ctx = g.op("Transpose", [ctx], perm=[1, 0, 3, 2, 4],
                   name="blk_ctx_bnsh")  # (B, nb, bs, nh, hs)
    ctx = g.op("Reshape", [ctx, g.ints("blk_merged_shape", [0, -1, c.inner])],
               name="blk_ctx_padded")  # (B, nb*bs, inner)
    return g.op("Slice", [ctx, g.ints("blk_zero_1d", [0]), _as_1d(g, t, "blk_seq_len_1d"),
                          g.ints("blk_axes1_1d", [1])], name="blk_context")  # (B, T, inner)


def _attention_op_body(b: GraphBuilder, c: MHAConfig, q: str, k: str, v: str, start_1d: str,
                       qend_1d: str, kend_1d: str, bias: str | None) -> str:
    """One Attention node on 3-D slices: q (B, bs, inner), k/v (B, end, inner) -> (B, bs, inner)."""
    axes1 = b.ints("axes1_1d_", [1])
    zero = b.ints("zero_1d_k", [0])
    # Reshape (no copy in ORT) restores the static width that shape inference loses through a
    # Slice with runtime bounds; without it ORT infers a 0 width for the Attention output and warns.
    width = b.ints("width_shape", [0, -1, c.inner])
    qb = b.op("Slice", [q, start_1d, qend_1d, axes1], name="q_block_")  # (B, bs, inner)
    qb = b.op("Reshape", [qb, width], name="q_block")  # (B, bs, inner)
    kb = b.op("Slice", [k, zero, kend_1d, axes1], name="k_prefix_")  # (B, end, inner)
    kb = b.op("Reshape", [kb, width], name="k_prefix")  # (B, end, inner)
    vb = b.op("Slice", [v, zero, kend_1d, axes1], name="v_prefix_")  # (B, end, inner)
    vb = b.op("Reshape", [vb, width], name="v_prefix")  # (B, end, inner)
    inputs = [qb, kb, vb] + ([bias] if bias is not None else [])
    return b.op("Attention", inputs, name="attention", q_num_heads=c.heads,
                kv_num_heads=c.heads, scale=1.0)  # q is already scaled


def _plain_body(b: GraphBuilder, q: str, k: str, v: str, start_1d: str, qend_1d: str,
                kend_1d: str, bias: str | None) -> str:
    """MatMul/Add/Softmax/MatMul: q (B, nh, bs, hs), k^T (B, nh, hs, end) -> (B, nh, bs, hs)."""
    zero = b.ints("zero_1d_k", [0])
    qb = b.op("Slice", [q, start_1d, qend_1d, b.ints("axes2_1d", [2])],
              name="q_block")  # (B, nh, bs, hs)
    kb = b.op("Slice", [k, zero, kend_1d, b.ints("axes3_1d", [3])],
              name="k_prefix")  # (B, nh, hs, end)
    vb = b.op("Slice", [v, zero, kend_1d, b.ints("axes2_1d_", [2])],
              name="v_prefix")  # (B, nh, end, hs)
    scores = b.op("MatMul", [qb, kb], name="scores")  # (B, nh, bs, end)
    if bias is not None:
        scores = b.op("Add", [scores, bias], name="masked_scores")  # (B, nh, bs, end)
    probs = b.op("Softmax", [scores], axis=-1, name="probs")  # (B, nh, bs, end)
    return b.op("MatMul", [probs, vb], name="context")  # (B, nh, bs, hs)


def _elem(g: GraphBuilder) -> int:
    return ONNX_DTYPES[g.dtype]


def _run_loop(g: GraphBuilder, b: GraphBuilder, nb: str, it: str, cond: str, ctx_b: str,
              batch_of: str, tail: list[int]) -> str:
    """Wrap body builder b (iteration ``it``, condition ``cond``, scan output ctx_b of shape
    (B, *rest)) in a Loop of nb iterations; returns the stacked scan output (nb, B, *rest).
    ``batch_of``: an outer value with B first; ``tail``: rest, with one -1."""
    cond_out = b.op("Identity", [cond], name="cond_out")
    body = helper.make_graph(
        b.nodes, g.name("blk_body"),
        [helper.make_tensor_value_info(it, TensorProto.INT64, []),
         helper.make_tensor_value_info(cond, TensorProto.BOOL, [])],
        [helper.make_tensor_value_info(cond_out, TensorProto.BOOL, []),
         helper.make_tensor_value_info(ctx_b, _elem(g), None)],
        initializer=b.initializers)
    # An explicit true condition: onnx.reference's Loop runs no iteration when it is omitted.
    true = g.const("blk_true", np.array(True), float_dtype=False)
    stacked = g.op("Loop", [nb, true], body=body, name="blk_loop")  # (nb, B, *rest)
    # ORT stacks scan outputs on a new axis, onnx.reference concatenates them on axis 0: both hold
    # the same data in the same order, so one Reshape pins the layout for either.
    batch = g.op("Shape", [batch_of], start=0, end=1, name="blk_batch")
    shape = g.op("Concat", [_as_1d(g, nb, "blk_count_1d"), batch, g.ints("blk_tail", tail)],
                 axis=0, name="blk_stacked_shape")
    return g.op("Reshape", [stacked, shape], name="blk_stacked")  # (nb, B, *rest)


def auto_core(g: GraphBuilder, q: str, k: str, v: str, c: MHAConfig,
              threshold: int = AUTO_THRESHOLD, block: int = BLOCK) -> str:
    """Opset 23+: ``If`` on the runtime T: one fused Attention node for T < threshold (fastest at
    short T, memory O(h*T^2) is small there), the blocked loop for T >= threshold."""
    t = _scalar_dim(g, q, 1, "auto_seq_len")  # ()
    short = g.op("Less", [t, g.ints("auto_threshold", threshold)], name="auto_is_short")  # () bool
    branches = []
    for tag, build in (("fused", lambda s: fused_core(s, q, k, v, c)),
                       ("blocked", lambda s: blocked_core(s, q, k, v, c, block, True))):
        s = _Sub(dtype=g.dtype, prefix=f"{tag}/")
        out = build(s)  # (B, T, inner)
        branches.append(helper.make_graph(
            s.nodes, g.name(f"auto_{tag}"), [],
            [helper.make_tensor_value_info(out, _elem(g), None)], initializer=s.initializers))
    return g.op("If", [short], then_branch=branches[0], else_branch=branches[1],
                name="auto_attention")  # (B, T, inner)
