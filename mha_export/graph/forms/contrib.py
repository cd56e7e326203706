"""ONNX Runtime's own attention operators (domain com.microsoft): they run only in ONNX Runtime.

- ``contrib-mha``: ``MultiHeadAttention`` with ``unidirectional=1`` (causal), 3-D q/k/v.
- ``contrib-gqa``: ``GroupQueryAttention``, causal by construction; its ``seqlens_k`` (B,) = T - 1
  and ``total_sequence_length`` = T come from the runtime shape. Its CPU kernel needs H % 8 == 0.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ...config import MHAConfig
from ..builder import CONTRIB, GraphBuilder
from .base import QUADRATIC, AttentionIO, AttentionOut, Feature, GraphForm


def contrib_mha_core(g: GraphBuilder, io: AttentionIO, c: MHAConfig) -> AttentionOut:
    return AttentionOut(g.op("MultiHeadAttention", [io.q, io.k, io.v], name="attention",
                             domain=CONTRIB, num_heads=c.heads, unidirectional=int(c.causal),
                             scale=c.scale))  # (B, T, D)


def contrib_gqa_core(g: GraphBuilder, io: AttentionIO, c: MHAConfig) -> AttentionOut:
    t = g.op("Cast", [g.op("Shape", [io.q], start=1, end=2, name="seq_len")],
             to=TensorProto.INT32, name="seq_len_i32")  # (1,)
    total = g.op("Squeeze", [t, g.ints("axis0", [0])], name="total_len")  # ()
    last = g.op("Sub", [t, g.const("one_i32", np.array([1], np.int32), float_dtype=False)],
                name="last_pos")  # (1,)
    seqlens = g.op("Expand", [last, g.op("Shape", [io.q], start=0, end=1, name="batch")],
                   name="seqlens_k")  # (B,)
    return AttentionOut(g.op("GroupQueryAttention", [io.q, io.k, io.v, "", "", seqlens, total],
                             name="attention", domain=CONTRIB, num_heads=c.heads,
                             kv_num_heads=c.kv_heads, scale=c.scale))  # (B, T, D)


def _gqa_refuses(c: MHAConfig) -> str | None:
    if c.head_dim % 8:
        return f"needs head_dim % 8 == 0 (ONNX Runtime's kernel), got {c.head_dim}"
    return None


CONTRIB_MHA = GraphForm(
    name="contrib-mha", core=contrib_mha_core, min_opset=17, memory=QUADRATIC,
    summary="ONNX Runtime's com.microsoft.MultiHeadAttention (unidirectional=1)",
    domains=((CONTRIB, 1),), supports=frozenset({Feature.NON_CAUSAL}), standard=False)
CONTRIB_GQA = GraphForm(
    name="contrib-gqa", core=contrib_gqa_core, min_opset=17, memory=QUADRATIC,
    summary="ONNX Runtime's com.microsoft.GroupQueryAttention (causal only; head_dim % 8 == 0)",
    domains=((CONTRIB, 1),), supports=frozenset({Feature.GQA}), refuse=_gqa_refuses, standard=False)
