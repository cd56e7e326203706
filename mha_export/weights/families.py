"""Hugging Face checkpoint families: one ``Family`` record per config.json ``model_type``.

A record says where a layer's attention tensors live, what they are called in our layouts, the
MHAConfig fields config.json gives (both transformers spellings: 4.x rope_theta, rope_scaling,
rotary_pct, rotary_emb_base and 5.x rope_parameters, partial_rotary_factor, layer_types), and
transformers' defaults for the keys a config.json may omit — data in the record, read through
``Settings``. ``huggingface`` does the reading (files, shards, layer selection, errors).

Adding a model type is one record in FAMILIES (and a row in docs/checkpoints.md's table): reuse a
fields function (``decoder_fields`` serves Llama-style decoders: its layer-type rule, biases and
extras — q/k norms, softmax scale, softcapping, sinks, output gate, NoPE layers — are arguments)
and write a small one, or a ``convert``, only where the new type's math differs. Multimodal
wrappers (Gemma 3, Qwen3.5) are their text model's record with ``nested`` (config.json's
text_config) and ``prefix`` (the language model's tensors only, never the vision tower's or a
multi-token-prediction head's).

Torch-free on purpose (``convert`` functions only call tensor methods): the CLI reads the
registry for its help without importing torch.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Union

from ..errors import UsageError


@dataclass(frozen=True)
class Settings:
    """config.json, read-only; a key it omits takes the family's default (transformers')."""

    config: Mapping[str, Any]
    defaults: Mapping[str, Any] = field(default_factory=dict)

    def __contains__(self, key: str) -> bool:
        return key in self.config or key in self.defaults

    def __getitem__(self, key: str) -> Any:
        return self.config[key] if key in self.config else self.defaults[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default

    def first(self, *keys: str) -> Any:
        """The first of keys that config.json sets, else the default of the first that has one
        (one setting under its old and new names)."""
        for source in (self.config, self.defaults):
            for key in keys:
                if key in source:
                    return source[key]
        raise KeyError(" / ".join(keys))


Fields = Callable[[Settings, int], dict]  # config.json (with defaults), layer -> MHAConfig fields
Convert = Callable[[dict, dict], dict]  # (fields, {our-named tensors}) -> our state dict
ANY_PREFIX = r"(?:^|\.)"  # tensor names: anything (or nothing) before the attention module


def unchanged(fields: dict, tensors: dict) -> dict:
    """Tensors already in our layout once renamed."""
    return tensors


@dataclass(frozen=True)
class Family:
    model_type: str  # config.json's model_type, e.g. "llama"
    layout: str  # our layout its tensors map onto: "split" | "fused" | "latent"
    attention: str  # the layer's attention module, after the prefix ("model.", "transformer.")
    tensors: dict[str, str]  # checkpoint module (or parameter) -> ours ({"q_proj": "W_query"})
    defaults: dict[str, Any]  # transformers' defaults for the config.json keys `fields` reads
    fields: Fields
    convert: Convert = unchanged
    layer_count: str = "num_hidden_layers"  # the config.json key (no default: never guessed)
    context: str = "max_position_embeddings"  # the config.json key of the context length
    nested: Optional[str] = None  # multimodal: the key of the text model's config ("text_config")
    prefix: str = ANY_PREFIX  # regex matched right before `attention` in tensor names
    summary: str = ""  # what it reads from config.json, for the docs' table / help


# Rotary position embeddings --------------------------------------------------------------------

RopeAliases = Mapping[str, str]  # a model type's old rope type names -> ours (Phi-3: su)
LONG_CONTEXT = ("llama3", "yarn", "longrope")  # rope types with original_max_position_embeddings
OWN_KEYS = ("rope_theta", "rope_type", "type", "partial_rotary_factor")


def rope_scaling(s: Settings, params: Mapping[str, Any],
                 aliases: Optional[RopeAliases] = None) -> Optional[dict]:
    """MHAConfig's rope_scaling from one rope dict, completed as transformers completes it:
    original_max_position_embeddings from config.json's top level first (Phi-3 keeps it there,
    and transformers prefers it), else the dict's, else max_position_embeddings; yarn's and
    longrope's factor, when null or absent, max_position_embeddings / that. The type is checked
    later (MHAConfig), so an unsupported one is an error naming it."""
    kind = params.get("rope_type") or params.get("type") or "default"
    kind = (aliases or {}).get(kind, kind)
    if kind == "default":
        return None
    extra = {k: v for k, v in params.items() if k not in OWN_KEYS}
    if kind in LONG_CONTEXT:
        original = s.get("original_max_position_embeddings") or extra.get(
            "original_max_position_embeddings") or s["max_position_embeddings"]
        extra["original_max_position_embeddings"] = original
        if kind != "llama3" and extra.get("factor") is None:
            extra["factor"] = s["max_position_embeddings"] / original
    return {"rope_type": kind, **extra}


def rope(s: Settings, partial_key: str = "partial_rotary_factor",
         aliases: Optional[RopeAliases] = None) -> dict:
    """theta, rotated fraction and scaling: 5.x rope_parameters, else the 4.x keys (rope_theta or
    rotary_emb_base, rope_scaling, partial_key)."""
    params = {**(s.get("rope_scaling") or {}), **(s.get("rope_parameters") or {})}
    theta = params["rope_theta"] if "rope_theta" in params else s.first(
        "rope_theta", "rotary_emb_base")
    partial = params.get("partial_rotary_factor", s[partial_key])
    return {"rope_theta": float(theta), "partial": float(partial),
            "rope_scaling": rope_scaling(s, params, aliases)}


def rotary_fields(s: Settings, head_dim: int, partial_key: str = "partial_rotary_factor",
                  aliases: Optional[RopeAliases] = None) -> dict:
    """MHAConfig's rotary fields (rotate_half style) for heads of head_dim."""
    r = rope(s, partial_key, aliases)
    return {"rotary": "half", "rotary_dim": int(head_dim * r["partial"]),
            "rope_theta": r["rope_theta"], "rope_scaling": r["rope_scaling"]}


