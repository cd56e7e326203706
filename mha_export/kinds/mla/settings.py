"""Multi-head Latent Attention's settings (DeepSeek-V2/V3), torch-free: ``Latent``, the
section MHAConfig nests (``MHAConfig.latent``, set: the layer is MLA, layout "latent") and what
the torch-free stages ask of it (derived fields, cache widths, the softmax scale, the slug, the
CLI options), and ``MLAConfig``, the flat view of an MLA layer that the eager layer (layer.py)
and the graph (graph.py, forms.py) read (``MLAConfig.of(config)``).

    per token the cache holds the normalised latent (R = kv_lora_rank) and one shared rotated
    key (Hr = qk_rope_head_dim); each head's query is [q_nope (Hn) | q_rot (Hr)], its key
    [k_nope (Hn) | k_rot (Hr)] and its value (Hv) come from the latent through kv_b_proj

Rotary layouts (MHAConfig.rotary of an MLA layer, ``ROPE_LAYOUTS``), which decide what the cache
holds: V2's complex-number form rotates pairs (2i, 2i+1) in place ("interleaved"); V3's
``rope_interleave`` reads those pairs and writes the halves [rotated evens | rotated odds]
("deinterleaving"); V3 without it rotates halves ("half"); Kimi Linear keeps the shared key's
part as it is ("unrotated": NoPE, no position_ids).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from ... import rope_types
from ...errors import UsageError, require_positive as _positive
from ...layer_option import refused_by
from ..section import section_from_json
from ..dsa.settings import SparseIndex

NAME = "Multi-head Latent Attention"
LAYOUT = "latent"  # the one weight layout of its checkpoints (and the kind's name)
ROPE_LAYOUTS = ("deinterleaving", "interleaved", "half", "unrotated")
UNROTATED = "unrotated"  # the rope part of queries and keys kept as is (Kimi Linear)
LATENT_FIELDS = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
INDEX_OPTIONS = ("index_topk", "index_heads", "index_head_dim", "index_source")  # SparseIndex


@dataclass(frozen=True)
class Latent:
    """What an MLA layer adds to MHAConfig (defaults: DeepSeek-V3's, without q LoRA)."""

    kv_lora_rank: int = 512  # R: the cached latent's width
    qk_nope_head_dim: int = 128  # Hn
    qk_rope_head_dim: int = 64  # Hr: the shared rotated key's width
    v_head_dim: int = 128  # Hv
    q_lora_rank: Optional[int] = None  # queries through a low-rank bottleneck (V3, V2 full)
    norm_eps: float = 1e-6  # the q_a / kv_a RMSNorms
    # DeepSeek Sparse Attention's lightning indexer (kinds/dsa/), or dense MLA
    index: Optional[SparseIndex] = None

    def __post_init__(self) -> None:
        for name in LATENT_FIELDS:
            _positive(name, getattr(self, name))
        if self.q_lora_rank is not None:
            _positive("q_lora_rank", self.q_lora_rank)
        if self.index is not None:
            object.__setattr__(self, "index", SparseIndex.from_value(self.index))
            self.index.check(self.q_lora_rank, self.qk_rope_head_dim)
        if self.qk_rope_head_dim % 2:
            raise UsageError(f"qk_rope_head_dim must be even, got {self.qk_rope_head_dim}")
        if isinstance(self.norm_eps, bool) or not (
                isinstance(self.norm_eps, (int, float)) and math.isfinite(self.norm_eps)
                and self.norm_eps > 0):
            raise UsageError(f"norm_eps must be a positive number, got {self.norm_eps!r}")

    def resolve(self, c: Any) -> Dict[str, Any]:
        """The MHAConfig fields this section decides, derived from it (a given one must agree);
        the options that do not apply to MLA refused. ``c``: the MHAConfig being built."""
        refused = {"a sliding window": c.sliding_window, "attention chunks": c.attention_chunk,
                   "v_head_dim (the latent section's)": c.v_head_dim, "alibi": c.alibi,
                   "qk_norm": c.qk_norm != "none", **refused_by(c, "latent"),
                   "sinks": c.sinks, "output_gate": c.output_gate,
                   "a non-causal layer": not c.causal, "dropout": c.dropout,
                   "norm_offset": c.norm_offset, "layout " + repr(c.layout):
                   c.layout not in (None, LAYOUT)}
        for name, on in refused.items():
            if on:
                raise UsageError(f"{name} does not apply to {NAME}")
        derived = {"d_in": c.dim, "kv_heads": 1, "layout": LAYOUT,
                   "head_dim": self.qk_nope_head_dim + self.qk_rope_head_dim,
                   "rotary": "deinterleaving" if c.rotary == "none" else c.rotary,
                   "rotary_dim": self.qk_rope_head_dim}
        for name, value in derived.items():
            given = getattr(c, name)
            if given is not None and given != value and name != "rotary":
                raise UsageError(f"{name} of a {NAME} layer is {value} (from its latent "
                                 f"section), got {given}")
        if derived["rotary"] not in ROPE_LAYOUTS:
            raise UsageError(f"unknown rotary {derived['rotary']!r} for {NAME}: choose one of "
                             f"{', '.join(ROPE_LAYOUTS)}")
        return {**derived, "out_bias": False if c.out_bias is None else c.out_bias}

    rotary_choices = ROPE_LAYOUTS

    def check_rope(self, scaling: Optional[dict]) -> None:
        if (scaling or {}).get("rope_type") == "longrope":
            raise UsageError(f"longrope does not apply to {NAME}")

    def cache_shape(self, c: Any) -> Tuple[int, int, int]:
        """(heads, key width, value width) of the cache: one head of the latent and the shared
        rotated key."""
        return 1, self.kv_lora_rank, self.qk_rope_head_dim + self.index_width

    @property
    def reach(self) -> int:
        """DSA: the top-k keys a query keeps (0: dense)."""
        return self.index.topk if self.index else 0

    @property
    def index_width(self) -> int:
        """The index key's width the value cache holds after k_rot (0: dense MLA)."""
        return self.index.cached_width if self.index else 0

    @property
    def extra_inputs(self) -> Tuple[str, ...]:
        """Inputs every call takes beyond its kind's (signature.py): a shared-top-k layer's
        source indices."""
        return ("topk_indices",) if self.index and self.index.shared else ()

    @property
    def extra_outputs(self) -> Tuple[str, ...]:
        """Outputs every call gives beyond its kind's (signature.py): the selection of a DSA
        layer whose top-k later shared layers read."""
        return ("topk_indices",) if self.index and self.index.feeds else ()

    def attended_kv_width(self, c: Any) -> int:
        """Numbers per key position once attention expands it: every head's key and value."""
        return c.heads * (c.head_dim + self.v_head_dim)

    def scale(self, c: Any) -> float:
        return MLAConfig.of(c).scale

    def slug(self, c: Any) -> str:
        q = self.q_lora_rank
        return (f"{c.layout}-h{c.heads}-d{c.dim}-r{self.kv_lora_rank}-rope{c.rotary_dim}"
                + (f"-q{q}" if q else "") + (f"-topk{self.index.topk}" if self.index else "")
                + (f"-of{self.index.source}" if self.index and self.index.shared else "")
                + ("-feeds" if self.index and self.index.feeds else ""))

    @property
    def cache_docs(self) -> Dict[str, str]:
        rope = "the rotated keys every head shares (qk_rope_head_dim wide)"
        shared = self.index is not None and self.index.shared
        if self.index and not shared:
            rope = (f"[{rope} | the lightning indexer's keys (index_head_dim wide)], side by "
                    "side")
        source = {"topk_indices": f"layer {self.index.source}'s top-k key positions of each "
                                  "query (one past the keys keeps nothing)"} if shared else {}
        if self.index and self.index.feeds:
            source = {"topk_indices": "this layer's top-k key positions of each query, best "
                                      "first (the selection later shared layers read)"}
        return {**source, "past_key": "the normalised latents (kv_lora_rank wide)",
                "past_value": rope, "present_key": "the latents after this call",
                "present_value": "the value cache after this call"}

    @classmethod
    def cli_options(cls) -> Dict[str, str]:
        """The CLI's options of this section (cli/options.py makes them): field -> help; the
        first turns the section on, the others need it."""
        return {"kv_lora_rank": f"{NAME} (DeepSeek-V2/V3): the cached latent's width; the "
                                "other MLA options need it (docs/mla.md) [default: not MLA].",
                "q_lora_rank": "MLA: queries through a low-rank bottleneck [default: none, "
                               "q_proj].",
                "qk_nope_head_dim": "MLA: each head's unrotated query/key width [default: "
                                    f"{cls.qk_nope_head_dim}].",
                "qk_rope_head_dim": "MLA: the shared rotated key's width [default: "
                                    f"{cls.qk_rope_head_dim}].",
                "v_head_dim": "Each value head's width, unlike the keys' (MiMo-V2) [default: "
                              f"head-dim]; MLA: each head's value width [default: "
                              f"{cls.v_head_dim}].",
                "index_topk": "MLA: DeepSeek Sparse Attention, each query's top K keys by its "
                              "lightning indexer (docs/mla.md) [default: dense].",
                "index_heads": "DSA: the indexer's heads [default: "
                               f"{SparseIndex.heads}].",
                "index_head_dim": "DSA: the indexer's head width [default: "
                                  f"{SparseIndex.head_dim}].",
                "index_source": "DSA: no indexer; each call takes layer N's top-k as the input "
                                "topk_indices (GLM-5's shared layers, docs/mla.md) [default: "
                                "its own indexer]."}

    @classmethod
    def from_options(cls, kw: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """The section's options popped from the CLI's keywords (None: none given); without
        --kv-lora-rank, --v-head-dim stays the standard layer's (MHAConfig.v_head_dim)."""
        given = {k: kw[k] for k in cls.cli_options() if kw.get(k) is not None}
        if set(given) <= {"v_head_dim"}:
            return None
        given = {k: kw.pop(k) for k in given}
        if "kv_lora_rank" not in given:
            raise UsageError(f"--{next(iter(given)).replace('_', '-')} needs --kv-lora-rank "
                             f"({NAME})")
        index = {k[len("index_"):]: given.pop(k) for k in INDEX_OPTIONS if k in given}
        if index and "topk" not in index:
            raise UsageError(f"--index-{next(iter(index)).replace('_', '-')} needs "
                             "--index-topk")
        return {**given, **({"index": index} if index else {})}

    @classmethod
    def from_value(cls, value: Any) -> "Latent":
        """A Latent, or config.json's object of one (unknown keys refused)."""
        return section_from_json(cls, value, "latent")


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
    index: Optional[SparseIndex] = None  # DeepSeek Sparse Attention's indexer

    @classmethod
    def of(cls, c: Any) -> "MLAConfig":
        """The flat view of an MHAConfig with a latent section."""
        if c.latent is None:
            raise UsageError(f"not a {NAME} layer (no latent section)")
        s = c.latent
        return cls(c.dim, c.heads, s.kv_lora_rank, s.qk_nope_head_dim, s.qk_rope_head_dim,
                   s.v_head_dim, s.q_lora_rank, c.qkv_bias, c.out_bias, c.rotary, c.rope_theta,
                   c.rope_scaling, s.norm_eps, s.index)

    def __post_init__(self) -> None:
        Latent(self.kv_lora_rank, self.qk_nope_head_dim, self.qk_rope_head_dim,
               self.v_head_dim, self.q_lora_rank, self.norm_eps, self.index)
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
        index = self.index.weight_shapes(self.dim, self.q_lora_rank) if self.index else {}
        return {**queries, "kv_a_proj_with_mqa": (r + self.qk_rope_head_dim, self.dim),
                "kv_b_proj": (n * (self.qk_nope_head_dim + self.v_head_dim), r),
                "o_proj": (self.dim, n * self.v_head_dim), **index}

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
        index = self.index.call_flops(seq, keys) if self.index else 0.0
        return projections + min(absorbed, expanded) + index


def yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0
