"""Local/global decoders whose full-attention layers are NoPE (only the sliding layers rotate):
Cohere 2 (rotary in pairs), EXAONE 4 (q/k norm per head), AFMoE (q/k norm per head and an
output gate from its own gate_proj)."""
from __future__ import annotations

from .base import Family, Settings
from .decoder import (ATTN, DECODER_DEFAULTS, DECODER_TENSORS, NORM_TENSORS, decoder_fields,
                      fixed, head_norm, interleaved_rope, rotates_when)
from .gguf_common import GGUFArch, Metadata, one_rope_base, swa_period
from .layer_types import FULL, SLIDING, periodic, typed

LOCAL_GLOBAL = {**DECODER_DEFAULTS, "attention_bias": False, "sliding_window": 4096}


def exaone4_layers(s: Settings, layer: int) -> str:
    """EXAONE 4's default layer types: without sliding_window every layer is full; else
    sliding_window_pattern, a period (4) or 4.x's letters ("LLLG": L sliding, G full)."""
    pattern = s["sliding_window_pattern"]
    if s.get("sliding_window") is None:
        return FULL
    if isinstance(pattern, str):
        return FULL if pattern[layer % len(pattern)] == "G" else SLIDING
    return periodic(pattern)(s, layer)


def ungated_bias(fields: dict, tensors: dict) -> dict:
    """AFMoE: gate_proj has no bias even when attention_bias gives q/k/v one (a zero bias)."""
    if not fields["qkv_bias"] or "W_gate.bias" in tensors:
        return tensors
    weight = tensors["W_gate.weight"]
    return {**tensors, "W_gate.bias": weight.new_zeros(weight.shape[0])}


RECORDS = (
    Family("cohere2", "split", ATTN, DECODER_TENSORS,
           {**LOCAL_GLOBAL, "sliding_window_pattern": 4},
           decoder_fields(typed(periodic("sliding_window_pattern")), "attention_bias",
                          "attention_bias", interleaved_rope,
                          rotates_when(lambda s, kind: kind == SLIDING
                                       and s.get("sliding_window") is not None)),
           summary="layer_types (or sliding_window_pattern) + sliding_window; sliding layers "
                   "rotate in pairs, full layers are NoPE; attention_bias"),
    Family("exaone4", "split", ATTN, NORM_TENSORS,
           {**LOCAL_GLOBAL, "sliding_window_pattern": 4, "rms_norm_eps": 1e-5},
           decoder_fields(typed(exaone4_layers), False, False, head_norm(0.0),
                          rotates_when(lambda s, kind: kind == SLIDING
                                       or s.get("sliding_window") is None)),
           summary="q/k norm per head, layer_types (or sliding_window_pattern) + "
                   "sliding_window; with a window, full layers are NoPE"),
    Family("afmoe", "split", ATTN, {**NORM_TENSORS, "gate_proj": "W_gate"},
           {**LOCAL_GLOBAL, "head_dim": 128, "sliding_window": 1024, "rms_norm_eps": 1e-5,
            "global_attn_every_n_layers": 4},
           decoder_fields(typed(periodic("global_attn_every_n_layers")), "attention_bias",
                          "attention_bias", head_norm(0.0), fixed(output_gate=True),
                          rotates_when(lambda s, kind: kind == SLIDING)),
           ungated_bias,
           summary="q/k norm per head, output gate (gate_proj), layer_types (or every "
                   "global_attn_every_n_layers-th full) + sliding_window; full layers NoPE"),
)


# GGUF (llama.cpp's files) -----------------------------------------------------------------------

def afmoe(f: Metadata, layer: int) -> dict:
    """AFMoE as llama.cpp runs it: every 4th layer full and NoPE (hard-coded), the others
    rotating and sliding within attention.sliding_window (none written: every layer attends
    fully, still NoPE every 4th); one rope base."""
    one_rope_base(f)
    return {"global_attn_every_n_layers": 4, "layer_types": None,
            "sliding_window": f.arch_value("attention.sliding_window") or None}


def cohere2(f: Metadata, layer: int) -> dict:
    """Cohere 2: the window as written, every n-th layer full (llama.cpp's period); one rope
    base."""
    one_rope_base(f)
    return {"sliding_window": f.require("attention.sliding_window"),
            "sliding_window_pattern": swa_period(f)}


def exaone4(f: Metadata, layer: int) -> dict:
    """EXAONE 4: llama.cpp slides only in the 64-layer (32B) model (window 4096 unless written,
    every n-th layer full, those NoPE); other sizes attend fully and rotate on every layer."""
    if f.require("block_count") != 64:
        return {"sliding_window": None}
    one_rope_base(f)
    return {"sliding_window": f.arch_value("attention.sliding_window", 4096),
            "sliding_window_pattern": swa_period(f)}


GGUF = {
    "afmoe": GGUFArch("afmoe", extra=afmoe),  # the converter skips LlamaModel's permute
    "cohere2": GGUFArch("cohere2", extra=cohere2),
    "exaone4": GGUFArch("exaone4", extra=exaone4),
}
