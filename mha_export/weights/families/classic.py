"""Earlier decoders, each a record of its own config.json spelling: GPT-J (rotary in pairs on
rotary_dim), GPT-Neo (unscaled scores, local layers), OPT (no rotary), GPT-BigCode (StarCoder 1:
one fused c_attn, multi-query), Persimmon (per-head fused QKV, LayerNorm q/k norms), Falcon
(query_key_value grouped per kv head), OLMo (a q/k/v clamp) and DBRX (a fused Wqkv, its clamp
and kv heads in attn_config)."""
from __future__ import annotations

from ...errors import UsageError
from .alibi import falcon_slopes, with_slopes
from .base import Family, Settings
from .decoder import (ATTN, DECODER_DEFAULTS, DECODER_TENSORS, decoder_fields, layer_norm,
                      per_head_split)
from .gguf_common import GGUFArch, Metadata, has
from .layer_types import full_layers
from .llama import qkv_rows_convert
from .rope import rotary_fields


def plain(heads: int, dim: int, kv_heads: int, bias: bool, out_bias: bool, **extra) -> dict:
    """The fields of a layer whose head width is dim / heads (causal, no window, no rotary
    unless `extra` says)."""
    return {"dim": dim, "d_in": dim, "heads": heads, "head_dim": dim // heads,
            "kv_heads": kv_heads, "causal": True, "qkv_bias": bias, "out_bias": out_bias,
            "sliding_window": None, "rotary": "none", **extra}


