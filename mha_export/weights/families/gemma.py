"""Gemma, Gemma 2 and VaultGemma (softcapping), Gemma 3 (q/k norm (1 + w), a rope per layer
type), Gemma 3n (q/k norm by w, a weightless value norm; its last layers KV-shared) and Gemma 4
(Gemma 3n's, with a shape per layer, keys as values, proportional rope); the multimodal wrappers
read from text_config."""
from __future__ import annotations

import dataclasses
from typing import Callable

from ...errors import UsageError
from .base import Extra, Family, Settings, same_as
from .decoder import (ATTN, DECODER_DEFAULTS, DECODER_TENSORS, LANGUAGE_MODEL, NORM_TENSORS,
                      decoder_fields, head_norm)
from .gguf_common import FROM_HF, GGUFArch, Metadata, head_dim, present
from .layer_types import FULL, LayerType, full_layers, periodic, typed
from .rope import rope_by_layer_type

GEMMA_DEFAULTS = {**DECODER_DEFAULTS, "attention_bias": False, "head_dim": 256,
                  "num_key_value_heads": 4, "query_pre_attn_scalar": 256, "sliding_window": 4096,
                  "rms_norm_eps": 1e-6}


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


GEMMA3 = Family(
    "gemma3_text", "split", ATTN, NORM_TENSORS,
    {**GEMMA_DEFAULTS, "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0,
     "sliding_window_pattern": 6, "use_bidirectional_attention": False},
    decoder_fields(typed(periodic("sliding_window_pattern")), "attention_bias",
                   "attention_bias", head_norm(1.0), gemma_logits(softcap=False),
                   rope_by_layer_type("rope_local_base_freq")),
    summary="q/k norm per head (1 + w), scale query_pre_attn_scalar**-0.5, layer_types (or "
            "sliding_window_pattern) + sliding_window, a rope per layer type (rope_parameters "
            "by type; 4.x rope_theta / rope_local_base_freq, rope_scaling on full layers)")

GEMMA3N_LAYERS = typed(periodic(5))  # layer_types, or every 5th layer full


def shared_kv(layer_type: LayerType) -> Extra:
    """Gemma 3n / 4: each of the last num_kv_shared_layers attends with the keys and values of
    the last earlier layer of its type (transformers' kv_sharing_modes 'store' layer): a
    KV-shared layer (kinds/kv_shared/), without the value norm (its source layer's)."""
    def extra(s: Settings, layer: int, kind: str, fields: dict) -> dict:
        first = s["num_hidden_layers"] - s["num_kv_shared_layers"]
        if layer < first:
            return {}
        source = next((i for i in range(first - 1, -1, -1) if layer_type(s, i) == kind), None)
        if source is None:
            raise UsageError(f"KV-shared layer {layer} ({kind}) has no earlier {kind} layer "
                             "to share with")
        return {"layout": "shared", "kv_shared": {"kv_shared_layer": source},
                "v_norm_eps": None}
    return extra


def without_own_keys(fields: dict, tensors: dict) -> dict:
    """A KV-shared layer's key / value projections and norms, where a checkpoint keeps them,
    are left out: transformers ignores them on load (the source layer's are used)."""
    if not fields.get("kv_shared"):
        return tensors
    return {k: v for k, v in tensors.items()
            if not k.startswith(("W_key.", "W_value.", "k_norm."))}


def gemma3n_extras(s: Settings, layer: int, kind: str, fields: dict) -> dict:
    """Gemma 3n: softmax scale 1, q/k norms by w (not 1 + w), values RMS-normalised without a
    weight."""
    return {"softmax_scale": 1.0, "v_norm_eps": float(s["rms_norm_eps"])}


GEMMA3N = Family(
    "gemma3n_text", "split", ATTN, NORM_TENSORS,
    {**GEMMA_DEFAULTS, "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0,
     "sliding_window": 512, "num_kv_shared_layers": 15, "head_dim": 256,
     "num_key_value_heads": 2},
    decoder_fields(GEMMA3N_LAYERS, "attention_bias", "attention_bias", head_norm(0.0),
                   gemma3n_extras, rope_by_layer_type("rope_local_base_freq"),
                   shared_kv(GEMMA3N_LAYERS)),
    without_own_keys,
    summary="q/k norm per head by w, a weightless value norm, scale 1, layer_types (or every "
            "5th full) + sliding_window, a rope per layer type; the last num_kv_shared_layers "
            "attend with the last earlier layer of their type's keys and values (KV-shared)")

