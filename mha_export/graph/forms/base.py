"""What a graph form is: one record per form (its core builder, opsets, where it switches code
path, what it supports, what it refuses), and the values a core reads and writes.

Shape legend: B = batch, T = this call's length, P = past length, S = P + T keys,
N = query heads, K = key/value heads, H = head size, D = N * H.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Optional

from ...config import MHAConfig
from ...signature import Signature
from ..builder import GraphBuilder, split_heads


class Feature(enum.Enum):
    """What a form may support beyond a causal full-sequence call."""

    NON_CAUSAL = "non-causal"
    KV_CACHE = "kv-cache"
    ATTENTION_MASK = "attention-mask"
    GQA = "gqa"
    SLIDING_WINDOW = "sliding-window"

    def __str__(self) -> str:
        return self.value


ALL_FEATURES = frozenset(Feature)


def required_features(config: MHAConfig, sig: Signature) -> frozenset[Feature]:
    """What a graph form must support to build this config and signature."""
    wanted = {Feature.KV_CACHE: sig.has_cache, Feature.ATTENTION_MASK: sig.has_mask,
              Feature.NON_CAUSAL: not config.causal, Feature.GQA: config.kv_heads != config.heads,
              Feature.SLIDING_WINDOW: bool(config.sliding_window)}
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
class AttentionIO:
    """Graph values a core reads (names in the builder's scope)."""

    q: str  # (B, T, D), not yet scaled
    k: str  # (B, T, K*H): this call's keys
    v: str  # (B, T, K*H)
    past_key: Optional[str] = None  # (B, K, P, H)
    past_value: Optional[str] = None
    attention_mask: Optional[str] = None  # (B, S) int64, 1 = token

    @property
    def has_cache(self) -> bool:
        return self.past_key is not None


@dataclass(frozen=True)
class AttentionOut:
    context: str  # (B, T, D)
    present_key: Optional[str] = None  # (B, K, S, H)
    present_value: Optional[str] = None


Core = Callable[[GraphBuilder, AttentionIO, MHAConfig], AttentionOut]


@dataclass(frozen=True)
class GraphForm:
    name: str
    core: Core
    min_opset: int
    summary: str
    memory: Memory
    domains: tuple = ()  # extra (domain, version) opset imports
    switch_seq_lens: tuple = ()  # lengths where the form changes code path (checked both sides)
    supports: frozenset[Feature] = frozenset()
    refuse: Callable[[MHAConfig], Optional[str]] = lambda c: None  # why a config cannot be built
    standard: bool = True  # only standard ONNX ops (runs outside ONNX Runtime)

    def problem(self, config: MHAConfig, sig: Signature) -> Optional[str]:
        """Why this form cannot build config with this signature, or None."""
        missing = sorted(str(f) for f in required_features(config, sig) - self.supports)
        if missing:
            return f"does not support {', '.join(missing)}"
        return self.refuse(config)


def keys_values(g: GraphBuilder, io: AttentionIO, c: MHAConfig) -> tuple[str, str]:
    """(B, K, S, H) keys and values: the past concatenated with this call's (= the present)."""
    k = split_heads(g, io.k, c.kv_heads, c.head_dim, "k")  # (B, K, T, H)
    v = split_heads(g, io.v, c.kv_heads, c.head_dim, "v")  # (B, K, T, H)
    if io.has_cache:
        k = g.op("Concat", [io.past_key, k], axis=2, name="all_keys")  # (B, K, S, H)
        v = g.op("Concat", [io.past_value, v], axis=2, name="all_values")  # (B, K, S, H)
    return k, v


def cache_out(io: AttentionIO, context: str, keys: str, values: str) -> AttentionOut:
    """The core's result: present_key/present_value only when the call has a cache."""
    return AttentionOut(context, keys, values) if io.has_cache else AttentionOut(context)
