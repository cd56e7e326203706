"""Llama and the decoders that are Llama's math with a twist of their own: Mistral and Mixtral
(every layer slides), Ministral (layer_types), Phi-3 (one qkv_proj, longrope), Granite
(attention_multiplier), Starcoder2 (biases), SmolLM3 (NoPE layers), Arcee and InternLM3
(Llama's), Seed-OSS and Solar Open (their own output bias), Apertus and Hunyuan v3 (q/k norm per
head), Nemotron (partial rotary), LFM2 (renamed q/k norms; its conv layers refused), Hunyuan
(q/k norm after rotary), BitNet (a norm before o_proj)."""
from __future__ import annotations

from typing import Optional

from ...errors import UsageError
from .base import Family, Settings, same_as
from .decoder import (ATTN, DECODER_DEFAULTS, DECODER_TENSORS, NOPE, NORM_TENSORS,
                      decoder_fields, fixed, head_norm)
from .gguf_common import (FROM_HF, GGUFArch, Metadata, RopeScaling, has, head_dim, no_window,
                          present)
from .layer_types import FULL, SLIDING, full_layers, sliding_layers, typed
from .rope import rotary_fields


def multiplier_scale(s: Settings, layer: int, kind: str, fields: dict) -> dict:
    """Granite: the softmax scale is attention_multiplier."""
    return {"softmax_scale": float(s["attention_multiplier"])}


def phi3_rope(s: Settings, layer: int, kind: str, fields: dict) -> dict:
    """Phi-3: rope types "su" and "yarn" in its config.json mean longrope (transformers maps
    them); original_max_position_embeddings is a top-level key (default 4096)."""
    return rotary_fields(s, fields["head_dim"], aliases={"su": "longrope", "yarn": "longrope"})


def phimoe_rope(s: Settings, layer: int, kind: str, fields: dict) -> dict:
    """Phi-MoE: longrope with short_mscale / long_mscale (the attention factor of each side of
    the switch). transformers 5.23's Phimoe rotary rebuilds its table from config.json at every
    call without the length, so it keeps the short factors past the switch: read so (only the
    factor switches)."""
    r = phi3_rope(s, layer, kind, fields)
    scaling = r["rope_scaling"]
    if scaling and scaling["rope_type"] == "longrope" and "short_factor" in scaling:
        r["rope_scaling"] = {**scaling, "long_factor": scaling["short_factor"]}
    return r


def qkv_rows_convert(fields: dict, tensors: dict) -> dict:
    """Phi-3's qkv_proj stacks all query rows, then key rows, then value rows (by their sizes:
    heads * head_dim, kv_heads * head_dim twice)."""
    q = fields["heads"] * fields["head_dim"]
    kv = fields["kv_heads"] * fields["head_dim"]
    out = {k: v for k, v in tensors.items() if not k.startswith("qkv_proj.")}
    for part in ("weight", "bias"):
        t = tensors.get(f"qkv_proj.{part}")
        if t is not None:
            out.update({f"W_query.{part}": t[:q], f"W_key.{part}": t[q:q + kv],
                        f"W_value.{part}": t[q + kv:]})
    return out


def uses_rope(s: Settings, layer: int) -> bool:
    """SmolLM3: no_rope_layers[layer] 1 rotates, 0 is a NoPE layer; without the list, every
    no_rope_layer_interval-th layer is NoPE."""
    flags = s.get("no_rope_layers")
    if flags is None:
        return (layer + 1) % s["no_rope_layer_interval"] != 0
    if not isinstance(flags, list) or len(flags) <= layer:
        raise UsageError(f"config.json: no_rope_layers has no entry for layer {layer}")
    return bool(flags[layer])


def nope_layers(s: Settings, layer: int, kind: str, fields: dict) -> dict:
    return {} if uses_rope(s, layer) else dict(NOPE)


