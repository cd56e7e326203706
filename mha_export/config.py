"""The one configuration dataclass that every stage (module, export, check) reads."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Optional

from .errors import UsageError, require_positive as _positive
from .layer_option import check_declared, option
from .kinds.kv_shared.settings import SharedKV
from .kinds.mla.settings import ROPE_LAYOUTS, Latent  # noqa: F401 (ROPE_LAYOUTS: the CLI's)
from .kinds.dsv4.settings import DeepSeekV4
from .kinds.qsa.settings import BlockIndex
from .rope_types import SCALING_FIELDS, SCALINGS, normalized_scaling  # noqa: F401

# A kind of attention other than the standard one is a section of the config (kinds/): its field
# -> its settings class, which derives the fields it decides, and answers the torch-free stages.
# Multi-head Latent Attention (kinds/mla/), cross-layer KV sharing (kinds/kv_shared/), Qwen4-exp's
# block top-k sparse attention (kinds/qsa/), DeepSeek-V4's attention (kinds/dsv4/)
SECTIONS = {"latent": Latent, "kv_shared": SharedKV, "qsa": BlockIndex, "dsv4": DeepSeekV4}
# "latent", "shared", "qsa", "dsv4": the layouts of a config with that section (its checkpoints'
# one)
LAYOUTS = ("single", "stacked", "split", "fused", "latent", "shared", "qsa", "dsv4")
# RMSNorm of q and k after the projections: over each head's features (Qwen3, Gemma 3, Qwen3.5) or
# over the whole projection before the heads split (OLMo 2).
QK_NORMS = ("none", "head", "full")
# the q/k norm's kind: rms = RMSNorm, layer = LayerNorm (the mean subtracted first: Phi, StableLM,
# Cohere), the latter with an optional bias
QK_NORM_TYPES = ("rms", "layer")
# what scales the queries (query_scale_beta): position = floor(position_id / length) (Ministral 3);
# slot = floor((slot + 1) / length), slot the query's cache index (Llama 4's temperature tuning)
QUERY_SCALE_BY = ("position", "slot")
# Rotary position embeddings (layer/rotary.py applies them); their settings are checked without
# torch (rope_types.py), so that an ONNX Runtime benchmark worker that reads a config never
# imports it.
ROTARY = ("none", "half", "interleaved")


@dataclass(frozen=True)
class MHAConfig:
    """Causal multi-head attention: x (B, T, d_in) -> y (B, T, dim).

    ``head_dim`` defaults to dim // heads; the inner width heads * head_dim may differ from dim
    (split/fused layouts project it back with an output projection).
    """

    dim: int = 768
    heads: int = 12
    d_in: int | None = None  # default: dim
    head_dim: int | None = None  # default: dim // heads
    v_head_dim: int | None = None  # each value head's width (default: head_dim; MiMo-V2's)
    kv_heads: int | None = None  # key/value heads (default: heads; 1 = multi-query)
    qkv_bias: bool = False
    # split / fused / latent only (single / stacked have no output projection); default True,
    # False for an MLA layer (DeepSeek's attention_bias is false)
    out_bias: Optional[bool] = None
    dropout: float = 0.0
    max_seq_len: int = 1024
    causal: bool = True
    sliding_window: int | None = None  # query i sees key j only when i - j < window (Mistral)
    # query i sees key j <= i only in its own chunk: (j - s) // C == (i - s) // C, s the slot of
    # its row's first token (Llama 4's attention_chunk_size)
    attention_chunk: int | None = None
    rotary: str = "none"  # "half" (GPT-NeoX / Llama) | "interleaved" (GPT-J) position embeddings
    rotary_dim: int | None = None  # features of each head that rotate (default: head_dim)
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # {"rope_type": "linear" | "llama3", "factor": ..., ...}
    qk_norm: str = "none"  # QK_NORMS: RMSNorm on q and k before rotary
    qk_norm_eps: float = option(1e-6, "The q/k norm's eps.", positive=True)
    qk_norm_type: str = "rms"  # QK_NORM_TYPES
    qk_norm_bias: bool = False  # the norm adds a learned bias (Phi's LayerNorm)
    qk_norm_per_head: bool = False  # one weight (and bias) per head, (N, H) (StableLM, Cohere)
    qk_norm_after_rope: bool = False  # the q/k norm after rotary, not before (Hunyuan)
    qk_norm_weightless: bool = False  # an RMSNorm without weight (Llama 4's L2 norm)
    qkv_clip: float | None = option(
        None, "Clamp q, k and v to [-clip, clip] after the projections (and q/k norm), before "
        "rotary (DBRX, OLMo, OLMoE: clip_qkv).", positive=True, refused_by={
            "latent": "qkv_clip",
            "kv_shared": "qkv_clip (it clamps the source layer's keys and values)"})
    # queries scaled by position after rotary: q * (1 + beta * log(1 + floor(pos / length)))
    # (Ministral 3's llama_4_scaling_beta over original_max_position_embeddings)
    query_scale_beta: float | None = option(
        None, "Queries times 1 + beta * log(1 + floor(position / length)) after rotary "
        "(Ministral 3's llama_4_scaling_beta); with --query-scale-length.", positive=True,
        refused_by={"latent": "query_scale_beta", "kv_shared": "query_scale_beta"})
    query_scale_length: int | None = None
    query_scale_by: str = "position"  # QUERY_SCALE_BY
    norm_offset: float = 0.0  # the norm multiplies by (norm_offset + weight): 1 for Gemma, Qwen3.5
    softmax_scale: float | None = option(
        None, "Softmax scale [default: 1/sqrt(head_dim)] (Gemma: query_pre_attn_scalar^-0.5, "
        "Granite: attention_multiplier).", positive=True,
        refused_by={"latent": "softmax_scale (MLA's is (Hn + Hr)^-0.5 and yarn's mscale)"})
    softcap: float | None = option(
        None, "Logit softcapping cap*tanh(s/cap), before the mask (Gemma 2).", positive=True,
        refused_by={"latent": "softcap"})
    sinks: bool = False  # a learned logit per head joins the softmax denominator (gpt-oss)
    # head h's score of query i and key j gains alibi_slopes[h] * (j - i) (BLOOM, MPT, Falcon)
    alibi: bool = False
    output_gate: bool = False  # y = out_proj(attention * sigmoid(x @ W_gate)) (Qwen3.5)
    out_norm_eps: float | None = option(
        None, "An RMSNorm of the attention output before the output projection, with this eps "
        "(BitNet's attn_sub_norm).", positive=True, refused_by={"latent": "out_norm_eps"})
    v_norm_eps: float | None = option(
        None, "Values RMS-normalised over each head's features, without a weight, with this "
        "eps (Gemma 3n's v_norm).", positive=True, refused_by={
            "latent": "v_norm_eps", "kv_shared": "a value norm (the source layer's)"})
    value_multiplier: float | None = option(
        None, "Values times this right after their projection (MiMo-V2's "
        "attention_value_scale) [default: none].", positive=True, refused_by={
            "latent": "value_multiplier", "kv_shared": "value_multiplier (the source layer's)"})
    layout: Optional[str] = None  # LAYOUTS (default: "latent" with a latent section, else split)
    latent: Optional[Latent] = None  # Multi-head Latent Attention (kinds/mla/), or a plain layer
    kv_shared: Optional[SharedKV] = None  # attends with another layer's keys and values
    qsa: Optional[BlockIndex] = None  # Qwen4-exp's indexer picks each query's blocks of keys
    dsv4: Optional[DeepSeekV4] = None  # DeepSeek-V4's sliding and compressed attention

    def __post_init__(self) -> None:
        _positive("dim", self.dim)
        _positive("heads", self.heads)
        _positive("max_seq_len", self.max_seq_len)
        if sum(getattr(self, f) is not None for f in SECTIONS) > 1:
            raise UsageError("a layer is of one attention kind: "
                             + " and ".join(SECTIONS) + " do not combine")
        if self.section is not None:
            self._resolve_section()
        if self.out_bias is None:
            object.__setattr__(self, "out_bias", True)
        if self.layout is None:
            object.__setattr__(self, "layout", "split")
        self._check_layout()
        if not 0.0 <= self.dropout < 1.0:
            raise UsageError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.d_in is None:
            object.__setattr__(self, "d_in", self.dim)
        _positive("d_in", self.d_in)
        if self.head_dim is None:
            if self.dim % self.heads:
                raise UsageError(
                    f"dim {self.dim} is not divisible by heads {self.heads} "
                    "(pick another head count or give --head-dim)")
            object.__setattr__(self, "head_dim", self.dim // self.heads)
        _positive("head_dim", self.head_dim)
        if self.v_head_dim is not None:
            _positive("v_head_dim", self.v_head_dim)
        self._check_rotary()
        self._check_logits()
        self._check_locality()
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        _positive("kv_heads", self.kv_heads)
        if self.heads % self.kv_heads:
            raise UsageError(f"heads ({self.heads}) must be a multiple of kv_heads "
                             f"({self.kv_heads}): query head h uses key/value head "
                             "h // (heads / kv_heads)")
        extras = [n for n, on in (("qk_norm", self.qk_norm != "none"), ("sinks", self.sinks),
                                  ("alibi", self.alibi),
                                  ("output_gate", self.output_gate),
                                  ("out_norm_eps", self.out_norm_eps)) if on]
        if self.layout in ("single", "stacked") and extras:
            raise UsageError(f"{extras[0]} has weights only the split and fused layouts hold "
                             f"(layout {self.layout!r})")
        if self.layout in ("single", "stacked") and self.kv_heads != self.heads:
            raise UsageError(f"layout {self.layout!r} has one key/value head per query head: "
                             "kv_heads must equal heads (use split or fused)")
        if self.layout == "single" and self.heads != 1:
            raise UsageError(f"layout 'single' has exactly one head, got heads={self.heads}")
        if self.layout in ("single", "stacked") and self.value_dim != self.head_dim:
            raise UsageError(f"layout {self.layout!r} has value heads as wide as its keys: "
                             "v_head_dim must equal head_dim (use split or fused)")
        if self.layout in ("single", "stacked") and self.inner != self.dim:
            raise UsageError(
                f"layout {self.layout!r} has no output projection, so heads*head_dim "
                f"({self.heads}*{self.head_dim}={self.inner}) must equal dim ({self.dim})")

    def _check_layout(self) -> None:
        """A known layout; a kind's own layout only with its section, one section at most."""
        if self.layout not in LAYOUTS:
            raise UsageError(f"unknown layout {self.layout!r}: choose one of {', '.join(LAYOUTS)}")
        if self.layout == "latent" and self.latent is None:
            raise UsageError("layout 'latent' is Multi-head Latent Attention: give its latent "
                             "section (--kv-lora-rank ...)")
        if self.layout == "shared" and self.kv_shared is None:
            raise UsageError("layout 'shared' is a KV-shared layer: give the layer it shares "
                             "with (--kv-shared-layer N)")
        if self.layout == "qsa" and self.qsa is None:
            raise UsageError("layout 'qsa' is Qwen4-exp's QSA: give its qsa section")
        if self.layout == "dsv4" and self.dsv4 is None:
            raise UsageError("layout 'dsv4' is DeepSeek-V4's attention: give its dsv4 section")

    @property
    def section(self) -> Any:
        """The settings of the layer's attention kind (config.SECTIONS), or None: standard
        multi-head / grouped-query attention."""
        return next((getattr(self, f) for f in SECTIONS if getattr(self, f) is not None), None)

    @property
    def kind(self) -> str:
        """The attention kind's name (kinds/registry.py): "standard", or its section's field."""
        return next((f for f in SECTIONS if getattr(self, f) is not None), "standard")

    def _resolve_section(self) -> None:
        """The section read (a dict from config.json too), and the fields it decides set."""
        field = self.kind
        section = SECTIONS[field].from_value(getattr(self, field))
        object.__setattr__(self, field, section)
        for name, value in section.resolve(self).items():
            object.__setattr__(self, name, value)

    @property
    def cache_shape(self) -> tuple[int, int, int]:
        """(heads, key width, value width) of the cache: (kv_heads, head_dim, v_head_dim), or the
        section's (an MLA layer's: latent and shared rotated key)."""
        if self.section is not None:
            return self.section.cache_shape(self)
        return self.kv_heads, self.head_dim, self.value_dim

    @property
    def reach(self) -> int:
        """How many keys a query can attend at most (0: all): the sliding window or chunk, or
        the section's (a sparse layer's top-k); the check's calls cross it."""
        own = getattr(self.section, "reach", 0)
        return self.sliding_window or self.attention_chunk or own

    @property
    def attended_kv_width(self) -> int:
        """Numbers per key position once attention reads it (keys: kv_heads * head_dim; an MLA
        layer: every head's expanded key and value)."""
        if self.section is not None:
            return self.section.attended_kv_width(self)
        return self.kv_inner

    @property
    def extra_inputs(self) -> tuple[str, ...]:
        """Inputs every call of the layer takes beyond its signature kind's, where its kind
        says (a GLM-5 shared-top-k layer's source indices): signature.py declares them."""
        return getattr(self.section, "extra_inputs", ())

    @property
    def extra_outputs(self) -> tuple[str, ...]:
        """Outputs every call of the layer gives beyond its signature kind's, where its kind
        says (a GLM-5 DSA layer's selection that later shared layers read)."""
        return getattr(self.section, "extra_outputs", ())

    @property
    def cache_docs(self) -> dict[str, str]:
        """What the cache tensors hold, where the kind says (signature.py)."""
        return getattr(self.section, "cache_docs", {})

    @property
    def inner(self) -> int:
        """Width of the concatenated query (or key) heads: heads * head_dim."""
        return self.heads * self.head_dim

    @property
    def value_dim(self) -> int:
        """Each value head's width: v_head_dim, else head_dim."""
        return self.v_head_dim or self.head_dim

    @property
    def v_inner(self) -> int:
        """Width of the merged attention output: heads * value_dim (the output projection's
        input, the output gate's and output norm's width)."""
        return self.heads * self.value_dim

    @property
    def kv_v_inner(self) -> int:
        """Width of the concatenated value heads: kv_heads * value_dim."""
        return self.kv_heads * self.value_dim

    def _check_rotary(self) -> None:
        choices = self.section.rotary_choices if self.section else ROTARY
        if self.rotary not in choices:
            raise UsageError(f"unknown rotary {self.rotary!r}: choose one of {', '.join(choices)}")
        if self.rotary == "none":
            return
        if self.rotary_dim is None:
            object.__setattr__(self, "rotary_dim", self.head_dim)
        _positive("rotary_dim", self.rotary_dim)
        if self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
            raise UsageError(f"rotary_dim must be even and <= head_dim ({self.head_dim}), "
                             f"got {self.rotary_dim}")
        if not (isinstance(self.rope_theta, (int, float)) and math.isfinite(self.rope_theta)
                and self.rope_theta > 0):
            raise UsageError(f"rope_theta must be a positive number, got {self.rope_theta!r}")
        object.__setattr__(self, "rope_scaling",
                           normalized_scaling(self.rope_scaling, self.rotary_dim))
        if self.section:
            self.section.check_rope(self.rope_scaling)

    def _check_logits(self) -> None:
        """q/k norm, the softmax scale, softcapping: each a finite positive number where set."""
        if self.qk_norm not in QK_NORMS:
            raise UsageError(f"unknown qk_norm {self.qk_norm!r}: choose one of "
                             f"{', '.join(QK_NORMS)}")
        if self.qk_norm_type not in QK_NORM_TYPES:
            raise UsageError(f"unknown qk_norm_type {self.qk_norm_type!r}: choose one of "
                             f"{', '.join(QK_NORM_TYPES)}")
        shaped = [name for name, on in (("qk_norm_type", self.qk_norm_type != "rms"),
                                        ("qk_norm_bias", self.qk_norm_bias),
                                        ("qk_norm_per_head", self.qk_norm_per_head),
                                        ("qk_norm_after_rope", self.qk_norm_after_rope),
                                        ("qk_norm_weightless", self.qk_norm_weightless)) if on]
        if shaped and self.qk_norm == "none":
            raise UsageError(f"{shaped[0]} shapes the q/k norm: it needs qk_norm head or full")
        self._check_query_scale()
        if self.qk_norm_weightless and (self.qk_norm != "head" or self.qk_norm_type != "rms"
                                        or self.qk_norm_bias or self.qk_norm_per_head):
            raise UsageError("qk_norm_weightless is an RMSNorm of each head without weights: it "
                             "needs qk_norm head and takes no qk_norm_type layer, qk_norm_bias "
                             "or qk_norm_per_head")
        if self.qk_norm_per_head and self.qk_norm != "head":
            raise UsageError("qk_norm_per_head gives each head its own norm weights: it needs "
                             f"qk_norm head, got {self.qk_norm!r}")
        check_declared(self)
        if not (isinstance(self.norm_offset, (int, float)) and math.isfinite(self.norm_offset)):
            raise UsageError(f"norm_offset must be a finite number, got {self.norm_offset!r}")

    def _check_query_scale(self) -> None:
        """Both query_scale settings or neither; positions come with rotary's position_ids."""
        beta, length = self.query_scale_beta, self.query_scale_length
        if (beta is None) != (length is None):
            raise UsageError("query_scale_beta and query_scale_length go together (q * (1 + "
                             "beta * log(1 + floor(position / length))))")
        if length is not None and (isinstance(length, bool) or not isinstance(length, int)
                                   or length <= 0):
            raise UsageError(f"query_scale_length must be a positive integer, got {length!r}")
        if self.query_scale_by not in QUERY_SCALE_BY:
            raise UsageError(f"unknown query_scale_by {self.query_scale_by!r}: choose one of "
                             f"{', '.join(QUERY_SCALE_BY)}")
        if beta is not None and self.rotary == "none" and self.query_scale_by == "position":
            raise UsageError("query_scale_beta scales queries by position: it needs rotary "
                             "(whose position_ids give the positions), or query_scale_by slot")

    def _check_locality(self) -> None:
        """A sliding window or attention chunks (not both): a positive length, causal only."""
        for name, what in (("sliding_window", "a sliding window"),
                           ("attention_chunk", "attention chunks")):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
                if not self.causal:
                    raise UsageError(f"{what} needs a causal layer")
        if self.sliding_window and self.attention_chunk:
            raise UsageError("a layer has a sliding window or attention chunks, not both")

    @property
    def kv_inner(self) -> int:
        """Width of the concatenated key (or value) heads: kv_heads * head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def groups(self) -> int:
        """Query heads per key/value head (1: plain multi-head attention)."""
        return self.heads // self.kv_heads

    @property
    def scale(self) -> float:
        """Softmax scale (default 1/sqrt(head_dim); a kind's own, e.g. MLA's): written once, read
        by every implementation."""
        if self.section is not None:
            return self.section.scale(self)
        return self.softmax_scale or 1.0 / math.sqrt(self.head_dim)

    def replace(self, **changes: Any) -> "MHAConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "MHAConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise UsageError(f"config has unknown fields: {', '.join(sorted(unknown))}")
        return cls(**d)

    def slug(self) -> str:
        """Folder-name form, e.g. 'split-h12-d768', 'latent-h16-d2048-r512-rope64'."""
        if self.section is not None:
            return self.section.slug(self)
        s = f"{self.layout}-h{self.heads}-d{self.dim}"
        if self.d_in != self.dim:
            s += f"-in{self.d_in}"
        if self.head_dim * self.heads != self.dim:
            s += f"-hd{self.head_dim}"
        if self.value_dim != self.head_dim:
            s += f"-vd{self.value_dim}"
        if self.kv_heads != self.heads:
            s += f"-kv{self.kv_heads}"
        if self.sliding_window:
            s += f"-w{self.sliding_window}"
        if self.attention_chunk:
            s += f"-chunk{self.attention_chunk}"
        if self.rotary != "none":
            s += f"-rope{self.rotary_dim}"
        if self.qk_norm != "none":
            s += f"-qkn{self.qk_norm}" + "".join(tag for tag, on in (
                ("-ln", self.qk_norm_type == "layer"), ("b", self.qk_norm_bias),
                ("-ph", self.qk_norm_per_head), ("-post", self.qk_norm_after_rope),
                ("-unit", self.qk_norm_weightless)) if on)
        if self.qkv_clip:
            s += f"-clip{self.qkv_clip:g}"
        return s + "".join(f"-{tag}" for tag, on in (("cap", self.softcap), ("sinks", self.sinks),
                                                     ("alibi", self.alibi),
                                                     ("gate", self.output_gate),
                                                     ("onorm", self.out_norm_eps),
                                                     ("vnorm", self.v_norm_eps)) if on)
