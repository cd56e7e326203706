"""GLM-4, Helium and ERNIE 4.5 (and its MoE): rotary in pairs (x0, x1), (x2, x3), ... (GPT-J
style); GLM-4.5 (`glm4_moe`, GLM-4's successor) rotates halves of the first half of each head,
with optional q/k norms per head."""
from __future__ import annotations

from ...errors import UsageError
from .base import Family, Settings
from .decoder import (ATTN, DECODER_DEFAULTS, DECODER_TENSORS, NORM_TENSORS, decoder_fields,
                      head_norm, interleaved_rope)
from .gguf_common import GGUFArch, Metadata, has
from .layer_types import full_layers

ERNIE_DEFAULTS = {**DECODER_DEFAULTS, "rope_theta": 500000.0, "use_bias": False}


def optional_head_norm(s: Settings, layer: int, kind: str, fields: dict) -> dict:
    """GLM-4.5: q/k RMSNorm per head when use_qk_norm."""
    return head_norm(0.0)(s, layer, kind, fields) if s["use_qk_norm"] else {}


RECORDS = (
    Family("glm4", "split", ATTN, DECODER_TENSORS,
           {**DECODER_DEFAULTS, "attention_bias": True, "head_dim": 128,
            "partial_rotary_factor": 0.5},
           decoder_fields(full_layers, "attention_bias", False, interleaved_rope),
           summary="rotary in pairs on the first half of each head (partial_rotary_factor "
                   "0.5), attention_bias (q/k/v only)"),
    Family("glm4_moe", "split", ATTN, NORM_TENSORS,
           {**DECODER_DEFAULTS, "attention_bias": False, "partial_rotary_factor": 0.5,
            "use_qk_norm": False, "rms_norm_eps": 1e-5},
           decoder_fields(full_layers, "attention_bias", False, optional_head_norm),
           summary="rotary (halves) on the first half of each head, attention_bias (q/k/v "
                   "only), q/k norm per head when use_qk_norm"),
    Family("helium", "split", ATTN, DECODER_TENSORS,
           {**DECODER_DEFAULTS, "rope_theta": 100000.0, "attention_bias": False,
            "head_dim": 128},
           decoder_fields(full_layers, "attention_bias", False, interleaved_rope),
           summary="rotary in pairs, attention_bias (q/k/v only), head_dim"),
    Family("ernie4_5", "split", ATTN, DECODER_TENSORS,
           {**ERNIE_DEFAULTS, "head_dim": 128},
           decoder_fields(full_layers, "use_bias", "use_bias", interleaved_rope),
           summary="rotary in pairs, use_bias (q/k/v/o), head_dim"),
    Family("ernie4_5_moe", "split", ATTN, DECODER_TENSORS, ERNIE_DEFAULTS,
           decoder_fields(full_layers, "use_bias", "use_bias", interleaved_rope),
           summary="as ernie4_5"),
)


# GGUF (llama.cpp's files) -----------------------------------------------------------------------

def glm4(f: Metadata, layer: int) -> dict:
    """GLM-4: its vision models' M-RoPE (rope.dimension_sections, q/k rows moved for it) is
    refused."""
    if f.arch_value("rope.dimension_sections") is not None:
        raise UsageError(f"{f.path}: GLM-4's M-RoPE (rope.dimension_sections) is not read")
    return {}


def glm4moe(f: Metadata, layer: int) -> dict:
    """GLM-4.5: q/k norms where the file has them (no key says use_qk_norm); its last
    nextn_predict_layers blocks are multi-token-prediction layers, which neither llama.cpp nor
    transformers runs as decoder layers (refused); M-RoPE refused as GLM-4's."""
    count = f.require("block_count") - f.arch_value("nextn_predict_layers", 0)
    if layer >= count:
        raise UsageError(f"{f.path}: layer {layer} is a next-token-prediction (MTP) layer, not "
                         f"one of the {count} decoder layers")
    return {**glm4(f, layer), "num_hidden_layers": count,
            "use_qk_norm": has(f, layer, "attn_q_norm.weight")}


GGUF = {
    "ernie4_5": GGUFArch("ernie4_5", bias="use_bias"),
    "glm4": GGUFArch("glm4", extra=glm4),
    "glm4moe": GGUFArch("glm4_moe", extra=glm4moe),
    "ernie4_5-moe": GGUFArch("ernie4_5_moe", bias="use_bias"),
}