def lfm2_layers(s: Settings, layer: int) -> str:
    """LFM2's default layer types: full attention on full_attn_idxs (default all), the other
    layers short convolutions."""
    listed = s.get("full_attn_idxs")
    return FULL if listed is None or layer in listed else "conv"


def ntk_alpha(s: Settings, layer: int, kind: str, fields: dict) -> dict:
    """Hunyuan: rope type "dynamic" with an alpha is a fixed base (transformers' ntk_alpha),
    theta * alpha ** (H / (H - 2)), not dynamic NTK."""
    params = {**(s.get("rope_scaling") or {}), **(s.get("rope_parameters") or {})}
    if (params.get("rope_type") or params.get("type")) != "dynamic" or not params.get("alpha"):
        return {}
    h = fields["head_dim"]
    return {"rope_theta": fields["rope_theta"] * float(params["alpha"]) ** (h / (h - 2)),
            "rope_scaling": None}


def position_query_scale(s: Settings, layer: int, kind: str, fields: dict) -> dict:
    """Ministral 3: the rope dict's llama_4_scaling_beta scales queries by position over its
    original_max_position_embeddings (and leaves the rope as it is)."""
    params = {**(s.get("rope_scaling") or {}), **(s.get("rope_parameters") or {})}
    rope = {k: v for k, v in (fields["rope_scaling"] or {}).items()
            if k not in ("llama_4_scaling_beta", "max_position_embeddings")}
    out = {"rope_scaling": rope or None}
    if params.get("llama_4_scaling_beta"):
        length = params.get("original_max_position_embeddings") or rope.get(
            "original_max_position_embeddings")
        out.update(query_scale_beta=float(params["llama_4_scaling_beta"]),
                   query_scale_length=int(length))
    return out


def sliding_when_set(s: Settings, layer: int) -> str:
    """Ministral's default layer types: every layer slides when sliding_window is set."""
    return SLIDING if s.get("sliding_window") is not None else FULL


def smollm3_layers(s: Settings, layer: int) -> str:
    """SmolLM3's default layer types: sliding on the NoPE layers when use_sliding_window."""
    on = s["use_sliding_window"] and s.get("sliding_window") is not None
    return SLIDING if on and not uses_rope(s, layer) else FULL


HUNYUAN_TENSORS = {**DECODER_TENSORS, "query_layernorm": "q_norm", "key_layernorm": "k_norm"}
HUNYUAN_DEFAULTS = {**DECODER_DEFAULTS, "attention_bias": False, "rms_norm_eps": 1e-5}
INTERNLM3_BIAS = ("attention_bias", "qkv_bias")  # its config maps qkv_bias to attention_bias
LFM2_TENSORS = {"q_proj": "W_query", "k_proj": "W_key", "v_proj": "W_value",
                "out_proj": "out_proj", "q_layernorm": "q_norm", "k_layernorm": "k_norm"}

LLAMA = Family(
    "llama", "split", ATTN, DECODER_TENSORS,
    {**DECODER_DEFAULTS, "attention_bias": False},
    decoder_fields(full_layers, qkv_bias="attention_bias", out_bias="attention_bias"),
    summary="heads, num_key_value_heads, head_dim, attention_bias, rope")
GRANITE = Family(
    "granite", "split", ATTN, DECODER_TENSORS,
    {**DECODER_DEFAULTS, "attention_bias": False, "attention_multiplier": 1.0},
    decoder_fields(full_layers, "attention_bias", "attention_bias", multiplier_scale),
    summary="softmax scale attention_multiplier, attention_bias, rope")
HUNYUAN = Family(
    "hunyuan_v1_dense", "split", ATTN, HUNYUAN_TENSORS, HUNYUAN_DEFAULTS,
    decoder_fields(full_layers, "attention_bias", "attention_bias", head_norm(0.0),
                   fixed(qk_norm_after_rope=True), ntk_alpha),
    summary="q/k norm per head after rotary (query_layernorm, key_layernorm), attention_bias, "
            "rope (dynamic + alpha: a fixed base, theta * alpha^(H/(H-2)))")