def gemma4_layers(s: Settings, layer: int) -> str:
    """Gemma 4: layer_types (or every 6th layer full), the last layer always full (transformers
    forces it)."""
    return FULL if layer == s["num_hidden_layers"] - 1 else typed(periodic(6))(s, layer)


def gemma4_shape(s: Settings, layer: int, kind: str, fields: dict) -> dict:
    """Gemma 4: a layer's head width and kv heads from per_layer_config (keyed by layer); a
    config.json without it gives full layers global_head_dim (and num_global_key_value_heads
    with attention_k_eq_v), as transformers builds it; scale 1, a weightless value norm."""
    if s.get("use_bidirectional_attention") == "all":
        raise UsageError("config.json sets use_bidirectional_attention: all: bidirectional "
                         "layers are not supported (causal only)")
    table = s.get("per_layer_config")
    if table is None:
        table = {str(layer): _global_layer(s)} if kind == FULL else {}
    own = table.get(str(layer)) or {}
    shape = {k: own[k] for k in ("head_dim", "num_key_value_heads") if own.get(k)}
    return {"softmax_scale": 1.0, "v_norm_eps": float(s["rms_norm_eps"]),
            "head_dim": shape.get("head_dim", fields["head_dim"]),
            "kv_heads": shape.get("num_key_value_heads", fields["kv_heads"])}


def _global_layer(s: Settings) -> dict:
    kv = s.get("num_global_key_value_heads") if s["attention_k_eq_v"] else None
    return {"head_dim": s["global_head_dim"], "num_key_value_heads": kv}


def keys_as_values(fields: dict, tensors: dict) -> dict:
    """Gemma 4's full layers with attention_k_eq_v have no v_proj: the values are k_proj's
    output (before k_norm and rotary)."""
    if "W_value.weight" in tensors or "W_key.weight" not in tensors:
        return tensors
    return {**tensors, **{f"W_value.{p}": tensors[f"W_key.{p}"] for p in ("weight", "bias")
                          if f"W_key.{p}" in tensors}}


def gemma4_tensors(fields: dict, tensors: dict) -> dict:
    return without_own_keys(fields, keys_as_values(fields, tensors))


GEMMA4 = Family(
    "gemma4_text", "split", ATTN, NORM_TENSORS,
    {**GEMMA_DEFAULTS, "num_key_value_heads": 4, "head_dim": 256, "sliding_window": 512,
     "num_kv_shared_layers": 0, "attention_k_eq_v": False, "global_head_dim": 512,
     "num_global_key_value_heads": None, "rope_theta": 1_000_000.0,
     "rope_local_base_freq": 10_000.0},
    decoder_fields(gemma4_layers, "attention_bias", "attention_bias", head_norm(0.0),
                   gemma4_shape, rope_by_layer_type("rope_local_base_freq"),
                   shared_kv(gemma4_layers)),
    gemma4_tensors,
    summary="as gemma3n_text; per_layer_config's head_dim and kv heads (or global_head_dim on "
            "full layers), attention_k_eq_v (values from k_proj), the proportional rope "
            "type; the last layer full; KV-shared layers as gemma3n_text's")

GEMMA2 = Family(
    "gemma2", "split", ATTN, DECODER_TENSORS,
    {**GEMMA_DEFAULTS, "attn_logit_softcapping": 50.0,
     "use_bidirectional_attention": None},
    decoder_fields(typed(periodic(2)), "attention_bias", "attention_bias",
                   gemma_logits(softcap=True)),
    summary="scale query_pre_attn_scalar**-0.5, attn_logit_softcapping, "
            "layer_types (or every 2nd layer full) + sliding_window")

