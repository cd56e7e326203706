"""Build the ONNX model of a signature from layout-neutral weights, with one graph form's core.

Every form shares the projections:

    x (B, T, d_in) -> MatMul q_proj.weight / k_proj.weight / v_proj.weight (+ bias) -> q, k, v
    ... the form's attention core (forms/) ... -> context (B, T, D) -> MatMul out.weight -> y

The graph is written directly from the weights (no tracing): the opset is exact and nothing of
size max_seq_len is stored. Inputs and outputs are the signature's, by name, with its symbolic
axes.
"""
from __future__ import annotations

import functools
from typing import Any, Iterable, Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper
import torch
from torch import Tensor

from ..config import MHAConfig
from ..errors import UsageError
from .forms import STANDARD_FORMS, AttentionIO, GraphForm, resolve_opset
from .forms.base import Int8Cache
from .builder import ONNX_DTYPES, GraphBuilder, ProjectionWriter, dim
from .rotary import rotary_cos_sin, rotary_op, rotate_heads
from ..layer.layouts import AttentionWeights
from .nodes import all_nodes
from .norm import heads_rms_norm, rms_norm
from .ops import Ops
from ..signature import (FLOAT, INT8, INT8_FLOAT32_ONLY, Signature, TensorSpec,
                         make_signature)

DTYPES = tuple(ONNX_DTYPES)


def _value_info(t: TensorSpec, dtype: str) -> onnx.ValueInfoProto:
    elem = {FLOAT: ONNX_DTYPES[dtype], INT8: TensorProto.INT8}.get(t.dtype, TensorProto.INT64)
    return helper.make_tensor_value_info(t.name, elem, list(t.shape))


