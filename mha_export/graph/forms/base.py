"""What a graph form is: one record per form (its core builder, opsets, where it switches code
path, what it supports, what it refuses), and the values a core reads and writes.

Shape legend: B = batch, T = this call's length, P = past length, S = P + T keys,
N = query heads, K = key/value heads, H = head size, D = N * H.
"""
from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
from onnx import TensorProto

from ...config import MHAConfig
from ...signature import INT8, Signature
from ..builder import GraphBuilder, as_1d, dim, finite_lowest, split_heads
from ..ops import Ops


class Feature(enum.Enum):
    """What a form may support beyond a causal full-sequence call."""

    NON_CAUSAL = "non-causal"
    KV_CACHE = "kv-cache"
    ATTENTION_MASK = "attention-mask"
    GQA = "gqa"
    SLIDING_WINDOW = "sliding-window"
    CHUNKED = "attention-chunks"
    VALUE_WIDTH = "value-head-width"  # value heads narrower or wider than the keys'
    ALIBI = "alibi"
    SOFTCAP = "softcap"
    SINKS = "sinks"
    STATIC_CACHE = "static-cache"
    INT8_CACHE = "int8-cache"

    def __str__(self) -> str:
        return self.value


ALL_FEATURES = frozenset(Feature)  # every feature of a standard layer
# What a core built on the standard Attention node supports: it has no sink logits. Its
# softcap attribute is applied before the mask by ONNX Runtime 1.31 (transformers' order; proven
# in tests/test_layer_options.py), so softcapping is built with it.
# The value heads' own width is built with MatMuls only (decomposed, blocked-plain).
ATTENTION_NODE_FEATURES = ALL_FEATURES - {Feature.SINKS, Feature.STATIC_CACHE,
                                          Feature.INT8_CACHE, Feature.VALUE_WIDTH,
                                          Feature.ALIBI}



def required_features(config: MHAConfig, sig: Signature) -> frozenset[Feature]:
    """What a graph form must support to build this config and signature."""
    wanted = {Feature.KV_CACHE: sig.has_cache and not sig.static_cache,
              Feature.STATIC_CACHE: sig.static_cache, Feature.ATTENTION_MASK: sig.has_mask,
              Feature.NON_CAUSAL: not config.causal, Feature.GQA: config.kv_heads != config.heads,
              Feature.SLIDING_WINDOW: bool(config.sliding_window),
              Feature.CHUNKED: bool(config.attention_chunk), Feature.ALIBI: config.alibi,
              Feature.VALUE_WIDTH: (config.kind == "standard"
                                    and config.value_dim != config.head_dim),
              Feature.SOFTCAP: bool(config.softcap), Feature.SINKS: config.sinks,
              Feature.INT8_CACHE: sig.cache_dtype == INT8}
    return frozenset(f for f, on in wanted.items() if on)


@dataclass(frozen=True)
class Memory:
    """Whether a form materialises the (N, T, S) attention scores of a call of T queries: below
    ``linear_from`` it does (None: at every T; 0: never, memory linear in T)."""

    linear_from: Optional[int]

    def quadratic_at(self, t: int) -> bool:
        return self.linear_from is None or t < self.linear_from

    def __str__(self) -> str:
        if self.linear_from is None:
            return "O(N*T*S)"
        return "linear in T" + (f" from T = {self.linear_from}" if self.linear_from else "")


QUADRATIC = Memory(None)
LINEAR = Memory(0)


@dataclass(frozen=True)
class Int8Cache:
    """An int8 cache's static scales (graph values: (1,) per tensor | (1, K, 1, H) per channel)
    and their layout, as GroupQueryAttention's k_quant_type / v_quant_type name it."""

    k_scale: str
    v_scale: str
    k_quant_type: str  # "PER_TENSOR" | "PER_CHANNEL"
    v_quant_type: str