def gptj_fields(s: Settings, layer: int) -> dict:
    """GPT-J: rotary in pairs on the first rotary_dim features (all when null), base 10000."""
    heads, dim = s["n_head"], s["n_embd"]
    return plain(heads, dim, heads, False, False, rotary="interleaved",
                 rotary_dim=s.get("rotary_dim") or dim // heads, rope_theta=10000.0)


def gpt_neo_fields(s: Settings, layer: int) -> dict:
    """GPT-Neo: scores not scaled (scale 1); attention_layers (or attention_types expanded)
    says global or local, a local layer sees window_size keys."""
    kinds = s.get("attention_layers") or [kind for pattern, times in s["attention_types"]
                                          for _ in range(times) for kind in pattern]
    heads, dim = s["num_heads"], s["hidden_size"]
    window = s["window_size"] if kinds[layer] == "local" else None
    return plain(heads, dim, heads, False, True, softmax_scale=1.0, sliding_window=window)


def opt_fields(s: Settings, layer: int) -> dict:
    heads = s["num_attention_heads"]
    return plain(heads, s["hidden_size"], heads, s["enable_bias"], s["enable_bias"])


def bigcode_fields(s: Settings, layer: int) -> dict:
    """GPT-BigCode: one key/value head with multi_query; scale 1 without scale_attn_weights."""
    heads = s["n_head"]
    return plain(heads, s["n_embd"], 1 if s["multi_query"] else heads, True, True,
                 softmax_scale=None if s["scale_attn_weights"] else 1.0)


def bigcode_convert(fields: dict, tensors: dict) -> dict:
    """c_attn: multi-query stacks all query rows, then the key's and the value's; else per head
    [q_h; k_h; v_h] (as GPT-NeoX)."""
    if fields["kv_heads"] < fields["heads"]:
        return qkv_rows_convert(fields, tensors)
    return per_head_split("qkv_proj", ("W_query", "W_key", "W_value"))(fields, tensors)


def dbrx_fields(s: Settings, layer: int) -> dict:
    """DBRX: kv heads and clip_qkv in the nested attn_config; the rope as transformers 5.23
    reads it (rope_parameters / rope_theta: it ignores 4.x's attn_config.rope_theta)."""
    attn = s.get("attn_config") or {}
    heads, dim = s["n_heads"], s["d_model"]
    return plain(heads, dim, attn.get("kv_n_heads", 1), False, False,
                 qkv_clip=attn.get("clip_qkv"), **rotary_fields(s, dim // heads))


def falcon_fields(s: Settings, layer: int) -> dict:
    """Falcon: kv heads by layout (new_decoder_architecture: num_kv_heads; multi_query: one;
    else one per head), bias on all four, rotary, or ALiBi (alibi: its slopes from
    alibi.py)."""
    heads, dim = s["num_attention_heads"], s["hidden_size"]
    kv = s["num_kv_heads"] if s["new_decoder_architecture"] else (
        1 if s["multi_query"] else heads)
    position = {"alibi": True} if s["alibi"] else rotary_fields(s, dim // heads)
    return plain(heads, dim, kv, s["bias"], s["bias"], **position)


def grouped_qkv(fields: dict, tensors: dict) -> dict:
    """Falcon's query_key_value: per kv head, its query heads' rows, then its key's and its
    value's ((K, N/K + 2, H) rows); per-head [q; k; v] (K = N) and multi-query [q...; k; v]
    (K = 1) are its edge cases."""
    n, kv, h = fields["heads"], fields["kv_heads"], fields["head_dim"]
    out = {k: v for k, v in tensors.items() if not k.startswith("query_key_value.")}
    for part in ("weight", "bias"):
        t = tensors.get(f"query_key_value.{part}")
        if t is None:
            continue
        rest = tuple(t.shape[1:])
        groups = t.reshape(kv, n // kv + 2, h, *rest)  # (K, N/K + 2, H[, in])
        out[f"W_query.{part}"] = groups[:, :-2].reshape(n * h, *rest)
        out[f"W_key.{part}"] = groups[:, -2].reshape(kv * h, *rest)
        out[f"W_value.{part}"] = groups[:, -1].reshape(kv * h, *rest)
    return out


def olmo_clip(s: Settings, layer: int, kind: str, fields: dict) -> dict:
    """OLMo, OLMoE: q, k and v clamped to ±clip_qkv (when set)."""
    return {"qkv_clip": s.get("clip_qkv")}


GPT = {"layer_count": "n_layer", "context": "n_positions"}

RECORDS = (
    Family("gptj", "split", "h.{layer}.attn", {**DECODER_TENSORS, "out_proj": "out_proj"},
           {"rotary_dim": None}, gptj_fields, **GPT,
           summary="n_head, n_embd, rotary in pairs on rotary_dim (null: all), no biases"),
    Family("gpt_neo", "split", "h.{layer}.attn.attention",
           {**DECODER_TENSORS, "out_proj": "out_proj"},
           {"window_size": 256, "attention_types": [[["global", "local"], 12]]},
           gpt_neo_fields, layer_count="num_layers",
           summary="num_heads, scale 1 (scores not scaled), attention_layers (or "
                   "attention_types) + window_size, out_proj bias, no rotary"),
    Family("opt", "split", ATTN, {**DECODER_TENSORS, "out_proj": "out_proj"},
           {"enable_bias": True}, opt_fields,
           summary="heads, enable_bias, no rotary (positions are the model's)"),
    Family("gpt_bigcode", "split", "h.{layer}.attn", {"c_attn": "qkv_proj", "c_proj": "out_proj"},
           {"multi_query": True, "scale_attn_weights": True}, bigcode_fields, bigcode_convert,
           **GPT, summary="c_attn split (multi_query: query rows, one key and value head; "
                          "else per head), scale_attn_weights, biases, no rotary"),
    Family("persimmon", "split", "layers.{layer}.self_attn",
           {"query_key_value": "query_key_value", "dense": "out_proj",
            "q_layernorm": "q_norm", "k_layernorm": "k_norm"},
           {**DECODER_DEFAULTS, "partial_rotary_factor": 0.5, "qk_layernorm": True,
            "layer_norm_eps": 1e-5, "num_key_value_heads": None},
           decoder_fields(full_layers, True, True,
                          layer_norm("layer_norm_eps", bias=True, when="qk_layernorm")),
           per_head_split("query_key_value", ("W_query", "W_key", "W_value")),
           summary="query_key_value per head (as gpt_neox), dense, partial rotary (0.5), "
                   "LayerNorm q/k norms with bias (qk_layernorm)"),
    Family("falcon", "split", "h.{layer}.self_attention",
           {"query_key_value": "query_key_value", "dense": "out_proj"},
           {**DECODER_DEFAULTS, "alibi": False, "bias": False, "multi_query": True,
            "new_decoder_architecture": False, "num_kv_heads": None},
           falcon_fields, with_slopes(falcon_slopes, grouped_qkv),
           summary="query_key_value grouped per kv head (new_decoder_architecture + "
                   "num_kv_heads; multi_query; else per head), bias, rope or ALiBi (alibi: "
                   "slopes rounded to bfloat16 as transformers rounds them)"),
    Family("olmo", "split", ATTN, DECODER_TENSORS,
           {**DECODER_DEFAULTS, "attention_bias": False, "clip_qkv": None},
           decoder_fields(full_layers, "attention_bias", "attention_bias", olmo_clip),
           summary="clip_qkv (q, k, v clamped), attention_bias, rope"),
    Family("dbrx", "split", "blocks.{layer}.norm_attn_norm.attn",
           {"Wqkv": "qkv_proj", "out_proj": "out_proj"}, {**DECODER_DEFAULTS},
           dbrx_fields, qkv_rows_convert, layer_count="n_layers", context="max_seq_len",
           summary="n_heads, d_model, Wqkv split by sizes, attn_config's kv_n_heads and "
                   "clip_qkv; rope_parameters (transformers 5.23 ignores attn_config's "
                   "rope_theta)"),
)


# GGUF (llama.cpp's files) -----------------------------------------------------------------------

def olmo(f: Metadata, layer: int) -> dict:
    """OLMo: q, k, v clamped to attention.clamp_kqv (written from clip_qkv). llama.cpp's olmo
    has no attention biases (the converter permutes q/k weights only)."""
    if any(has(f, layer, f"attn_{n}.bias") for n in ("q", "k", "v", "output")):
        raise UsageError(f"{f.path}: attention biases in an olmo file are not read (llama.cpp's "
                         "olmo has none)")
    return {"clip_qkv": f.arch_value("attention.clamp_kqv") or None}


def falcon(f: Metadata, layer: int) -> dict:
    """Falcon: the converter stacks query_key_value's rows as query, key, value (head_count_kv
    key heads, any layout it came from); biases on all four or none."""
    heads = f.require("attention.head_count", layer)
    return {"new_decoder_architecture": True, "alibi": False,
            "num_kv_heads": f.arch_value("attention.head_count_kv", heads, layer)}


def starcoder(f: Metadata, layer: int) -> dict:
    """StarCoder (gpt_bigcode): one key/value head (the converter writes 1, llama.cpp reads
    c_attn so), scores scaled by 1 / sqrt(head_dim)."""
    if f.arch_value("attention.head_count_kv", 1, layer) != 1:
        raise UsageError(f"{f.path}: a starcoder file with several key/value heads is not read")
    return {"n_head": f.require("attention.head_count", layer), "multi_query": True,
            "n_embd": f.require("embedding_length"), "n_layer": f.require("block_count"),
            "n_positions": f.arch_value("context_length"), "scale_attn_weights": True}


def dbrx(f: Metadata, layer: int) -> dict:
    """DBRX: its own config.json spelling; q, k, v clamped to attention.clamp_kqv."""
    heads = f.require("attention.head_count", layer)
    return {"n_heads": heads, "d_model": f.require("embedding_length"),
            "n_layers": f.require("block_count"), "max_seq_len": f.arch_value("context_length"),
            "attn_config": {"kv_n_heads": f.arch_value("attention.head_count_kv", heads, layer),
                            "clip_qkv": f.arch_value("attention.clamp_kqv") or None}}


GGUF = {
    "olmo": GGUFArch("olmo", permuted=True, extra=olmo),
    "falcon": GGUFArch("falcon", extra=falcon, bias="bias", prefix="transformer.",
                       tensors={"query_key_value": "qkv_proj", "dense": "out_proj"},
                       convert=qkv_rows_convert),
    "starcoder": GGUFArch("gpt_bigcode", extra=starcoder, prefix="transformer."),
    "dbrx": GGUFArch("dbrx", extra=dbrx, prefix="transformer."),
}