# Layer types: which attention each layer has ---------------------------------------------------

FULL, SLIDING = "full_attention", "sliding_attention"
ATTENTION_TYPES = (FULL, SLIDING)  # softmax attention; any other type (linear_attention) is not
LayerType = Callable[[Settings, int], str]  # config.json, layer -> FULL | SLIDING | other


def full_layers(s: Settings, layer: int) -> str:
    return FULL


def sliding_layers(s: Settings, layer: int) -> str:
    """Mistral, Phi-3, Starcoder2: config.json's sliding_window (when set) on every layer."""
    return SLIDING


def upper_layers_sliding(s: Settings, layer: int) -> str:
    """Qwen2, Qwen3: sliding when use_sliding_window, on layers from max_window_layers on."""
    return SLIDING if s["use_sliding_window"] and layer >= s["max_window_layers"] else FULL


def switched_sliding(s: Settings, layer: int) -> str:
    """Qwen3-MoE: sliding on every layer when use_sliding_window."""
    return SLIDING if s["use_sliding_window"] else FULL


def periodic(period: Union[int, str], other: str = SLIDING) -> LayerType:
    """Layer i is full when i + 1 is a multiple of period (a number, or the config.json key that
    holds it), else `other` (Gemma 2, gpt-oss: every 2nd full; Gemma 3: sliding_window_pattern;
    Qwen3.5: full_attention_interval, the others linear attention)."""
    def layer_type(s: Settings, layer: int) -> str:
        n = s[period] if isinstance(period, str) else period
        return other if (layer + 1) % n else FULL
    return layer_type


def typed(rule: LayerType) -> LayerType:
    """5.x: layer_types names each layer's attention; without it, transformers' default rule
    (for the model types whose config has layer_types; Mistral's ignores it)."""
    def layer_type(s: Settings, layer: int) -> str:
        types = s.config.get("layer_types")
        if types is None:
            return rule(s, layer)
        if not isinstance(types, list) or len(types) <= layer:
            raise UsageError(f"config.json: layer_types has no entry for layer {layer}")
        return types[layer]
    return layer_type


def _not_attention(s: Settings, layer: int, kind: str, layer_type: LayerType) -> UsageError:
    count = s.get("num_hidden_layers") or 0
    ok = [str(i) for i in range(count) if layer_type(s, i) in ATTENTION_TYPES]
    return UsageError(f"--layer {layer} is a {kind} layer, not softmax attention: pick one of "
                      f"the full-attention layers ({', '.join(ok) or 'none'})")


