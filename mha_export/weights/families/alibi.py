"""Decoders whose positions are ALiBi's linear biases on the scores (no rotary): BLOOM (per-head
fused query_key_value), MPT (one Wqkv, its own slopes, a clamp and a softmax scale in
attn_config), and the slopes Falcon's ALiBi checkpoints take (classic.py's record). Each
layer's slopes are computed here from config.json, the way transformers does, and stored with
its weights (``alibi_slopes``)."""
from __future__ import annotations

import math
import struct
from typing import Callable

from ...alibi import geometric_slopes, mpt_slopes
from ...errors import UsageError
from .base import Convert, Family, Settings
from .decoder import per_head_split
from .gguf_common import GGUFArch, Metadata, has
from .llama import qkv_rows_convert

Slopes = Callable[[dict], list]  # the layer's fields -> its slopes


def with_slopes(slopes: Slopes, convert: Convert) -> Convert:
    """``convert``, then the layer's slopes as ``alibi_slopes`` where its fields say alibi."""
    def run(fields: dict, tensors: dict) -> dict:
        out = convert(fields, tensors)
        if fields.get("alibi"):
            like = next(iter(out.values()))
            out["alibi_slopes"] = like.new_tensor(slopes(fields)).float()  # (N,)
        return out
    return run


def paper_slopes(fields: dict) -> list:
    """The paper's slopes for the layer's heads (BLOOM's)."""
    return geometric_slopes(fields["heads"])


def falcon_slopes(fields: dict) -> list:
    """Falcon's build_alibi_tensor rounds the slopes to bfloat16 and its attention divides the
    biased scores by sqrt(head_dim): both folded in (the biases themselves it also rounds to
    bfloat16, which the layer does not: exact below 256 positions with 2^k heads)."""
    scale = math.sqrt(fields["head_dim"])
    return [bfloat16(s) / scale for s in geometric_slopes(fields["heads"])]


def bfloat16(x: float) -> float:
    """x rounded to bfloat16 (to nearest, ties to even), as torch's .bfloat16()."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def bloom_fields(s: Settings, layer: int) -> dict:
    heads, dim = s["n_head"], s["hidden_size"]
    return {"dim": dim, "d_in": dim, "heads": heads, "head_dim": dim // heads,
            "kv_heads": heads, "causal": True, "qkv_bias": True, "out_bias": True,
            "sliding_window": None, "rotary": "none", "alibi": True}


def mpt_fields(s: Settings, layer: int) -> dict:
    """MPT: attn_config's clip_qkv and softmax_scale; ALiBi on every layer with
    alibi_bias_max 8, as transformers 5.23 applies it whatever attn_config says; its qk_ln
    refused (transformers' MptAttention has no q/k LayerNorm: not the checkpoint's function)."""
    attn = s.get("attn_config") or {}
    if attn.get("qk_ln"):
        raise UsageError("config.json sets attn_config.qk_ln: transformers' MPT attention has no "
                         "q/k LayerNorm, so this checkpoint is not read")
    heads, dim = s["n_heads"], s["d_model"]
    return {"dim": dim, "d_in": dim, "heads": heads, "head_dim": dim // heads,
            "kv_heads": heads, "causal": True, "qkv_bias": False, "out_bias": False,
            "sliding_window": None, "rotary": "none", "alibi": True,
            "qkv_clip": attn.get("clip_qkv"), "softmax_scale": attn.get("softmax_scale")}


RECORDS = (
    Family("bloom", "split", "h.{layer}.self_attention",
           {"query_key_value": "query_key_value", "dense": "out_proj"}, {}, bloom_fields,
           with_slopes(paper_slopes,
                       per_head_split("query_key_value", ("W_query", "W_key", "W_value"))),
           layer_count="n_layer", context="seq_length",
           summary="n_head, query_key_value per head (as gpt_neox), dense, ALiBi (the "
                   "paper's slopes)"),
    Family("mpt", "fused", "blocks.{layer}.attn", {"Wqkv": "c_attn", "out_proj": "c_proj"},
           {}, mpt_fields, with_slopes(lambda f: mpt_slopes(f["heads"]), lambda f, t: t),
           layer_count="n_layers", context="max_seq_len",
           summary="n_heads, d_model, Wqkv as [q; k; v], no biases, ALiBi (MPT's slopes, "
                   "alibi_bias_max 8, on every layer as transformers applies it), "
                   "attn_config's clip_qkv and softmax_scale; qk_ln refused"),
)


# GGUF (llama.cpp's files) -----------------------------------------------------------------------

def mpt(f: Metadata, layer: int) -> dict:
    """MPT: its own config.json spelling, q/k/v clamped to attention.clamp_kqv. transformers
    applies ALiBi with a bias max of 8 on every layer and reads no kv heads, biases or q/k
    norms: a file whose llama.cpp layer has any other is refused."""
    heads = f.require("attention.head_count", layer)
    differ = {"ALiBi with another max bias than 8":
              f.arch_value("attention.max_alibi_bias", 0.0) != 8.0,
              "fewer key/value heads": f.arch_value("attention.head_count_kv", heads,
                                                    layer) != heads,
              "attention biases": has(f, layer, "attn_qkv.bias"),
              "q/k norms": has(f, layer, "attn_q_norm.weight")}
    for what, on in differ.items():
        if on:
            raise UsageError(f"{f.path}: an mpt layer with {what} is not read (transformers' MPT "
                             "attention has none)")
    return {"n_heads": heads, "d_model": f.require("embedding_length"),
            "n_layers": f.require("block_count"), "max_seq_len": f.arch_value("context_length"),
            "attn_config": {"clip_qkv": f.arch_value("attention.clamp_kqv") or None}}


def bloom(f: Metadata, layer: int) -> dict:
    """BLOOM: its own config.json spelling. llama.cpp's ALiBi (max bias 8, ggml's slopes) is
    the paper's sequence, as transformers computes it."""
    return {"n_head": f.require("attention.head_count", layer),
            "n_layer": f.require("block_count")}


GGUF = {
    "bloom": GGUFArch("bloom", extra=bloom, prefix="transformer.",
                      tensors={"query_key_value": "qkv_proj", "dense": "out_proj"},
                      convert=with_slopes(paper_slopes, qkv_rows_convert)),  # [q; k; v]
    "mpt": GGUFArch("mpt", extra=mpt, prefix="transformer."),
}