RECORDS = (
    LLAMA,
    Family("mistral", "split", ATTN, DECODER_TENSORS,
           {**DECODER_DEFAULTS, "sliding_window": 4096},
           decoder_fields(sliding_layers, qkv_bias=False, out_bias=False),
           summary="heads, num_key_value_heads, head_dim, rope, sliding_window"),
    Family("phi3", "split", ATTN, {"qkv_proj": "qkv_proj", "o_proj": "out_proj"},
           {**DECODER_DEFAULTS, "sliding_window": None, "max_position_embeddings": 4096,
            "original_max_position_embeddings": 4096},
           decoder_fields(sliding_layers, False, False, phi3_rope), qkv_rows_convert,
           summary="qkv_proj split by sizes, partial rotary, longrope (su / yarn) with the "
                   "top-level original_max_position_embeddings, sliding_window"),
    Family("phimoe", "split", ATTN, DECODER_TENSORS,
           {**DECODER_DEFAULTS, "rope_theta": 1_000_000.0, "attention_bias": False,
            "sliding_window": None, "original_max_position_embeddings": None},
           decoder_fields(sliding_layers, "attention_bias", "attention_bias", phimoe_rope),
           summary="longrope with short_mscale / long_mscale (transformers 5.23 keeps the "
                   "short factors past the switch: so do we), sliding_window, attention_bias"),
    GRANITE,
    same_as(GRANITE, "granitemoe"),
    same_as(GRANITE, "granitemoeshared"),
    Family("starcoder2", "split", ATTN, DECODER_TENSORS,
           {**DECODER_DEFAULTS, "use_bias": True, "num_key_value_heads": 2,
            "sliding_window": None},
           decoder_fields(sliding_layers, "use_bias", "use_bias"),
           summary="use_bias (q/k/v/o), sliding_window, rope"),
    Family("smollm3", "split", ATTN, DECODER_TENSORS,
           {**DECODER_DEFAULTS, "rope_theta": 2_000_000.0, "attention_bias": False,
            "num_key_value_heads": 4, "use_sliding_window": False, "sliding_window": None,
            "no_rope_layer_interval": 4},
           decoder_fields(typed(smollm3_layers), "attention_bias", "attention_bias",
                          nope_layers),
           summary="no_rope_layers (0: NoPE layer), layer_types + sliding_window, "
                   "attention_bias, rope"),
    same_as(LLAMA, "arcee"),
    Family("mixtral", "split", ATTN, DECODER_TENSORS,
           {**DECODER_DEFAULTS, "sliding_window": None},
           decoder_fields(sliding_layers, qkv_bias=False, out_bias=False),
           summary="as mistral (sliding_window default none)"),
    Family("ministral", "split", ATTN, DECODER_TENSORS,
           {**DECODER_DEFAULTS, "sliding_window": 4096},
           decoder_fields(typed(sliding_when_set), qkv_bias=False, out_bias=False),
           summary="layer_types (or every layer sliding when sliding_window is set), rope"),
    Family("ministral3", "split", ATTN, DECODER_TENSORS,
           {**DECODER_DEFAULTS, "sliding_window": None, "head_dim": 128},
           decoder_fields(sliding_layers, False, False, position_query_scale),
           summary="as mistral; rope_parameters' llama_4_scaling_beta scales the queries by "
                   "position (1 + beta log(1 + floor(position / "
                   "original_max_position_embeddings))), yarn"),
    Family("seed_oss", "split", ATTN, DECODER_TENSORS,
           {**DECODER_DEFAULTS, "attention_bias": True, "attention_out_bias": False,
            "head_dim": 128},
           decoder_fields(full_layers, "attention_bias", "attention_out_bias"),
           summary="attention_bias (q/k/v), attention_out_bias (o), head_dim, rope"),
    Family("solar_open", "split", ATTN, DECODER_TENSORS,
           {**DECODER_DEFAULTS, "attention_bias": False, "head_dim": 128},
           decoder_fields(full_layers, "attention_bias", False),
           summary="attention_bias (q/k/v only), head_dim, rope"),
    Family("apertus", "split", ATTN, NORM_TENSORS,
           {**DECODER_DEFAULTS, "attention_bias": False, "rms_norm_eps": 1e-5},
           decoder_fields(full_layers, "attention_bias", "attention_bias", head_norm(0.0)),
           summary="q/k norm per head, attention_bias, rope"),
    Family("hy_v3", "split", ATTN, NORM_TENSORS,
           {**DECODER_DEFAULTS, "rope_theta": 11158840.0, "attention_bias": False,
            "head_dim": 128, "rms_norm_eps": 1e-5},
           decoder_fields(full_layers, "attention_bias", "attention_bias", head_norm(0.0)),
           summary="as apertus (head_dim default 128)"),
    HUNYUAN,
    same_as(HUNYUAN, "hunyuan_v1_moe"),
    Family("bitnet", "split", ATTN, {**DECODER_TENSORS, "attn_sub_norm": "out_norm"},
           {**DECODER_DEFAULTS, "rope_theta": 500000.0, "attention_bias": False,
            "rms_norm_eps": 1e-5},
           decoder_fields(full_layers, "attention_bias", "attention_bias",
                          lambda s, layer, kind, fields: {
                              "out_norm_eps": float(s["rms_norm_eps"])}),
           summary="an RMSNorm of the attention output before o_proj (attn_sub_norm, "
                   "rms_norm_eps), attention_bias, rope (ternary-packed checkpoints are "
                   "refused)"),
    Family("internlm3", "split", ATTN, DECODER_TENSORS,
           {**DECODER_DEFAULTS, "attention_bias": False, "head_dim": 128},
           decoder_fields(full_layers, INTERNLM3_BIAS, INTERNLM3_BIAS),
           summary="as llama; the bias key spelled attention_bias or qkv_bias"),
    Family("nemotron", "split", ATTN, DECODER_TENSORS,
           {**DECODER_DEFAULTS, "attention_bias": False, "partial_rotary_factor": 0.5},
           decoder_fields(full_layers, "attention_bias", "attention_bias"),
           summary="partial rotary (default 0.5), attention_bias, head_dim"),
    Family("lfm2", "split", ATTN, LFM2_TENSORS,
           {**DECODER_DEFAULTS, "rope_theta": 1_000_000.0, "norm_eps": 1e-5},
           decoder_fields(typed(lfm2_layers), False, False, head_norm(0.0, eps="norm_eps")),
           summary="q_layernorm / k_layernorm (q/k norm per head, norm_eps), out_proj; the "
                   "full-attention layers of layer_types (or full_attn_idxs), conv ones "
                   "refused"),
)


