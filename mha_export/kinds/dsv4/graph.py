"""DeepSeek-V4's attention layer as ONNX graph code (layer.py's and compressed.py's function;
docs/deepseek-v4.md says what each layer type computes): the full-sequence call with a padding
mask, for every layer type (``dsv4_full_sequence``); the cached call of every layer type
(``dsv4_cached``; ``dsv4_sliding_cached`` a sliding layer's): past_key the rotated key = value
rows of its sliding cache, and a compressed layer's compressor (CSA: and indexer) state as
transformers keeps it, one input ``past_<key>`` and one output ``present_<key>`` per tensor
(graph_state.py names them: ``past_compressor.buffer_kv`` ...). A whole model: ``dsv4_model``.

    cached model    inputs                                  outputs
    sliding         x, attention_mask, past_key,            y, present_key
                    position_ids
    HCA             ... past_key, past_compressor.{buffer_kv, buffer_gate, compressed_kv},
                    position_ids -> y, present_key, present_compressor.{...}
    CSA             ... past_key, past_{compressor, indexer}.{buffer_kv, buffer_gate,
                    compressed_kv, overlap_kv, overlap_gate}, position_ids
                    -> y, present_key, present_{compressor, indexer}.{...}

    x -> q_a_proj -> q_a_norm (weighted RMSNorm) -> q_b_proj -> per-head RMSNorm (no weight)
    x -> kv_proj -> kv_norm: one key = value head, the key and the value of every query head
    rotary: interleaved pairs on each head's trailing r channels, at the token's position
    keys = values = [past | this call's rows | the pooled rows (HCA, CSA: graph_compressed.py)]
    mask: sliding-window causal with padding on this call's rows; the pooled rows' causality
          (a query sees the windows its position closed), CSA: only the indexer's top k of them
    softmax over [logits | the head's sink], its column dropped -> o
    o's trailing r channels rotated back (cos, -sin) -> grouped low rank o_a_proj -> o_b_proj

Weights: the eager layer's state dict (transformers' names: ``q_a_proj.weight``, ``sinks``,
``compressor.kv_proj.weight``, ...); the initializers carry them. Standard ops only (opset
17), float32, on ONNX Runtime's CPU provider.

Shape legend: B = batch, T = this call, D = hidden size, H = heads, d = head width,
r = rope_dim, Rq = q_lora_rank, G = o_groups, Ro = o_lora_rank, W = window, P = cached
rows, R = P + T sliding keys, n = pooled rows, S = R + n keys.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper
from torch import Tensor

from ...errors import UsageError
from ...graph.builder import GraphBuilder
from ...graph.norm import heads_rms_norm, rms_norm
from ...graph.ops import Ops
from ...graph.rotary import cos_sin_at
from ...signature import BATCH, PAST, SEQ, TOTAL
from .graph_compressed import additive, pooled_rows, rotate_tail
from .graph_state import PRESENT_AXES, state_keys, state_shapes
from .settings import SLIDING, DSV4Shape

OPSET = 17
INPUTS = ("x", "attention_mask", "position_ids")  # signature.py's names, in its order
# a sliding layer's cached call: key = value, one cache tensor (past_key / present_key)
INPUTS_CACHED = ("x", "attention_mask", "past_key", "position_ids")
OUTPUTS_CACHED = ("y", "present_key")
# a compressed layer's state: past_<key> in, present_<key> out (graph_state.py's keys)
PAST_STATE, PRESENT_STATE = "past_", "present_"
PRESENT = "min(past_seq + seq, window - 1)"


def dsv4_full_sequence(g: GraphBuilder, shape: DSV4Shape, weights: Mapping[str, Tensor],
                       x: str, keep: str, positions: str) -> str:
    """The layer's nodes for x (B, T, D), keep (B, T) int64 (1 token, 0 padding) and
    positions (B, T) int64; returns y (B, T, D)."""
    return _layer(g, shape, weights, x, keep, positions, None)[0]


def dsv4_sliding_cached(g: GraphBuilder, shape: DSV4Shape, weights: Mapping[str, Tensor],
                        x: str, keep: str, positions: str, past: str) -> tuple[str, str]:
    """A sliding layer's call after P cached rows: past (B, 1, P, d) the rotated key = value
    rows of the positions before these (transformers' sliding cache: at most W - 1), keep
    (B, >= P + T) int64 (its last P + T columns read: the past's and this call's), positions
    (B, T); returns y (B, T, D) and present (B, 1, min(P + T, W - 1), d)."""
    if shape.layer_type != SLIDING:
        raise UsageError(f"a {shape.layer_type} layer's cached call carries its compressor's "
                         "state too: build it with dsv4_cached")
    y, present, _ = dsv4_cached(g, shape, weights, x, keep, positions, past, {})
    return y, present


def dsv4_cached(g: GraphBuilder, shape: DSV4Shape, weights: Mapping[str, Tensor], x: str,
                keep: str, positions: str, past: str, state: Mapping[str, str]
                ) -> tuple[str, str, dict[str, str]]:
    """Any layer type's call after P cached positions: as ``dsv4_sliding_cached``, and a
    compressed layer's ``state`` the past compressor (and indexer) state by the eager state
    dict's key (graph_state.py: ``compressor.buffer_kv`` ...; every key of
    ``state_keys(layer_type)``); returns y, present and the updated state by key."""
    missing = set(state_keys(shape.layer_type)) - set(state)
    if missing:
        raise UsageError(f"a {shape.layer_type} layer's cached call needs its state "
                         f"{sorted(missing)}")
    y, present, presents = _layer(g, shape, weights, x, keep, positions, past, state)
    assert present is not None
    return y, present, presents


def _layer(g: GraphBuilder, s: DSV4Shape, w: Mapping[str, Tensor], x: str, keep: str,
           positions: str, past: str | None, state: Mapping[str, str] | None = None
           ) -> tuple[str, str | None, dict[str, str]]:
    """y (B, T, D), and with a past (B, 1, P, d) the sliding rows kept (B, 1, <= W - 1, d)
    and the updated compressor state (``state``: the past's; empty for a sliding layer)."""
    op = Ops(g)
    scaling = dict(s.rope_scaling) if s.rope_scaling else None
    cos, sin = cos_sin_at(g, positions, s.rope_dim, s.rope_theta, scaling)  # (B, T, r/2)
    q, kv, residual = _project(g, s, w, x, cos, sin)  # (B,H,T,d), (B,1,T,d), (B,T,Rq)
    present: str | None = None
    presents: dict[str, str] = {}
    if past is not None:
        kv = op.Concat(past, kv, axis=2, name="sliding_rows")  # (B, 1, P + T, d)
        present = _last_rows(g, kv, s.window - 1)  # (B, 1, min(P + T, W - 1), d)
    bias = _sliding_bias(g, s, keep, positions, kv)  # (B, 1, T, P + T)
    if s.layer_type != SLIDING:
        rows, row_bias, presents = pooled_rows(g, s, w, x, residual, positions, cos, sin,
                                               state if past is not None else None)
        kv = op.Concat(kv, rows, axis=2, name="keys_values")  # (B, 1, S, d)
        bias = op.Concat(bias, row_bias, axis=3, name="all_bias")  # (B, 1, T, S)
    o = _attend(g, s, w, q, kv, bias)  # (B, H, T, d)
    o = op.Reshape(op.Transpose(o, perm=[0, 2, 1, 3]),
                   g.ints("o_flat", [0, 0, s.heads * s.head_dim]))  # (B, T, H*d)
    o = rotate_tail(g, o, s.heads, s.head_dim, s.rope_dim, cos, op.Neg(sin, name="minus_sin"),
                    "unrotate")  # (B, T, H*d): the value's rotation undone
    return _grouped_output(g, s, w, o), present, presents  # y (B, T, D)


def _last_rows(g: GraphBuilder, rows: str, count: int) -> str:
    """rows (B, 1, R, d) -> the last min(R, count) of them (the node ``present_rows``)."""
    op = Ops(g).named("present")
    total = op.Shape(rows, start=2, end=3)  # (1,) R
    start = op.Max(op.Sub(total, g.ints("kept_rows", [count])), g.ints("zero_1d", [0]))
    return op.Slice(rows, start, total, g.ints("axes2_1d", [2]), name="rows")


def _project(g: GraphBuilder, s: DSV4Shape, w: Mapping[str, Tensor], x: str, cos: str,
             sin: str) -> tuple[str, str, str]:
    """x (B, T, D) -> q (B, H, T, d) and kv (B, 1, T, d), normalised and rotated, and the
    queries' low-rank residual q_a_norm(q_a_proj(x)) (B, T, Rq) (CSA's index queries')."""
    op = Ops(g)
    residual = rms_norm(g, g.linear(x, "q_a_proj", w["q_a_proj.weight"], None),
                        w["q_a_norm.weight"], s.eps, 0.0, "q_a_norm")  # (B, T, Rq)
    q = g.linear(residual, "q_b_proj", w["q_b_proj.weight"], None)  # (B, T, H*d)
    q = heads_rms_norm(g, q, s.heads, s.head_dim, torch.ones(s.head_dim), s.eps, 0.0,
                       "q_norm")  # (B, T, H*d): unweighted, per head
    q = rotate_tail(g, q, s.heads, s.head_dim, s.rope_dim, cos, sin, "q_rope")  # (B, T, H*d)
    q = op.Transpose(op.Reshape(q, g.ints("q_heads", [0, 0, s.heads, s.head_dim])),
                     perm=[0, 2, 1, 3], name="q")  # (B, H, T, d)
    kv = rms_norm(g, g.linear(x, "kv_proj", w["kv_proj.weight"], None), w["kv_norm.weight"],
                  s.eps, 0.0, "kv_norm")  # (B, T, d)
    kv = rotate_tail(g, kv, 1, s.head_dim, s.rope_dim, cos, sin, "kv_rope")  # (B, T, d)
    return q, op.Unsqueeze(kv, g.ints("axes1", [1]), name="kv"), residual  # kv (B, 1, T, d)


def _sliding_bias(g: GraphBuilder, s: DSV4Shape, keep: str, positions: str, keys: str
                  ) -> str:
    """(B, 1, T, R) additive over the R sliding keys (B, 1, R, d), the P = R - T past ones
    first: query i sees key j iff i - W < j <= i (positions; key j at positions[:, 0] - P + j,
    as the eager layer) and j is not padding (keep's last R columns). Nodes ``sliding_*``."""
    op = Ops(g).named("sliding")
    count = op.Shape(keys, start=2, end=3)  # (1,) R
    past = op.Sub(count, op.Shape(positions, start=1, end=2))  # (1,) P
    steps = op.Range(g.ints("zero", 0), op.Squeeze(count, g.ints("axes0", [0])),
                     g.ints("one", 1))  # (R,)
    first = op.Slice(positions, g.ints("zero_1d", [0]), g.ints("one_1d", [1]),
                     g.ints("axes1", [1]))  # (B, 1)
    key_pos = op.Unsqueeze(op.Add(op.Sub(first, past), steps), g.ints("axes1", [1]))  # B,1,R
    query_pos = op.Unsqueeze(positions, g.ints("axes_last", [2]))  # (B, T, 1)
    future = op.Greater(key_pos, query_pos, name="future")  # (B, T, R)
    oldest = op.Sub(query_pos, g.ints("window", s.window - 1))  # (B, T, 1)
    behind = op.Less(key_pos, oldest, name="behind")  # (B, T, R): i - j >= W
    keep = op.Slice(keep, op.Neg(count), op.Shape(keep, start=1, end=2),
                    g.ints("axes1", [1]))  # (B, R): the keys' own columns
    padding = op.Unsqueeze(op.Equal(keep, g.ints("pad", 0), name="padding_keys"),
                           g.ints("axes1", [1]))  # (B, 1, R): a test's fault edits it
    hidden = op.Or(op.Or(future, behind), padding)  # (B, T, R)
    return additive(g, op.Not(hidden, name="seen"), "sliding_mask")  # (B, 1, T, R)


def _attend(g: GraphBuilder, s: DSV4Shape, w: Mapping[str, Tensor], q: str, kv: str,
            bias: str) -> str:
    """q (B, H, T, d), kv (B, 1, S, d) the key and the value, bias (B, 1, T, S): softmax over
    [q . k / sqrt(d) + bias | the head's sink] (gpt-oss's sinks), the sink's column dropped,
    times the values -> (B, H, T, d). Nodes ``attn_*`` (``attn_sink``: a test's fault)."""
    op = Ops(g).named("attn")
    keys_t = op.Transpose(kv, perm=[0, 1, 3, 2])  # (B, 1, d, S)
    logits = op.Mul(op.MatMul(q, keys_t), g.const("attn.scale", np.array(s.head_dim ** -0.5)))
    logits = op.Add(logits, bias, name="logits")  # (B, H, T, S)
    rows = op.Concat(op.Shape(logits, start=0, end=3), g.ints("one_column", [1]),
                     axis=0)  # [B, H, T, 1]
    sink = op.Expand(g.const("sinks", w["sinks"].reshape(1, -1, 1, 1)), rows,
                     name="sink")  # (B, H, T, 1)
    probs = op.Softmax(op.Concat(logits, sink, axis=-1), axis=-1)  # (B, H, T, S + 1)
    keys = op.Shape(logits, start=3, end=4)  # (1,) S
    probs = op.Slice(probs, g.ints("zero_1d", [0]), keys, g.ints("axes_last_1d", [-1]),
                     name="probs")  # (B, H, T, S): the sink's column dropped
    return op.MatMul(probs, kv, name="context")  # (B, H, T, d)


def _grouped_output(g: GraphBuilder, s: DSV4Shape, w: Mapping[str, Tensor], o: str) -> str:
    """o (B, T, H*d) -> (B, T, D): each group of H / G consecutive heads through its own rows
    of o_a_proj (G*Ro, H*d/G), then o_b_proj. Nodes ``o_groups_*``."""
    op, gw = Ops(g).named("o_groups"), s.group_width
    o = op.Reshape(o, g.ints("o_groups_shape", [0, 0, s.o_groups, 1, gw]))  # (B, T, G, 1, gw)
    wa = w["o_a_proj.weight"].reshape(s.o_groups, s.o_lora_rank, gw).transpose(1, 2)
    low = op.MatMul(o, g.const("o_a_proj.weight", wa))  # (B, T, G, 1, Ro)
    low = op.Reshape(low, g.ints("o_low_shape", [0, 0, s.o_groups * s.o_lora_rank]))  # B,T,GRo
    return g.linear(low, "o_b_proj", w["o_b_proj.weight"], None)  # (B, T, D)


def dsv4_model(shape: DSV4Shape, weights: Mapping[str, Tensor], opset: int = OPSET,
               cached: bool = False) -> onnx.ModelProto:
    """The layer's ONNX model, float32, batch and seq dynamic: inputs x (batch, seq, D) float,
    attention_mask (batch, seq) int64 (1 token, 0 padding), position_ids (batch, seq) int64;
    output y (batch, seq, D). ``cached``: attention_mask (batch, past_seq + seq) (its last
    past_seq + seq columns read), past_key (batch, 1, past_seq, d) (the rotated key = value
    rows, past_seq <= window - 1; 0 at prefill), then a compressed layer's state inputs
    (graph_state.py: ``past_compressor.buffer_kv`` ..., zero-length at prefill), before
    position_ids; outputs present_key (batch, 1, min(past_seq + seq, window - 1), d) and the
    updated state (``present_compressor.buffer_kv`` ...) after y."""
    g = GraphBuilder(dtype="float32")
    keys = state_keys(shape.layer_type) if cached else ()
    if cached:
        state = {key: PAST_STATE + key for key in keys}
        y, present, presents = dsv4_cached(g, shape, weights, "x", "attention_mask",
                                           "position_ids", "past_key", state)
        outputs = {"y": y, "present_key": present,
                   **{PRESENT_STATE + key: presents[key] for key in keys}}
    else:
        outputs = {"y": dsv4_full_sequence(g, shape, weights, *INPUTS)}
    for name, tensor in outputs.items():
        g.nodes.append(helper.make_node("Identity", [tensor], [name], name=f"{name}_out"))
    inputs, outputs_info = _io(shape, cached)
    graph = helper.make_graph(g.nodes, f"dsv4_{shape.layer_type}", inputs, outputs_info,
                              initializer=g.initializers)
    opsets = [helper.make_opsetid("", opset)]
    return helper.make_model(graph, opset_imports=opsets, producer_name="mha-export",
                             ir_version=helper.find_min_ir_version_for(opsets))


def _io(shape: DSV4Shape, cached: bool) -> tuple[list, list]:
    """The model's inputs and outputs (ValueInfoProto), in order, with their shapes."""
    rows = [BATCH, 1, PAST, shape.head_dim]
    spec = {"x": (TensorProto.FLOAT, [BATCH, SEQ, shape.dim]),
            "attention_mask": (TensorProto.INT64, [BATCH, TOTAL if cached else SEQ]),
            "past_key": (TensorProto.FLOAT, rows),
            "position_ids": (TensorProto.INT64, [BATCH, SEQ]),
            "y": (TensorProto.FLOAT, [BATCH, SEQ, shape.dim]),
            "present_key": (TensorProto.FLOAT, rows[:2] + [PRESENT] + rows[3:])}
    inputs, outputs = list(INPUTS_CACHED if cached else INPUTS), list(
        OUTPUTS_CACHED if cached else ("y",))
    if cached:
        for key, dims in state_shapes(shape, BATCH).items():
            spec[PAST_STATE + key] = (TensorProto.FLOAT, dims)
            spec[PRESENT_STATE + key] = (TensorProto.FLOAT, [PRESENT_AXES.get(d, d)
                                                             for d in dims])
            inputs.insert(inputs.index("position_ids"), PAST_STATE + key)
            outputs.append(PRESENT_STATE + key)
    return ([helper.make_tensor_value_info(n, *spec[n]) for n in inputs],
            [helper.make_tensor_value_info(n, *spec[n]) for n in outputs])
