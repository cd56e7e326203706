"""Llama-style decoder layers: their fields (heads, biases, window, rotary) with a model
type's extras, tensor conversions, and the names and defaults the records share."""
from __future__ import annotations

import re
from typing import Any, Callable, Union

from .base import Convert, Extra, Fields, Settings
from .layer_types import ATTENTION_TYPES, CHUNKED, SLIDING, LayerType, not_attention
from .rope import rotary_fields

# fixed, or the config.json key that says (a tuple: its spellings, the first set wins)
Bias = Union[bool, str, tuple[str, ...]]
NOPE = {"rotary": "none", "rotary_dim": None, "rope_scaling": None}  # a layer without rotary


def decoder_fields(layer_type: LayerType, qkv_bias: Bias, out_bias: Bias,
                   *extras: Extra) -> Fields:
    """Fields of a Llama-style decoder layer: grouped-query heads, head_dim, rotate_half rotary,
    the window or chunks of its layer type; the model type's biases and extras."""
    def bias(s: Settings, rule: Bias) -> bool:
        if isinstance(rule, bool):
            return rule
        return s.first(*rule) if isinstance(rule, tuple) else s[rule]

    def fields(s: Settings, layer: int) -> dict:
        kind = layer_type(s, layer)
        if kind not in ATTENTION_TYPES:
            raise not_attention(s, layer, kind, layer_type)
        heads = s["num_attention_heads"]
        head_dim = s.get("head_dim") or s["hidden_size"] // heads
        out = {"dim": s["hidden_size"], "d_in": s["hidden_size"], "heads": heads,
               "head_dim": head_dim, "kv_heads": s.get("num_key_value_heads") or heads,
               "causal": True, "qkv_bias": bias(s, qkv_bias), "out_bias": bias(s, out_bias),
               "sliding_window": s.get("sliding_window") if kind == SLIDING else None,
               "attention_chunk": s.get("attention_chunk_size") if kind == CHUNKED else None,
               **rotary_fields(s, head_dim)}
        for extra in extras:
            out.update(extra(s, layer, kind, out))
        return out
    return fields


def fixed(**values: Any) -> Extra:
    """Fields every layer of the model type has (sinks=True, output_gate=True)."""
    return lambda s, layer, kind, fields: dict(values)


def interleaved_rope(s: Settings, layer: int, kind: str, fields: dict) -> dict:
    """GLM-4, Helium, ERNIE 4.5: the rotated features are rotated in pairs (x0, x1), (x2, x3),
    ... (GPT-J style), the first rotary_dim of each head (GLM-4: partial 0.5)."""
    return {"rotary": "interleaved"}


def head_norm(offset: float, eps: str = "rms_norm_eps") -> Extra:
    """RMSNorm of q and k over each head's features, by (offset + weight): Qwen3 (0), Gemma 3 and
    Qwen3.5 (1: their weights start at 0); its epsilon is config.json's `eps` key."""
    return lambda s, layer, kind, fields: {"qk_norm": "head", "norm_offset": offset,
                                           "qk_norm_eps": float(s[eps])}


def whole_norm(s: Settings, layer: int, kind: str, fields: dict) -> dict:
    """OLMo 2 and 3, FlexOlmo, MiniMax-M2: RMSNorm of q and k over the whole projection, before
    the heads split."""
    return {"qk_norm": "full", "qk_norm_eps": float(s["rms_norm_eps"])}


def rotates_when(rule: Callable[[Settings, str], bool]) -> Extra:
    """Layers rotate only where rule(config.json, layer type) holds; the others are NoPE layers
    (Cohere 2, AFMoE, EXAONE 4: the full-attention layers of a local/global model)."""
    return lambda s, layer, kind, fields: {} if rule(s, kind) else dict(NOPE)


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


def stacked_heads(*names: str) -> Convert:
    """StableLM's per-head norms: one module per head, read as `name`.{i}.weight, stacked
    into `name`.weight (N, H) (and the biases alike)."""
    def convert(fields: dict, tensors: dict) -> dict:
        out = dict(tensors)
        for name, part in ((n, p) for n in names for p in ("weight", "bias")):
            rows = sorted((int(k.split(".")[-2]), k) for k in tensors
                          if re.fullmatch(rf"{name}\.\d+\.{part}", k))
            if rows:
                first = tensors[rows[0][1]]
                stacked = first.new_zeros((len(rows), *first.shape))  # (N, H)
                for i, (_, key) in enumerate(rows):
                    stacked[i] = out.pop(key)
                out[f"{name}.{part}"] = stacked
        return out
    return convert


def layer_norm(eps: str, per_head: bool = False, bias: bool = False,
               when: str = "") -> Extra:
    """LayerNorm of q and k over each head's features (the mean subtracted: Phi with its bias,
    StableLM and Cohere with a weight per head), eps from config.json's `eps` key; only where
    config.json's `when` key is true (when given)."""
    def extra(s: Settings, layer: int, kind: str, fields: dict) -> dict:
        if when and not s[when]:
            return {}
        return {"qk_norm": "head", "qk_norm_type": "layer", "qk_norm_eps": float(s[eps]),
                "qk_norm_per_head": per_head, "qk_norm_bias": bias}
    return extra


# Names and defaults the records share ---------------------------------------------------------

ATTN = "layers.{layer}.self_attn"
DECODER_TENSORS = {"q_proj": "W_query", "k_proj": "W_key", "v_proj": "W_value",
                   "o_proj": "out_proj"}
NORM_TENSORS = {**DECODER_TENSORS, "q_norm": "q_norm", "k_norm": "k_norm"}
DECODER_DEFAULTS = {"rope_theta": 10000.0, "partial_rotary_factor": 1.0}
# A multimodal checkpoint's language model: 5.x model.language_model., 4.x language_model.model.
LANGUAGE_MODEL = r"^(?:model\.language_model|language_model\.model|language_model)\."
