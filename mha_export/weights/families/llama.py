"""Llama and the decoders that are Llama's math with a twist of their own: Mistral and Mixtral
(every layer slides), Ministral (layer_types), Phi-3 (one qkv_proj, longrope), Granite
(attention_multiplier), Starcoder2 (biases), SmolLM3 (NoPE layers), Arcee and InternLM3
(Llama's), Seed-OSS and Solar Open (their own output bias), Apertus and Hunyuan v3 (q/k norm per
head), Nemotron (partial rotary), LFM2 (renamed q/k norms; its conv layers refused), Hunyuan
(q/k norm after rotary), BitNet (a norm before o_proj)."""
from __future__ import annotations

from ...errors import UsageError
from .base import Family, Settings, same_as
from .decoder import (ATTN, DECODER_DEFAULTS, DECODER_TENSORS, NOPE, NORM_TENSORS,
                      decoder_fields, fixed, head_norm)
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
