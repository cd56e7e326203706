"""``attention-op``: one standard ONNX ``Attention`` node (opset 23). Memory O(N*T*S).

Without cache or padding mask: 3-D q/k/v (B, T, D) with ``is_causal=1`` (ONNX Runtime's CPU
kernel reads 3-D inputs with strided GEMMs: no transposes). With a cache: still 3-D q/k/v, the
node's own past_key/past_value inputs and present outputs (ONNX Runtime appends the new keys
itself: half the time of a separate Concat for a single-token step at P = 1024, measured), and an
additive mask built by ``builder.score_mask`` (bottom-right causal + padding), never
``is_causal`` (whose alignment for T != S differed between kernels).
"""
from __future__ import annotations

from ...config import MHAConfig
from ..builder import GraphBuilder, additive, dim, score_mask
from ..ops import Ops
from .base import ATTENTION_NODE_FEATURES, QUADRATIC, AttentionIO, AttentionOut, GraphForm


def attention_op_core(g: GraphBuilder, io: AttentionIO, c: MHAConfig) -> AttentionOut:
    heads = dict(q_num_heads=c.heads, kv_num_heads=c.kv_heads, scale=c.scale,
                 **({"softcap": float(c.softcap)} if c.softcap else {}))
    op = Ops(g)
    if not (io.has_cache or io.attention_mask or c.sliding_window or c.attention_chunk):
        return AttentionOut(op.Attention(io.q, io.k, io.v, is_causal=int(c.causal),
                                         **heads))  # (B, T, D)
    t = dim(g, io.q, 1, "seq_len")  # () T
    s = op.Add(dim(g, io.past_key, 2, "past_len"), t) if io.has_cache else t  # () S = P + T
    masked = score_mask(g, c.causal, t, s, io.attention_mask, window=c.sliding_window or 0,
                        chunk=c.attention_chunk or 0)  # (B|1, 1, T, S) bool
    inputs = [io.q, io.k, io.v, additive(g, masked, "attn_bias") if masked else ""]
    if not io.has_cache:
        return AttentionOut(op.Attention(*inputs, **heads))  # (B, T, D)
    ctx, keys, values = op.Attention(*inputs, io.past_key, io.past_value, n_out=3,
                                     **heads)  # (B, T, D), 2 x (B, K, S, H)
    return AttentionOut(ctx, keys, values)


FORM = GraphForm(
    name="attention-op", core=attention_op_core, min_opset=23, memory=QUADRATIC,
    summary="one standard Attention node on 3-D q/k/v (is_causal=1; with a cache or padding "
            "mask: an explicit bottom-right mask, and the node's own past/present)",
    supports=ATTENTION_NODE_FEATURES)