# Llama-style decoders --------------------------------------------------------------------------

Bias = Union[bool, str]  # fixed, or the config.json key that says
# What a model type adds to a decoder layer: (config.json, layer, its layer type, the fields so
# far) -> the fields it sets.
Extra = Callable[[Settings, int, str, dict], dict]


def decoder_fields(layer_type: LayerType, qkv_bias: Bias, out_bias: Bias,
                   *extras: Extra) -> Fields:
    """Fields of a Llama-style decoder layer: grouped-query heads, head_dim, rotate_half rotary,
    the window of its layer type; the model type's biases and extras."""
    def bias(s: Settings, rule: Bias) -> bool:
        return s[rule] if isinstance(rule, str) else rule

    def fields(s: Settings, layer: int) -> dict:
        kind = layer_type(s, layer)
        if kind not in ATTENTION_TYPES:
            raise _not_attention(s, layer, kind, layer_type)
        heads = s["num_attention_heads"]
        head_dim = s.get("head_dim") or s["hidden_size"] // heads
        out = {"dim": s["hidden_size"], "d_in": s["hidden_size"], "heads": heads,
               "head_dim": head_dim, "kv_heads": s.get("num_key_value_heads") or heads,
               "causal": True, "qkv_bias": bias(s, qkv_bias), "out_bias": bias(s, out_bias),
               "sliding_window": s.get("sliding_window") if kind == SLIDING else None,
               **rotary_fields(s, head_dim)}
        for extra in extras:
            out.update(extra(s, layer, kind, out))
        return out
    return fields


def fixed(**values: Any) -> Extra:
    """Fields every layer of the model type has (sinks=True, output_gate=True)."""
    return lambda s, layer, kind, fields: dict(values)


def head_norm(offset: float) -> Extra:
    """RMSNorm of q and k over each head's features, by (offset + weight): Qwen3 (0), Gemma 3 and
    Qwen3.5 (1: their weights start at 0)."""
    return lambda s, layer, kind, fields: {"qk_norm": "head", "norm_offset": offset,
                                           "qk_norm_eps": float(s["rms_norm_eps"])}


def whole_norm(s: Settings, layer: int, kind: str, fields: dict) -> dict:
    """OLMo 2: RMSNorm of q and k over the whole projection, before the heads split."""
    return {"qk_norm": "full", "qk_norm_eps": float(s["rms_norm_eps"])}


def gemma_logits(softcap: bool) -> Extra:
    """Gemma: softmax scale query_pre_attn_scalar**-0.5; Gemma 2 softcaps the scores with
    attn_logit_softcapping (Gemma 3's config keeps the key, its attention never applies it)."""
    def extra(s: Settings, layer: int, kind: str, fields: dict) -> dict:
        if s.get("use_bidirectional_attention"):
            raise UsageError("config.json sets use_bidirectional_attention: bidirectional "
                             "layers are not supported (causal only)")
        out = {"softmax_scale": float(s["query_pre_attn_scalar"]) ** -0.5}
        if softcap:
            out["softcap"] = s.get("attn_logit_softcapping")
        return out
    return extra


def multiplier_scale(s: Settings, layer: int, kind: str, fields: dict) -> dict:
    """Granite: the softmax scale is attention_multiplier."""
    return {"softmax_scale": float(s["attention_multiplier"])}


def typed_rope(s: Settings, layer: int, kind: str, fields: dict) -> dict:
    """Gemma 3: a rope per layer type. 5.x rope_parameters keyed by layer type; 4.x rope_theta
    (full layers) and rope_local_base_freq (sliding ones); rope_scaling applies to full layers
    only; a theta a dict omits comes from those keys (defaults 1M and 10k)."""
    params = dict((s.get("rope_parameters") or {}).get(kind) or {})
    if kind == FULL:
        params.update(s.get("rope_scaling") or {})
    theta = params.get("rope_theta", s["rope_theta" if kind == FULL else "rope_local_base_freq"])
    return {"rotary": "half", "rope_theta": float(theta), "rope_scaling": rope_scaling(s, params),
            "rotary_dim": int(fields["head_dim"] * params.get("partial_rotary_factor", 1.0))}


