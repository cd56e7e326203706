"""``blocked`` / ``blocked-plain``: an ONNX ``Loop`` over blocks of queries, memory linear in T.

Every ONNX Runtime CPU attention kernel materialises the (N, T, S) scores. Here a ``Loop`` runs one
block of ``bs`` queries per iteration; block i (queries [i*bs, (i+1)*bs), at key positions
P + i*bs ...) attends only to keys [0, P + (i+1)*bs), so one block's scores are (N, bs, end) and
nothing is computed above the diagonal block.

- The block count is ``nb = ceil(T / block)`` and the block size ``bs = ceil(T / nb)`` (<= block),
  both from the runtime T: queries are padded by fewer than ``nb`` rows (none when T < block), and
  the ragged last block's keys come from Slice clamping at S. Padded query rows are sliced off.
- Each block's mask comes from ``builder.score_mask`` with the block's start: (bs, end) causal
  comparisons (+ the padding keys of attention_mask), never a (T, S) mask.
- Queries are scaled by 1/sqrt(H) once, before the loop (never the scores).

Two bodies (``use_attention_op``): one standard ``Attention`` node per block (opset 23), or
MatMul / Where / Softmax / MatMul (opset 17). Without a cache or padding mask the Attention body
reads 3-D (B, len, D) slices (no transposes at all); otherwise blocks are 4-D (B, N, len, H).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from onnx import TensorProto, helper

from ...config import MHAConfig
from ..builder import (GraphBuilder, additive, alibi_bias, as_1d, ceil_div, dim, repeat_kv,
                       row_masked_positions, scale_queries, score_mask, split_heads)
from ..ops import Ops
from .base import (ALL_FEATURES, ATTENTION_NODE_FEATURES, LINEAR, AttentionIO, AttentionOut,
                   Feature, GraphForm, cache_out, keys_values, probabilities, read_cache,
                   static_keys_values)

BLOCK = 256
BLOCK_EDGES = (BLOCK, BLOCK + 1, 2 * BLOCK + 1)  # one block, two, three (the last ragged)


@dataclass(frozen=True)
class _Operands:
    """What the loop slices per block: queries padded to whole blocks, keys and values (all
    blocks read prefixes of them), the past length and the axis of each that is sliced."""

    queries: str  # (B, nb*bs, D) | (B, N, nb*bs, H)
    keys: str  # (B, S, D) | (B, K, S, H) | (B, K, H, S) for the plain body
    values: str  # (B, S, D) | (B, K, S, H)
    past: str | None  # () P; None for a flat call (no cache)
    query_axis: int
    key_axis: int
    value_axis: int
    flat: bool  # 3-D (B, len, D) slices: no cache, no padding mask, Attention body
    codes: bool = False  # keys/values are an int8 cache's codes: each block dequantizes its own


def blocked_core(g: GraphBuilder, io: AttentionIO, c: MHAConfig, block: int = BLOCK,
                 use_attention_op: bool = True) -> AttentionOut:
    if block < 1:
        raise ValueError(f"block must be positive, got {block}")
    op = Ops(g)
    seq_len = dim(g, io.q, 1, "blk_seq_len")  # () T
    n_blocks = ceil_div(g, seq_len, g.ints("blk_block", block), "blk_count")  # ()
    block_size = ceil_div(g, seq_len, n_blocks, "blk_size")  # () queries per block, <= block
    padding = op.Sub(op.Mul(n_blocks, block_size), seq_len)  # () rows that fill the last block
    operands, present = _operands(g, io, c, use_attention_op, seq_len, padding)
    body = g.sub("blk/")
    iteration, cond = body.name("iter"), body.name("cond_in")
    context = _block_context(body, io, c, operands, iteration, block_size, use_attention_op)
    tail = [-1, c.v_inner] if operands.flat else [c.heads, -1, c.value_dim]
    ctx = run_loop(g, body, n_blocks, iteration, cond, context, operands.queries,
                    tail)  # (nb, B, bs, D) | (nb, B, N, bs, H)
    perm = [1, 0, 2, 3] if operands.flat else [1, 0, 3, 2, 4]
    ctx = op.Transpose(ctx, perm=perm)  # (B, nb, bs, [N,] H|D)
    ctx = op.Reshape(ctx, g.ints("blk_merged_shape", [0, -1, c.v_inner]))  # (B, nb*bs, N*Hv)
    ctx = op.Slice(ctx, g.ints("blk_zero_1d", [0]), as_1d(g, seq_len, "blk_seq_len_1d"),
                   g.ints("blk_axes1_1d", [1]))  # (B, T, D): the padded rows dropped
    return cache_out(io, ctx, *present)


def _operands(g: GraphBuilder, io: AttentionIO, c: MHAConfig, use_attention_op: bool,
              seq_len: str, padding: str) -> tuple[_Operands, tuple[str, str]]:
    """The loop's operands, and the present keys/values (B, K, S, H) of a call with a cache."""
    op = Ops(g)
    q = scale_queries(g, io.q, c.scale)  # (B, T, D)
    if use_attention_op and not io.has_cache and io.attention_mask is None:
        ops = _Operands(pad_axis(g, q, padding, 1), io.k, io.v, None, 1, 1, 1, True)
        return ops, (io.k, io.v)
    q = split_heads(g, q, c.heads, c.head_dim, "blk_q")  # (B, N, T, H)
    if io.past_lengths is not None:  # a static cache: written in place, valid prefix read
        # the Attention body slices each block's keys from the buffers themselves; the plain
        # body transposes the valid prefix once
        keys, values, *present = static_keys_values(
            g, io, c, seq_len, valid_prefix=not use_attention_op)  # (B, K, S|C, H)
        past = op.ReduceMax(io.past_lengths, keepdims=0)  # () the longest row's
    else:
        keys, values = present = keys_values(g, io, c)  # (B, K, S, H)
        past = op.Sub(dim(g, keys, 2, "blk_key_len"), seq_len)  # () P = S - T
    if use_attention_op:  # (an int8 cache's buffers: codes, read block by block)
        return _Operands(pad_axis(g, q, padding, 2), keys, values, past, 2, 2, 2, False,
                         codes=io.int8_cache is not None and io.past_lengths is not None), present
    # plain MatMuls: every query head gets its kv head's copy, keys transposed for q @ k^T
    keys_t = op.Transpose(repeat_kv(g, keys, c.groups, "blk_k"), perm=[0, 1, 3, 2])  # (B,N,H,S)
    values = repeat_kv(g, values, c.groups, "blk_v")  # (B, N, S, H)
    return _Operands(pad_axis(g, q, padding, 2), keys_t, values, past, 2, 3, 2, False), present