RECORDS = (
    Family("gemma", "split", ATTN, DECODER_TENSORS,
           {**DECODER_DEFAULTS, "attention_bias": False, "head_dim": 256},
           decoder_fields(full_layers, "attention_bias", "attention_bias"),
           summary="heads, num_key_value_heads, head_dim (default 256), attention_bias, rope"),
    GEMMA2,
    same_as(GEMMA2, "vaultgemma"),
    GEMMA3,
    dataclasses.replace(GEMMA3, model_type="gemma3", nested="text_config",
                        prefix=LANGUAGE_MODEL, summary="gemma3_text's, from text_config"),
    GEMMA3N,
    dataclasses.replace(GEMMA3N, model_type="gemma3n", nested="text_config",
                        prefix=LANGUAGE_MODEL, summary="gemma3n_text's, from text_config"),
    GEMMA4,
    dataclasses.replace(GEMMA4, model_type="gemma4", nested="text_config",
                        prefix=LANGUAGE_MODEL, summary="gemma4_text's, from text_config"),
)


# GGUF (llama.cpp's files) -----------------------------------------------------------------------

def gemma_scale(layers_27b: int) -> Callable[[Metadata, int], float]:
    """Gemma's query_pre_attn_scalar, which no GGUF key holds: llama.cpp's rule (its
    llama-model.cpp) — n_embd / n_head for the 27B model (known by its layer count), else
    head_dim."""
    def scalar(f: Metadata, layer: int) -> float:
        if f.require("block_count") == layers_27b:
            return f.require("embedding_length") / f.require("attention.head_count", layer)
        return head_dim(f, layer)
    return scalar


def gemma2(f: Metadata, layer: int) -> dict:
    """Softcapping and the window as written; every 2nd layer full (llama.cpp's pattern 2, the
    family's default)."""
    return present(query_pre_attn_scalar=gemma_scale(46)(f, layer),
                   attn_logit_softcapping=f.arch_value("attn_logit_softcapping"),
                   sliding_window=f.arch_value("attention.sliding_window"))


def gemma3(f: Metadata, layer: int) -> dict:
    """Every 6th layer full (llama.cpp's hard-coded pattern), local rope theta 10000 unless the
    file says (rope.freq_base_swa); no window written (or 0): every layer full, as llama.cpp."""
    window = f.arch_value("attention.sliding_window")
    out = {"query_pre_attn_scalar": gemma_scale(62)(f, layer), "sliding_window_pattern": 6,
           "rope_local_base_freq": f.arch_value("rope.freq_base_swa", 10000.0)}
    if window:
        return {**out, "sliding_window": window}
    return {**out, "layer_types": ["full_attention"] * f.require("block_count")}


GEMMA3N_SHARED_FROM = 20  # llama.cpp's n_layer_kv_from_start for gemma3n (hard-coded)


def gemma3n(f: Metadata, layer: int) -> dict:
    """Gemma 3n as llama.cpp runs it (hard-coded, whatever the file's pattern array and
    shared_kv_layers say): every 5th layer full, the others sliding (rope.freq_base_swa, default
    10000); the layers from 20 on attend with layer 18's (sliding) or 19's (full) keys and
    values — transformers' rule gives the same sources for that split."""
    count = f.require("block_count")
    return {"layer_types": ["full_attention" if i % 5 == 4 else "sliding_attention"
                            for i in range(count)],
            "num_kv_shared_layers": max(count - GEMMA3N_SHARED_FROM, 0),
            "sliding_window": f.require("attention.sliding_window"),
            "rope_local_base_freq": f.arch_value("rope.freq_base_swa", 10000.0)}


GGUF = {
    "gemma2": GGUFArch("gemma2", norm_shift=1.0, extra=gemma2),
    "gemma3": GGUFArch("gemma3_text", norm_shift=1.0, extra=gemma3),
    "gemma": GGUFArch("gemma", norm_shift=1.0),
    "gemma3n": GGUFArch("gemma3n_text", extra=gemma3n),  # norms stored as w (no shift)
}
GGUF_REFUSED = {
    "gemma4": ("Gemma 4 as llama.cpp stores it (sliding layers' own head width key_length_swa, "
               "the proportional rope as rope_freqs factors) is not read" + FROM_HF),
}
