"""Multi-head Latent Attention: DeepSeek-V2 and V3, and V3's attention in GLM-4.7-Flash
(`glm4_moe_lite`) and Youtu-LLM (every layer is one), Kimi Linear's NoPE MLA layers (its
KDA linear-attention layers refused), and DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5's
`glm_moe_dsa`: MLA with a lightning indexer); DeepSeek-V4 (its own kind, kinds/dsv4/: sliding
and compressed attention, tensors under DeepSeek's names or transformers')."""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from ...errors import UsageError
from .base import Family, Fields, Settings
from .decoder import ATTN
from .gguf_common import FROM_HF, GGUFArch, Metadata, RopeScaling, has, present
from .layer_types import ATTENTION_TYPES, FULL, not_attention, typed
from .rope import rope

# the checkpoints' names are the layer's (kinds/mla/layer.py)
LATENT_TENSORS = {name: name for name in (
    "q_proj", "q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm",
    "kv_b_proj", "o_proj", "indexer.wq_b", "indexer.wk", "indexer.k_norm",
    "indexer.weights_proj")}
LATENT_DEFAULTS = {"rope_theta": 10000.0, "partial_rotary_factor": 1.0, "kv_lora_rank": 512,
                   "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
                   "v_head_dim": 128, "attention_bias": False}
# transformers builds q_a_layernorm / kv_a_layernorm with RMSNorm's own eps, never rms_norm_eps
# (which only the decoder's norms read)
LATENT_NORM_EPS = 1e-6


def latent_fields(rope_layout: Callable[[Settings], str]) -> Fields:
    """An MLA layer (every layer of DeepSeek-V2/V3 is one): MHAConfig's latent section, the
    rotary layout that decides what the cache holds, yarn's mscale in the rope dict; no
    output bias unless attention_bias."""
    def fields(s: Settings, layer: int) -> dict:
        r = rope(s)
        latent = {name: s[name] for name in ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim",
                                             "qk_nope_head_dim", "v_head_dim")}
        return {"dim": s["hidden_size"], "heads": s["num_attention_heads"], "causal": True,
                "qkv_bias": s["attention_bias"], "out_bias": s["attention_bias"],
                "rotary": rope_layout(s), "rope_theta": r["rope_theta"],
                "rope_scaling": r["rope_scaling"],
                "latent": {**latent, "norm_eps": LATENT_NORM_EPS}}
    return fields


RECORDS = (
    Family("deepseek_v2", "latent", ATTN, LATENT_TENSORS,
           {**LATENT_DEFAULTS, "max_position_embeddings": 2048},
           latent_fields(lambda s: "interleaved"),  # V2's complex-number rotation: pairs
           summary="Multi-head Latent Attention: kv_lora_rank, q_lora_rank (null: q_proj), "
                   "qk_nope/rope_head_dim, v_head_dim, attention_bias, rope pairs (complex "
                   "form), yarn with mscale_all_dim; the latent norms' eps is 1e-6, as "
                   "transformers builds them (not rms_norm_eps)"),
    Family("deepseek_v3", "latent", ATTN, LATENT_TENSORS,
           {**LATENT_DEFAULTS, "max_position_embeddings": 4096, "rope_interleave": True},
           latent_fields(lambda s: "deinterleaving" if s["rope_interleave"] else "half"),
           summary="as deepseek_v2; rope_interleave (pairs in, halves out; false: halves)"),
)


def kimi_layers(s: Settings, layer: int) -> str:
    """Kimi Linear's default layer types: linear_attn_config's full_attn_layers (1-indexed),
    else every 4th layer from layer 4 full, the others KDA linear attention."""
    listed = (s.get("linear_attn_config") or {}).get("full_attn_layers")
    if listed is not None:
        return FULL if layer + 1 in listed else "linear_attention"
    return FULL if layer and layer % 4 == 0 else "linear_attention"


def kimi_fields(s: Settings, layer: int) -> dict:
    """Kimi Linear: MLA layers whose rope part is not rotated (NoPE); its KDA layers refused."""
    kind = typed(kimi_layers)(s, layer)
    if kind not in ATTENTION_TYPES:
        raise not_attention(s, layer, kind, typed(kimi_layers))
    return latent_fields(lambda s: "unrotated")(s, layer)