def _key_range(b: GraphBuilder, io: AttentionIO, c: MHAConfig, ops: _Operands, start: str,
               block_size: str) -> tuple[str, str, str]:
    """Keys [key_start, key_end) the block reads, and where its first query sits relative to
    key_start: a scalar, or (B,) for a static cache, whose rows start at their own
    past_lengths (the range then covers the longest row's keys and the shortest row's window)."""
    op = Ops(b)  # the *first_key names: a test's fault moves them
    first_key = start if ops.past is None else op.Add(ops.past, start,
                                                      name="first_key")  # () longest row's
    causal = c.causal or io.past_lengths is not None  # a static cache's rows always are
    key_end = (op.Add(first_key, block_size) if causal
               else b.ints("all_keys", np.iinfo(np.int64).max))  # () Slice clamps at S
    row_first = oldest_first = first_key
    if io.past_lengths is not None:
        row_first = op.Add(io.past_lengths, start, name="row_first_key")  # (B,)
        shortest = op.ReduceMin(io.past_lengths, keepdims=0)  # ()
        oldest_first = op.Add(shortest, start, name="shortest_first_key")  # ()
    if not c.sliding_window:
        return b.ints("zero", 0), key_end, row_first
    # keys older than the block's window are never read: the oldest its first query sees
    oldest = op.Sub(oldest_first, b.ints("window_back", c.sliding_window - 1))  # ()
    key_start = op.Max(oldest, b.ints("zero", 0))  # ()
    return key_start, key_end, op.Sub(row_first, key_start)