@dataclass(frozen=True)
class AttentionIO:
    """Graph values a core reads (names in the builder's scope)."""

    q: Optional[str]  # (B, T, D), not yet scaled; None for a form that projects per branch
    k: Optional[str]  # (B, T, K*H): this call's keys (None: the past holds them, KV-shared)
    v: Optional[str]  # (B, T, K*H)
    past_key: Optional[str] = None  # (B, K, P, H)
    past_value: Optional[str] = None
    attention_mask: Optional[str] = None  # (B, S) int64, 1 = token
    sinks: Optional[str] = None  # (1, N, 1, 1): one logit per head in the softmax denominator
    alibi: Optional[str] = None  # (1, N, 1, 1): ALiBi's slope per head
    past_lengths: Optional[str] = None  # (B,) int64: a static cache's valid entries per row
    # builds q, k, v from x in a builder (a branch of an If too: a form whose GraphForm's
    # inputs are per_branch, so that no q/k/v of the whole call is captured by the If)
    project: Optional[Callable[["GraphBuilder"], tuple[str, str, str]]] = None
    int8_cache: Optional[Int8Cache] = None  # the static buffers hold int8 codes
    # x -> q, k and v packed, (B, T, (N + 2K)*H), unrotated: one projection of the concatenated
    # weights, for a core that applies rotary itself (``GraphForm.inputs`` = packed_qkv)
    project_packed: Optional[Callable[["GraphBuilder"], str]] = None
    qkv: Optional[str] = None  # (B, T, (N + 2K)*H): project_packed's, where the form asks
    position_ids: Optional[str] = None  # (B, T) int64: a rotary layer's positions

    @property
    def has_cache(self) -> bool:
        return self.past_key is not None

    def cache_elem(self, g: GraphBuilder) -> int:
        """The element type of present_key / present_value."""
        return TensorProto.INT8 if self.int8_cache else g.elem


@dataclass(frozen=True)
class AttentionOut:
    context: str  # (B, T, D)
    present_key: Optional[str] = None  # (B, K, S, H)
    present_value: Optional[str] = None


Core = Callable[[GraphBuilder, AttentionIO, MHAConfig], AttentionOut]
# (builder, the layer's io) -> the io its core reads: which projections are built before it
Inputs = Callable[[GraphBuilder, AttentionIO], AttentionIO]


def separate_qkv(g: GraphBuilder, io: AttentionIO) -> AttentionIO:
    """The layer's three projections, normalised and rotated (io.project) before the core."""
    q, k, v = io.project(g)  # (B, T, N*H), 2 x (B, T, K*H)
    return dataclasses.replace(io, q=q, k=k, v=v)


def packed_qkv(g: GraphBuilder, io: AttentionIO) -> AttentionIO:
    """One projection of the concatenated weights, unrotated: the core applies rotary."""
    return dataclasses.replace(io, qkv=io.project_packed(g))  # (B, T, (N + 2K)*H)


def per_branch(g: GraphBuilder, io: AttentionIO) -> AttentionIO:
    """Nothing before the core: it projects inside each If branch itself (an If that captured
    the whole call's q, k and v kept them live until it returned: +3 x 48 MiB at T = 16384,
    12 x 768)."""
    return io
# (builder, config, weights, form, signature, opset, int8 cache scales) -> the graph values of
# the signature's outputs: the layer around a form's core (graph/model.py: the standard one)
LayerBuilder = Callable[..., dict]


@dataclass(frozen=True)
class GraphForm:
    name: str
    core: Core
    min_opset: int
    summary: str
    memory: Memory
    switch_seq_lens: tuple = ()  # lengths where the form changes code path (checked both sides)
    supports: frozenset[Feature] = frozenset()
    requires: frozenset[Feature] = frozenset()  # what every model it builds has (a static cache)
    refuse: Callable[[MHAConfig], Optional[str]] = lambda c: None  # why a config cannot be built
    standard: bool = True  # only standard ONNX ops (runs outside ONNX Runtime)
    # a static cache: can it run several new tokens over a non-empty cache at batch > 1? (no:
    # such a call is refused by the runtime with an error, never answered wrongly)
    static_chunks: bool = True
    # what is built before the core: the three projections and rotary (separate_qkv), one
    # packed projection whose rotary the core applies (packed_qkv), nothing (per_branch)
    inputs: Inputs = separate_qkv
    # the longest static buffer (and call) it runs, from the layer (None: any): a table of
    # that many positions is in the graph; longer ones are refused by the runtime, never wrong
    max_cache: Optional[Callable[[MHAConfig], int]] = None
    # can it run T > 1 at batch > 1 at all (over an empty cache too)? (no: NaN, never a wrong
    # number; the check leaves such calls out)
    batch_prompts: bool = True
    kind: str = "standard"  # the attention kind whose layers it builds (MHAConfig.kind)
    layer: Optional[LayerBuilder] = None  # its kind's layer around the core (None: standard)

    def problem(self, config: MHAConfig, sig: Signature) -> Optional[str]:
        """Why this form cannot build config with this signature, or None."""
        if config.kind != self.kind:
            return f"builds {self.kind} layers only (this layer is {config.kind})"
        wanted = required_features(config, sig)
        missing = sorted(str(f) for f in wanted - self.supports)
        if missing:
            return f"does not support {', '.join(missing)}"
        lacking = sorted(str(f) for f in self.requires - wanted)
        if lacking:
            return f"builds {', '.join(lacking)} models only"
        return self.refuse(config)


