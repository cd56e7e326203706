"""LongCat-Flash (`longcat_flash`): two attention modules in each decoder layer
(``layers.{L}.self_attn.0`` and ``.1``, addressed ``--layer L.0`` / ``L.1``), each DeepSeek-V3's
attention (deepseek.py's record) with a q LoRA, its rope always on pairs (written as halves),
and constant LoRA scales that transformers' ``LongcatFlashMLA`` multiplies in after the
projections: the query by (hidden_size / q_lora_rank)^0.5, the normalised latent by
(hidden_size / kv_lora_rank)^0.5. They are folded into the weights here (``lora_scales``):
q_b_proj's rows and kv_a_layernorm's weight, so the layer, its cache (the scaled latent, as
transformers caches it) and every form are DeepSeek-V3's own."""
from __future__ import annotations

import dataclasses

from .base import Settings
from .deepseek import DEEPSEEK_V3

MODULES = 2  # attention modules per decoder layer


def longcat_fields(s: Settings, layer: int) -> dict:
    """deepseek_v3's fields (rope pairs in, halves out: rope_interleave's default, a key
    LongCat's config does not have); transformers' rotary tables are head_dim wide, so a
    head_dim other than qk_rope_head_dim is a checkpoint it cannot run."""
    head_dim = s.get("head_dim") or s["hidden_size"] // s["num_attention_heads"]
    if head_dim != s["qk_rope_head_dim"]:
        raise ValueError(f"head_dim {head_dim} (the rotary tables' width) must equal "
                         f"qk_rope_head_dim {s['qk_rope_head_dim']}")
    return DEEPSEEK_V3.fields(s, layer)


def lora_scales(fields: dict, tensors: dict) -> dict:
    """The LoRA scales folded in: q_b_proj's rows by (dim / q_lora_rank)^0.5 (both the nope and
    the rope part of every head's query), kv_a_layernorm's weight by (dim / kv_lora_rank)^0.5
    (the latent, after its norm, before the cache); the ranks are the tensors' widths."""
    q_b, kv_norm = tensors["q_b_proj.weight"], tensors["kv_a_layernorm.weight"]  # (N*H, Rq), (R,)
    return {**tensors, "q_b_proj.weight": q_b * (fields["dim"] / q_b.shape[1]) ** 0.5,
            "kv_a_layernorm.weight": kv_norm * (fields["dim"] / kv_norm.shape[0]) ** 0.5}


RECORDS = (
    dataclasses.replace(
        DEEPSEEK_V3, model_type="longcat_flash", attention="layers.{layer}.self_attn.{module}",
        defaults={**DEEPSEEK_V3.defaults, "rope_interleave": True, "rope_theta": 10000000.0,
                  "head_dim": 64, "max_position_embeddings": 131072},
        fields=longcat_fields, convert=lora_scales, layer_count="num_layers", modules=MODULES,
        summary="deepseek_v3's attention with q LoRA, rope pairs in, halves out; two modules a "
                "layer (--layer N.0, N.1); the constant LoRA scales (hidden_size / "
                "q_lora_rank)^0.5 and (hidden_size / kv_lora_rank)^0.5 folded into q_b_proj's "
                "rows and kv_a_layernorm's weight; head_dim must equal qk_rope_head_dim"),
)
