"""Multi-head Latent Attention's settings (DeepSeek-V2/V3), torch-free: ``Latent``, the
section MHAConfig nests (``MHAConfig.latent``, set: the layer is MLA, layout "latent"), and
``MLAConfig``, the flat view of an MLA layer that the eager layer (layer/mla.py) and the graph
(graph/mla.py) read (``MHAConfig.mla``).

    per token the cache holds the normalised latent (R = kv_lora_rank) and one shared rotated
    key (Hr = qk_rope_head_dim); each head's query is [q_nope (Hn) | q_rot (Hr)], its key
    [k_nope (Hn) | k_rot (Hr)] and its value (Hv) come from the latent through kv_b_proj

Rotary layouts (MHAConfig.rotary of an MLA layer, ``ROPE_LAYOUTS``), which decide what the cache
holds: V2's complex-number form rotates pairs (2i, 2i+1) in place ("interleaved"); V3's
``rope_interleave`` reads those pairs and writes the halves [rotated evens | rotated odds]
("deinterleaving"); V3 without it rotates halves ("half").
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from . import rope_types
from .errors import UsageError, require_positive as _positive

ROPE_LAYOUTS = ("deinterleaving", "interleaved", "half")
LATENT_FIELDS = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


@dataclass(frozen=True)
class Latent:
    """What an MLA layer adds to MHAConfig (defaults: DeepSeek-V3's, without q LoRA)."""

    kv_lora_rank: int = 512  # R: the cached latent's width
    qk_nope_head_dim: int = 128  # Hn
    qk_rope_head_dim: int = 64  # Hr: the shared rotated key's width
    v_head_dim: int = 128  # Hv
    q_lora_rank: Optional[int] = None  # queries through a low-rank bottleneck (V3, V2 full)
    norm_eps: float = 1e-6  # the q_a / kv_a RMSNorms

    def __post_init__(self) -> None:
        for name in LATENT_FIELDS:
            _positive(name, getattr(self, name))
        if self.q_lora_rank is not None:
            _positive("q_lora_rank", self.q_lora_rank)
        if self.qk_rope_head_dim % 2:
            raise UsageError(f"qk_rope_head_dim must be even, got {self.qk_rope_head_dim}")
        if isinstance(self.norm_eps, bool) or not (
                isinstance(self.norm_eps, (int, float)) and math.isfinite(self.norm_eps)
                and self.norm_eps > 0):
            raise UsageError(f"norm_eps must be a positive number, got {self.norm_eps!r}")

    @classmethod
    def from_value(cls, value: Any) -> "Latent":
        """A Latent, or config.json's dict of one (unknown keys refused)."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise UsageError(f"latent must be a JSON object, got {value!r}")
        unknown = set(value) - set(cls.__dataclass_fields__)
        if unknown:
            raise UsageError(f"latent has unknown fields: {', '.join(sorted(unknown))}")
        return cls(**value)


@dataclass(frozen=True)
class MLAConfig:
    """An MLA layer, flat, as a DeepSeek-V2/V3 config.json states it: x (B, T, dim) ->
    y (B, T, dim)."""

    dim: int  # hidden_size
    heads: int  # num_attention_heads
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: Optional[int] = None
    bias: bool = False  # attention_bias: q_a_proj, kv_a_proj_with_mqa
    out_bias: bool = False  # attention_bias: o_proj
    rope_layout: str = "deinterleaving"  # ROPE_LAYOUTS
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None  # yarn with mscale / mscale_all_dim, or None
    norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        Latent(self.kv_lora_rank, self.qk_nope_head_dim, self.qk_rope_head_dim,
               self.v_head_dim, self.q_lora_rank, self.norm_eps)
        if self.rope_layout not in ROPE_LAYOUTS:
            raise UsageError(f"unknown rope layout {self.rope_layout!r}: choose one of "
                             f"{', '.join(ROPE_LAYOUTS)}")
        object.__setattr__(self, "rope_scaling", rope_types.normalized_scaling(
            self.rope_scaling, self.qk_rope_head_dim))
        mscale = (self.rope_scaling or {}).get("mscale_all_dim")  # read for every scaling type
        if mscale is not None and (isinstance(mscale, bool) or not isinstance(
                mscale, (int, float)) or not math.isfinite(mscale) or mscale < 0):
            raise UsageError(f"rope_scaling mscale_all_dim must be a number >= 0, got {mscale!r}")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def scale(self) -> float:
        """(Hn + Hr)^-0.5, times yarn's mscale(factor, mscale_all_dim)^2 where it is set
        (transformers' ``yarn_apply_mscale``)."""
        s, scaling = self.qk_head_dim ** -0.5, self.rope_scaling or {}
        if scaling.get("rope_type") not in (None, "default") and scaling.get("mscale_all_dim"):
            m = yarn_mscale(scaling["factor"], scaling["mscale_all_dim"])
            s = s * m * m
        return s

    def cache_widths(self) -> Tuple[int, int]:
        """Numbers cached per token: (latent R, shared rotated key Hr)."""
        return self.kv_lora_rank, self.qk_rope_head_dim

    def weight_shapes(self) -> Dict[str, Tuple[int, int]]:
        """The projections' weights, [out, in], by checkpoint name."""
        q = self.heads * self.qk_head_dim
        r, n = self.kv_lora_rank, self.heads
        queries = {"q_proj": (q, self.dim)} if self.q_lora_rank is None else {
            "q_a_proj": (self.q_lora_rank, self.dim), "q_b_proj": (q, self.q_lora_rank)}
        return {**queries, "kv_a_proj_with_mqa": (r + self.qk_rope_head_dim, self.dim),
                "kv_b_proj": (n * (self.qk_nope_head_dim + self.v_head_dim), r),
                "o_proj": (self.dim, n * self.v_head_dim)}

    def call_flops(self, seq: int, pairs: float, keys: int) -> float:
        """FLOPs of a call of ``seq`` queries over ``keys`` keys with ``pairs`` (query, key)
        pairs, in the cheaper form: absorbed (kv_b_proj applied per query, 2R + Hr per pair and
        head) or expanded (kv_b_proj applied per key, Hn + Hr + Hv per pair and head)."""
        shapes = self.weight_shapes()
        kv_b = math.prod(shapes.pop("kv_b_proj"))
        projections = 2 * seq * sum(math.prod(s) for s in shapes.values())
        absorbed = 2 * seq * kv_b + 2 * pairs * self.heads * (2 * self.kv_lora_rank
                                                               + self.qk_rope_head_dim)
        expanded = 2 * keys * kv_b + 2 * pairs * self.heads * (
            self.qk_head_dim + self.v_head_dim)
        return projections + min(absorbed, expanded)


def refuse_unbuilt(config_latent: Optional["Latent"], int8_cache: bool) -> None:
    """What is not built for Multi-head Latent Attention yet: a one-line refusal (export and
    bench)."""
    if config_latent is None:
        return
    if int8_cache:
        raise UsageError("--kv-cache-dtype int8 is not built for Multi-head Latent Attention "
                         "yet (its latent cache is float)")


def yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0
