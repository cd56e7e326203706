"""Build the ONNX model of a signature from layout-neutral weights, with one graph form's core.

Every form shares the projections:

    x (B, T, d_in) -> MatMul qkv.weight (+ qkv.bias) -> (B, T, 3*D) -> Split -> q, k, v
    ... the form's attention core (forms/) ... -> context (B, T, D) -> MatMul out.weight -> y

The graph is written directly from the weights (no tracing): the opset is exact and nothing of
size max_seq_len is stored. Inputs and outputs are the signature's, by name, with its symbolic
axes.
"""
from __future__ import annotations

import onnx
import torch
from onnx import TensorProto, helper

from ..config import MHAConfig
from ..errors import UsageError
from .forms import FORMS, AttentionIO, GraphForm, resolve_opset
from .builder import ONNX_DTYPES, GraphBuilder, rotary_cos_sin, rotary_op, rotate_heads
from ..layer.layouts import AttentionWeights
from ..layer.rotary import inv_freq
from ..signature import FLOAT, Signature, TensorSpec, make_signature

DTYPES = tuple(ONNX_DTYPES)


def _value_info(t: TensorSpec, dtype: str) -> onnx.ValueInfoProto:
    elem = ONNX_DTYPES[dtype] if t.dtype == FLOAT else TensorProto.INT64
    return helper.make_tensor_value_info(t.name, elem, list(t.shape))


def required_features(config: MHAConfig, sig: Signature) -> frozenset:
    """What a graph form must support to build this config and signature (forms.FEATURES)."""
    return sig.features | {f for f, on in (("non-causal", not config.causal),
                                           ("gqa", config.kv_heads != config.heads),
                                           ("sliding-window", bool(config.sliding_window))) if on}


def build_model(config: MHAConfig, w: AttentionWeights, form: GraphForm,
                opset: int | None = None, dtype: str = "float32",
                signature: Signature | None = None,
                metadata: dict[str, str] | None = None) -> onnx.ModelProto:
    c = config
    sig = signature or make_signature(c)
    needs = required_features(c, sig)
    if problem := form.problem(c, needs):
        able = [f.name for f in FORMS.values() if not f.problem(c, needs)]
        raise UsageError(f"attention form {form.name!r} {problem}"
                         + (f" (forms that can: {', '.join(able)})" if able else ""))
    if dtype not in ONNX_DTYPES:
        raise UsageError(f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    opset = resolve_opset(form, opset)
    g = GraphBuilder(dtype=dtype)
    qkv = g.linear("x", "qkv", torch.cat([w.wq, w.wk, w.wv]),
                   None if w.bq is None else torch.cat([w.bq, w.bk, w.bv]))  # (B, T, 3*D)
    q, k, v = g.op("Split", [qkv, g.ints("qkv_split", [c.inner, c.kv_inner, c.kv_inner])],
                   n_out=3, axis=2, name="qkv_split")  # (B, T, N*H), 2 x (B, T, K*H)
    if c.rotary != "none":  # rotate q and k by position_ids before any core
        freq = inv_freq(c.rotary_dim, c.rope_theta, c.rope_scaling).numpy()
        cos, sin = rotary_cos_sin(g, "position_ids", freq)  # (B, T, rd/2)
        inter = c.rotary == "interleaved"
        if opset >= 23:  # the standard RotaryEmbedding node
            q, k = (rotary_op(g, t, n, c.rotary_dim, inter, cos, sin, name)
                    for t, n, name in ((q, c.heads, "q"), (k, c.kv_heads, "k")))
        else:  # the same rotation in plain ops (Split / Mul / Sub / Add / Concat)
            q, k = (rotate_heads(g, t, n, c.head_dim, c.rotary_dim, inter, cos, sin, name)
                    for t, n, name in ((q, c.heads, "q"), (k, c.kv_heads, "k")))
    named = set(sig.input_names)
    io = AttentionIO(q, k, v, *(n if n in named else None
                                for n in ("past_key", "past_value", "attention_mask")))
    out = form.core(g, io, c)
    y = out.context if w.wo is None else g.linear(out.context, "out", w.wo, w.bo)  # (B, T, dim)
    results = {"y": y, "present_key": out.present_key, "present_value": out.present_value}
    for name in sig.output_names:
        g.nodes.append(helper.make_node("Identity", [results[name]], [name], name=f"{name}_out"))

    graph = helper.make_graph(g.nodes, f"mha_{form.name}",
                              [_value_info(t, dtype) for t in sig.inputs],
                              [_value_info(t, dtype) for t in sig.outputs],
                              initializer=g.initializers)
    opsets = [helper.make_opsetid("", opset)]
    ir_version = helper.find_min_ir_version_for(opsets)  # onnx 1.23 would write 14; ORT reads 13
    opsets += [helper.make_opsetid(domain, version) for domain, version in form.domains]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="mha-export",
                              ir_version=ir_version)
    helper.set_model_props(model, metadata or {})
    return model