# GGUF (llama.cpp's files) -----------------------------------------------------------------------

def phi3(f: Metadata, layer: int) -> dict:
    """A window of 0 means none (the converter writes 0 for Phi-4)."""
    return {"sliding_window": f.arch_value("attention.sliding_window") or None}


def granite(f: Metadata, layer: int) -> dict:
    """Granite: the softmax scale is attention.scale (attention_multiplier), else llama.cpp's
    1 / sqrt(head_dim); rope.scaling.finetuned false turns its rope off: refused."""
    if f.arch_value("rope.scaling.finetuned") is False:
        raise UsageError(f"{f.path}: a granite file without rope (rope.scaling.finetuned false) "
                         "is not read")
    return {"attention_multiplier": f.arch_value("attention.scale")
            or head_dim(f, layer) ** -0.5}


def smollm3(f: Metadata, layer: int) -> dict:
    """SmolLM3: llama.cpp's every 4th layer NoPE (hard-coded), no window."""
    return {"no_rope_layer_interval": 4, "use_sliding_window": False}


def seed_oss(f: Metadata, layer: int) -> dict:
    """Seed-OSS: the output bias is a key of its own."""
    return {"attention_out_bias": has(f, layer, "attn_output.bias")}


def lfm2(f: Metadata, layer: int) -> dict:
    """LFM2: the converter marks its short-convolution layers with head_count_kv 0 (a per-layer
    array); the others attend fully (a sliding window, the audio tokenizer's, refused)."""
    if f.arch_value("attention.sliding_window"):
        raise UsageError(f"{f.path}: an lfm2 file with a sliding window is not read")
    kv = f.require("attention.head_count_kv")
    kinds = [FULL if n else "conv" for n in (kv if isinstance(kv, list)
                                              else [kv] * f.require("block_count"))]
    return {"layer_types": kinds, "norm_eps": f.arch_value("attention.layer_norm_rms_epsilon")}


