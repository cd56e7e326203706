"""Cross-layer KV sharing's kind record: what every stage asks of it (kinds/base.py)."""
from __future__ import annotations

from ...config import MHAConfig
from .. import standard
from ..base import AttentionKind
from .graph import FORMS
from .layer import SharedKVAttention
from .settings import LAYOUT, NAME


def projections(c: MHAConfig) -> dict[str, tuple[int, int]]:
    """Its projection weights, [out, in], by graph name: queries and output only."""
    shapes = {"q_proj": (c.inner, c.d_in), "out_proj": (c.dim, c.v_inner),
              "gate_proj": (c.v_inner, c.d_in)}
    return {p: shapes[p] for p in quantizable(c)}


def quantizable(c: MHAConfig) -> list[str]:
    return ["q_proj", "out_proj"] + (["gate_proj"] if c.output_gate else [])


def call_flops(c: MHAConfig, seq: int, pairs: float, past: int) -> float:
    """The standard layer's, less the key and value projections it does not have."""
    return standard.call_flops(c, seq, pairs, past) - 2 * seq * c.d_in * 2 * c.kv_inner


KIND = AttentionKind(
    name="kv_shared", summary=NAME, layouts={LAYOUT: SharedKVAttention},
    anchors={}, forms=FORMS, projections=projections, quantizable=quantizable,
    map_projections=standard.map_projections, call_flops=call_flops,
    unbuilt={"int8-cache": "--kv-cache-dtype int8 does not apply to a KV-shared layer: it holds "
                           "no cache (quantize its source layer's)"})
