"""Hugging Face checkpoint families: one ``Family`` record per config.json ``model_type``.

A record says where a layer's attention tensors live, what they are called in our layouts, the
MHAConfig fields config.json gives (both transformers spellings: 4.x rope_theta, rope_scaling,
rotary_pct, rotary_emb_base and 5.x rope_parameters, partial_rotary_factor, layer_types), and
transformers' defaults for the keys a config.json may omit — data in the record, read through
``Settings``. ``huggingface`` does the reading (files, shards, layer selection, errors).

Adding a model type is one record in FAMILIES (and a README table row): reuse a fields function
(``decoder_fields`` serves Llama-style decoders, its bias and window rules are arguments) and
write a small one, or a ``convert``, only where the new type's math differs.

Torch-free on purpose (``convert`` functions only call tensor methods): the CLI reads the
registry for its help without importing torch.
"""
from __future__ import annotations

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


def unchanged(fields: dict, tensors: dict) -> dict:
    """Tensors already in our layout once renamed."""
    return tensors


@dataclass(frozen=True)
class Family:
    model_type: str  # config.json's model_type, e.g. "llama"
    layout: str  # our layout its tensors map onto: "split" | "fused"
    attention: str  # the layer's attention module, after any prefix ("model.", "transformer.")
    tensors: dict[str, str]  # checkpoint module -> our module ({"q_proj": "W_query", ...})
    defaults: dict[str, Any]  # transformers' defaults for the config.json keys `fields` reads
    fields: Fields
    convert: Convert = unchanged
    layer_count: str = "num_hidden_layers"  # the config.json key (no default: never guessed)
    context: str = "max_position_embeddings"  # the config.json key of the context length
    summary: str = ""  # what it reads from config.json, for the README table / help


# Rotary position embeddings --------------------------------------------------------------------

def rope(s: Settings, partial_key: str = "partial_rotary_factor") -> dict:
    """theta, rotated fraction and scaling: 5.x rope_parameters, else the 4.x keys (rope_theta or
    rotary_emb_base, rope_scaling, partial_key)."""
    params = dict(s.get("rope_parameters") or {})
    scaling = dict(s.get("rope_scaling") or {})
    theta = params["rope_theta"] if "rope_theta" in params else s.first(
        "rope_theta", "rotary_emb_base")
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    extra = {k: v for k, v in {**scaling, **params}.items()
             if k not in ("rope_theta", "rope_type", "type", "partial_rotary_factor")}
    partial = params.get("partial_rotary_factor", s[partial_key])
    return {"rope_theta": float(theta), "partial": float(partial),
            "rope_scaling": None if kind == "default" else {"rope_type": kind, **extra}}


def rotary_fields(s: Settings, head_dim: int, partial_key: str = "partial_rotary_factor") -> dict:
    """MHAConfig's rotary fields (rotate_half style) for heads of head_dim."""
    r = rope(s, partial_key)
    return {"rotary": "half", "rotary_dim": int(head_dim * r["partial"]),
            "rope_theta": r["rope_theta"], "rope_scaling": r["rope_scaling"]}


# Sliding windows -------------------------------------------------------------------------------

Window = Callable[[Settings, int], Optional[int]]  # config.json, layer -> its window or None


def no_window(s: Settings, layer: int) -> Optional[int]:
    return None


def every_layer_window(s: Settings, layer: int) -> Optional[int]:
    """Mistral: sliding_window on every layer."""
    return s["sliding_window"]


def upper_layers_window(s: Settings, layer: int) -> Optional[int]:
    """Qwen2: sliding_window when use_sliding_window, on layers from max_window_layers on."""
    on = s["use_sliding_window"] and layer >= s["max_window_layers"]
    return s["sliding_window"] if on else None


def layer_types_window(s: Settings, layer: int) -> Optional[int]:
    """5.x: layer_types names each layer's attention ("sliding_attention" or full)."""
    types = s["layer_types"]
    if not isinstance(types, list) or len(types) <= layer:
        raise UsageError(f"config.json: layer_types has no entry for layer {layer}")
    return s.get("sliding_window") if types[layer] == "sliding_attention" else None