DEEPSEEK_V3 = RECORDS[-1]
RECORDS += (
    dataclasses.replace(DEEPSEEK_V3, model_type="glm4_moe_lite", defaults={
        **DEEPSEEK_V3.defaults, "q_lora_rank": 768, "qk_nope_head_dim": 192,
        "v_head_dim": 256, "max_position_embeddings": 202752}, summary="as deepseek_v3"),
    dataclasses.replace(DEEPSEEK_V3, model_type="youtu", defaults={
        **DEEPSEEK_V3.defaults, "max_position_embeddings": 131072}, summary="as deepseek_v3"),
    Family("kimi_linear", "latent", ATTN, LATENT_TENSORS,
           {**LATENT_DEFAULTS, "q_lora_rank": None, "max_position_embeddings": 1048576},
           kimi_fields,
           summary="as deepseek_v3, its rope part not rotated (NoPE: rotary unrotated, no "
                   "position_ids); layer_types (or linear_attn_config's full_attn_layers): "
                   "the KDA linear-attention layers refused"),
)


def topk_source(s: Settings, layer: int) -> Optional[int]:
    """glm_moe_dsa: the layer whose top-k a layer reuses (indexer_types "shared"): the nearest
    earlier "full" one, as transformers' decoder loop passes each layer's selection on
    (prev_topk_indices; a shared layer passes on the one it got); None: its own indexer."""
    kinds = s.get("indexer_types")
    if not kinds or kinds[layer] == "full":
        return None
    if kinds[layer] != "shared":
        raise UsageError(f"layer {layer}: unknown indexer_types entry {kinds[layer]!r} "
                         "(full or shared)")
    full = [i for i in range(layer) if kinds[i] == "full"]
    if not full:
        raise UsageError(f"layer {layer} reuses an earlier layer's top-k selection "
                         "(indexer_types 'shared'), but no earlier layer is 'full'")
    return full[-1]


def topk_readers(s: Settings, layer: int) -> list[int]:
    """glm_moe_dsa: the later shared layers that read ``layer``'s own selection (its top-k
    then an output of the export, topk_indices)."""
    kinds = s.get("indexer_types") or []
    return [i for i in range(layer + 1, len(kinds)) if kinds[i] == "shared"
            and topk_source(s, i) == layer]


def sparse_fields(index_rope: str) -> Fields:
    """DeepSeek Sparse Attention: V3's MLA (pairs in, halves out, always) with the lightning
    indexer's settings (kinds/dsa/); glm_moe_dsa's layers that reuse an earlier layer's top-k
    (indexer_types "shared") name it (the index's source: their input topk_indices), and the layer
    they read outputs its selection (the index feeds: its output topk_indices)."""
    def fields(s: Settings, layer: int) -> dict:
        source = topk_source(s, layer)
        out = latent_fields(lambda s: "deinterleaving")(s, layer)
        out["latent"]["index"] = {"topk": s["index_topk"], "heads": s["index_n_heads"],
                                  "head_dim": s["index_head_dim"], "rope": index_rope,
                                  **({} if source is None else {"source": source}),
                                  **({"feeds": True} if topk_readers(s, layer) else {})}
        return out
    return fields


SPARSE_DEFAULTS = {**LATENT_DEFAULTS, "index_topk": 2048, "index_head_dim": 128}
RECORDS += (
    Family("deepseek_v32", "latent", ATTN, LATENT_TENSORS,
           {**SPARSE_DEFAULTS, "index_n_heads": 64, "max_position_embeddings": 163840},
           sparse_fields("half"),
           summary="DeepSeek Sparse Attention: deepseek_v3's MLA (rope pairs in, halves out) "
                   "and the lightning indexer: index_topk, index_n_heads, index_head_dim, its "
                   "rope on halves"),
    Family("glm_moe_dsa", "latent", ATTN, LATENT_TENSORS,
           {**SPARSE_DEFAULTS, "index_n_heads": 32, "q_lora_rank": 2048,
            "qk_nope_head_dim": 192, "v_head_dim": 256, "max_position_embeddings": 202752},
           sparse_fields("deinterleaving"),
           summary="as deepseek_v32, the indexer's rope on pairs (written as halves); "
                   "indexer_types 'shared' layers take the nearest earlier 'full' layer's "
                   "top-k as the input topk_indices, the 'full' layer they read outputs "
                   "its own (topk_indices)"),
)


