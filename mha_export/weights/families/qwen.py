"""Qwen2, Qwen2-MoE, Qwen3, Qwen3-MoE, dots.llm1 (Qwen3's attention), Qwen3.5 and Qwen3-Next
(gated attention; their linear-attention layers refused), Qwen4-exp (Qwen3.5's gated attention
with the QSA indexer, kinds/qsa/; its GatedDeltaNet layers refused)."""
from __future__ import annotations

import dataclasses

from ...errors import UsageError
from .base import Family, Settings
from .decoder import (ATTN, DECODER_DEFAULTS, DECODER_TENSORS, LANGUAGE_MODEL, NORM_TENSORS,
                      decoder_fields, fixed, head_norm, per_head_split)
from .gguf_common import GGUFArch, Metadata, no_window
from .layer_types import (FULL, SLIDING, periodic, switched_sliding, typed,
                          upper_layers_sliding)

# Qwen3.5 text checkpoints: model.layers or model.language_model.layers — not mtp.layers (the
# multi-token-prediction head transformers ignores).
QWEN35_TEXT = r"^(?:model\.(?:language_model\.)?)?"
QWEN3_DEFAULTS = {**DECODER_DEFAULTS, "attention_bias": False, "rms_norm_eps": 1e-6,
                  "use_sliding_window": False, "sliding_window": 4096}
QWEN2_LIKE = typed(upper_layers_sliding)


def qwen2_moe_layers(s: Settings, layer: int) -> str:
    """Qwen2-MoE's default layer types: with use_sliding_window, every other layer below
    max_window_layers slides."""
    on = s["use_sliding_window"] and layer < s["max_window_layers"]
    return SLIDING if on and (layer + 1) % 2 else FULL


def dots1_layers(s: Settings, layer: int) -> str:
    """dots.llm1's default layer types: sliding from max_window_layers on, when
    sliding_window is set."""
    on = s.get("sliding_window") is not None and layer >= s["max_window_layers"]
    return SLIDING if on else FULL


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

GATED_DELTANET = "linear_attention (GatedDeltaNet)"  # a Qwen4-exp layer left to the model
QSA_KEYS = {"heads": "indexer_n_heads", "head_dim": "indexer_head_dim",
            "budget": "indexer_budget", "compress_ratio": "indexer_compress_ratio"}


def qwen4_layers(s: Settings, layer: int) -> str:
    """Qwen4-exp's layer types: layer_types (its "indexed_attention", or "full_attention" as
    the released checkpoints spell it, is QSA), else every full_attention_interval-th layer;
    the others GatedDeltaNet."""
    kind = typed(periodic("full_attention_interval", "linear_attention"))(s, layer)
    if kind in ("indexed_attention", FULL):
        return FULL
    return GATED_DELTANET if kind == "linear_attention" else kind


def qsa_section(s: Settings, layer: int, kind: str, fields: dict) -> dict:
    """The indexer's settings (kinds/qsa/): config.json's indexer_* keys, one index key head."""
    missing = [key for key in (*QSA_KEYS.values(), "indexer_kv_heads") if s.get(key) is None]
    if missing:
        raise UsageError(f"config.json: a Qwen4-exp attention layer needs its QSA indexer's "
                         f"settings: {', '.join(missing)} not given")
    if s["indexer_kv_heads"] != 1:
        raise UsageError(f"config.json: indexer_kv_heads is {s['indexer_kv_heads']}: Qwen4-exp's "
                         "QSA has one index key head")
    return {"qsa": {name: s[key] for name, key in QSA_KEYS.items()}}


QWEN4 = Family(
    "qwen4_exp_text", "qsa", ATTN,
    {**NORM_TENSORS, "q_proj": "q_proj", **{f"indexer.{name}": f"indexer.{name}" for name in (
        "index_qk_proj", "q_layernorm", "k_layernorm")}},
    {**QWEN3_DEFAULTS, "head_dim": 256, "num_key_value_heads": 2, "full_attention_interval": 4,
     "max_position_embeddings": 32768},
    decoder_fields(qwen4_layers, "attention_bias", "attention_bias", head_norm(1.0),
                   fixed(output_gate=True), qsa_section),
    per_head_split("q_proj", ("W_query", "W_gate")), prefix=QWEN35_TEXT,
    summary="qwen3_5_text's gated attention and the QSA indexer: indexer_n_heads, "
            "indexer_head_dim, indexer_budget, indexer_compress_ratio (blocks of keys per "
            "query); its linear_attention layers are GatedDeltaNet (rows, not exported)")

RECORDS = (
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
    Family("qwen2_moe", "split", ATTN, DECODER_TENSORS,
           {**DECODER_DEFAULTS, "qkv_bias": True, "use_sliding_window": False,
            "sliding_window": 4096, "max_window_layers": 28},
           decoder_fields(typed(qwen2_moe_layers), "qkv_bias", False),
           summary="qkv_bias (q/k/v), layer_types (or use_sliding_window: every other layer "
                   "below max_window_layers), rope"),
    Family("dots1", "split", ATTN, NORM_TENSORS,
           {**QWEN3_DEFAULTS, "num_key_value_heads": 32, "sliding_window": 4096,
            "max_window_layers": 62},
           decoder_fields(typed(dots1_layers), "attention_bias", "attention_bias",
                          head_norm(0.0)),
           summary="as qwen3; layer_types (or sliding from max_window_layers on)"),
    QWEN35,
    dataclasses.replace(QWEN35, model_type="qwen3_5", nested="text_config",
                        prefix=LANGUAGE_MODEL, summary="qwen3_5_text's, from text_config"),
    dataclasses.replace(QWEN35, model_type="qwen3_next",
                        defaults={**QWEN35.defaults, "num_key_value_heads": 2},
                        summary="as qwen3_5_text (Qwen3.5's gated attention came from it)"),
    QWEN4,
    dataclasses.replace(QWEN4, model_type="qwen4_exp", nested="text_config",
                        prefix=LANGUAGE_MODEL, summary="qwen4_exp_text's, from text_config"),
)


# GGUF (llama.cpp's files) -----------------------------------------------------------------------

def full_attention(f: Metadata, layer: int) -> dict:
    """Qwen2/Qwen3: llama.cpp attends fully on every layer (no sliding window)."""
    return {"use_sliding_window": False}


def qwen3next(f: Metadata, layer: int) -> dict:
    """Qwen3-Next: every full_attention_interval-th layer attends (llama.cpp's rule: the
    others are linear attention, refused as the family refuses them)."""
    return {"full_attention_interval": f.arch_value("full_attention_interval", 4),
            "layer_types": None}


GGUF = {
    "qwen2": GGUFArch("qwen2", extra=full_attention),
    "qwen3": GGUFArch("qwen3", extra=full_attention),
    "qwen3moe": GGUFArch("qwen3_moe", extra=full_attention),
    "qwen2moe": GGUFArch("qwen2_moe", extra=full_attention, bias="qkv_bias"),
    "dots1": GGUFArch("dots1", extra=no_window),
    "qwen3next": GGUFArch("qwen3_next", norm_shift=1.0, extra=qwen3next),  # q/k norms: 1 + w
}
