"""DeepSeek-V4's compressed layers' parts as ONNX graph code (compressed.py's functions, the
full-sequence and cached calls): the compressor's pooled rows (HCA: windows of ``rate`` tokens;
CSA: overlapping windows of 2 * rate slots), their causality, and CSA's lightning indexer (ReLU
scores, TopK, ScatterElements into a mask) over every row pooled so far; the cached call's
state (buffer, rows, overlap) through graph_state.py; and the helpers graph.py shares with
them (the rotation of a head's trailing channels, the additive mask). Standard ops only
(opset 17), float32.

Shape legend: B = batch, T = this call, D = hidden size, m = rate, n = the windows this call
closes ((Pb + T) // m, Pb the past's buffered tokens, 0 without a past), N = the past's rows,
w = a row's width (d, the head width, or the indexer's di), c = a projection's width (2w
overlapping, else w), r = rope_dim (the rotated trailing channels), Hi = index heads,
k = index_topk.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
from torch import Tensor

from ...graph.builder import GraphBuilder
from ...graph.norm import rms_norm
from ...graph.ops import Ops
from ...graph.rotary import cos_sin_at, rotate_heads
from .graph_state import complete_windows, last_firsts, part, prior_window
from .settings import DSV4Shape

LOWEST = float(np.finfo(np.float32).min)  # the eager layer's masked fill (finite)


def rotate_tail(g: GraphBuilder, x: str, heads: int, width: int, rope_dim: int, cos: str,
                sin: str, name: str) -> str:
    """x (B, T, heads*w): the trailing r channels of each head rotated in interleaved pairs
    (V4 lays a head out [nope | rope]); cos, sin (B|1, T, r/2). Nodes named ``<name>_*``."""
    if rope_dim == 0:
        return x
    op = Ops(g).named(name)
    x = op.Reshape(x, g.ints("tail_heads", [0, 0, heads, width]))  # (B, T, heads, w)
    nope, tail = op.Split(x, g.ints(f"{name}_split", [width - rope_dim, rope_dim]), axis=3,
                          n_out=2)  # (B, T, heads, w - r), (B, T, heads, r)
    tail = op.Reshape(tail, g.ints("tail_flat", [0, 0, heads * rope_dim]))  # (B, T, heads*r)
    tail = rotate_heads(g, tail, heads, rope_dim, rope_dim, True, cos, sin, f"{name}_rot")
    tail = op.Reshape(tail, g.ints("tail_heads_r", [0, 0, heads, rope_dim]))  # (B,T,heads,r)
    x = op.Concat(nope, tail, axis=3)  # (B, T, heads, w)
    return op.Reshape(x, g.ints("tail_out", [0, 0, heads * width]),
                      name="out")  # (B, T, heads*w)


def additive(g: GraphBuilder, seen: str, name: str) -> str:
    """bool seen (B, T, S) -> (B, 1, T, S) float32: 0 where seen, float32's lowest elsewhere."""
    op = Ops(g).named(name)
    bias = op.Where(seen, g.const("mask_zero", 0.0), g.const("mask_lowest", LOWEST))
    return op.Unsqueeze(bias, g.ints("axes1", [1]), name="bias")  # (B, 1, T, S)


def closed_by(g: GraphBuilder, positions: str, rows: str, rate: int) -> str:
    """(B, T, n) bool: row i's window is closed by the query's position (i < (pos + 1) // m).
    ``rows`` (B, n, w): the pooled rows (their count read). Nodes ``closed_*``."""
    op = Ops(g).named("closed")
    n = op.Squeeze(op.Shape(rows, start=1, end=2), g.ints("axes0", [0]))  # () n
    threshold = op.Div(op.Add(positions, g.ints("one", 1)), g.ints("rate", rate))  # (B, T)
    index = op.Range(g.ints("zero", 0), n, g.ints("one", 1))  # (n,)
    return op.Less(index, op.Unsqueeze(threshold, g.ints("axes_last", [2])),
                   name="seen")  # (B, T, n)


def window_starts(g: GraphBuilder, windows: str, rate: int, past_rows: str | None) -> str:
    """(1, n) int64: the first position of each window closed this call, N * m, (N + 1) * m,
    ...; ``windows`` (B, n, ...) read for n, ``past_rows`` (B, N, w) for N (None: N = 0)."""
    op = Ops(g).named("window_start")
    n = op.Squeeze(op.Shape(windows, start=1, end=2), g.ints("axes0", [0]))  # () n
    first = g.ints("zero", 0) if past_rows is None else op.Squeeze(
        op.Shape(past_rows, start=1, end=2), g.ints("axes0", [0]))  # () N
    index = op.Range(first, op.Add(first, n), g.ints("one", 1))  # (n,) N .. N + n - 1
    return op.Unsqueeze(op.Mul(index, g.ints("rate", rate)), g.ints("axes0", [0]))  # (1, n)