def phi3_rope(s: Settings, layer: int, kind: str, fields: dict) -> dict:
    """Phi-3: rope types "su" and "yarn" in its config.json mean longrope (transformers maps
    them); original_max_position_embeddings is a top-level key (default 4096)."""
    return rotary_fields(s, fields["head_dim"], aliases={"su": "longrope", "yarn": "longrope"})


def uses_rope(s: Settings, layer: int) -> bool:
    """SmolLM3: no_rope_layers[layer] 1 rotates, 0 is a NoPE layer; without the list, every
    no_rope_layer_interval-th layer is NoPE."""
    flags = s.get("no_rope_layers")
    if flags is None:
        return (layer + 1) % s["no_rope_layer_interval"] != 0
    if not isinstance(flags, list) or len(flags) <= layer:
        raise UsageError(f"config.json: no_rope_layers has no entry for layer {layer}")
    return bool(flags[layer])


def nope_layers(s: Settings, layer: int, kind: str, fields: dict) -> dict:
    return {} if uses_rope(s, layer) else {"rotary": "none", "rotary_dim": None,
                                            "rope_scaling": None}


def smollm3_layers(s: Settings, layer: int) -> str:
    """SmolLM3's default layer types: sliding on the NoPE layers when use_sliding_window."""
    on = s["use_sliding_window"] and s.get("sliding_window") is not None
    return SLIDING if on and not uses_rope(s, layer) else FULL


# Tensor conversions ----------------------------------------------------------------------------

def per_head_split(source: str, names: tuple[str, ...]) -> Convert:
    """`source` holds, per head, one block of rows for each of `names` ((N, len(names), H, in)
    rows): GPT-NeoX's query_key_value [q_h; k_h; v_h], Qwen3.5's q_proj [query_h; gate_h]."""
    def convert(fields: dict, tensors: dict) -> dict:
        heads, head_dim = fields["heads"], fields["head_dim"]
        out = {k: v for k, v in tensors.items() if not k.startswith(f"{source}.")}
        for part in ("weight", "bias"):
            t = tensors.get(f"{source}.{part}")
            if t is None:
                continue
            per_head = t.reshape(heads, len(names), head_dim, *t.shape[1:])  # (N, n, H[, in])
            for i, name in enumerate(names):
                out[f"{name}.{part}"] = per_head[:, i].reshape(heads * head_dim, *t.shape[1:])
        return out
    return convert


def qkv_rows_convert(fields: dict, tensors: dict) -> dict:
    """Phi-3's qkv_proj stacks all query rows, then key rows, then value rows (by their sizes:
    heads * head_dim, kv_heads * head_dim twice)."""
    q = fields["heads"] * fields["head_dim"]
    kv = fields["kv_heads"] * fields["head_dim"]
    out = {k: v for k, v in tensors.items() if not k.startswith("qkv_proj.")}
    for part in ("weight", "bias"):
        t = tensors.get(f"qkv_proj.{part}")
        if t is not None:
            out.update({f"W_query.{part}": t[:q], f"W_key.{part}": t[q:q + kv],
                        f"W_value.{part}": t[q + kv:]})
    return out


def gpt2_fields(s: Settings, layer: int) -> dict:
    if not s["scale_attn_weights"] or s["scale_attn_by_inverse_layer_idx"]:
        raise UsageError("this GPT-2 checkpoint scales attention differently "
                         "(scale_attn_weights / scale_attn_by_inverse_layer_idx): not supported")
    heads, dim = s["n_head"], s["n_embd"]
    return {"dim": dim, "d_in": dim, "heads": heads, "head_dim": dim // heads, "kv_heads": heads,
            "causal": True, "sliding_window": None, "rotary": "none", "qkv_bias": True,
            "out_bias": True}


def gpt2_convert(fields: dict, tensors: dict) -> dict:
    """Conv1D stores [in, out]: transposed to nn.Linear's [out, in]."""
    return {k: (v.t().contiguous() if k.endswith("weight") else v) for k, v in tensors.items()}


