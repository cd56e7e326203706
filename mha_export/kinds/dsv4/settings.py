"""DeepSeek-V4's attention settings (torch-free): ``DSV4Shape``, one layer's shape as read from a
checkpoint's config.json (docs/deepseek-v4.md says what each layer type computes).

    queries   q_b_proj(RMSNorm(q_a_proj(x))) -> (B, S, H, d), then an unweighted RMSNorm per head
    key=value RMSNorm(kv_proj(x)) -> (B, S, d): one head, the key and the value of every head
    rotary    interleaved pairs on the trailing rope_dim channels (q, kv; inverse on the output)
    attention softmax with a per-head sink column, sliding-window causal mask with padding
    output    grouped low rank: o_groups groups of heads -> o_lora_rank each -> o_b_proj

Only ``sliding_attention`` layers are built; the compressed layer types are refused in one line.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ...errors import UsageError, require_positive

SLIDING = "sliding_attention"
# layer type -> what it needs that is not built (docs/deepseek-v4.md)
UNBUILT = {
    "compressed_sparse_attention": "its compressor (overlapping windows) and lightning indexer "
                                   "(top-k of the compressed rows)",
    "heavily_compressed_attention": "its compressor (windows of compress_rates' tokens pooled "
                                    "into extra key = value rows)",
}


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
    rope_theta: float = 10000.0  # the "main" rope's (sliding layers)
    eps: float = 1e-6  # rms_norm_eps

    def __post_init__(self) -> None:
        for name in ("dim", "heads", "head_dim", "q_lora_rank", "o_groups", "o_lora_rank",
                     "window"):
            require_positive(name, getattr(self, name))
        if self.rope_dim % 2 or not 0 <= self.rope_dim <= self.head_dim:
            raise UsageError(f"qk_rope_head_dim {self.rope_dim} must be even and at most "
                             f"head_dim {self.head_dim}")
        if self.heads % self.o_groups:
            raise UsageError(f"o_groups {self.o_groups} must divide num_attention_heads "
                             f"{self.heads}")

    @property
    def group_width(self) -> int:
        """The input width of one output group: H * d / o_groups."""
        return self.heads * self.head_dim // self.o_groups


def layer_type(cfg: Mapping[str, Any], layer: int) -> str:
    """The layer's type, or a one-line refusal (an index out of range, a type not built)."""
    types = cfg.get("layer_types") or []
    if not 0 <= layer < len(types):
        raise UsageError(f"layer {layer} is not in this checkpoint: it has {len(types)} layers "
                         f"(0..{len(types) - 1})")
    kind = types[layer]
    if kind in UNBUILT:
        raise UsageError(f"layer {layer} is DeepSeek-V4's {kind}: not built yet, it needs "
                         f"{UNBUILT[kind]} (only {SLIDING} layers are)")
    if kind != SLIDING:
        raise UsageError(f"layer {layer} has an unknown DeepSeek-V4 layer type {kind!r}")
    return kind


def shape_from_config(cfg: Mapping[str, Any], layer: int) -> DSV4Shape:
    """The shape of a sliding_attention layer from a deepseek_v4 config.json (as transformers
    5.23's DeepseekV4Config writes it); any other layer refused in one line."""
    layer_type(cfg, layer)
    head_dim = cfg["head_dim"]
    main = (cfg.get("rope_parameters") or {}).get("main") or {}
    factor = main.get("partial_rotary_factor", cfg.get("partial_rotary_factor"))
    if factor is None:
        raise UsageError("config.json has no partial_rotary_factor (nor rope_parameters.main's)")
    if main.get("rope_type", "default") != "default":
        raise UsageError(f"the main rope's type {main['rope_type']!r} is not built (default "
                         f"only)")
    return DSV4Shape(
        dim=cfg["hidden_size"], heads=cfg["num_attention_heads"], head_dim=head_dim,
        rope_dim=int(head_dim * factor), q_lora_rank=cfg["q_lora_rank"],
        o_groups=cfg["o_groups"], o_lora_rank=cfg["o_lora_rank"], window=cfg["sliding_window"],
        rope_theta=float(main.get("rope_theta", cfg.get("rope_theta", 10000.0))),
        eps=float(cfg.get("rms_norm_eps", 1e-6)))