def check_buildable(config: MHAConfig, form: GraphForm, sig: Signature, dtype: str,
                    forms: Iterable[GraphForm] = STANDARD_FORMS) -> None:
    """A form that cannot build this config and signature, or an unknown dtype: a UsageError
    naming the ``forms`` that can (kinds/registry.py passes every kind's)."""
    if problem := form.problem(config, sig):
        able = [f.name for f in forms if not f.problem(config, sig)]
        raise UsageError(f"attention form {form.name!r} {problem}"
                         + (f" (forms that can: {', '.join(able)})" if able else ""))
    if dtype not in ONNX_DTYPES:
        raise UsageError(f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    if sig.cache_dtype == INT8 and dtype != "float32":
        raise UsageError(INT8_FLOAT32_ONLY.format(dtype=dtype))


def build_model(config: MHAConfig, w: AttentionWeights | Mapping[str, Tensor], form: GraphForm,
                opset: int | None = None, dtype: str = "float32",
                signature: Signature | None = None,
                projections: ProjectionWriter | None = None,
                kv_cache: Any = None) -> onnx.ModelProto:
    """The ONNX model of the layer around the form's core: the standard layer's (``w``:
    layout-neutral weights) or the form's kind's (``form.layer``: e.g. Multi-head Latent
    Attention's, ``w`` its state dict); ``opset`` None: the form's lowest
    (``resolve_opset``); ``projections``: how a lossy step writes the projections (q/k/v,
    output, gate; weight-only quantized: MatMulNBits); ``kv_cache``: the scales of an int8
    static cache (a signature whose cache dtype is int8)."""
    c = config
    sig = signature or make_signature(c)
    check_buildable(c, form, sig, dtype)
    if (sig.cache_dtype == INT8) != (kv_cache is not None):
        raise UsageError("an int8 cache needs both the int8 signature and its scales")
    opset = _projections_opset(projections, form, opset)
    g = GraphBuilder(dtype=dtype, projections=projections)
    layer = form.layer or _attention_layer
    results = layer(g, c, w, form, sig, opset, kv_cache)
    for name in sig.output_names:
        _name_output(g, results[name], name)
    return _model(g, sig, dtype, opset, f"mha_{form.name}")


def _projections_opset(projections: ProjectionWriter | None, form: GraphForm,
                       opset: int | None) -> int:
    """The form's opset, at least what the projections' nodes need (float8 DequantizeLinear:
    21) when none was asked for; an opset asked for below that is an error."""
    needed = getattr(projections, "min_opset", 1)
    if opset is None and needed > form.min_opset:
        opset = needed
    opset = resolve_opset(form, opset)
    if opset < needed:
        raise UsageError(f"opset {opset}: the kept projections need opset {needed} or later")
    return opset


def _model(g: GraphBuilder, sig: Signature, dtype: str, opset: int, name: str
           ) -> onnx.ModelProto:
    """The graph of g's nodes with the signature's inputs and outputs, at the exact opset."""
    graph = helper.make_graph(g.nodes, name, [_value_info(t, dtype) for t in sig.inputs],
                              [_value_info(t, dtype) for t in sig.outputs],
                              initializer=g.initializers)
    opsets = [helper.make_opsetid("", opset)]
    ir_version = helper.find_min_ir_version_for(opsets)  # onnx 1.23 would write 14; ORT reads 13
    # the domains its nodes use (com.microsoft: ONNX Runtime's contrib operators, version 1)
    opsets += [helper.make_opsetid(domain, 1)
               for domain in sorted({n.domain for n in all_nodes(g.nodes) if n.domain})]
    return helper.make_model(graph, opset_imports=opsets, producer_name="mha-export",
                             ir_version=ir_version)


def _attention_layer(g: GraphBuilder, c: MHAConfig, w: AttentionWeights, form: GraphForm,
                     sig: Signature, opset: int, kv_cache: Any) -> dict[str, str]:
    """The layer's nodes: projections, the form's core, gate, output projection; returns the
    graph values of y (and present_key / present_value)."""
    named = set(sig.input_names)
    sinks = None if w.sinks is None else g.const("attn.sinks", w.sinks.reshape(1, -1, 1, 1))
    alibi = None if w.alibi_slopes is None else g.const(
        "attn.alibi_slopes", w.alibi_slopes.reshape(1, -1, 1, 1))  # (1, N, 1, 1)
    io = AttentionIO(None, None, None, *(n if n in named else None
                                         for n in ("past_key", "past_value", "attention_mask")),
                     sinks=sinks, alibi=alibi,  # (1, N, 1, 1) each
                     past_lengths="past_lengths" if "past_lengths" in named else None,
                     project=functools.partial(queries_keys_values, c=c, w=w, opset=opset,
                                               sig=sig),
                     int8_cache=_int8_cache(g, c, kv_cache),
                     project_packed=functools.partial(packed_projection, c=c, w=w),
                     position_ids="position_ids" if "position_ids" in named else None)
    out = form.core(g, form.inputs(g, io), c)
    y = layer_output(g, c, w, out.context)  # (B, T, dim)
    return {"y": y, "present_key": out.present_key, "present_value": out.present_value}


def layer_output(g: GraphBuilder, c: MHAConfig, w: AttentionWeights, context: str) -> str:
    """context (B, T, N*Hv) -> output gate -> output norm -> output projection: y (B, T, dim)."""
    if w.wg is not None:  # output gate: context * sigmoid(x @ W_gate^T + b)
        op = Ops(g)  # gated_context: a test's fault bypasses it
        gate = op.Sigmoid(g.linear("x", "gate", w.wg, w.bg), name="gate")  # (B, T, N*H)
        context = op.Mul(context, gate, name="gated_context")  # (B, T, N*H)
    if c.out_norm_eps:  # BitNet: RMSNorm of the context before the output projection
        context = rms_norm(g, context, w.out_norm, c.out_norm_eps, 0.0, "out_norm")
    return context if w.wo is None else g.linear(context, "out", w.wo, w.bo)  # (B, T, dim)


def _int8_cache(g: GraphBuilder, c: MHAConfig, spec: Any) -> Int8Cache | None:
    """An int8 cache's scales as initializers (one set, read by every branch and block); keys
    and values of different granularities both per channel (GroupQueryAttention needs one)."""
    if spec is None:
        return None
    key, value = spec.key, spec.value
    if key.granularity != value.granularity:
        key, value = key.per_channel(c.kv_heads, c.head_dim), value.per_channel(c.kv_heads,
                                                                                c.value_dim)
    return Int8Cache(g.const("kv_cache.k_scale", key.scale), g.const("kv_cache.v_scale",
                                                                     value.scale),
                     key.quant_type, value.quant_type)


def _name_output(g: GraphBuilder, tensor: str, name: str) -> None:
    """Give the declared output name to the node output that computes it, renamed wherever it
    is read (subgraphs too): no Identity copy between the two. A static cache's ScatterND then
    writes straight into the buffer the caller bound as present (an Identity after it cost a
    copy of the whole buffer per step, and ScatterND another one). Falls back to an Identity
    where no top-level node computes the tensor (a graph input or an initializer)."""
    if not any(tensor in n.output for n in g.nodes):
        g.nodes.append(helper.make_node("Identity", [tensor], [name], name=f"{name}_out"))
        return
    for node in all_nodes(g.nodes):
        node.input[:] = [name if i == tensor else i for i in node.input]
        node.output[:] = [name if o == tensor else o for o in node.output]


def queries_keys_values(g: GraphBuilder, c: MHAConfig, w: AttentionWeights, opset: int,
                         sig: Signature) -> tuple[str, str, str]:
    """x -> projections -> q/k norm -> clamp -> rotary (-> q/k norm, where it comes after
    rotary) -> queries scaled by position or slot: q (B, T, N*H), k and v (B, T, K*H)."""
    q, k, v = _project_qkv(g, c, w)  # (B, T, N*H), (B, T, K*H), (B, T, K*Hv)
    if c.value_multiplier:  # MiMo-V2: values scaled right after their projection
        v = Ops(g).Mul(v, g.const("value_multiplier", np.array(c.value_multiplier)),
                       name="value_multiplied")
    if c.v_norm_eps:  # Gemma 3n: values RMS-normalised per head, no weight
        v = heads_rms_norm(g, v, c.kv_heads, c.value_dim, torch.ones(c.value_dim), c.v_norm_eps,
                           0.0, "v_norm")
    if c.qk_norm != "none" and not c.qk_norm_after_rope:  # before rotary, as transformers
        q, k = _normalize_qk(g, c, w, q, k)
    if c.qkv_clip:
        q, k, v = _clamp(g, c.qkv_clip, q, k, v)
    if c.rotary != "none":  # rotate q and k by position_ids before any core
        q, k = _rotate_qk(g, c, q, k, opset)
    if c.qk_norm != "none" and c.qk_norm_after_rope:  # Hunyuan: after rotary
        q, k = _normalize_qk(g, c, w, q, k)
    if c.query_scale_beta:
        q = _scale_queries(g, c, q, sig)
    return q, k, v


def _scale_queries(g: GraphBuilder, c: MHAConfig, q: str, sig: Signature) -> str:
    """q (B, T, N*H) times 1 + beta * log(1 + floor(n / length)), n the position (Ministral 3)
    or the query's cache slot + 1 (Llama 4's temperature tuning), in float32 as transformers
    computes it."""
    op = Ops(g).named("query_scale")
    counts = "position_ids" if c.query_scale_by == "position" else op.Add(
        _query_slots(g, sig), g.ints("query_scale.one_slot", 1))  # (B|1, T)
    pos = op.Cast(counts, to=TensorProto.FLOAT)  # (B|1, T)
    steps = op.Floor(op.Div(pos, g.const("query_scale.length", np.array(
        c.query_scale_length, np.float32), float_dtype=False)))
    one = g.const("query_scale.one", np.array(1.0, np.float32), float_dtype=False)
    scale = op.Add(one, op.Mul(op.Log(op.Add(one, steps)), g.const(
        "query_scale.beta", np.array(c.query_scale_beta, np.float32), float_dtype=False)))
    scale = op.Unsqueeze(scale, g.ints("axes_last", [2]))  # (B|1, T, 1)
    if g.dtype != "float32":
        scale = op.Cast(scale, to=g.elem)
    return op.Mul(q, scale, name="scaled")


def _query_slots(g: GraphBuilder, sig: Signature) -> str:
    """The cache slot of each query (B|1, T): past_lengths[b] + i (a static cache), P + i (a
    growing one), i (no cache)."""
    op = Ops(g).named("query_slot")
    steps = op.Range(g.ints("zero", 0), dim(g, "x", 1, "query_slot_len"), g.ints("one", 1))
    if sig.static_cache:
        return op.Add(op.Unsqueeze("past_lengths", g.ints("axes1", [1])), steps)  # (B, T)
    if sig.has_cache:
        steps = op.Add(steps, dim(g, "past_key", 2, "query_slot_past"))  # (T,)
    return op.Unsqueeze(steps, g.ints("axes0", [0]))  # (1, T)


def _clamp(g: GraphBuilder, clip: float, *tensors: str) -> list[str]:
    """Each tensor clamped to [-clip, clip] (DBRX's, OLMo's clip_qkv)."""
    op = Ops(g).named("qkv_clip")
    low, high = g.const("qkv_clip.min", np.array(-clip)), g.const("qkv_clip.max", np.array(clip))
    return [op.Clip(t, low, high, name=f"clipped_{i}") for i, t in enumerate(tensors)]


def _project_qkv(g: GraphBuilder, c: MHAConfig, w: AttentionWeights) -> list[str]:
    """x (B, T, d_in) -> three MatMuls (+ bias) -> q (B, T, N*H), k, v (B, T, K*H).

    Not one (d_in, 3*D) MatMul + Split: the same speed here, but the fused output and the
    Split's copies are 2 x 3*D per token at once, which ONNX Runtime's memory pattern keeps
    reserved for the whole call (T = 16384, 12 x 768: peak 1091 -> 996 MiB, static prefill
    1267 -> 986 MiB)."""
    return [g.linear("x", name, weight, bias) for name, weight, bias in (
        ("q_proj", w.wq, w.bq), ("k_proj", w.wk, w.bk), ("v_proj", w.wv, w.bv))]


def packed_projection(g: GraphBuilder, c: MHAConfig, w: AttentionWeights) -> str:
    """x (B, T, d_in) -> one projection of the q, k and v weights concatenated along their
    outputs (biases too, zeros for a missing one) -> (B, T, (N + 2K)*H), unrotated, clamped
    where the layer clamps (the same Clip on q, k and v). Quantized projections: one
    MatMulNBits where their block layouts concatenate (``ProjectionWriter.packed``), else
    their three nodes and a Concat whose doc_string says why."""
    parts = (("q_proj", w.wq, w.bq), ("k_proj", w.wk, w.bk), ("v_proj", w.wv, w.bv))
    bias = None
    if any(b is not None for _, _, b in parts):
        bias = torch.cat([torch.zeros(wt.shape[0]) if b is None else b for _, wt, b in parts])
    if g.projections is None:
        qkv = g.linear("x", "qkv_proj", torch.cat([wt for _, wt, _ in parts]), bias)
    else:
        qkv, why = g.projections.packed(g, "x", "qkv_proj", [(n, wt) for n, wt, _ in parts])
        if qkv is None:  # three nodes, their biases added each
            qkv = Ops(g).Concat(*_project_qkv(g, c, w), axis=-1, name="qkv_concat")
            g.nodes[-1].doc_string = f"q, k and v projected by three nodes: {why}"
        elif bias is not None:
            qkv = Ops(g).Add(qkv, g.const("qkv_proj.bias", bias), name="qkv_proj_add")
    if c.qkv_clip:
        qkv = _clamp(g, c.qkv_clip, qkv)[0]
    return qkv  # (B, T, (N + 2K)*H)


def _normalize_qk(g: GraphBuilder, c: MHAConfig, w: AttentionWeights, q: str, k: str
                  ) -> tuple[str, str]:
    return (normalize_heads(g, c, q, c.heads, w.q_norm, w.q_norm_bias, "q_norm"),
            normalize_heads(g, c, k, c.kv_heads, w.k_norm, w.k_norm_bias, "k_norm"))


def normalize_heads(g: GraphBuilder, c: MHAConfig, x: str, heads: int, weight: Tensor | None,
                    bias: Tensor | None, name: str) -> str:
    """x (B, T, heads*H) through the q (or k) norm: RMSNorm, or LayerNorm with its bias, over
    each head's features, or over the whole projection (OLMo 2); weightless (Llama 4): x /
    rms(x) over each head."""
    args = dict(eps=c.qk_norm_eps, offset=c.norm_offset, centered=c.qk_norm_type == "layer")
    if c.qk_norm_weightless:
        unit = torch.full((c.head_dim,), 1.0 - c.norm_offset)  # (offset + w) = 1
        return heads_rms_norm(g, x, heads, c.head_dim, unit, name=name, **args)
    if c.qk_norm == "full":
        return rms_norm(g, x, weight, name=name, bias=bias, **args)
    return heads_rms_norm(g, x, heads, c.head_dim, weight, name=name, bias=bias, **args)


def _rotate_qk(g: GraphBuilder, c: MHAConfig, q: str, k: str, opset: int) -> tuple[str, str]:
    cos, sin = rotary_cos_sin(g, "position_ids", c)  # (B, T, rd/2)
    return (rotate(g, c, q, c.heads, cos, sin, opset, "q"),
            rotate(g, c, k, c.kv_heads, cos, sin, opset, "k"))


def rotate(g: GraphBuilder, c: MHAConfig, x: str, heads: int, cos: str, sin: str, opset: int,
           name: str) -> str:
    """x (B, T, heads*H) rotated by cos / sin (B, T, rd/2): the standard RotaryEmbedding node
    from opset 23, the same rotation in plain ops (Split / Mul / Sub / Add / Concat) below."""
    interleaved = c.rotary == "interleaved"
    if opset >= 23:
        return rotary_op(g, x, heads, c.rotary_dim, interleaved, cos, sin, name)
    return rotate_heads(g, x, heads, c.head_dim, c.rotary_dim, interleaved, cos, sin, name)
