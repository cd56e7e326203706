"""DeepSeek-V4's attention settings (torch-free): ``DSV4Shape``, one layer's shape (read from a
checkpoint's config.json by weights/families/deepseek_v4.py; docs/deepseek-v4.md says what each
layer type computes), and
``DeepSeekV4``, the section MHAConfig nests (``MHAConfig.dsv4``: the kind "dsv4", layout "dsv4"):
what of the shape MHAConfig's own fields do not hold (dim, heads, head_dim, rotary_dim,
rope_theta, rope_scaling and sliding_window do).

    queries   q_b_proj(RMSNorm(q_a_proj(x))) -> (B, S, H, d), then an unweighted RMSNorm per head
    key=value RMSNorm(kv_proj(x)) -> (B, S, d): one head, the key and the value of every head
    rotary    interleaved pairs on the trailing rope_dim channels (q, kv; inverse on the output)
    attention softmax with a per-head sink column, sliding-window causal mask with padding
    output    grouped low rank: o_groups groups of heads -> o_lora_rank each -> o_b_proj

    compressed  (compressed_sparse_attention, heavily_compressed_attention) windows of ``rate``
              tokens pooled into extra key = value rows; CSA's lightning indexer keeps the top
              ``index_topk`` of them per query

Every layer type is built, full-sequence and cached calls.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from ... import rope_types
from ...errors import UsageError, require_positive
from ...layer_option import declared
from ..section import ConfigOnlySection

SLIDING = "sliding_attention"
CSA, HCA = "compressed_sparse_attention", "heavily_compressed_attention"
LAYER_TYPES = (SLIDING, CSA, HCA)
NAME = "DeepSeek-V4 attention"
LAYOUT = "dsv4"  # its one weight layout: transformers' DeepseekV4Attention's tensor names
# the call kinds (signature.py) not built for it: its caches are not mapped onto the signature
UNBUILT_CALLS = {kind: f"--{kind} is not built for {NAME} yet: its caches (the sliding "
                       "window's rows, the compressor's and indexer's pooled rows and open "
                       "windows) are not mapped onto the signature's past_key/past_value; the "
                       "full-sequence call (--attention-mask) is"
                 for kind in ("kv-cache", "static-cache")}


@dataclass(frozen=True)
class DSV4Shape:
    """One sliding_attention layer of DeepSeek-V4 (V4-Flash's numbers by default)."""

    dim: int = 4096  # hidden_size (D)
    heads: int = 64  # num_attention_heads (H)
    head_dim: int = 512  # d: the query, key and value width of a head
    rope_dim: int = 64  # qk_rope_head_dim: the trailing channels rotated
    q_lora_rank: int = 1024
    o_groups: int = 8
    o_lora_rank: int = 1024
    window: int = 128  # sliding_window: a query sees itself and the window - 1 before it
    rope_theta: float = 10000.0  # the "main" rope's (sliding layers), "compress" (the others)
    eps: float = 1e-6  # rms_norm_eps
    layer_type: str = SLIDING  # LAYER_TYPES
    rate: int = 0  # compress_rates[layer_type]: tokens pooled into one row (0: sliding)
    index_heads: int = 0  # CSA's indexer: index_n_heads (Hi)
    index_head_dim: int = 0  # di
    index_topk: int = 0  # k
    rope_scaling: Optional[Mapping[str, Any]] = None  # the rope's scaling (yarn: "compress")

    def __post_init__(self) -> None:
        for name in ("dim", "heads", "head_dim", "q_lora_rank", "o_groups", "o_lora_rank",
                     "window"):
            require_positive(name, getattr(self, name))
        if self.rope_dim % 2 or not 0 <= self.rope_dim <= self.head_dim:
            raise UsageError(f"qk_rope_head_dim {self.rope_dim} must be even and at most "
                             f"head_dim {self.head_dim}")
        if self.layer_type not in LAYER_TYPES:
            raise UsageError(f"unknown DeepSeek-V4 layer type {self.layer_type!r}: choose one "
                             f"of {', '.join(LAYER_TYPES)}")
        if self.layer_type != SLIDING:
            require_positive(f"compress_rates' {self.layer_type}", self.rate)
        if self.layer_type == CSA:
            for name in ("index_heads", "index_head_dim", "index_topk"):
                require_positive(name, getattr(self, name))
            if self.rope_dim > self.index_head_dim:
                raise UsageError(f"index_head_dim {self.index_head_dim} must hold the rotated "
                                 f"{self.rope_dim} channels")
        scaling = rope_types.normalized_scaling(self.rope_scaling, self.rope_dim)
        if rope_types.attention_factor(scaling) != 1.0:
            raise UsageError(f"a rope attention_factor other than 1 is not built (DeepSeek-V4's "
                             f"is 1), got {rope_types.attention_factor(scaling)}")
        if self.heads % self.o_groups:
            raise UsageError(f"o_groups {self.o_groups} must divide num_attention_heads "
                             f"{self.heads}")

    @property
    def group_width(self) -> int:
        """The input width of one output group: H * d / o_groups."""
        return self.heads * self.head_dim // self.o_groups


OWN_OPTIONS = ("qk_norm_eps",)  # declared options it reads or ignores (its eps: DeepSeekV4's)
# DSV4Shape's fields MHAConfig holds itself: the shape's name -> MHAConfig's
SHARED_FIELDS = {"dim": "dim", "heads": "heads", "head_dim": "head_dim",
                 "rope_dim": "rotary_dim", "window": "sliding_window",
                 "rope_theta": "rope_theta", "rope_scaling": "rope_scaling"}


@dataclass(frozen=True)
class DeepSeekV4(ConfigOnlySection):
    """The layer's own settings (DSV4Shape's fields MHAConfig does not hold)."""

    json_name = "dsv4"  # MHAConfig's field, config.json's key (no annotation: not a field)

    layer_type: str = SLIDING  # LAYER_TYPES
    q_lora_rank: int = 1024
    o_groups: int = 8
    o_lora_rank: int = 1024
    eps: float = 1e-6  # rms_norm_eps
    rate: int = 0  # tokens pooled into one row (0: sliding)
    index_heads: int = 0  # CSA's indexer
    index_head_dim: int = 0
    index_topk: int = 0

    def shape(self, c: Any) -> DSV4Shape:
        """The eager layer's shape (its checks: DSV4Shape's)."""
        shared = {name: getattr(c, field) for name, field in SHARED_FIELDS.items()}
        own = {name: getattr(self, name) for name in self.__dataclass_fields__}
        return DSV4Shape(**shared, **own)

    def resolve(self, c: Any) -> Dict[str, Any]:
        """The layout, one key = value head, sinks; the options its layer does not have
        refused, the shape checked."""
        options = {f.name: getattr(c, f.name) for f, _ in declared(c)
                   if f.name not in OWN_OPTIONS}  # the declared ones it has none of
        refused = {**options, "attention chunks": c.attention_chunk,
                   "alibi": c.alibi, "softcap": c.softcap, "a non-causal layer": not c.causal,
                   "q/k/v biases": c.qkv_bias, "an output gate": c.output_gate,
                   "d_in other than dim": c.d_in not in (None, c.dim),
                   "v_head_dim other than head_dim": c.v_head_dim not in (None, c.head_dim),
                   "a q/k norm other than its own": c.qk_norm != "none",
                   "layout " + repr(c.layout): c.layout not in (None, LAYOUT)}
        for name, on in refused.items():
            if on:
                raise UsageError(f"{name} does not apply to {NAME}")
        missing = [name for name in ("head_dim", "sliding_window", "rotary_dim")
                   if getattr(c, name) is None]
        if missing:
            raise UsageError(f"{NAME} needs {', '.join(missing)}")
        self.shape(c)
        return {"layout": LAYOUT, "kv_heads": 1, "sinks": True, "out_bias": False}

    rotary_choices = ("interleaved",)

    def check_rope(self, scaling: Optional[dict]) -> None:
        return None  # DSV4Shape's (resolve): an attention_factor of 1

    def cache_shape(self, c: Any) -> Tuple[int, int, int]:
        """(heads, key width, value width): one rotated key = value row per token."""
        return 1, c.head_dim, c.head_dim

    def attended_kv_width(self, c: Any) -> int:
        return c.head_dim

    def scale(self, c: Any) -> float:
        return float(c.head_dim) ** -0.5

    def slug(self, c: Any) -> str:
        """'dsv4-csa4-h4-d64-hd32-w8' (sliding: 'dsv4-sliding-h4-...')."""
        kind = {SLIDING: "sliding", CSA: "csa", HCA: "hca"}[self.layer_type]
        rate = str(self.rate) if self.rate else ""
        return f"{LAYOUT}-{kind}{rate}-h{c.heads}-d{c.dim}-hd{c.head_dim}-w{c.sliding_window}"

    unbuilt_calls = UNBUILT_CALLS

    @property
    def cache_docs(self) -> Dict[str, str]:
        return {}


def config_fields(shape: DSV4Shape) -> Dict[str, Any]:
    """MHAConfig's fields of a layer's shape (the family record's, from config.json)."""
    own = {name: getattr(shape, name) for name in DeepSeekV4.__dataclass_fields__}
    shared = {field: getattr(shape, name) for name, field in SHARED_FIELDS.items()}
    scaling = shared["rope_scaling"]
    return {**shared, "rope_scaling": dict(scaling) if scaling else None,
            "rotary": "interleaved", "causal": True, "dsv4": own}
