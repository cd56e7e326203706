"""ONNX Runtime's own attention operators (domain com.microsoft): they run only in ONNX Runtime.

- ``contrib-mha``: ``MultiHeadAttention`` with ``unidirectional=1`` (causal), 3-D q/k/v.
- ``contrib-gqa``: ``GroupQueryAttention``, causal by construction; its ``seqlens_k`` (B,) = T - 1
  and ``total_sequence_length`` = T come from the runtime shape. Its CPU kernel needs H % 8 == 0.
  An int8 static cache: the node's own (kv_cache_bit_width=8, static k_scale / v_scale).
  Its present outputs are always asked for: ONNX Runtime's CUDA kernel (fp16 / bf16) refuses
  to run without them, and its CPU kernel takes its flash path only with them.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ...config import MHAConfig
from ..builder import CONTRIB, GraphBuilder
from ..ops import Ops
from .base import QUADRATIC, AttentionIO, AttentionOut, Feature, GraphForm


def contrib_mha_core(g: GraphBuilder, io: AttentionIO, c: MHAConfig) -> AttentionOut:
    return AttentionOut(Ops(g).MultiHeadAttention(
        io.q, io.k, io.v, domain=CONTRIB, num_heads=c.heads, unidirectional=int(c.causal),
        scale=c.scale))  # (B, T, D)


def contrib_gqa_core(g: GraphBuilder, io: AttentionIO, c: MHAConfig) -> AttentionOut:
    """Without a cache: the whole call is the prompt (seqlens_k = T - 1, total = T). With a
    static cache: past_key/past_value are the app's buffers, which the node writes in place
    when present is bound to them; seqlens_k[b] = past_lengths[b] + T - 1, and total is the
    buffer's length S for one token or one row (ONNX Runtime's decoding and chunk paths read
    each row's length from seqlens_k) and T for a batch of prompts, which it can run at past 0
    only: T > 1 over a non-empty cache at batch > 1 makes the context NaN, never a wrong number.

    total_sequence_length is read on the host: it comes from shapes alone. Computed from
    values (max(past_lengths) + T), ONNX Runtime 1.31's CUDA kernel read it before the device
    had written it (measured on an H200: 0, or a stale length, and wrong outputs)."""
    op = Ops(g)
    zero, one = g.ints("zero_1d", [0]), g.ints("one_1d", [1])
    b, t = op.Shape(io.q, start=0, end=1), op.Shape(io.q, start=1, end=2)  # (1,) B, (1,) T
    if io.past_lengths is None:  # every row starts at 0
        starts = op.Expand(zero, b)  # (B,)
        total = t  # (1,) T
    else:
        starts = io.past_lengths  # (B,)
        decoding = op.Or(op.Equal(t, one), op.Equal(b, one))  # (1,) one token or one row
        total = op.Where(decoding, op.Shape(io.past_key, start=2, end=3), t)  # (1,) S or T
        over_cache = op.Greater(op.ReduceMax(starts, keepdims=1), zero)  # (1,)
        unrunnable = op.And(op.Not(decoding), over_cache)  # (1,) prompts of B > 1 over a cache
    # (B,) past_lengths + T - 1 ("row_ends": a test shifts it)
    last = op.Sub(op.Add(starts, t, name="row_ends"), one)
    seqlens = op.Cast(last, to=TensorProto.INT32)  # (B,) int32
    total = op.Cast(op.Squeeze(total, g.ints("axis0", [0])), to=TensorProto.INT32)  # () int32
    cache = [io.past_key, io.past_value] if io.past_lengths is not None else ["", ""]
    inputs, int8 = [io.q, io.k, io.v, *cache, seqlens, total], {}
    if io.int8_cache:  # the node quantizes on write and reads its buffers dequantized
        s = io.int8_cache
        inputs += ["", "", "", "", "", s.k_scale, s.v_scale]  # after cos/sin .. head_sink
        int8 = dict(kv_cache_bit_width=8, k_quant_type=s.k_quant_type,
                    v_quant_type=s.v_quant_type)
    # present_key / present_value (B, kvN, total, H): the cache's own buffers when one is bound,
    # else scratch the graph drops
    y, present_key, present_value = op.GroupQueryAttention(
        *inputs, n_out=3, domain=CONTRIB, num_heads=c.heads, kv_num_heads=c.kv_heads,
        scale=c.scale, **int8)
    if io.past_lengths is None:
        return AttentionOut(y)
    poison = op.Where(unrunnable, g.const("nan", np.nan), g.const("zero", 0.0))  # (1,)
    return AttentionOut(op.Add(y, poison), present_key, present_value)  # (B, T, D)


def _gqa_refuses(c: MHAConfig) -> str | None:
    if c.head_dim % 8:
        return f"needs head_dim % 8 == 0 (ONNX Runtime's kernel), got {c.head_dim}"
    return None


CONTRIB_MHA = GraphForm(
    name="contrib-mha", core=contrib_mha_core, min_opset=17, memory=QUADRATIC,
    summary="ONNX Runtime's com.microsoft.MultiHeadAttention (unidirectional=1)",
    supports=frozenset({Feature.NON_CAUSAL}), standard=False)
CONTRIB_GQA = GraphForm(
    name="contrib-gqa", core=contrib_gqa_core, min_opset=17, memory=QUADRATIC,
    summary="ONNX Runtime's com.microsoft.GroupQueryAttention (causal only; head_dim % 8 == 0)",
    supports=frozenset({Feature.GQA, Feature.STATIC_CACHE, Feature.INT8_CACHE}),
    refuse=_gqa_refuses, standard=False, static_chunks=False)