def keys_values(g: GraphBuilder, io: AttentionIO, c: MHAConfig) -> tuple[str, str]:
    """(B, K, S, H) keys and (B, K, S, Hv) values: the past concatenated with this call's (= the
    present); the past itself where this call has none of its own (io.k None: a KV-shared
    layer's keys and values, given whole)."""
    if io.k is None:
        return io.past_key, io.past_value  # (B, K, S, H)
    k = split_heads(g, io.k, c.kv_heads, c.head_dim, "k")  # (B, K, T, H)
    v = split_heads(g, io.v, c.kv_heads, c.value_dim, "v")  # (B, K, T, Hv)
    if io.has_cache:  # all_keys / all_values: tests' faults edit them
        k = Ops(g).Concat(io.past_key, k, axis=2, name="all_keys")  # (B, K, S, H)
        v = Ops(g).Concat(io.past_value, v, axis=2, name="all_values")  # (B, K, S, H)
    return k, v


def cache_out(io: AttentionIO, context: str, keys: str, values: str) -> AttentionOut:
    """The core's result: present_key/present_value only when the call has a cache."""
    return AttentionOut(context, keys, values) if io.has_cache else AttentionOut(context)


def probabilities(g: GraphBuilder, scores: str, masked: Optional[str], c: MHAConfig,
                  sinks: Optional[str], bias: Optional[str] = None) -> str:
    """Scores (B, N, Tq, S) of scaled queries -> probabilities, in transformers' order:
    cap * tanh(s / cap) (softcapping) -> + bias (ALiBi's, (B|1, N, Tq, S)) -> masked -> softmax
    over the keys and one sink logit per head, whose column is dropped afterwards. The
    capped_in, capped_scores and masked_scores nodes: a test's fault reorders them; the
    probabilities: the node ``probs``."""
    op = Ops(g)
    if c.softcap:
        cap = g.const("softcap", np.array(c.softcap))
        scores = op.Mul(op.Tanh(op.Div(scores, cap, name="capped_in")), cap,
                        name="capped_scores")  # (B, N, Tq, S)
    if bias is not None:
        scores = op.Add(scores, bias, name="biased_scores")  # (B, N, Tq, S)
    if masked is not None:
        scores = op.Where(masked, g.const("mask_fill", finite_lowest(g.dtype)), scores,
                          name="masked_scores")  # (B, N, Tq, S)
    if sinks is None:
        return op.Softmax(scores, axis=-1, name="probs")  # (B, N, Tq, S)
    with_sinks = op.named("sinks")
    rows = with_sinks.Concat(with_sinks.Shape(scores, start=0, end=3),
                             g.ints("one_column", [1]), axis=0)  # [B, N, Tq, 1]
    column = with_sinks.Expand(sinks, rows)  # (B, N, Tq, 1)
    logits = with_sinks.Concat(scores, column, axis=-1)  # (B, N, Tq, S + 1)
    probs = with_sinks.Softmax(logits, axis=-1)  # (B, N, Tq, S + 1)
    keys = with_sinks.Shape(scores, start=3, end=4)  # (1,) S
    return op.Slice(probs, g.ints("zero_1d", [0]), keys, g.ints("axes_last_1d", [-1]),
                    name="probs")  # (B, N, Tq, S): the sink's column dropped


def static_keys_values(g: GraphBuilder, io: AttentionIO, c: MHAConfig, seq_len: str,
                       valid_prefix: bool = True) -> tuple[str, str, str, str]:
    """A static cache: this call's keys/values written into the buffers at rows' positions
    past_lengths[b] + i (ScatterND: in place when the caller binds present to past), and the
    valid prefix [0, max(past_lengths) + T) that attention reads (``valid_prefix=False``: the
    buffers themselves, for a core that slices its own ranges of them).
    Returns (keys, values) (B, K, S, H) and (present_key, present_value) (B, K, C, H).
    A KV-shared layer's (io.k None) buffers are read as given: written by their source layer."""
    if io.k is None:
        keys, values = valid_prefixes(g, io.past_lengths, seq_len, (io.past_key, "valid_keys"),
                                      (io.past_value, "valid_values"))  # (B, K, S, H)
        return keys, values, io.past_key, io.past_value
    k = split_heads(g, io.k, c.kv_heads, c.head_dim, "k")  # (B, K, T, H)
    v = split_heads(g, io.v, c.kv_heads, c.value_dim, "v")  # (B, K, T, Hv)
    if io.int8_cache:  # quantized on write
        k = int8_codes(g, k, io.int8_cache.k_scale, "key")  # (B, K, T, H) int8
        v = int8_codes(g, v, io.int8_cache.v_scale, "value")
    index = write_index(g, io.past_lengths, k, seq_len)  # (B, K, T, 3)
    op = Ops(g)  # key_write / value_write: tests look them up
    present_k = op.ScatterND(io.past_key, index, k, name="key_write")  # (B, K, C, H)
    present_v = op.ScatterND(io.past_value, index, v, name="value_write")  # (B, K, C, H)
    if not valid_prefix:
        return present_k, present_v, present_k, present_v
    keys, values = valid_prefixes(g, io.past_lengths, seq_len, (present_k, "valid_keys"),
                                  (present_v, "valid_values"))  # (B, K, S, H)
    keys, values = read_cache(g, io, keys, values)
    return keys, values, present_k, present_v


