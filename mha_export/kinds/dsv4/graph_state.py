"""DeepSeek-V4's compressed layers' cached call as ONNX graph code: the compressor's (and CSA's
indexer's) state, as transformers' DeepseekV4HCACache / DeepseekV4CSACache and the eager layer
(compressed.py) keep it, carried through the graph. The keys, shapes and axes are
settings.py's (``state_keys``, ``state_shapes``, ``cache_tensors``: the signature's names).

Naming: one ONNX input per state tensor, ``past_<cache>.<entry>``, and its updated value the
output ``present_<cache>.<entry>`` (<cache>: ``compressor``, CSA's ``indexer`` too; <entry>:
the eager state dict's own key, ``compressor.buffer_kv`` -> ``past_compressor.buffer_kv``):

    <cache>.buffer_kv      (B, Pb, c) the projections of the tokens since the last closed
    <cache>.buffer_gate    (B, Pb, c) window (Pb < m; 0 at the first call), the gate before
                           the position bias
    <cache>.compressed_kv  (B, N, w) every row pooled so far (N: 0 at the first call)
    <cache>.overlap_kv     (B, Po, w) CSA: the last closed window's first series (Po = m), and
    <cache>.overlap_gate   (B, Po, w) its gate with the position bias; Po = 0 while no window
                           has closed (the eager state has no entry: window 0's fill is used)

present: buffer (B, (Pb + T) % m, c), compressed_kv (B, N + (Pb + T) // m, w), overlap
(B, m, w) once a window has closed (else the past's, Po rows).

Shape legend: B = batch, T = this call, m = rate, w = a row's width (d, or the indexer's di),
c = a projection's width (2w with overlapping windows, else w), n = closed windows this call.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ...graph.builder import GraphBuilder
from ...graph.ops import Ops
from .settings import (BUFFER, OVERLAP, PRESENT_AXES, ROWS, state_keys,  # noqa: F401
                       state_shapes)

LAST = np.iinfo(np.int64).max  # Slice's "to the end"


def part(state: Mapping[str, str] | None, cache: str) -> dict[str, str] | None:
    """The entries of one cache (``compressor``, ``indexer``) keyed without its name."""
    if state is None:
        return None
    return {k.split(".", 1)[1]: v for k, v in state.items() if k.startswith(cache + ".")}


def complete_windows(g: GraphBuilder, kv: str, gate: str, rate: int,
                     past: Mapping[str, str] | None, present: dict[str, str], name: str
                     ) -> tuple[str, str]:
    """kv, gate (B, T, c) -> the complete windows' tokens (B, n*m, c) each: after the past's
    buffer (B, Pb, c) when there is one, whose updated value (the (Pb + T) % m left over) goes
    into ``present``. Nodes ``<name>_*`` (``<name>_carried_*``: a test's fault)."""
    op = Ops(g).named(name)
    if past is not None:
        kv = op.Concat(past["buffer_kv"], kv, axis=1, name="carried_kv")  # (B, Pb + T, c)
        gate = op.Concat(past["buffer_gate"], gate, axis=1, name="carried_gate")
    seq = op.Shape(kv, start=1, end=2)  # (1,) Pb + T
    step = g.ints("rate_1d", [rate])
    usable = op.Mul(op.Div(seq, step), step)  # (1,) n * m: complete windows only
    axis = g.ints("axes1_1d", [1])
    if past is not None:
        present["buffer_kv"], present["buffer_gate"] = (
            op.Slice(t, usable, seq, axis, name=f"left_{i}")  # (B, (Pb + T) % m, c)
            for i, t in (("kv", kv), ("gate", gate)))
    zero = g.ints("zero_1d", [0])
    return op.Slice(kv, zero, usable, axis), op.Slice(gate, zero, usable, axis)  # B, n*m, c


def prior_window(g: GraphBuilder, overlap: str, fill: float, rate: int, width: int,
                 name: str) -> str:
    """overlap (B, Po, w), Po in {0, m} -> window 0's first half (B, 1, m, w): the past's, or
    ``fill`` while no window has closed (Po = 0)."""
    op = Ops(g).named(name)
    rows = op.Concat(op.Shape(overlap, start=0, end=1), g.ints("window_rows", [rate, width]),
                     axis=0)  # [B, m, w]
    block = op.Expand(g.const(f"{name}_fill", np.array(fill, np.float32), float_dtype=False),
                      rows)  # (B, m, w)
    both = op.Concat(block, overlap, axis=1)  # (B, m + Po, w)
    last = op.Slice(both, g.ints("last_window", [-rate]), g.ints("to_end", [LAST]),
                    g.ints("axes1_1d", [1]))  # (B, m, w)
    return op.Unsqueeze(last, g.ints("axes1", [1]), name="prior")  # (B, 1, m, w)


def last_firsts(g: GraphBuilder, overlap: str, windows: str, rate: int, width: int,
                name: str) -> str:
    """The updated overlap state: the last closed window's first series (B, m, w), from
    windows (B, n, m, 2w), or the past's overlap (B, Po, w) when n = 0."""
    op = Ops(g).named(name)
    firsts = op.Slice(windows, g.ints("zero_1d", [0]), g.ints("series_1d", [width]),
                      g.ints("axes3_1d", [3]))  # (B, n, m, w)
    firsts = op.Reshape(firsts, g.ints("slots", [0, -1, width]))  # (B, n*m, w)
    both = op.Concat(overlap, firsts, axis=1)  # (B, Po + n*m, w)
    return op.Slice(both, g.ints("last_window", [-rate]), g.ints("to_end", [LAST]),
                    g.ints("axes1_1d", [1]), name="present")  # (B, min(m, Po + n*m), w)