# Model families --------------------------------------------------------------------------------

Bias = Union[bool, str]  # fixed, or the config.json key that says


def decoder_fields(window: Window, qkv_bias: Bias, out_bias: Bias) -> Fields:
    """Fields of a Llama-style decoder layer: grouped-query heads, head_dim, rotate_half rotary;
    its window rule (5.x layer_types first) and biases are the model type's."""
    def bias(s: Settings, rule: Bias) -> bool:
        return s[rule] if isinstance(rule, str) else rule

    def fields(s: Settings, layer: int) -> dict:
        heads = s["num_attention_heads"]
        head_dim = s.get("head_dim") or s["hidden_size"] // heads
        return {"dim": s["hidden_size"], "d_in": s["hidden_size"], "heads": heads,
                "head_dim": head_dim, "kv_heads": s.get("num_key_value_heads") or heads,
                "causal": True, "qkv_bias": bias(s, qkv_bias), "out_bias": bias(s, out_bias),
                "sliding_window": (layer_types_window if "layer_types" in s else window)(s, layer),
                **rotary_fields(s, head_dim)}
    return fields


DECODER_TENSORS = {"q_proj": "W_query", "k_proj": "W_key", "v_proj": "W_value",
                   "o_proj": "out_proj"}
DECODER_DEFAULTS = {"rope_theta": 10000.0, "partial_rotary_factor": 1.0}


def neox_fields(s: Settings, layer: int) -> dict:
    heads = s["num_attention_heads"]
    head_dim = s["hidden_size"] // heads
    return {"dim": s["hidden_size"], "d_in": s["hidden_size"], "heads": heads,
            "head_dim": head_dim, "kv_heads": heads, "causal": True, "sliding_window": None,
            "qkv_bias": s["attention_bias"], "out_bias": s["attention_bias"],
            **rotary_fields(s, head_dim, partial_key="rotary_pct")}


def neox_convert(fields: dict, tensors: dict) -> dict:
    """query_key_value holds, per head, [q_h; k_h; v_h] rows: (heads, 3, H, in) -> q | k | v."""
    heads, head_dim = fields["heads"], fields["head_dim"]
    out = {k: v for k, v in tensors.items() if not k.startswith("query_key_value.")}
    for part in ("weight", "bias"):
        qkv = tensors.get(f"query_key_value.{part}")
        if qkv is None:
            continue
        per_head = qkv.reshape(heads, 3, head_dim, *qkv.shape[1:])  # (N, 3, H[, in])
        for i, name in enumerate(("W_query", "W_key", "W_value")):
            out[f"{name}.{part}"] = per_head[:, i].reshape(heads * head_dim, *qkv.shape[1:])
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


FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    Family("llama", "split", "layers.{layer}.self_attn", DECODER_TENSORS,
           {**DECODER_DEFAULTS, "attention_bias": False},
           decoder_fields(no_window, qkv_bias="attention_bias", out_bias="attention_bias"),
           summary="heads, num_key_value_heads, head_dim, attention_bias, rope"),
    Family("mistral", "split", "layers.{layer}.self_attn", DECODER_TENSORS,
           {**DECODER_DEFAULTS, "sliding_window": 4096},
           decoder_fields(every_layer_window, qkv_bias=False, out_bias=False),
           summary="heads, num_key_value_heads, head_dim, rope, sliding_window"),
    Family("qwen2", "split", "layers.{layer}.self_attn", DECODER_TENSORS,
           {**DECODER_DEFAULTS, "sliding_window": 4096, "use_sliding_window": False,
            "max_window_layers": 28},
           decoder_fields(upper_layers_window, qkv_bias=True, out_bias=False),
           summary="heads, num_key_value_heads, head_dim, rope (q/k/v biases), "
                   "use_sliding_window + max_window_layers"),
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
)}


def supported_types() -> str:
    """The model types the registry serves, for help texts and errors: "llama, mistral, ..."."""
    return ", ".join(FAMILIES)