def valid_prefixes(g: GraphBuilder, past_lengths: str, seq_len: str,
                   *buffers: tuple[str, str]) -> list[str]:
    """Each (buffer (B, ., C, .), name)'s valid prefix [0, max(past_lengths) + T) on axis 2:
    what a static cache's attention reads after this call's write."""
    op = Ops(g)
    end = op.Add(op.ReduceMax(past_lengths, keepdims=0), seq_len,
                 name="valid_end")  # () max(past_lengths) + T
    prefix = [g.ints("zero_1d", [0]), as_1d(g, end, "valid_end_1d"), g.ints("axes2_1d", [2])]
    return [op.Slice(buffer, *prefix, name=name) for buffer, name in buffers]


def int8_codes(g: GraphBuilder, x: str, scale: str, name: str) -> str:
    """An int8 cache's write in standard ops: clip(round(x / scale), -128, 127) as int8 (ONNX
    Round rounds half to even, as GroupQueryAttention's int8 write does). Nodes named
    ``<name>_*`` (``_rounded``, ``_clipped``: tests' faults edit them)."""
    op = Ops(g).named(name)
    rounded = op.Round(op.Div(x, scale), name="rounded")
    clipped = op.Clip(rounded, g.const("int8_lowest", np.array(-128.0)),
                      g.const("int8_highest", np.array(127.0)), name="clipped")
    return op.Cast(clipped, to=TensorProto.INT8, name="codes")


def read_cache(g: GraphBuilder, io: AttentionIO, keys: str, values: str) -> tuple[str, str]:
    """Keys and values (B, K, S, H) as attention reads them: an int8 cache's codes * scale
    (the Mul ``key_read``: a test's fault looks it up)."""
    if not io.int8_cache:
        return keys, values
    read = []
    for codes, scale, name in ((keys, io.int8_cache.k_scale, "key"),
                               (values, io.int8_cache.v_scale, "value")):
        op = Ops(g).named(name)
        read.append(op.Mul(op.Cast(codes, to=g.elem), scale, name="read"))  # (B, K, S, H)
    return read[0], read[1]


def write_index(g: GraphBuilder, past_lengths: str, k: str, seq_len: str) -> str:
    """ScatterND's index of entry (b, h, i) of this call's keys k (B, K, T, H): (b, h,
    past_lengths[b] + i), (B, K, T, 3) int64 (ScatterElements' per-element index was H times
    larger, and its kernel ~30x slower on a long prefill). Nodes named ``write_*``
    (``write_positions``: a test's fault shifts it)."""
    op = Ops(g).named("write")
    steps = op.Range(g.ints("zero", 0), seq_len, g.ints("one", 1))  # (T,)
    rows = op.Unsqueeze(past_lengths, g.ints("axes1", [1]))  # (B, 1)
    written = op.Add(rows, steps, name="positions")  # (B, T)
    shape = op.Shape(k, start=0, end=3)  # (3,) = (B, K, T)
    batch = dim(g, k, 0, "write_batch")
    heads = dim(g, k, 1, "write_heads")
    parts = [op.Reshape(op.Range(g.ints("zero", 0), batch, g.ints("one", 1)),
                        g.ints("ids_b11", [-1, 1, 1])),  # (B,) -> (B, 1, 1)
             op.Reshape(op.Range(g.ints("zero", 0), heads, g.ints("one", 1)),
                        g.ints("ids_1k1", [1, -1, 1])),  # (K,) -> (1, K, 1)
             op.Unsqueeze(written, g.ints("axes1", [1]))]  # (B, 1, T)
    parts = [op.Unsqueeze(op.Expand(p, shape), g.ints("axes_last", [-1]))
             for p in parts]  # 3 x (B, K, T, 1): batch, head, slot
    return op.Concat(*parts, axis=-1)  # (B, K, T, 3)
