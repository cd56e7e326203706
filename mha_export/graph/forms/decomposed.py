"""``decomposed``: standard ops only (MatMul, Where, Softmax), opset 17: the portable form that
onnx's reference evaluator runs. Memory O(N*T*S) for the scores."""
from __future__ import annotations

from ...config import MHAConfig
from ..builder import (GraphBuilder, alibi_bias, dim, merge_heads, repeat_kv,
                       row_masked_positions, scale_queries, score_mask, split_heads)
from ..ops import Ops
from .base import (ALL_FEATURES, QUADRATIC, AttentionIO, AttentionOut, GraphForm, cache_out,
                   keys_values, probabilities, static_keys_values)


def decomposed_core(g: GraphBuilder, io: AttentionIO, c: MHAConfig) -> AttentionOut:
    q = split_heads(g, scale_queries(g, io.q, c.scale), c.heads, c.head_dim, "q")  # (B, N, T, H)
    seq_len = dim(g, q, 2, "seq_len")  # () T
    window, chunk = c.sliding_window or 0, c.attention_chunk or 0
    if io.past_lengths is not None:  # a static cache: written in place, read up to each row
        keys, values, *present = static_keys_values(g, io, c, seq_len)  # (B, K, S, H)
        masked = row_masked_positions(g, io.past_lengths, seq_len,
                                      dim(g, keys, 2, "key_len"), window, chunk)  # (B,1,T,S)
    else:
        keys, values = present = keys_values(g, io, c)  # (B, K, S, H)
        masked = score_mask(g, c.causal, seq_len, dim(g, keys, 2, "key_len"),
                            io.attention_mask, window=window, chunk=chunk)  # (B|1, 1|., T, S)
    op = Ops(g)
    k_t = op.Transpose(repeat_kv(g, keys, c.groups, "k"), perm=[0, 1, 3, 2])  # (B, N, H, S)
    scores = op.MatMul(q, k_t)  # (B, N, T, S)
    bias = None if io.alibi is None else alibi_bias(
        g, io.alibi, seq_len, dim(g, keys, 2, "key_len"), io.past_lengths)  # (B|1, N, T, S)
    probs = probabilities(g, scores, masked, c, io.sinks, bias)  # (B, N, T, S)
    ctx = op.MatMul(probs, repeat_kv(g, values, c.groups, "v"))  # (B, N, T, H)
    return cache_out(io, merge_heads(g, ctx, c.v_inner), *present)  # (B, T, N*Hv)


FORM = GraphForm(
    name="decomposed", core=decomposed_core, min_opset=17, memory=QUADRATIC,
    summary="MatMul, causal/padding mask from Range/Greater on the runtime lengths, Where, "
            "Softmax, MatMul: standard ops only, the portable form",
    supports=ALL_FEATURES)