def neox_fields(s: Settings, layer: int) -> dict:
    heads = s["num_attention_heads"]
    head_dim = s["hidden_size"] // heads
    return {"dim": s["hidden_size"], "d_in": s["hidden_size"], "heads": heads,
            "head_dim": head_dim, "kv_heads": heads, "causal": True, "sliding_window": None,
            "qkv_bias": s["attention_bias"], "out_bias": s["attention_bias"],
            **rotary_fields(s, head_dim, partial_key="rotary_pct")}


neox_convert = per_head_split("query_key_value", ("W_query", "W_key", "W_value"))


# The registry ----------------------------------------------------------------------------------

ATTN = "layers.{layer}.self_attn"
DECODER_TENSORS = {"q_proj": "W_query", "k_proj": "W_key", "v_proj": "W_value",
                   "o_proj": "out_proj"}
NORM_TENSORS = {**DECODER_TENSORS, "q_norm": "q_norm", "k_norm": "k_norm"}
DECODER_DEFAULTS = {"rope_theta": 10000.0, "partial_rotary_factor": 1.0}
# A multimodal checkpoint's language model: 5.x model.language_model., 4.x language_model.model.
LANGUAGE_MODEL = r"^(?:model\.language_model|language_model\.model|language_model)\."
# Qwen3.5 text checkpoints: model.layers or model.language_model.layers — not mtp.layers (the
# multi-token-prediction head transformers ignores).
QWEN35_TEXT = r"^(?:model\.(?:language_model\.)?)?"
QWEN3_DEFAULTS = {**DECODER_DEFAULTS, "attention_bias": False, "rms_norm_eps": 1e-6,
                  "use_sliding_window": False, "sliding_window": 4096}
GEMMA_DEFAULTS = {**DECODER_DEFAULTS, "attention_bias": False, "head_dim": 256,
                  "num_key_value_heads": 4, "query_pre_attn_scalar": 256, "sliding_window": 4096,
                  "rms_norm_eps": 1e-6}
# gpt-oss's rope when config.json has none (GptOssConfig.__post_init__)
GPT_OSS_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": False, "original_max_position_embeddings": 4096}


QWEN2_LIKE = typed(upper_layers_sliding)

GEMMA3 = Family(
    "gemma3_text", "split", ATTN, NORM_TENSORS,
    {**GEMMA_DEFAULTS, "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0,
     "sliding_window_pattern": 6, "use_bidirectional_attention": False},
    decoder_fields(typed(periodic("sliding_window_pattern")), "attention_bias",
                   "attention_bias", head_norm(1.0), gemma_logits(softcap=False), typed_rope),
    summary="q/k norm per head (1 + w), scale query_pre_attn_scalar**-0.5, layer_types (or "
            "sliding_window_pattern) + sliding_window, a rope per layer type (rope_parameters "
            "by type; 4.x rope_theta / rope_local_base_freq, rope_scaling on full layers)")

QWEN35 = Family(
    "qwen3_5_text", "split", ATTN,
    {**NORM_TENSORS, "q_proj": "q_proj"},
    {**QWEN3_DEFAULTS, "partial_rotary_factor": 0.25, "head_dim": 256,
     "num_key_value_heads": 4, "full_attention_interval": 4},
    decoder_fields(typed(periodic("full_attention_interval", "linear_attention")),
                   "attention_bias", "attention_bias", head_norm(1.0),
                   fixed(output_gate=True)),
    per_head_split("q_proj", ("W_query", "W_gate")), prefix=QWEN35_TEXT,
    summary="q_proj = per head [query | gate] (output gate), q/k norm per head (1 + w), "
            "partial rotary (0.25), full-attention layers of layer_types only")

# Multi-head Latent Attention (DeepSeek-V2/V3) ---------------------------------------------------

# the checkpoints' names are the layer's (kinds/mla/layer.py)
LATENT_TENSORS = {name: name for name in (
    "q_proj", "q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm",
    "kv_b_proj", "o_proj")}
LATENT_DEFAULTS = {"rope_theta": 10000.0, "partial_rotary_factor": 1.0, "kv_lora_rank": 512,
                   "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
                   "v_head_dim": 128, "attention_bias": False}
