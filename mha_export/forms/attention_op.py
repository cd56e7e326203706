"""``attention-op``: one standard ONNX ``Attention`` node (opset 23). Memory O(N*T*S).

Without cache or padding mask: 3-D q/k/v (B, T, D) with ``is_causal=1`` (ONNX Runtime's CPU
kernel reads 3-D inputs with strided GEMMs: no transposes). With a cache or a padding mask: 4-D
(B, N, T, H) queries over the (B, K, S, H) present keys/values and an additive mask built by
``graph.masked_scores`` (bottom-right causal + padding), never ``is_causal`` (whose alignment for
T != S differs between specs and kernels).
"""
from __future__ import annotations

from ..config import MHAConfig
from ..graph import GraphBuilder, additive, dim, masked_scores, merge_heads, split_heads
from .base import AttentionIO, AttentionOut, GraphForm, cache_out, keys_values


def attention_op_core(g: GraphBuilder, io: AttentionIO, c: MHAConfig) -> AttentionOut:
    if not io.has_cache and io.attention_mask is None:
        return AttentionOut(g.op("Attention", [io.q, io.k, io.v], name="attention",
                                 is_causal=int(c.causal), q_num_heads=c.heads,
                                 kv_num_heads=c.kv_heads, scale=c.scale))  # (B, T, D)
    q = split_heads(g, io.q, c.heads, c.head_dim, "q")  # (B, N, T, H)
    keys, values = keys_values(g, io, c)  # (B, K, S, H)
    masked = masked_scores(g, c.causal, dim(g, q, 2, "seq_len"), dim(g, keys, 2, "key_len"),
                           io.attention_mask)  # (B|1, 1|., T, S) bool
    inputs = [q, keys, values] + ([additive(g, masked, "attn_bias")] if masked else [])
    ctx = g.op("Attention", inputs, name="attention", scale=c.scale)  # (B, N, T, H)
    return cache_out(io, merge_heads(g, ctx, c.inner), keys, values)  # (B, T, D)


FORM = GraphForm(
    name="attention-op", core=attention_op_core, min_opset=23, memory="O(N*T*S)",
    summary="one standard Attention node (is_causal=1 on 3-D q/k/v; with a cache or padding "
            "mask, 4-D q/k/v and an additive mask)",
    supports=frozenset({"non-causal", "kv-cache", "attention-mask"}))
