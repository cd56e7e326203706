"""GPT-2 (Conv1D weights), GPT-NeoX (per-head fused QKV) and gpt-oss (sinks)."""
from __future__ import annotations

from ...errors import UsageError
from .base import Family, Settings
from .decoder import ATTN, DECODER_DEFAULTS, DECODER_TENSORS, decoder_fields, fixed, per_head_split
from .layer_types import periodic, typed
from .rope import rotary_fields

# gpt-oss's rope when config.json has none (GptOssConfig.__post_init__)
GPT_OSS_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": False, "original_max_position_embeddings": 4096}


def gpt2_fields(s: Settings, layer: int) -> dict:
    if not s["scale_attn_weights"] or s["scale_attn_by_inverse_layer_idx"]:
        raise UsageError("this GPT-2 checkpoint scales attention differently "
                         "(scale_attn_weights / scale_attn_by_inverse_layer_idx): not supported")
    heads, dim = s["n_head"], s["n_embd"]
    return {"dim": dim, "d_in": dim, "heads": heads, "head_dim": dim // heads, "kv_heads": heads,
            "causal": True, "sliding_window": None, "rotary": "none", "qkv_bias": True,
            "out_bias": True}


def gpt2_convert(fields: dict, tensors: dict) -> dict:
    """Conv1D stores [in, out]: transposed to nn.Linear's [out, in]."""
    return {k: (v.t().contiguous() if k.endswith("weight") else v) for k, v in tensors.items()}


def neox_fields(s: Settings, layer: int) -> dict:
    heads = s["num_attention_heads"]
    head_dim = s["hidden_size"] // heads
    return {"dim": s["hidden_size"], "d_in": s["hidden_size"], "heads": heads,
            "head_dim": head_dim, "kv_heads": heads, "causal": True, "sliding_window": None,
            "qkv_bias": s["attention_bias"], "out_bias": s["attention_bias"],
            **rotary_fields(s, head_dim, partial_key="rotary_pct")}


neox_convert = per_head_split("query_key_value", ("W_query", "W_key", "W_value"))

RECORDS = (
    Family("gpt_oss", "split", ATTN, {**DECODER_TENSORS, "sinks": "sinks"},
           {**DECODER_DEFAULTS, "rope_theta": 150000.0, "attention_bias": True,
            "head_dim": 64, "num_key_value_heads": 8, "sliding_window": 128,
            "rope_parameters": GPT_OSS_ROPE},
           decoder_fields(typed(periodic(2)), "attention_bias", "attention_bias",
                          fixed(sinks=True)),
           summary="sinks, attention_bias, layer_types (or every 2nd layer full) + "
                   "sliding_window, yarn"),
    Family("gpt_neox", "split", "layers.{layer}.attention",
           {"query_key_value": "query_key_value", "dense": "out_proj"},
           {"rotary_emb_base": 10000.0, "rotary_pct": 0.25, "attention_bias": True},
           neox_fields, neox_convert,
           summary="heads, attention_bias, partial rotary (rotary_pct), rope"),
    Family("gpt2", "fused", "h.{layer}.attn", {"c_attn": "c_attn", "c_proj": "c_proj"},
           {"n_head": 12, "n_embd": 768, "scale_attn_weights": True,
            "scale_attn_by_inverse_layer_idx": False},
           gpt2_fields, gpt2_convert, layer_count="n_layer", context="n_positions",
           summary="n_head, n_embd (Conv1D weights transposed)"),
)
