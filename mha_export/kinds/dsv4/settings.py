"""DeepSeek-V4's attention settings (torch-free): ``DSV4Shape``, one layer's shape as read from a
checkpoint's config.json (docs/deepseek-v4.md says what each layer type computes).

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
from typing import Any, Mapping, Optional

from ... import rope_types
from ...errors import UsageError, require_positive
from ...weights.families.base import Settings
from ...weights.families.rope import rope_scaling

SLIDING = "sliding_attention"
CSA, HCA = "compressed_sparse_attention", "heavily_compressed_attention"
LAYER_TYPES = (SLIDING, CSA, HCA)


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


def layer_type(cfg: Mapping[str, Any], layer: int) -> str:
    """The layer's type, or a one-line refusal (an index out of range)."""
    types = cfg.get("layer_types") or []
    if not 0 <= layer < len(types):
        raise UsageError(f"layer {layer} is not in this checkpoint: it has {len(types)} layers "
                         f"(0..{len(types) - 1})")
    return types[layer]


def _rope(cfg: Mapping[str, Any], kind: str) -> tuple[float, float, Optional[dict]]:
    """(theta, partial_rotary_factor, scaling) of the layer type's rope: "main" for sliding
    layers, "compress" (YaRN in the released checkpoints) for the others."""
    label = "main" if kind == SLIDING else "compress"
    rope = (cfg.get("rope_parameters") or {}).get(label) or {}
    factor = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor"))
    if factor is None:
        raise UsageError("config.json has no partial_rotary_factor (nor rope_parameters')")
    default = cfg.get("rope_theta" if label == "main" else "compress_rope_theta", 10000.0)
    return float(rope.get("rope_theta", default)), factor, rope_scaling(Settings(cfg), rope)


def shape_from_config(cfg: Mapping[str, Any], layer: int) -> DSV4Shape:
    """The shape of a layer from a deepseek_v4 config.json (as transformers 5.23's
    DeepseekV4Config writes it)."""
    kind = layer_type(cfg, layer)
    theta, factor, scaling = _rope(cfg, kind)
    head_dim = cfg["head_dim"]
    index = {"index_heads": cfg["index_n_heads"], "index_head_dim": cfg["index_head_dim"],
             "index_topk": cfg["index_topk"]} if kind == CSA else {}
    return DSV4Shape(
        dim=cfg["hidden_size"], heads=cfg["num_attention_heads"], head_dim=head_dim,
        rope_dim=int(head_dim * factor), q_lora_rank=cfg["q_lora_rank"],
        o_groups=cfg["o_groups"], o_lora_rank=cfg["o_lora_rank"], window=cfg["sliding_window"],
        rope_theta=theta, eps=float(cfg.get("rms_norm_eps", 1e-6)), layer_type=kind,
        rope_scaling=scaling,
        rate=(cfg.get("compress_rates") or {}).get(kind, 0) if kind != SLIDING else 0, **index)
