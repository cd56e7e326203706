"""ONNX Runtime's own attention operators (domain com.microsoft): they run only in ONNX Runtime.

- ``contrib-mha``: ``MultiHeadAttention`` with ``unidirectional=1`` (causal), 3-D q/k/v.
- ``contrib-gqa``: ``GroupQueryAttention``, causal by construction; its ``seqlens_k`` (B,) = T - 1
  and ``total_sequence_length`` = T come from the runtime shape. Its CPU kernel needs H % 8 == 0.
  An int8 static cache: the node's own (kv_cache_bit_width=8, static k_scale / v_scale).
  Its present outputs are always asked for: ONNX Runtime's CUDA kernel (fp16 / bf16) refuses
  to run without them, and its CPU kernel takes its flash path only with them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
from onnx import TensorProto

from ...config import MHAConfig
from ..builder import CONTRIB, GraphBuilder
from ..ops import Ops
from .base import QUADRATIC, AttentionIO, AttentionOut, Feature, GraphForm, cache_out


def contrib_mha_core(g: GraphBuilder, io: AttentionIO, c: MHAConfig) -> AttentionOut:
    return AttentionOut(Ops(g).MultiHeadAttention(
        io.q, io.k, io.v, domain=CONTRIB, num_heads=c.heads, unidirectional=int(c.causal),
        scale=c.scale))  # (B, T, D)


@dataclass(frozen=True)
class GqaLengths:
    """GroupQueryAttention's lengths of a call (``gqa_lengths``)."""

    seqlens: str  # (B,) int32: each row's last key, past_lengths[b] + T - 1
    total: str  # () int32: total_sequence_length
    unrunnable: Optional[str]  # (1,) bool: a call the node cannot run (None: no cache)


def gqa_lengths(g: GraphBuilder, io: AttentionIO, x: str, batch_prompts: bool = True
                ) -> GqaLengths:
    """Without a cache: the whole call is the prompt (seqlens_k = T - 1, total = T). With a
    static cache: past_key/past_value are the app's buffers, which the node writes in place
    when present is bound to them; seqlens_k[b] = past_lengths[b] + T - 1, and total is the
    buffer's length S for one token or one row (ONNX Runtime's decoding and chunk paths read
    each row's length from seqlens_k) and T for a batch of prompts, which it can run at past 0
    only: T > 1 over a non-empty cache at batch > 1 is ``unrunnable``.

    total_sequence_length is read on the host: it comes from shapes alone. Computed from
    values (max(past_lengths) + T), ONNX Runtime 1.31's CUDA kernel read it before the device
    had written it (measured on an H200: 0, or a stale length, and wrong outputs).
    x: the call's (B, T, ...) queries (or packed q/k/v); ``batch_prompts`` False: a batch of
    prompts is ``unrunnable`` too, over an empty cache or without one."""
    op = Ops(g)
    zero, one = g.ints("zero_1d", [0]), g.ints("one_1d", [1])
    b, t = op.Shape(x, start=0, end=1), op.Shape(x, start=1, end=2)  # (1,) B, (1,) T
    unrunnable = decoding = None
    if io.past_lengths is not None or not batch_prompts:  # (1,) one token or one row
        decoding = op.Or(op.Equal(t, one), op.Equal(b, one))
    if io.past_lengths is None:  # every row starts at 0
        starts = op.Expand(zero, b)  # (B,)
        total = t  # (1,) T
    else:
        starts = io.past_lengths  # (B,)
        total = op.Where(decoding, op.Shape(io.past_key, start=2, end=3), t)  # (1,) S or T
    if not batch_prompts:
        unrunnable = op.Not(decoding)  # (1,) prompts of B > 1
    elif io.past_lengths is not None:  # (1,) prompts of B > 1 over a cache
        over_cache = op.Greater(op.ReduceMax(starts, keepdims=1), zero)  # (1,)
        unrunnable = op.And(op.Not(decoding), over_cache)
    # (B,) past_lengths + (T - 1) ("row_ends": a test shifts it); T - 1 folds once T is fixed
    last = op.Add(starts, op.Sub(t, one), name="row_ends")
    seqlens = op.Cast(last, to=TensorProto.INT32)  # (B,) int32
    total = op.Cast(op.Squeeze(total, g.ints("axis0", [0])), to=TensorProto.INT32)  # () int32
    return GqaLengths(seqlens, total, unrunnable)


def gqa_cache(io: AttentionIO) -> list[str]:
    """past_key, past_value: the static buffers, or none (a call without a cache)."""
    return [io.past_key, io.past_value] if io.past_lengths is not None else ["", ""]


def gqa_out(g: GraphBuilder, io: AttentionIO, lengths: GqaLengths, y: str, present_key: str,
            present_value: str) -> AttentionOut:
    """The node's outputs as the core's: a call it cannot run made NaN, never a wrong
    number; present_key / present_value (B, K, S, H) the cache's own buffers when one is
    bound, else scratch the graph drops."""
    if lengths.unrunnable is not None:  # chosen in float32 (a CPU kernel: with the call's
        op = Ops(g)  # shape fixed, ONNX Runtime folds it to 0 and drops y + 0, no node left)
        poison = op.Where(lengths.unrunnable, g.const("guard_f32.nan", np.float32(np.nan), False),
                          g.const("guard_f32.zero", np.float32(0), False))  # (1,)
        y = op.Add(y, op.Cast(poison, to=g.elem))  # (B, T, D)
    return cache_out(io, y, present_key, present_value)


def contrib_gqa_core(g: GraphBuilder, io: AttentionIO, c: MHAConfig) -> AttentionOut:
    """q, k and v separate (projected and rotated before the node); the lengths of
    ``gqa_lengths``. An int8 static cache: the node's own (quantized on write)."""
    lengths = gqa_lengths(g, io, io.q)
    inputs, int8 = [io.q, io.k, io.v, *gqa_cache(io), lengths.seqlens, lengths.total], {}
    if io.int8_cache:  # the node quantizes on write and reads its buffers dequantized
        s = io.int8_cache
        inputs += ["", "", "", "", "", s.k_scale, s.v_scale]  # after cos/sin .. head_sink
        int8 = dict(kv_cache_bit_width=8, k_quant_type=s.k_quant_type,
                    v_quant_type=s.v_quant_type)
    # present_key / present_value always asked for (the module's docstring)
    y, present_key, present_value = Ops(g).GroupQueryAttention(
        *inputs, n_out=3, domain=CONTRIB, num_heads=c.heads, kv_num_heads=c.kv_heads,
        scale=c.scale, **int8)
    return gqa_out(g, io, lengths, y, present_key, present_value)


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
