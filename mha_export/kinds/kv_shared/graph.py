"""A KV-shared layer as an ONNX graph (layer.py's function) and its one form: the decomposed
core (MatMul, Where, Softmax: standard ops, opset 17) over the keys and values given as
inputs, which it reads and never writes.

    x -> q_proj -> q norm -> rotary -> q                        (B, T, N*H)
      shared / shared-masked      shared_key, shared_value: this call's keys (S = T)
      shared-kv-cache             the source layer's present (S = P + T), attention_mask (B, S)
      shared-static-cache         the source layer's buffers after its write, each row's valid
                                  prefix [0, past_lengths[b] + T) read
    the core -> context (B, T, N*Hv) -> gate -> output norm -> o_proj -> y

Shape legend: B = batch, T = this call, S = keys read, N = heads, K = kv heads, H = head size.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from ...config import MHAConfig
from ...graph.builder import GraphBuilder
from ...graph.forms import decomposed
from ...graph.forms.base import AttentionIO, GraphForm
from ...graph.model import layer_output, normalize_heads, rotate
from ...graph.rotary import rotary_cos_sin
from ...layer.base import AttentionWeights
from ...signature import Signature


def build_shared(g: GraphBuilder, c: MHAConfig, w: AttentionWeights, form: GraphForm,
                 sig: Signature, opset: int = 17, kv_cache: Any = None) -> dict[str, str]:
    """The layer's nodes; returns the graph value of y."""
    q = g.linear("x", "q_proj", w.wq, w.bq)  # (B, T, N*H)
    if c.qk_norm != "none":
        q = normalize_heads(g, c, q, c.heads, w.q_norm, w.q_norm_bias, "q_norm")
    if c.rotary != "none":
        cos, sin = rotary_cos_sin(g, "position_ids", c)  # (B, T, rd/2)
        q = rotate(g, c, q, c.heads, cos, sin, opset, "q")  # (B, T, N*H)
    named = set(sig.input_names)
    sinks = None if w.sinks is None else g.const("attn.sinks", w.sinks.reshape(1, -1, 1, 1))
    alibi = None if w.alibi_slopes is None else g.const(
        "attn.alibi_slopes", w.alibi_slopes.reshape(1, -1, 1, 1))  # (1, N, 1, 1)
    io = AttentionIO(q, None, None, "shared_key", "shared_value",  # (B, K, S|C, H)
                     "attention_mask" if "attention_mask" in named else None,
                     sinks=sinks, alibi=alibi,
                     past_lengths="past_lengths" if "past_lengths" in named else None)
    context = form.core(g, io, c).context  # (B, T, N*Hv)
    return {"y": layer_output(g, c, w, context)}  # (B, T, dim)


SHARED_KEYS = dataclasses.replace(
    decomposed.FORM, name="shared-keys", kind="kv_shared", layer=build_shared,
    summary="a KV-shared layer (the only form for it): the decomposed core over the keys and "
            "values given as inputs (MatMul, Where, Softmax: standard ops)")
FORMS = (SHARED_KEYS,)
