"""Qwen2, Qwen2-MoE, Qwen3, Qwen3-MoE, dots.llm1 (Qwen3's attention), Qwen3.5 and Qwen3-Next
(gated attention; their linear-attention layers refused)."""
from __future__ import annotations

import dataclasses

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
