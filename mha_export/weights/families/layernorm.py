"""Decoders whose q/k norms are LayerNorms (the mean subtracted), each optional: Phi (shared by
the heads, with a bias; partial rotary, `dense` output), StableLM (one module per head; partial
rotary 0.25) and Cohere (a weight per head; rotary in pairs)."""
from __future__ import annotations

from .base import INDEXED, Family
from .decoder import (ATTN, DECODER_DEFAULTS, DECODER_TENSORS, decoder_fields, interleaved_rope,
                      layer_norm, stacked_heads)
from .gguf_common import GGUFArch, GGUFExtra, has, present
from .layer_types import full_layers

LAYERNORM_DEFAULTS = {**DECODER_DEFAULTS, "layer_norm_eps": 1e-5}
QKV = {"q_proj": "W_query", "k_proj": "W_key", "v_proj": "W_value"}

RECORDS = (
    Family("phi", "split", ATTN,
           {**QKV, "dense": "out_proj", "q_layernorm": "q_norm", "k_layernorm": "k_norm"},
           {**LAYERNORM_DEFAULTS, "partial_rotary_factor": 0.5, "qk_layernorm": False},
           decoder_fields(full_layers, True, True,
                          layer_norm("layer_norm_eps", bias=True, when="qk_layernorm")),
           summary="biases on all four (o: dense), partial rotary (default 0.5); with "
                   "qk_layernorm, a LayerNorm (weight and bias) over each head's features"),
    Family("stablelm", "split", ATTN,
           {**DECODER_TENSORS, "q_layernorm.norms" + INDEXED: "q_norm",
            "k_layernorm.norms" + INDEXED: "k_norm"},
           {**LAYERNORM_DEFAULTS, "partial_rotary_factor": 0.25, "use_qkv_bias": False,
            "qk_layernorm": False},
           decoder_fields(full_layers, "use_qkv_bias", False,
                          layer_norm("layer_norm_eps", per_head=True, when="qk_layernorm")),
           stacked_heads("q_norm", "k_norm"),
           summary="use_qkv_bias (q/k/v), partial rotary (default 0.25); with qk_layernorm, "
                   "a LayerNorm per head (its own weight)"),
    Family("cohere", "split", ATTN, {**DECODER_TENSORS, "q_norm": "q_norm", "k_norm": "k_norm"},
           {**LAYERNORM_DEFAULTS, "rope_theta": 500000.0, "attention_bias": False,
            "use_qk_norm": False},
           decoder_fields(full_layers, "attention_bias", "attention_bias", interleaved_rope,
                          layer_norm("layer_norm_eps", per_head=True, when="use_qk_norm")),
           summary="rotary in pairs, attention_bias; with use_qk_norm, a LayerNorm with a "
                   "weight per head (no bias)"),
)


# GGUF (llama.cpp's files) -----------------------------------------------------------------------

def layer_norm_qk(key: str) -> GGUFExtra:
    """StableLM (qk_layernorm), Command R (use_qk_norm): LayerNorm q/k norms when the file has
    them, attention.layer_norm_epsilon their epsilon."""
    return lambda f, layer: present(
        **{key: has(f, layer, "attn_q_norm.weight")},
        layer_norm_eps=f.arch_value("attention.layer_norm_epsilon"))


GGUF = {
    "command-r": GGUFArch("cohere", extra=layer_norm_qk("use_qk_norm")),
    "stablelm": GGUFArch("stablelm", extra=layer_norm_qk("qk_layernorm"), bias="use_qkv_bias",
                         tensors={**DECODER_TENSORS, "q_layernorm": "q_norm",
                                  "k_layernorm": "k_norm"}),  # per-head norms stacked (N, H)
    "phi2": GGUFArch("phi", extra=layer_norm_qk("qk_layernorm")),
}