# transformers builds q_a_layernorm / kv_a_layernorm with RMSNorm's own eps, never rms_norm_eps
# (which only the decoder's norms read)
LATENT_NORM_EPS = 1e-6


def latent_fields(rope_layout: Callable[[Settings], str]) -> Fields:
    """An MLA layer (every layer of DeepSeek-V2/V3 is one): MHAConfig's latent section, the
    rotary layout that decides what the cache holds, yarn's mscale in the rope dict; no
    output bias unless attention_bias."""
    def fields(s: Settings, layer: int) -> dict:
        r = rope(s)
        latent = {name: s[name] for name in ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim",
                                             "qk_nope_head_dim", "v_head_dim")}
        return {"dim": s["hidden_size"], "heads": s["num_attention_heads"], "causal": True,
                "qkv_bias": s["attention_bias"], "out_bias": s["attention_bias"],
                "rotary": rope_layout(s), "rope_theta": r["rope_theta"],
                "rope_scaling": r["rope_scaling"],
                "latent": {**latent, "norm_eps": LATENT_NORM_EPS}}
    return fields


LATENT_FAMILIES = (
    Family("deepseek_v2", "latent", ATTN, LATENT_TENSORS,
           {**LATENT_DEFAULTS, "max_position_embeddings": 2048},
           latent_fields(lambda s: "interleaved"),  # V2's complex-number rotation: pairs
           summary="Multi-head Latent Attention: kv_lora_rank, q_lora_rank (null: q_proj), "
                   "qk_nope/rope_head_dim, v_head_dim, attention_bias, rope pairs (complex "
                   "form), yarn with mscale_all_dim; the latent norms' eps is 1e-6, as "
                   "transformers builds them (not rms_norm_eps)"),
    Family("deepseek_v3", "latent", ATTN, LATENT_TENSORS,
           {**LATENT_DEFAULTS, "max_position_embeddings": 4096, "rope_interleave": True},
           latent_fields(lambda s: "deinterleaving" if s["rope_interleave"] else "half"),
           summary="as deepseek_v2; rope_interleave (pairs in, halves out; false: halves)"),
)


FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    Family("llama", "split", ATTN, DECODER_TENSORS,
           {**DECODER_DEFAULTS, "attention_bias": False},
           decoder_fields(full_layers, qkv_bias="attention_bias", out_bias="attention_bias"),
           summary="heads, num_key_value_heads, head_dim, attention_bias, rope"),
    Family("mistral", "split", ATTN, DECODER_TENSORS,
           {**DECODER_DEFAULTS, "sliding_window": 4096},
           decoder_fields(sliding_layers, qkv_bias=False, out_bias=False),
           summary="heads, num_key_value_heads, head_dim, rope, sliding_window"),
    Family("qwen2", "split", ATTN, DECODER_TENSORS,
           {**DECODER_DEFAULTS, "sliding_window": 4096, "use_sliding_window": False,
            "max_window_layers": 28},
           decoder_fields(QWEN2_LIKE, qkv_bias=True, out_bias=False),
           summary="heads, num_key_value_heads, head_dim, rope (q/k/v biases), "
                   "use_sliding_window + max_window_layers"),
    Family("qwen3", "split", ATTN, NORM_TENSORS,
           {**QWEN3_DEFAULTS, "head_dim": 128, "num_key_value_heads": 32,
            "max_window_layers": 28},
           decoder_fields(QWEN2_LIKE, "attention_bias", "attention_bias", head_norm(0.0)),
           summary="q/k norm per head, head_dim, attention_bias, rope, layer_types or "
                   "use_sliding_window + max_window_layers"),
    Family("qwen3_moe", "split", ATTN, NORM_TENSORS,
           {**QWEN3_DEFAULTS, "num_key_value_heads": 4},
           decoder_fields(switched_sliding, "attention_bias", "attention_bias",
                          head_norm(0.0)),
           summary="as qwen3; use_sliding_window: sliding_window on every layer"),
    QWEN35,
    dataclasses.replace(QWEN35, model_type="qwen3_5", nested="text_config",
                        prefix=LANGUAGE_MODEL, summary="qwen3_5_text's, from text_config"),
    Family("gemma2", "split", ATTN, DECODER_TENSORS,
           {**GEMMA_DEFAULTS, "attn_logit_softcapping": 50.0,
            "use_bidirectional_attention": None},
           decoder_fields(typed(periodic(2)), "attention_bias", "attention_bias",
                          gemma_logits(softcap=True)),
           summary="scale query_pre_attn_scalar**-0.5, attn_logit_softcapping, "
                   "layer_types (or every 2nd layer full) + sliding_window"),
    GEMMA3,
    dataclasses.replace(GEMMA3, model_type="gemma3", nested="text_config",
                        prefix=LANGUAGE_MODEL, summary="gemma3_text's, from text_config"),
    Family("phi3", "split", ATTN, {"qkv_proj": "qkv_proj", "o_proj": "out_proj"},
           {**DECODER_DEFAULTS, "sliding_window": None, "max_position_embeddings": 4096,
            "original_max_position_embeddings": 4096},
           decoder_fields(sliding_layers, False, False, phi3_rope), qkv_rows_convert,
           summary="qkv_proj split by sizes, partial rotary, longrope (su / yarn) with the "
                   "top-level original_max_position_embeddings, sliding_window"),
    Family("olmo2", "split", ATTN, NORM_TENSORS,
           {**DECODER_DEFAULTS, "attention_bias": False, "rms_norm_eps": 1e-5},
           decoder_fields(full_layers, "attention_bias", "attention_bias", whole_norm),
           summary="q/k norm over the whole projection, attention_bias, rope"),
    Family("granite", "split", ATTN, DECODER_TENSORS,
           {**DECODER_DEFAULTS, "attention_bias": False, "attention_multiplier": 1.0},
           decoder_fields(full_layers, "attention_bias", "attention_bias",
                          multiplier_scale),
           summary="softmax scale attention_multiplier, attention_bias, rope"),
    Family("starcoder2", "split", ATTN, DECODER_TENSORS,
           {**DECODER_DEFAULTS, "use_bias": True, "num_key_value_heads": 2,
            "sliding_window": None},
           decoder_fields(sliding_layers, "use_bias", "use_bias"),
           summary="use_bias (q/k/v/o), sliding_window, rope"),
    Family("gpt_oss", "split", ATTN, {**DECODER_TENSORS, "sinks": "sinks"},
           {**DECODER_DEFAULTS, "rope_theta": 150000.0, "attention_bias": True,
            "head_dim": 64, "num_key_value_heads": 8, "sliding_window": 128,
            "rope_parameters": GPT_OSS_ROPE},
           decoder_fields(typed(periodic(2)), "attention_bias", "attention_bias",
                          fixed(sinks=True)),
           summary="sinks, attention_bias, layer_types (or every 2nd layer full) + "
                   "sliding_window, yarn"),
    Family("smollm3", "split", ATTN, DECODER_TENSORS,
           {**DECODER_DEFAULTS, "rope_theta": 2_000_000.0, "attention_bias": False,
            "num_key_value_heads": 4, "use_sliding_window": False, "sliding_window": None,
            "no_rope_layer_interval": 4},
           decoder_fields(typed(smollm3_layers), "attention_bias", "attention_bias",
                          nope_layers),
           summary="no_rope_layers (0: NoPE layer), layer_types + sliding_window, "
                   "attention_bias, rope"),
    Family("gpt_neox", "split", "layers.{layer}.attention",
           {"query_key_value": "query_key_value", "dense": "out_proj"},
           {"rotary_emb_base": 10000.0, "rotary_pct": 0.25, "attention_bias": True},
           neox_fields, neox_convert,
           summary="heads, attention_bias, partial rotary (rotary_pct), rope"),
    Family("gpt2", "fused", "h.{layer}.attn", {"c_attn": "c_attn", "c_proj": "c_proj"},
           {"n_head": 12, "n_embd": 768, "scale_attn_weights": True,
            "scale_attn_by_inverse_layer_idx": False},
           gpt2_fields, gpt2_convert, layer_count="n_layer", context="n_positions",
           summary="n_head, n_embd (Conv1D weights transposed)"),
    *LATENT_FAMILIES,
)}


def supported_types() -> str:
    """The model types the registry serves, for help texts and errors: "llama, mistral, ..."."""
    return ", ".join(FAMILIES)