def _overlapped(g: GraphBuilder, t: str, width: int, fill: float, name: str,
                prior: str | None = None) -> str:
    """t (B, n, m, 2w) -> (B, n, 2m, w): window i's slots are window i - 1's first series
    ([..., :w]; window 0: ``prior`` (B, 1, m, w), the past's last window's, else ``fill``)
    then its own second series ([..., w:])."""
    op = Ops(g).named(name)
    earlier, own = op.Split(t, g.ints("series_split", [width, width]), axis=3,
                            n_out=2)  # (B, n, m, w) each
    if prior is None:
        pads = g.ints("one_window_before", [0, 1, 0, 0, 0, 0, 0, 0])
        shifted = op.Pad(earlier, pads, g.const(f"{name}_fill", np.array(fill, np.float32),
                                                float_dtype=False))  # (B, n + 1, m, w)
    else:
        shifted = op.Concat(prior, earlier, axis=1)  # (B, n + 1, m, w)
    first = op.Slice(shifted, g.ints("zero_1d", [0]), g.ints("minus_one_1d", [-1]),
                     g.ints("axes1", [1]))  # (B, n, m, w): window i - 1's
    return op.Concat(first, own, axis=2)  # (B, n, 2m, w)


def _overlap_state(g: GraphBuilder, s: DSV4Shape, kv: str, gate: str, width: int,
                   past: Mapping[str, str] | None, present: dict[str, str], name: str
                   ) -> tuple[str, str]:
    """kv, gate (B, n, m, 2w) -> the overlapping windows (B, n, 2m, w) each, window 0's first
    half the past's overlap state (if any), the updated one into ``present``."""
    priors: dict[str, str | None] = {"kv": None, "gate": None}
    if past is not None:
        for key, t, fill in (("kv", kv, 0.0), ("gate", gate, float("-inf"))):
            priors[key] = prior_window(g, past[f"overlap_{key}"], fill, s.rate, width,
                                       f"{name}_{key}_prior")  # (B, 1, m, w)
            present[f"overlap_{key}"] = last_firsts(g, past[f"overlap_{key}"], t, s.rate,
                                                    width, f"{name}_{key}_overlap")
    return (_overlapped(g, kv, width, 0.0, f"{name}_kv", priors["kv"]),
            _overlapped(g, gate, width, float("-inf"), f"{name}_gate", priors["gate"]))


def compressed_rows(g: GraphBuilder, s: DSV4Shape, w: Mapping[str, Tensor], x: str,
                    prefix: str, width: int, overlap: bool,
                    past: Mapping[str, str] | None = None) -> tuple[str, dict[str, str]]:
    """Every pooled row (B, N + n, w): the past's N (``past``: graph_state.py's entries of
    this compressor; None: the full-sequence call, N = 0) then the n windows this call
    closes, each a softmax over its slots (gate + position_bias, per channel), the weighted
    sum, the weighted RMSNorm, the "compress" rope at its first position; and the updated
    state (empty without a past). ``prefix``: the weights' (``compressor.``,
    ``compressor.indexer.compressor.``); nodes named after it."""
    name = prefix.rstrip(".").replace(".", "_")
    op = Ops(g).named(name)
    present: dict[str, str] = {}
    series = 2 * width if overlap else width
    kv = g.linear(x, f"{prefix}kv_proj", w[f"{prefix}kv_proj.weight"], None)  # (B, T, c)
    gate = g.linear(x, f"{prefix}gate_proj", w[f"{prefix}gate_proj.weight"], None)
    kv, gate = complete_windows(g, kv, gate, s.rate, past, present, name)  # (B, n*m, c)
    windows = g.ints(f"{name}_windows", [0, -1, s.rate, series])
    kv, gate = (op.Reshape(v, windows) for v in (kv, gate))  # (B, n, m, c)
    gate = op.Add(gate, g.const(f"{prefix}position_bias", w[f"{prefix}position_bias"]))
    if overlap:
        kv, gate = _overlap_state(g, s, kv, gate, width, past, present, name)  # B,n,2m,w
    weights = op.Softmax(gate, axis=2, name="weights")  # over each window's slots
    pooled = op.ReduceSum(op.Mul(kv, weights), g.ints("axes2_1d", [2]), keepdims=0,
                          name="pooled")  # (B, n, w)
    pooled = rms_norm(g, pooled, w[f"{prefix}kv_norm.weight"], s.eps, 0.0, f"{name}_norm")
    held = None if past is None else past["compressed_kv"]  # (B, N, w)
    cos, sin = cos_sin_at(g, window_starts(g, pooled, s.rate, held), s.rope_dim,
                          s.rope_theta, dict(s.rope_scaling) if s.rope_scaling else None)
    rows = rotate_tail(g, pooled, 1, width, s.rope_dim, cos, sin, f"{name}_rope")  # (B, n, w)
    if held is not None:
        rows = present["compressed_kv"] = op.Concat(held, rows, axis=1, name="rows")
    return rows, present  # (B, N + n, w)