def mistral3_rope(f: Metadata, generic: RopeScaling) -> Optional[dict]:
    """Ministral 3 as llama.cpp runs it: yarn with mscale 1 and mscale_all_dim the converter's
    rope.scaling.yarn_log_multiplier; queries scaled by position (attention.temperature_scale,
    llama_4_scaling_beta) over the original context. A yarn attention or extrapolation factor,
    which llama.cpp does not read, is refused."""
    if f.arch_value("rope.scaling.type", "none") != "yarn":
        return generic(f)
    unread = [k for k in ("yarn_attn_factor", "yarn_ext_factor")
              if f.arch_value(f"rope.scaling.{k}") is not None]
    if unread:
        raise UsageError(f"{f.path}: rope.scaling.{unread[0]} is not read by llama.cpp's mistral3 "
                         "(transformers would apply it)")
    original = f.require("rope.scaling.original_context_length")
    return present(rope_type="yarn", factor=f.require("rope.scaling.factor"),
                   original_max_position_embeddings=original, mscale=1.0,
                   mscale_all_dim=f.arch_value("rope.scaling.yarn_log_multiplier"),
                   beta_fast=f.arch_value("rope.scaling.yarn_beta_fast"),
                   beta_slow=f.arch_value("rope.scaling.yarn_beta_slow"),
                   llama_4_scaling_beta=f.arch_value("attention.temperature_scale"))


GGUF = {
    "llama": GGUFArch("llama", permuted=True),  # Llama, SmolLM2, Mistral (the converter's)
    "phi3": GGUFArch("phi3", extra=phi3),
    "starcoder2": GGUFArch("starcoder2", extra=no_window, bias="use_bias"),
    "granite": GGUFArch("granite", permuted=True, extra=granite),
    "arcee": GGUFArch("arcee", permuted=True),
    "smollm3": GGUFArch("smollm3", permuted=True, extra=smollm3),
    "apertus": GGUFArch("apertus"),  # the converter's undo_permute = False
    "seed_oss": GGUFArch("seed_oss", extra=seed_oss),
    "hunyuan-dense": GGUFArch("hunyuan_v1_dense"),  # rope.freq_base: alpha already applied
    "nemotron": GGUFArch("nemotron", norm_shift=1.0),  # LayerNorm1P: 1 + w (none in attention)
    "bitnet": GGUFArch("bitnet", tensors={**DECODER_TENSORS, "inner_attn_ln": "out_norm"}),
    "lfm2": GGUFArch("lfm2", extra=lfm2),
    # Ministral 3 (its converter permutes q/k as LlamaModel's); llama.cpp has no window
    "mistral3": GGUFArch("ministral3", permuted=True, extra=no_window, rope=mistral3_rope),
}
GGUF_REFUSED = {
    "phimoe": ("llama.cpp's phimoe differs from transformers' PhiMoE attention: the converter's "
               "longrope attention factor instead of short_mscale / long_mscale, factors "
               "chosen by context size, no sliding window" + FROM_HF),
}