def _block_context(b: GraphBuilder, io: AttentionIO, c: MHAConfig, ops: _Operands,
                   iteration: str, block_size: str, use_attention_op: bool) -> str:
    """The loop body: block ``iteration``'s queries [start, start + bs) sit at key positions
    P + start ...; they read keys [key_start, key_end) only. Returns the block's context."""
    op = Ops(b)
    start = op.Mul(iteration, block_size)  # () first query of the block
    key_start, key_end, first_rel = _key_range(b, io, c, ops, start, block_size)
    key_start_1d = as_1d(b, key_start, "key_start_1d")  # (1,)
    key_end_1d = as_1d(b, key_end, "key_end_1d")  # (1,)
    query_end = op.Add(start, block_size)  # ()
    q_block = op.Slice(ops.queries, as_1d(b, start, "start_1d"), as_1d(b, query_end, "q_end_1d"),
                       b.ints("q_axis", [ops.query_axis]))  # (B, bs, D) | (B, N, bs, H)
    k_block = op.Slice(ops.keys, key_start_1d, key_end_1d, b.ints(
        "k_axis", [ops.key_axis]))  # (B, len, D) | (B, K, len, H) | (B, N, H, len)
    v_block = op.Slice(ops.values, key_start_1d, key_end_1d,
                       b.ints("v_axis", [ops.value_axis]))  # (B, len, D) | (B, K, len, H)
    if ops.codes:  # this block's keys and values dequantized, never the whole cache
        k_block, v_block = read_cache(b, io, k_block, v_block)  # (B, K, len, H)
    key_len = dim(b, k_block, ops.key_axis, "key_len")
    window, chunk = c.sliding_window or 0, c.attention_chunk or 0  # (chunks: key_start 0)
    if io.past_lengths is not None:  # row b's query i sits at first_rel[b] + i
        masked = row_masked_positions(b, first_rel, block_size, key_len, window,
                                      chunk)  # (B, 1, bs, len)
    else:  # query i of the block sits at first_rel + i (positions relative to key_start)
        mask_block = None if io.attention_mask is None else op.Slice(
            io.attention_mask, key_start_1d, key_end_1d, b.ints("mask_axis", [1]))  # (B, len)
        masked = score_mask(b, c.causal, block_size, key_len, mask_block, start=first_rel,
                            window=window, chunk=chunk)  # (.., bs, len) bool
    if use_attention_op:
        return _attention_body(b, c, io, q_block, k_block, v_block, masked,
                               ops.flat)  # (B, bs, D) | (B, N, bs, H)
    bias = None if io.alibi is None else alibi_bias(
        b, io.alibi, block_size, key_len, first_rel)  # (B|1, N, bs, len)
    return _plain_body(b, c, io, q_block, k_block, v_block, masked, bias)  # (B, N, bs, H)


def pad_axis(g: GraphBuilder, x: str, pad: str, axis: int) -> str:
    """Pad x with ``pad`` zero rows at the end of ``axis`` (x is 3-D or 4-D)."""
    rank = 3 if axis == 1 else 4
    op = Ops(g)
    pads = op.Concat(g.ints("blk_pads_head", [0] * (rank + axis)), as_1d(g, pad, "blk_pad_1d"),
                     g.ints("blk_pads_tail", [0] * (rank - axis - 1)), axis=0)  # (2*rank,)
    if g.dtype not in PAD_DTYPES:  # padded in float32 (exact both ways)
        return op.Cast(op.Pad(op.Cast(x, to=TensorProto.FLOAT), pads, mode="constant"),
                       to=g.elem)
    return op.Pad(x, pads, mode="constant")


# the dtypes ONNX Runtime's Pad has kernels for on every provider (1.31's CUDA Pad has no
# bfloat16: a bf16 Pad made the CUDA session fail to initialise, "Provider type for Pad node
# ... is not set", H200 2026-11-27)
PAD_DTYPES = ("float32", "float16")


