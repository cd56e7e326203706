"""Standard multi-head / grouped-query attention (and multi-query: one key/value head): the
kind of every config without a section. Its eager layer is layer/ (four weight layouts of one
function), its graph graph/model.py's layer around the forms of graph/forms/."""
from __future__ import annotations

import dataclasses

from torch import nn

from ..config import MHAConfig
from ..graph.forms import STANDARD_FORMS
from ..layer.layouts import LAYOUT_CLASSES
from .base import AttentionKind, WeightMap

# projection -> AttentionWeights' field (the layout-neutral weights every layout converts to)
FIELDS = {"q_proj": "wq", "k_proj": "wk", "v_proj": "wv", "out_proj": "wo", "gate_proj": "wg"}


def projections(c: MHAConfig) -> dict[str, tuple[int, int]]:
    """The layer's projection weights, [out, in], by graph name."""
    shapes = {"q_proj": (c.inner, c.d_in), "k_proj": (c.kv_inner, c.d_in),
              "v_proj": (c.kv_inner, c.d_in), "out_proj": (c.dim, c.inner),
              "gate_proj": (c.inner, c.d_in)}
    return {p: shapes[p] for p in quantizable(c)}


def quantizable(c: MHAConfig) -> list[str]:
    """Every projection (norms, biases and sinks stay float)."""
    return ["q_proj", "k_proj", "v_proj"] + (
        ["out_proj"] if c.layout in ("split", "fused") else []) + (
        ["gate_proj"] if c.output_gate else [])


def map_projections(module: nn.Module, fn: WeightMap) -> nn.Module:
    """A module of the same layout whose projections hold fn(name, weight), through the
    layout-neutral weights."""
    w = module.to_weights()
    out = type(module)(module.config).eval()
    out.load_weights(dataclasses.replace(w, **{
        f: fn(name, getattr(w, f)) for name, f in FIELDS.items() if getattr(w, f) is not None}))
    return out.train(module.training)


def call_flops(c: MHAConfig, seq: int, pairs: float, past: int) -> float:
    """Projections 2*T*(d_in*(inner + 2*kv_inner) + inner*dim) + attention 4*inner per (query,
    key) pair: the call's own pairs and T*P over a cache of P (T*min(P, w) with a window w, at
    most that with chunks of w)."""
    w = c.sliding_window or c.attention_chunk
    attn = 4 * pairs * c.inner + 4 * seq * (min(past, w) if w else past) * c.inner
    return 2 * seq * (c.d_in * (c.inner + 2 * c.kv_inner) + c.inner * c.dim) + attn


KIND = AttentionKind(
    name="standard", summary="multi-head / grouped-query attention",
    layouts=LAYOUT_CLASSES,
    anchors={"fused": "c_attn.weight", "split": "out_proj.weight",
             "stacked": "heads.0.W_query.weight", "single": "W_query.weight"},
    forms=STANDARD_FORMS, projections=projections, quantizable=quantizable,
    map_projections=map_projections, call_flops=call_flops)
