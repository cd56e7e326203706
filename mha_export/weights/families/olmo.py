"""OLMo 2, OLMo 3, FlexOlmo and MiniMax-M2: q/k RMSNorm over the whole projection (before the
heads split); OLMo 3 adds sliding layers with a rope per layer type, MiniMax-M2 partial rotary
from its legacy rotary_dim."""
from __future__ import annotations

from ...errors import UsageError
from .base import Family, Settings
from .decoder import ATTN, DECODER_DEFAULTS, NORM_TENSORS, decoder_fields, whole_norm
from .gguf_common import GGUFArch, Metadata
from .layer_types import full_layers, periodic, typed
from .rope import rope_by_layer_type

OLMO_DEFAULTS = {**DECODER_DEFAULTS, "rope_theta": 500000.0, "attention_bias": False}


def legacy_rotary_dim(s: Settings, layer: int, kind: str, fields: dict) -> dict:
    """MiniMax-M2: released config.json files give partial rotary as rotary_dim, read by
    transformers as partial_rotary_factor = rotary_dim / head_dim unless that factor is set."""
    params = {**(s.get("rope_scaling") or {}), **(s.get("rope_parameters") or {})}
    if s.config.get("rotary_dim") is None or "partial_rotary_factor" in params \
            or "partial_rotary_factor" in s.config:
        return {}
    return {"rotary_dim": int(s["rotary_dim"])}


RECORDS = (
    Family("olmo2", "split", ATTN, NORM_TENSORS,
           {**DECODER_DEFAULTS, "attention_bias": False, "rms_norm_eps": 1e-5},
           decoder_fields(full_layers, "attention_bias", "attention_bias", whole_norm),
           summary="q/k norm over the whole projection, attention_bias, rope"),
    Family("olmo3", "split", ATTN, NORM_TENSORS,
           {**OLMO_DEFAULTS, "rms_norm_eps": 1e-5, "sliding_window": 4096},
           decoder_fields(typed(periodic(4)), "attention_bias", "attention_bias", whole_norm,
                          rope_by_layer_type(sliding_theta=None)),
           summary="as olmo2; layer_types (or every 4th layer full) + sliding_window, a rope "
                   "per layer type (rope_parameters keyed by type; 4.x rope_theta and "
                   "rope_scaling on full layers, the default theta on sliding ones)"),
    Family("olmoe", "split", ATTN, NORM_TENSORS,
           {**DECODER_DEFAULTS, "attention_bias": False, "rms_norm_eps": 1e-5,
            "clip_qkv": None},
           decoder_fields(full_layers, "attention_bias", "attention_bias", whole_norm,
                          lambda s, layer, kind, fields: {"qkv_clip": s.get("clip_qkv")}),
           summary="as olmo2; clip_qkv (q, k, v clamped after the norms)"),
    Family("flex_olmo", "split", ATTN, NORM_TENSORS,
           {**OLMO_DEFAULTS, "rms_norm_eps": 1e-6},
           decoder_fields(full_layers, "attention_bias", "attention_bias", whole_norm),
           summary="as olmo2"),
    Family("minimax_m2", "split", ATTN, NORM_TENSORS,
           {**DECODER_DEFAULTS, "rope_theta": 5_000_000.0, "head_dim": 128,
            "rms_norm_eps": 1e-6},
           decoder_fields(full_layers, False, False, whole_norm, legacy_rotary_dim),
           summary="q/k norm over the whole projection, head_dim, partial rotary (legacy "
                   "rotary_dim, or partial_rotary_factor)"),
)


# GGUF (llama.cpp's files) -----------------------------------------------------------------------

def olmo2(f: Metadata, layer: int) -> dict:
    """OLMo 2: every layer full; OLMo 3 (olmo2 with a window: sliding layers, a rope of their
    own) is refused."""
    if f.arch_value("attention.sliding_window"):
        raise UsageError(f"{f.path}: an olmo2 file with a sliding window (OLMo 3) is not read: "
                         "export from the Hugging Face checkpoint")
    return {}


def olmoe(f: Metadata, layer: int) -> dict:
    """OLMoE: llama.cpp clamps nothing (its olmoe reads no clamp_kqv)."""
    return {"clip_qkv": None}


GGUF = {
    "olmo2": GGUFArch("olmo2", extra=olmo2),
    "olmoe": GGUFArch("olmoe", extra=olmoe),
    "minimax-m2": GGUFArch("minimax_m2"),  # (its converter may write rope.freq_base_swa -1)
}
