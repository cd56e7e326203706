"""``decomposed``: standard ops only (MatMul, Where, Softmax), opset 17: the portable form that
onnx's reference evaluator runs. Memory O(N*T*S) for the scores."""
from __future__ import annotations

from ...config import MHAConfig
from ..builder import (GraphBuilder, dim, merge_heads, repeat_kv,
                     scale_queries, score_mask, split_heads)
from .base import (ALL_FEATURES, QUADRATIC, AttentionIO, AttentionOut, GraphForm, cache_out,
                   keys_values, probabilities)


def decomposed_core(g: GraphBuilder, io: AttentionIO, c: MHAConfig) -> AttentionOut:
    q = split_heads(g, scale_queries(g, io.q, c.scale), c.heads, c.head_dim, "q")  # (B, N, T, H)
    keys, values = keys_values(g, io, c)  # (B, K, S, H)
    k_t = g.op("Transpose", [repeat_kv(g, keys, c.groups, "k")], perm=[0, 1, 3, 2],
               name="k_bhds")  # (B, N, H, S)
    scores = g.op("MatMul", [q, k_t], name="scores")  # (B, N, T, S)
    masked = score_mask(g, c.causal, dim(g, q, 2, "seq_len"), dim(g, keys, 2, "key_len"),
                        io.attention_mask, window=c.sliding_window or 0)  # (B|1, 1|., T, S)
    probs = probabilities(g, scores, masked, c, io.sinks)  # (B, N, T, S)
    ctx = g.op("MatMul", [probs, repeat_kv(g, values, c.groups, "v")],
               name="context")  # (B, N, T, H)
    return cache_out(io, merge_heads(g, ctx, c.inner), keys, values)  # (B, T, D)


FORM = GraphForm(
    name="decomposed", core=decomposed_core, min_opset=17, memory=QUADRATIC,
    summary="MatMul, causal/padding mask from Range/Greater on the runtime lengths, Where, "
            "Softmax, MatMul: standard ops only, the portable form",
    supports=ALL_FEATURES)