def index_picks(g: GraphBuilder, s: DSV4Shape, w: Mapping[str, Tensor], x: str,
                residual: str, closed: str, cos: str, sin: str,
                past: Mapping[str, str] | None = None) -> tuple[str, dict[str, str]]:
    """CSA's lightning indexer: (B, T, n) bool, the closed rows each query keeps, its top k
    by score[t, s] = sum_h wt[t, h] * ReLU(qi[t, h] . K[s]) / sqrt(di), float32, over every
    row its compressor pooled (past and new: ``past`` its state, graph_state.py's entries; the
    updated one returned). residual (B, T, Rq) the queries' q_a_norm output; closed (B, T, n);
    cos, sin (B, T, r/2) at the queries' positions. TopK keeps the lower index of equal
    scores, as the eager layer's ``top_rows``. Nodes named ``index_*``."""
    op, hi, di = Ops(g).named("index"), s.index_heads, s.index_head_dim
    pre = "compressor.indexer."
    keys, present = compressed_rows(g, s, w, x, pre + "compressor.", di, True, past)  # B,n,di
    q = g.linear(residual, pre + "q_b_proj", w[pre + "q_b_proj.weight"], None)  # (B,T,Hi*di)
    q = rotate_tail(g, q, hi, di, s.rope_dim, cos, sin, "index_q_rope")  # (B, T, Hi*di)
    q = op.Reshape(q, g.ints("index_q_heads", [0, 0, hi, di]))  # (B, T, Hi, di)
    keys_t = op.Unsqueeze(op.Transpose(keys, perm=[0, 2, 1]), g.ints("axes1", [1]))  # B,1,di,n
    dots = op.Relu(op.MatMul(q, keys_t))  # (B, T, Hi, n)
    wt = g.linear(x, pre + "scorer.weights_proj", w[pre + "scorer.weights_proj.weight"], None)
    wt = op.Mul(wt, g.const("index_head_scale", np.array(hi ** -0.5)))  # (B, T, Hi)
    wt = op.Unsqueeze(wt, g.ints("axes_last", [3]))  # (B, T, Hi, 1)
    scaled = op.Mul(dots, g.const("index_score_scale", np.array(di ** -0.5)))
    scores = op.ReduceSum(op.Mul(scaled, wt), g.ints("axes2_1d", [2]), keepdims=0,
                          name="scores")  # (B, T, n)
    hidden = g.const("index_hidden", np.array(-np.inf, np.float32), float_dtype=False)
    scores = op.Where(closed, scores, hidden)  # (B, T, n): rows not closed by t score -inf
    k = op.Min(op.Shape(scores, start=2, end=3), g.ints("index_topk", [s.index_topk]))  # (1,)
    _, kept = op.TopK(scores, k, axis=-1, largest=1, sorted=0, n_out=2)  # (B, T, k)
    false = op.Expand(g.const("index_false", np.array(False), float_dtype=False),
                      op.Shape(scores))  # (B, T, n)
    true = op.Expand(g.const("index_true", np.array(True), float_dtype=False), op.Shape(kept))
    picked = op.ScatterElements(false, kept, true, axis=-1)  # (B, T, n)
    return op.And(picked, closed, name="picked"), present  # picks past the bound dropped


def pooled_rows(g: GraphBuilder, s: DSV4Shape, w: Mapping[str, Tensor], x: str,
                residual: str, positions: str, cos: str, sin: str,
                state: Mapping[str, str] | None = None) -> tuple[str, str, dict[str, str]]:
    """A compressed layer's extra key = value rows (B, 1, n, d) and their additive mask
    (B, 1, T, n): HCA's every closed row, CSA's the indexer's picks among them; ``state``
    (the cached call): graph_state.py's past inputs by key, the present ones returned by key
    (empty without a state)."""
    sparse = s.index_topk > 0
    rows, present = compressed_rows(g, s, w, x, "compressor.", s.head_dim, sparse,
                                    part(state, "compressor"))  # (B, n, d)
    seen = closed_by(g, positions, rows, s.rate)  # (B, T, n)
    presents = {f"compressor.{k}": v for k, v in present.items()}
    if sparse:
        seen, present = index_picks(g, s, w, x, residual, seen, cos, sin,
                                    part(state, "indexer"))  # (B, T, n)
        presents.update({f"indexer.{k}": v for k, v in present.items()})
    rows = Ops(g).Unsqueeze(rows, g.ints("axes1", [1]), name="pooled_4d")  # (B, 1, n, d)
    return rows, additive(g, seen, "pooled_mask"), presents