def _attention_body(b: GraphBuilder, c: MHAConfig, io: AttentionIO, qb: str, kb: str, vb: str,
                    masked: str | None, flat: bool) -> str:
    """One Attention node per block (queries already scaled)."""
    # Reshape (no copy in ORT) restores the static sizes that shape inference loses through a
    # Slice with runtime bounds; without it ORT infers a 0 width for the output and warns.
    if flat:
        q_shape = b.ints("width_shape", [0, -1, c.inner])
        kv_shape = b.ints("kv_width_shape", [0, -1, c.kv_inner])
    else:
        q_shape = b.ints("q_shape", [0, c.heads, -1, c.head_dim])
        kv_shape = b.ints("kv_shape", [0, c.kv_heads, -1, c.head_dim])
    op = Ops(b)
    qb = op.Reshape(qb, q_shape)  # (B, bs, D) | (B, N, bs, H)
    kb = op.Reshape(kb, kv_shape)  # (B, len, K*H) | (B, K, len, H)
    vb = op.Reshape(vb, kv_shape)  # (B, len, K*H) | (B, K, len, H)
    inputs = [qb, kb, vb] + ([additive(b, masked, "block_bias")] if masked else [])
    heads = dict(q_num_heads=c.heads, kv_num_heads=c.kv_heads) if flat else {}
    if c.softcap:  # applied to the scaled scores, before the mask (ONNX Runtime 1.31)
        heads["softcap"] = float(c.softcap)
    return op.Attention(*inputs, scale=1.0, **heads)  # (B, bs, D) | (B, N, bs, H)


def _plain_body(b: GraphBuilder, c: MHAConfig, io: AttentionIO, qb: str, kb: str, vb: str,
                masked: str | None, bias: str | None) -> str:
    """q (B, N, bs, H) @ k^T (B, N, H, end) -> probabilities (softcap, ALiBi's bias, mask,
    sinks) -> @ v -> (B, N, bs, H)."""
    op = Ops(b)
    scores = op.MatMul(qb, kb)  # (B, N, bs, end)
    probs = probabilities(b, scores, masked, c, io.sinks, bias)  # (B, N, bs, end)
    return op.MatMul(probs, vb)  # (B, N, bs, H)


def run_loop(g: GraphBuilder, b: GraphBuilder, nb: str, it: str, cond: str, ctx_b: str,
              batch_of: str, tail: list[int]) -> str:
    """Wrap body builder b (iteration ``it``, condition ``cond``, scan output ctx_b of shape
    (B, *rest)) in a Loop of nb iterations; returns the stacked scan output (nb, B, *rest).
    ``batch_of``: an outer value with B first; ``tail``: rest, with one -1."""
    cond_out = Ops(b).Identity(cond)
    body = b.subgraph(
        g.name("blk_body"),
        [helper.make_tensor_value_info(it, TensorProto.INT64, []),
         helper.make_tensor_value_info(cond, TensorProto.BOOL, [])],
        [helper.make_tensor_value_info(cond_out, TensorProto.BOOL, []),
         helper.make_tensor_value_info(ctx_b, g.elem, None)])
    # An explicit true condition: onnx.reference's Loop runs no iteration when it is omitted.
    true = g.const("blk_true", np.array(True), float_dtype=False)
    op = Ops(g)
    stacked = op.Loop(nb, true, body=body)  # (nb, B, *rest)
    # ORT stacks scan outputs on a new axis, onnx.reference concatenates them on axis 0: both hold
    # the same data in the same order, so one Reshape pins the layout for either.
    batch = op.Shape(batch_of, start=0, end=1)  # (1,) B
    shape = op.Concat(as_1d(g, nb, "blk_count_1d"), batch, g.ints("blk_tail", tail),
                      axis=0)  # [nb, B, *tail]
    return op.Reshape(stacked, shape)  # (nb, B, *rest)


BLOCKED = GraphForm(
    name="blocked", core=blocked_core, min_opset=23, memory=LINEAR,
    summary=f"a Loop over blocks of <= {BLOCK} queries, one Attention node per block over keys "
            "[0, block end), mask only for the block",
    switch_seq_lens=BLOCK_EDGES,
    supports=ATTENTION_NODE_FEATURES | {Feature.STATIC_CACHE, Feature.INT8_CACHE})
BLOCKED_PLAIN = GraphForm(
    name="blocked-plain", core=functools.partial(blocked_core, use_attention_op=False),
    min_opset=17, memory=LINEAR,
    summary="the same loop with MatMul/Where/Softmax/MatMul (portable)",
    switch_seq_lens=BLOCK_EDGES, supports=ALL_FEATURES)
