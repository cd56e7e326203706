"""Llama 4: rotary layers (no_rope_layers 1) rotate in pairs, attend within chunks of
attention_chunk_size tokens and take a weightless RMS ("L2") norm of q and k after rotary; NoPE
layers attend to everything and scale their queries by cache slot (temperature tuning). The
multimodal wrapper reads from text_config."""
from __future__ import annotations

import dataclasses

from ...errors import UsageError
from .base import Family, Settings
from .decoder import ATTN, DECODER_DEFAULTS, DECODER_TENSORS, LANGUAGE_MODEL, NOPE, decoder_fields
from .gguf_common import GGUFArch, Metadata, one_rope_base, swa_period
from .layer_types import CHUNKED, FULL, typed
from .llama import uses_rope


def llama4_layers(s: Settings, layer: int) -> str:
    """transformers' default layer types: chunked on the rotary layers, full on the NoPE ones."""
    return CHUNKED if uses_rope(s, layer) else FULL


def llama4_attention(s: Settings, layer: int, kind: str, fields: dict) -> dict:
    """Rotary layers: rotary in pairs (its complex product) and, with use_qk_norm, x / rms(x)
    of each head's q and k after rotary; NoPE layers, with attn_temperature_tuning: queries
    times 1 + attn_scale * log(1 + floor((slot + 1) / floor_scale))."""
    if uses_rope(s, layer):
        norm = dict(qk_norm="head", qk_norm_weightless=True, qk_norm_after_rope=True,
                    qk_norm_eps=float(s["rms_norm_eps"]))
        return {"rotary": "interleaved", **(norm if s["use_qk_norm"] else {})}
    tuning = dict(query_scale_beta=float(s["attn_scale"]),
                  query_scale_length=int(s["floor_scale"]), query_scale_by="slot")
    return {**NOPE, **(tuning if s["attn_temperature_tuning"] else {})}


LLAMA4 = Family(
    "llama4_text", "split", ATTN, DECODER_TENSORS,
    {**DECODER_DEFAULTS, "rope_theta": 500_000.0, "head_dim": 128, "attention_bias": False,
     "rms_norm_eps": 1e-5, "use_qk_norm": True, "no_rope_layer_interval": 4,
     "attention_chunk_size": 8192, "attn_temperature_tuning": True, "floor_scale": 8192,
     "attn_scale": 0.1},
    decoder_fields(typed(llama4_layers), "attention_bias", "attention_bias", llama4_attention),
    summary="no_rope_layers (or every no_rope_layer_interval-th NoPE); rotary layers: in pairs, "
            "layer_types' chunked_attention (attention_chunk_size), use_qk_norm's weightless "
            "norm after rotary; NoPE layers: attn_temperature_tuning (attn_scale, floor_scale) "
            "by cache slot; attention_bias")

RECORDS = (
    LLAMA4,
    dataclasses.replace(LLAMA4, model_type="llama4", nested="text_config", prefix=LANGUAGE_MODEL,
                        summary="llama4_text's, from text_config"),
)


# GGUF (llama.cpp's files) -----------------------------------------------------------------------

def llama4(f: Metadata, layer: int) -> dict:
    """Llama 4 as llama.cpp runs it (llama-model.cpp): chunks of 8192 and temperature tuning
    (attn_scale 0.1, floor_scale 8192) hard-coded, every n-th layer (sliding_window_pattern,
    default 4) NoPE and full, the q/k norm unless the file has 128 experts; one rope base. A
    sliding_window of 0 (MobileLLM) is refused: llama.cpp then leaves its last layer unrotated
    with no temperature length."""
    if f.arch_value("attention.sliding_window") == 0:
        raise UsageError(f"{f.path}: a llama4 file without chunks (attention.sliding_window 0) "
                         "is not read")
    one_rope_base(f)
    return {"no_rope_layer_interval": swa_period(f), "attention_chunk_size": 8192,
            "attn_temperature_tuning": True, "floor_scale": 8192, "attn_scale": 0.1,
            "use_qk_norm": f.arch_value("expert_count") != 128}


GGUF = {"llama4": GGUFArch("llama4_text", extra=llama4)}  # the converter's undo_permute = False