# GGUF (llama.cpp's files) ----------------------------------------------------------------------
# llama.cpp's converter (DeepseekV2Model, and GlmMoeDsaModel after it) writes MLA as multi-query
# attention over the latent: key_length kv_lora_rank + rope, value_length kv_lora_rank, the heads'
# own widths as key_length_mla / value_length_mla, and kv_b_proj split per head into k_b
# (transposed: [N, R, Hn]) and v_b ([N, Hv, R]); every other tensor as the checkpoint holds it.

def latent_shape(f: Metadata, layer: int) -> dict:
    """MLA's heads (the file's head_count_kv 1 is its multi-query form, not the layer's)."""
    heads = f.require("attention.head_count", layer)
    return {"num_attention_heads": heads, "num_key_value_heads": heads}


def latent_gguf(f: Metadata, layer: int) -> dict:
    """The latent widths; rope_interleave: llama.cpp rotates adjacent pairs (pairs in; the
    halves out are the same attention)."""
    rope = f.require("rope.dimension_count")
    return {"q_lora_rank": f.arch_value("attention.q_lora_rank"),
            "kv_lora_rank": f.require("attention.kv_lora_rank"), "qk_rope_head_dim": rope,
            "qk_nope_head_dim": f.require("attention.key_length_mla") - rope,
            "v_head_dim": f.require("attention.value_length_mla"), "rope_interleave": True}


def sparse_gguf(f: Metadata, layer: int) -> dict:
    """glm-dsa: the indexer's settings; a layer without indexer tensors reuses an earlier
    layer's top-k (transformers' indexer_types "shared", which the file does not name: its
    shared layers hold no indexer)."""
    types = ["full" if has(f, i, "indexer.attn_k.weight") else "shared"
             for i in range(f.require("block_count"))]
    return {**latent_gguf(f, layer), "index_topk": f.require("attention.indexer.top_k"),
            "index_n_heads": f.require("attention.indexer.head_count"),
            "index_head_dim": f.require("attention.indexer.key_length"), "indexer_types": types}


def yarn_log_multiplier(f: Metadata, generic: RopeScaling) -> Optional[dict]:
    """yarn whose mscale the converter wrote as yarn_log_multiplier = 0.1 * mscale_all_dim (its
    deepseek2 rule); transformers' mscale (not stored) read as equal to mscale_all_dim, as in
    the released checkpoints' configs (their ratio, the rope's attention factor, is then 1)."""
    log_multiplier = f.arch_value("rope.scaling.yarn_log_multiplier")
    if f.arch_value("rope.scaling.type") != "yarn" or log_multiplier is None:
        return generic(f)
    mscale = round(log_multiplier / 0.1, 6)  # as written: float32 (~7 digits)
    return {"rope_type": "yarn", "factor": f.require("rope.scaling.factor"),
            "mscale": mscale, "mscale_all_dim": mscale, **present(
                beta_fast=f.arch_value("rope.scaling.yarn_beta_fast"),
                beta_slow=f.arch_value("rope.scaling.yarn_beta_slow"))}


def joined_kv_b(fields: dict, tensors: dict) -> dict:
    """kv_b_proj [N * (Hn + Hv), R] from the file's k_b [N, R, Hn] and v_b [N, Hv, R]."""
    out = dict(tensors)
    k_b, v_b = out.pop("k_b_proj.weight"), out.pop("v_b_proj.weight")
    heads, rank, nope = k_b.shape
    joined = v_b.new_empty((heads, nope + v_b.shape[1], rank))  # (N, Hn + Hv, R)
    joined[:, :nope] = k_b.transpose(1, 2)
    joined[:, nope:] = v_b
    out["kv_b_proj.weight"] = joined.reshape(-1, rank)
    return out


GGUF_LATENT_TENSORS = {**{n: n for n in LATENT_TENSORS if n != "kv_b_proj"},
                       "k_b_proj": "k_b_proj", "v_b_proj": "v_b_proj"}
GGUF = {
    "deepseek2": GGUFArch("deepseek_v3", extra=latent_gguf, shape=latent_shape,
                          tensors=GGUF_LATENT_TENSORS, convert=joined_kv_b,
                          rope=yarn_log_multiplier),
    "glm-dsa": GGUFArch("glm_moe_dsa", extra=sparse_gguf, shape=latent_shape,
                        tensors=GGUF_LATENT_TENSORS, convert=joined_kv_b,
                        rope=yarn_log_multiplier),
}
GGUF_REFUSED = {
    "kimi-linear": ("its KDA linear-attention layers and NoPE MLA layers are not read from "
                    "GGUF" + FROM_HF),
}
