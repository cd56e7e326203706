"""Layers of real Hugging Face checkpoints against transformers' own attention modules.

transformers is a test-only dependency: tiny random configs are built here and saved with
save_pretrained (nothing is downloaded). Each layer is exported with --weights FOLDER --layer N
and must equal the attention module inside the transformers model — full sequences of a
left-padded batch, and cached decoding (prefill + single-token steps with the model's own cache).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

from hf_decode import capture, decode
from mha_export import UsageError, export_onnx, export_torchscript
from mha_export.address import parse_address, split_address
from mha_export.artifact import read_artifact
from mha_export.check.runners.ort import OrtRunner
from mha_export.comparison.torch_runners import TorchScriptRunner
from mha_export.comparison.runner import positions
from mha_export.weights.families import FAMILIES, Settings, supported_types
from mha_export.weights.huggingface import _layer_pattern

COMMON = dict(num_hidden_layers=3, intermediate_size=32, vocab_size=60,
              max_position_embeddings=64)
# The newer model types: 4 layers (full and sliding ones), weights 10x transformers' init so that
# softcapping, sinks and norms move the result.
NEW = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=4,
           intermediate_size=32, vocab_size=60, max_position_embeddings=64, initializer_range=0.2)
LINEAR = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
              linear_value_head_dim=8, layer_types=["linear_attention", "full_attention"] * 2)
GEMMA = dict(NEW, head_dim=16, query_pre_attn_scalar=20, sliding_window=4)
TOKENS = dict(boi_token_index=61, eoi_token_index=62, image_token_index=63)  # ids are < 60
SIGLIP = dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
              image_size=16, patch_size=8)
QWEN_VISION = dict(depth=1, hidden_size=16, num_heads=2, intermediate_size=16,
                   out_hidden_size=64, num_position_embeddings=16)
# Multi-head Latent Attention (DeepSeek-V2/V3): experts on every layer after the first
MLA = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=2,
           intermediate_size=32, vocab_size=60, max_position_embeddings=64, initializer_range=0.2,
           kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=24,
           n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
           moe_intermediate_size=16, first_k_dense_replace=1)
DSA = dict(index_topk=4, index_n_heads=8, index_head_dim=16)
MLA_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 0.9,
            "mscale_all_dim": 0.8, "original_max_position_embeddings": 16}
# LongCat-Flash: two MLA modules a layer (self_attn.0, .1), yarn's mscale, every bias
LONGCAT = dict({k: v for k, v in MLA.items() if k not in (
    "num_hidden_layers", "intermediate_size", "num_experts_per_tok", "n_group", "topk_group",
    "moe_intermediate_size", "first_k_dense_replace")}, num_layers=2, q_lora_rank=48, head_dim=8,
    ffn_hidden_size=32, expert_ffn_hidden_size=16, zero_expert_num=2, moe_topk=2,
    attention_bias=True, rope_parameters=MLA_YARN)
LONGROPE = {"type": "longrope", "short_factor": [1.0, 1.3, 2.1, 3.7],
            "long_factor": [1.5, 2.5, 4.0, 9.0]}  # rotary_dim / 2 = 4 entries


class Spec(NamedTuple):
    kind: str  # model_type
    config: dict  # AutoConfig.for_model kwargs
    layers: tuple  # the layers exported and compared (addresses: 1, or "1.0" for LongCat)
    multimodal: bool = False  # built as ...ForConditionalGeneration (text_config nested)
    attn: str = "eager"  # transformers' attention implementation compared against


MODELS = {
    "gpt2": Spec("gpt2", dict(n_embd=64, n_head=4, n_layer=3, vocab_size=60, n_positions=64),
                 (1,)),
    "llama": Spec("llama", dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                **COMMON), (1,)),
    "llama-mqa-llama3": Spec("llama", dict(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=1, attention_bias=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8}, **COMMON), (1,)),
    "mistral": Spec("mistral", dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                    sliding_window=4, **COMMON), (1,)),  # < the sequences below
    "qwen2": Spec("qwen2", dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                **COMMON), (1,)),
    "gpt_neox": Spec("gpt_neox", dict(hidden_size=64, num_attention_heads=4, rotary_pct=0.25,
                                      **COMMON), (1,)),
    # explicit head_dim 32 (not 64 / 4); layers 2, 3 slide (max_window_layers 2)
    "qwen3": Spec("qwen3", dict(NEW, head_dim=32, use_sliding_window=True, sliding_window=4,
                                max_window_layers=2), (1, 3)),
    "qwen3_moe": Spec("qwen3_moe", dict(NEW, head_dim=32, num_experts=4, num_experts_per_tok=2,
                                        moe_intermediate_size=16, use_sliding_window=True,
                                        sliding_window=4), (1,)),
    "qwen3_5_text": Spec("qwen3_5_text", dict(NEW, head_dim=16, attention_bias=True, **LINEAR),
                         (1,)),
    "qwen3_5": Spec("qwen3_5", dict(text_config=dict(NEW, head_dim=16, **LINEAR),
                                    vision_config=QWEN_VISION), (3,), multimodal=True),
    "gemma2": Spec("gemma2", dict(GEMMA, attn_logit_softcapping=5.0), (0, 1)),
    "gemma3_text": Spec("gemma3_text", dict(GEMMA, sliding_window_pattern=2, attention_bias=True),
                        (0, 1)),
    "gemma3": Spec("gemma3", dict(text_config=dict(GEMMA, vocab_size=64, layer_types=[
        "sliding_attention", "full_attention", "full_attention", "sliding_attention"]),
        vision_config=SIGLIP, mm_tokens_per_image=4, **TOKENS), (0, 1), multimodal=True),
    # longrope switches tables past original_max_position_embeddings 8: while decoding
    "phi3": Spec("phi3", dict(NEW, pad_token_id=None, sliding_window=5, partial_rotary_factor=0.5,
                              original_max_position_embeddings=8, rope_scaling=LONGROPE), (1,)),
    "olmo2": Spec("olmo2", dict(NEW, pad_token_id=None), (1,)),
    "granite": Spec("granite", dict(NEW, attention_multiplier=0.3, attention_bias=True), (1,)),
    "starcoder2": Spec("starcoder2", dict(NEW, use_bias=True, sliding_window=4), (1,)),
    "gpt_oss": Spec("gpt_oss", dict(NEW, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                                    sliding_window=4), (0, 1)),
    # layer 3 is NoPE (no_rope_layer_interval 4) and slides (use_sliding_window)
    "smollm3": Spec("smollm3", dict(NEW, pad_token_id=None, use_sliding_window=True,
                                    sliding_window=4), (1, 3)),
    # transformers 5.23's decoders that map onto the layer's features (issue 49)
    "arcee": Spec("arcee", dict(NEW, attention_bias=True), (1,)),
    "mixtral": Spec("mixtral", dict(NEW, num_local_experts=4, num_experts_per_tok=2,
                                sliding_window=4), (1,)),
    "ministral": Spec("ministral", dict(NEW, head_dim=16, sliding_window=4, layer_types=[
        "full_attention", "sliding_attention"] * 2), (0, 1)),
    "seed_oss": Spec("seed_oss", dict(NEW, head_dim=16, attention_bias=True,
                                  attention_out_bias=True), (1,)),
    "solar_open": Spec("solar_open", dict(NEW, head_dim=16, attention_bias=True), (1,)),
    "apertus": Spec("apertus", dict(NEW, attention_bias=True), (1,)),
    "glm4": Spec("glm4", dict(NEW, head_dim=16, pad_token_id=0), (1,)),
    "helium": Spec("helium", dict(NEW, head_dim=16, attention_bias=True), (1,)),
    "ernie4_5": Spec("ernie4_5", dict(NEW, head_dim=16, use_bias=True), (1,)),
    "qwen2_moe": Spec("qwen2_moe", dict(NEW, num_experts=4, num_experts_per_tok=2,
                                    moe_intermediate_size=16, shared_expert_intermediate_size=16,
                                    use_sliding_window=True, sliding_window=4,
                                    max_window_layers=3), (0, 1)),
    "dots1": Spec("dots1", dict(NEW, head_dim=16, n_routed_experts=4, num_experts_per_tok=2,
                            moe_intermediate_size=16, first_k_dense_replace=1, n_group=1,
                            topk_group=1, n_shared_experts=1, sliding_window=4,
                            max_window_layers=2), (1, 3)),
    # layers 4 and 5 attend with layers 2's and 3's keys and values (refused, below)
    "gemma3n_text": Spec("gemma3n_text", dict(
        GEMMA, num_hidden_layers=6, num_kv_shared_layers=2, hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=60, laurel_rank=4, altup_num_inputs=2,
        activation_sparsity_pattern=[0.0] * 6,
        layer_types=["sliding_attention", "full_attention"] * 3, rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1e6}}), (0, 1, 3)),
    # full layers: head_dim 32, one kv head, values from k_proj (attention_k_eq_v), the
    # proportional rope (a quarter of the head's frequencies); layers 4 and 5 KV-shared
    "gemma4_text": Spec("gemma4_text", dict(
        GEMMA, num_hidden_layers=6, num_kv_shared_layers=2, hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=60, global_head_dim=32, num_global_key_value_heads=1,
        attention_k_eq_v=True, layer_types=["sliding_attention", "full_attention"] * 3),
        (0, 1, 3)),
    "vaultgemma": Spec("vaultgemma", dict(GEMMA, attn_logit_softcapping=5.0), (0, 1)),
    "hy_v3": Spec("hy_v3", dict(NEW, head_dim=16, attention_bias=True, num_experts=4,
                                num_experts_per_tok=2, moe_intermediate_size=16), (1,)),
    "internlm3": Spec("internlm3", dict(NEW, head_dim=16, qkv_bias=True, bias=True), (1,)),
    "nemotron": Spec("nemotron", dict(NEW, head_dim=16, attention_bias=True), (1,)),
    "lfm2": Spec("lfm2", dict(NEW, norm_eps=1e-4, layer_types=[
        "conv", "full_attention", "conv", "full_attention"]), (1, 3)),
    "olmo3": Spec("olmo3", dict(NEW, pad_token_id=None, sliding_window=4, rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 500000.0}}), (0, 3)),
    "flex_olmo": Spec("flex_olmo", dict(NEW, pad_token_id=None, num_experts=4,
                                        num_experts_per_tok=2), (1,)),
    "minimax_m2": Spec("minimax_m2", dict(NEW, head_dim=16, rotary_dim=8, num_local_experts=4,
                                          num_experts_per_tok=2), (1,)),
    "glm4_moe": Spec("glm4_moe", dict(NEW, head_dim=16, use_qk_norm=True, attention_bias=True,
                                      pad_token_id=0, n_routed_experts=4, num_experts_per_tok=2,
                                      moe_intermediate_size=16, first_k_dense_replace=1,
                                      n_group=1, topk_group=1), (1,)),
    "ernie4_5_moe": Spec("ernie4_5_moe", dict(NEW, use_bias=True, moe_num_experts=4, moe_k=2,
                                              moe_intermediate_size=16), (1,)),
    "cohere2": Spec("cohere2", dict(NEW, pad_token_id=0, sliding_window=4, attention_bias=True),
                    (0, 3)),
    "exaone4": Spec("exaone4", dict(NEW, sliding_window=4, sliding_window_pattern=4), (0, 3)),
    "afmoe": Spec("afmoe", dict(NEW, head_dim=16, sliding_window=4, num_experts=4,
                                num_experts_per_tok=2, moe_intermediate_size=16,
                                num_dense_layers=1, global_attn_every_n_layers=2), (0, 1)),
    "phi": Spec("phi", dict(NEW, qk_layernorm=True, pad_token_id=None), (1,)),
    "phi-plain": Spec("phi", dict(NEW, pad_token_id=None, partial_rotary_factor=0.25), (1,)),
    "stablelm": Spec("stablelm", dict(NEW, qk_layernorm=True, use_qkv_bias=True), (1,)),
    "cohere": Spec("cohere", dict(NEW, use_qk_norm=True, attention_bias=True, pad_token_id=0),
                   (1,)),
    "hunyuan_v1_dense": Spec("hunyuan_v1_dense", dict(NEW, head_dim=16, attention_bias=True,
                                                      rope_parameters={
        "rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0, "rope_theta": 10000.0}), (1,)),
    "hunyuan_v1_moe": Spec("hunyuan_v1_moe", dict(NEW, head_dim=16, num_experts=4, moe_topk=2),
                           (1,)),
    "bitnet": Spec("bitnet", dict(NEW, pad_token_id=None, bos_token_id=None, eos_token_id=None),
                   (1,)),
    "ministral3": Spec("ministral3", dict(NEW, head_dim=16, sliding_window=5, rope_parameters={
        "rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "beta_fast": 32.0,
        "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.5,
        "original_max_position_embeddings": 4}), (1,)),
    "phimoe": Spec("phimoe", dict(NEW, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                                  sliding_window=6, attention_bias=True, rope_parameters={
        "rope_type": "longrope", "rope_theta": 10000.0, "short_mscale": 1.1, "long_mscale": 1.3,
        "short_factor": [1.0, 1.3, 2.1, 3.7, 4.0, 5.0, 6.0, 7.0],
        "long_factor": [1.5, 2.5, 4.0, 9.0, 10.0, 11.0, 12.0, 13.0],
        "original_max_position_embeddings": 8}), (1,)),
    "granitemoe": Spec("granitemoe", dict(NEW, attention_multiplier=0.3, num_local_experts=4,
                                          num_experts_per_tok=2), (1,)),
    "granitemoeshared": Spec("granitemoeshared", dict(
        NEW, attention_multiplier=0.3, num_local_experts=4, num_experts_per_tok=2,
        shared_intermediate_size=16), (1,)),
    "olmoe": Spec("olmoe", dict(NEW, clip_qkv=0.3, num_experts=4, num_experts_per_tok=2,
                                pad_token_id=None), (1,)),
    "olmo": Spec("olmo", dict(NEW, clip_qkv=0.3, attention_bias=True, pad_token_id=None), (1,)),
    "dbrx": Spec("dbrx", dict(d_model=64, n_heads=4, n_layers=3, max_seq_len=64, vocab_size=60,
                              initializer_range=0.2, attn_config={
                                  "kv_n_heads": 2, "clip_qkv": 0.3, "rope_theta": 5e5},
                              rope_theta=20000.0,  # transformers 5.23 reads this one
                              ffn_config={"ffn_hidden_size": 32, "moe_num_experts": 4,
                                          "moe_top_k": 2}), (1,)),
    "gemma": Spec("gemma", dict(NEW, head_dim=16), (1,)),
    # ALiBi: BLOOM (6 heads: the slopes beyond the largest power of two), MPT (6 heads, its
    # own slopes, a clamp), Falcon's ALiBi (against SDPA: transformers 5.23's eager Falcon adds
    # the biases twice, once in the mask and once to the scores)
    "bloom": Spec("bloom", dict(hidden_size=96, n_head=6, n_layer=2, vocab_size=60,
                                initializer_range=0.2), (1,)),
    "mpt": Spec("mpt", dict(d_model=96, n_heads=6, n_layers=2, max_seq_len=64, vocab_size=60,
                            expansion_ratio=1, initializer_range=0.2,
                            attn_config={"clip_qkv": 0.5}), (1,)),
    "falcon-alibi": Spec("falcon", dict(NEW, num_attention_heads=4, multi_query=False,
                                        alibi=True, bias=True, num_hidden_layers=3), (1,),
                         attn="sdpa"),
    # layer 0 full (kv heads 2), layer 1 sliding (kv heads 4, sinks; window 4); values 8 wide
    # against keys of 24 (rotary 8 of them), scaled by 0.6
    "mimo_v2_flash": Spec("mimo_v2_flash", dict(
        NEW, head_dim=24, v_head_dim=8, sliding_window=4, attention_value_scale=0.6,
        n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        attention_bias=True), (0, 1)),
    # layers 0-2 rotate in pairs and attend in chunks of 4 (crossed by the 11 tokens and the
    # left padding: chunks count from a row's first token); layer 3 is NoPE with temperature
    # tuning by cache slot (floor_scale 2: the scale moves every second slot)
    "llama4_text": Spec("llama4_text", dict(NEW, head_dim=16, attention_chunk_size=4,
                                            floor_scale=2, attn_scale=0.5, num_local_experts=2,
                                            intermediate_size_mlp=32), (1, 3)),
    "gptj": Spec("gptj", dict(n_embd=64, n_head=4, n_layer=3, rotary_dim=8, vocab_size=60,
                              n_positions=64, initializer_range=0.2), (1,)),
    "gpt_neo": Spec("gpt_neo", dict(hidden_size=64, num_heads=4, num_layers=2, window_size=4,
                                    attention_types=[[["global", "local"], 1]], vocab_size=60,
                                    max_position_embeddings=64, initializer_range=0.2), (0, 1)),
    "opt": Spec("opt", dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=3,
                            ffn_dim=32, vocab_size=60, max_position_embeddings=64,
                            word_embed_proj_dim=64, init_std=0.2), (1,)),
    "gpt_bigcode": Spec("gpt_bigcode", dict(n_embd=64, n_head=4, n_layer=3, vocab_size=60,
                                            n_positions=64, initializer_range=0.2), (1,)),
    "gpt_bigcode-mha": Spec("gpt_bigcode", dict(n_embd=64, n_head=4, n_layer=3, vocab_size=60,
                                                n_positions=64, multi_query=False), (1,)),
    "falcon": Spec("falcon", dict(NEW, num_attention_heads=4, multi_query=True, bias=True,
                                  num_hidden_layers=3), (1,)),
    "falcon-new": Spec("falcon", dict(NEW, num_attention_heads=4, num_kv_heads=2,
                                      new_decoder_architecture=True, num_hidden_layers=3),
                       (1,)),
    "falcon-mha": Spec("falcon", dict(NEW, num_attention_heads=4, multi_query=False,
                                      num_hidden_layers=3), (1,)),
    "persimmon": Spec("persimmon", dict(NEW, num_key_value_heads=None), (1,)),
    "qwen3_next": Spec("qwen3_next", dict(NEW, head_dim=16, num_experts=4, num_experts_per_tok=2,
                                          moe_intermediate_size=16,
                                          shared_expert_intermediate_size=16, **LINEAR), (1, 3)),
    # V2 without q LoRA (V2-Lite), its complex-number rope; V3 with q LoRA, rope_interleave and
    # yarn's mscale; V3 rotating halves, with biases
    "deepseek_v2": Spec("deepseek_v2", dict(MLA, q_lora_rank=None), (1,)),
    "deepseek_v3": Spec("deepseek_v3", dict(MLA, q_lora_rank=48, rope_interleave=True,
                                            rope_parameters=MLA_YARN), (1,)),
    "glm4_moe_lite": Spec("glm4_moe_lite", dict(MLA, q_lora_rank=48), (1,)),
    "youtu": Spec("youtu", dict(MLA, q_lora_rank=48), (1,)),
    "kimi_linear": Spec("kimi_linear", dict(
        MLA, num_hidden_layers=3, q_lora_rank=None, layer_types=[
            "linear_attention", "full_attention", "linear_attention"], linear_head_dim=8,
        linear_num_heads=4, num_local_experts=4, moe_intermediate_size=16, pad_token_id=0,
        bos_token_id=None, eos_token_id=None), (1,)),
    "deepseek_v3-halves-bias": Spec("deepseek_v3", dict(
        MLA, q_lora_rank=48, rope_interleave=False, attention_bias=True), (0,)),
    # DeepSeek Sparse Attention: each query keeps its top 4 keys (B, L = 3, 11: it acts)
    "deepseek_v32": Spec("deepseek_v32", dict(MLA, q_lora_rank=48, **DSA), (1,)),
    "glm_moe_dsa": Spec("glm_moe_dsa", dict(MLA, q_lora_rank=48, **DSA), (1,)),
    "longcat_flash": Spec("longcat_flash", LONGCAT, ("0.1", "1.0")),
}
CASES = [f"{name}@{layer}" for name, spec in MODELS.items() for layer in spec.layers]
# onnx: the default form; onnx-standard: a standard-ops one (decomposed; MLA: latent-expanded,
# the default's other core, since its short calls run the absorbed one)
FORMATS = ["onnx", "onnx-standard", "torchscript"]
B, L, PREFILL = 3, 11, 6


def _attention(model, kind: str, layer):
    if isinstance(layer, str):  # "L.M": module M of layer L (LongCat-Flash's self_attn.M)
        index, module = split_address(layer)
        return model.model.layers[index].self_attn[module]
    if kind == "dbrx":
        return model.transformer.blocks[layer].norm_attn_norm.attn
    if kind == "mpt":
        return model.transformer.blocks[layer].attn
    if hasattr(model, "transformer"):  # gpt2, gptj, gpt_neo (its wrapper), gpt_bigcode, falcon
        block = model.transformer.h[layer]
        return getattr(block, "attn", None) or block.self_attention
    if kind == "gpt_neox":
        return model.gpt_neox.layers[layer].attention
    decoder = getattr(model.model, "decoder", None)  # OPT
    if decoder is not None:
        return decoder.layers[layer].self_attn
    return getattr(model.model, "language_model", model.model).layers[layer].self_attn


def _build(name: str):
    """The tiny model, its attention's norm weights, sinks and biases randomised (their initial
    values hide bugs: Gemma's norm weights start at 0, so (1 + w) read as w would pass)."""
    spec = MODELS[name]
    torch.manual_seed(0)
    auto = AutoModelForImageTextToText if spec.multimodal else AutoModelForCausalLM
    model = auto.from_config(AutoConfig.for_model(spec.kind, **spec.config),
                             attn_implementation=spec.attn).eval()
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for key, p in model.named_parameters():
            if re.search(r"\.(self_attn|attention|attn)\..*(norms?(\.\d+)?\.weight|sinks|bias)$",
                         key):
                p.add_(torch.randn(p.shape, generator=g) * 0.5)
    return model


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            model = _build(name)
            folder = tmp_path_factory.mktemp(name) / "ckpt"
            model.save_pretrained(folder)
            cache[name] = model, folder
        return cache[name]
    return get


@pytest.fixture(params=CASES)
def checkpoint(request, built):
    name, layer = request.param.split("@")
    model, folder = built(name)
    return name, MODELS[name].kind, model, folder, parse_address(layer)


def _capture(model, kind, layer):
    """Hooks recording every call's (input hidden states, attention output) of the layer."""
    return capture(_attention(model, kind, layer), residual=kind == "bloom")


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 60, (B, L), generator=g)
    mask = torch.ones(B, L, dtype=torch.long)
    mask[1, :3] = 0
    mask[2, :7] = 0  # left padding, longer than the windows before the real tokens
    return ids, mask, torch.from_numpy(positions(mask.numpy()))


def _feeds(sig, **arrays):
    return {k: v for k, v in arrays.items() if k in sig.input_names}


def _close(got, want, rows, what):
    diff = np.abs(got - want)[rows]
    assert np.isfinite(got).all() and diff.max() <= 2e-5, (what, float(diff.max()))


def _export(fmt, folder, layer, output, **options):
    """(artifact, runner) of the layer in fmt: onnx (its default form), onnx-standard,
    torchscript."""
    if fmt == "torchscript":
        art = export_torchscript(weights=folder, layer=layer, output=output, validate=False,
                                 **options).path
        sig = read_artifact(art).signature
        return art, TorchScriptRunner(sig, art / "model.pt")
    form = None
    if fmt == "onnx-standard":
        model_type = json.loads((Path(folder) / "config.json").read_text())["model_type"]
        form = "latent-expanded" if FAMILIES[model_type].layout == "latent" else "decomposed"
    art = export_onnx(weights=folder, layer=layer, output=output, validate=False,
                      attention=form, **options).path
    return art, OrtRunner(read_artifact(art).signature, art / "model.onnx")


@pytest.mark.parametrize("fmt", FORMATS)
def test_full_sequence_layer_equals_transformers(checkpoint, fmt, tmp_path):
    name, kind, model, folder, layer = checkpoint
    ids, mask, pos = _batch()
    calls, handle = _capture(model, kind, layer)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=pos)
    handle.remove()
    art, runner = _export(fmt, folder, layer, tmp_path / "a", attention_mask=True)
    sig = read_artifact(art).signature
    x, want = calls[0]
    got = runner.run(_feeds(sig, x=x, attention_mask=mask.numpy(), position_ids=pos.numpy()))
    _close(got["y"], want, mask.numpy().astype(bool), f"{name}@{layer} {fmt}")


def _decode_in_transformers(model, kind, layer, ids, mask, pos):
    """Prefill PREFILL tokens, then single-token steps with the model's own cache: the layer's
    calls and the final cache."""
    attn = _attention(model, kind, layer)
    calls, cache = decode(model, attn, ids, mask, pos, PREFILL, residual=kind == "bloom")
    # LongCat's module L.M caches at transformers' layer_idx 2L + M
    return calls, cache.layers[layer if isinstance(layer, int) else attn.layer_idx]


@pytest.mark.parametrize("fmt", FORMATS)
def test_cached_decode_equals_transformers_with_its_own_cache(checkpoint, fmt, tmp_path):
    """Prefill, then single-token steps, in transformers (its DynamicCache) and in the exported
    decode model (our present -> past), on a left-padded batch: y at every real position and
    the final cache (a sliding or chunked layer's: the last entries transformers keeps)."""
    name, kind, model, folder, layer = checkpoint
    ids, mask, pos = _batch()
    calls, theirs = _decode_in_transformers(model, kind, layer, ids, mask, pos)
    art, runner = _export(fmt, folder, layer, tmp_path / "kv", kv_cache=True)
    artifact = read_artifact(art)
    sig, c = artifact.signature, artifact.config
    present = {f"present_{n}": np.zeros(sig.cache_buffer(f"past_{n}", B, 0), np.float32)
               for n in ("key", "value")}
    start = 0
    for x, want in calls:
        end = start + x.shape[1]
        present = runner.run(_feeds(sig, x=x, attention_mask=mask[:, :end].numpy(),
                                    past_key=present["present_key"],
                                    past_value=present["present_value"],
                                    position_ids=pos[:, start:end].numpy()))
        rows = mask[:, start:end].numpy().astype(bool)
        _close(present["y"], want, rows, f"{name}@{layer} {fmt} tokens {start}-{end}")
        start = end
    assert start == L
    kept = theirs.keys.shape[2]
    # transformers keeps the last window - 1 (or chunk - 1) entries of a sliding (or chunked)
    # layer; GPT-Neo's local layers keep every entry
    reach = None if kind == "gpt_neo" else c.sliding_window or c.attention_chunk
    assert kept == (min(L, reach - 1) if reach else L), kept
    real = mask.numpy().astype(bool)[:, L - kept:]
    pairs = [(present["present_key"], theirs.keys), (present["present_value"], theirs.values)]
    if getattr(theirs, "indexer_keys", None) is not None:  # DSA: values [k_rot | index key]
        pairs.append((present["present_value"][..., theirs.values.shape[-1]:],
                      theirs.indexer_keys[:, None]))
    for ours, cached in pairs:
        # Falcon's new architecture caches each key head broadcast to its query heads
        ours = np.repeat(ours, cached.shape[1] // ours.shape[1], axis=1)[..., :cached.shape[-1]]
        diff = np.abs(ours[:, :, L - kept:] - cached.numpy()).transpose(0, 2, 1, 3)[real]
        assert diff.max() <= 2e-5, (name, "present vs transformers' cache", float(diff.max()))


# What config.json must give each case: (heads, kv_heads, head_dim, sliding_window, rotary,
# rotary_dim) and the options of the newer types.
EXPECT = {
    "gpt2@1": ((4, 4, 16, None, "none", None), {}),
    "llama@1": ((4, 2, 16, None, "half", 16), {}),
    "llama-mqa-llama3@1": ((4, 1, 16, None, "half", 16), dict(qkv_bias=True, out_bias=True)),
    "mistral@1": ((4, 2, 16, 4, "half", 16), {}),
    "qwen2@1": ((4, 2, 16, None, "half", 16), dict(qkv_bias=True, out_bias=False)),
    "gpt_neox@1": ((4, 4, 16, None, "half", 4), {}),  # rotary_pct 0.25
    "qwen3@1": ((4, 2, 32, None, "half", 32), dict(qk_norm="head", norm_offset=0.0)),
    "qwen3@3": ((4, 2, 32, 4, "half", 32), dict(qk_norm="head", qk_norm_eps=1e-6)),
    "qwen3_moe@1": ((4, 2, 32, 4, "half", 32), dict(qk_norm="head", norm_offset=0.0)),
    "qwen3_5_text@1": ((4, 2, 16, None, "half", 4), dict(
        qk_norm="head", norm_offset=1.0, output_gate=True, qkv_bias=True, out_bias=True)),
    "qwen3_5@3": ((4, 2, 16, None, "half", 4), dict(qk_norm="head", norm_offset=1.0,
                                                    output_gate=True, qkv_bias=False)),
    "gemma2@0": ((4, 2, 16, 4, "half", 16), dict(softmax_scale=20 ** -0.5, softcap=5.0)),
    "gemma2@1": ((4, 2, 16, None, "half", 16), dict(softmax_scale=20 ** -0.5, softcap=5.0)),
    "gemma3_text@0": ((4, 2, 16, 4, "half", 16), dict(
        rope_theta=10000.0, qk_norm="head", norm_offset=1.0, softcap=None, qkv_bias=True)),
    "gemma3_text@1": ((4, 2, 16, None, "half", 16), dict(rope_theta=1e6, softmax_scale=20 ** -0.5)),
    "gemma3@0": ((4, 2, 16, 4, "half", 16), dict(rope_theta=10000.0)),
    "gemma3@1": ((4, 2, 16, None, "half", 16), dict(rope_theta=1e6, norm_offset=1.0)),
    "phi3@1": ((4, 2, 16, 5, "half", 8), dict(qkv_bias=False, out_bias=False)),
    "olmo2@1": ((4, 2, 16, None, "half", 16), dict(qk_norm="full", qk_norm_eps=1e-5)),
    "granite@1": ((4, 2, 16, None, "half", 16), dict(softmax_scale=0.3, qkv_bias=True)),
    "starcoder2@1": ((4, 2, 16, 4, "half", 16), dict(qkv_bias=True, out_bias=True)),
    "gpt_oss@0": ((4, 2, 16, 4, "half", 16), dict(sinks=True, qkv_bias=True, rope_theta=150000.0)),
    "gpt_oss@1": ((4, 2, 16, None, "half", 16), dict(sinks=True, out_bias=True)),
    "smollm3@1": ((4, 2, 16, None, "half", 16), dict(rope_theta=2e6)),
    "smollm3@3": ((4, 2, 16, 4, "none", None), {}),  # NoPE
    "arcee@1": ((4, 2, 16, None, "half", 16), dict(qkv_bias=True, out_bias=True)),
    "mixtral@1": ((4, 2, 16, 4, "half", 16), dict(qkv_bias=False)),
    "ministral@0": ((4, 2, 16, None, "half", 16), {}),
    "ministral@1": ((4, 2, 16, 4, "half", 16), {}),
    "seed_oss@1": ((4, 2, 16, None, "half", 16), dict(qkv_bias=True, out_bias=True)),
    "solar_open@1": ((4, 2, 16, None, "half", 16), dict(qkv_bias=True, out_bias=False)),
    "apertus@1": ((4, 2, 16, None, "half", 16), dict(qk_norm="head", qkv_bias=True)),
    "glm4@1": ((4, 2, 16, None, "interleaved", 8), dict(qkv_bias=True, out_bias=False)),
    "helium@1": ((4, 2, 16, None, "interleaved", 16), dict(qkv_bias=True, out_bias=False)),
    "ernie4_5@1": ((4, 2, 16, None, "interleaved", 16), dict(qkv_bias=True, out_bias=True)),
    "qwen2_moe@0": ((4, 2, 16, 4, "half", 16), dict(qkv_bias=True, out_bias=False)),
    "qwen2_moe@1": ((4, 2, 16, None, "half", 16), {}),
    "dots1@1": ((4, 2, 16, None, "half", 16), dict(qk_norm="head")),
    "dots1@3": ((4, 2, 16, 4, "half", 16), dict(qk_norm="head")),
    "gemma3n_text@0": ((4, 2, 16, 4, "half", 16), dict(softmax_scale=1.0, norm_offset=0.0,
                                                       v_norm_eps=1e-6, rope_theta=10000.0)),
    "gemma3n_text@1": ((4, 2, 16, None, "half", 16), dict(qk_norm="head", rope_theta=1e6)),
    "gemma3n_text@3": ((4, 2, 16, None, "half", 16), dict(v_norm_eps=1e-6)),
    "gemma4_text@0": ((4, 2, 16, 4, "half", 16), dict(softmax_scale=1.0, v_norm_eps=1e-6,
                                                      rope_theta=10000.0)),
    "gemma4_text@1": ((4, 1, 32, None, "half", 32), dict(rope_theta=1e6, v_norm_eps=1e-6)),
    "gemma4_text@3": ((4, 1, 32, None, "half", 32), dict(qk_norm="head", norm_offset=0.0)),
    "vaultgemma@0": ((4, 2, 16, 4, "half", 16), dict(softmax_scale=20 ** -0.5, softcap=5.0)),
    "vaultgemma@1": ((4, 2, 16, None, "half", 16), dict(softcap=5.0)),
    "hy_v3@1": ((4, 2, 16, None, "half", 16), dict(qk_norm="head", qkv_bias=True, out_bias=True)),
    "internlm3@1": ((4, 2, 16, None, "half", 16), dict(qkv_bias=True, out_bias=True)),
    "nemotron@1": ((4, 2, 16, None, "half", 8), dict(qkv_bias=True, out_bias=True)),
    "lfm2@1": ((4, 2, 16, None, "half", 16), dict(qk_norm="head", qk_norm_eps=1e-4)),
    "lfm2@3": ((4, 2, 16, None, "half", 16), dict(rope_theta=1e6, out_bias=False)),
    "olmo3@0": ((4, 2, 16, 4, "half", 16), dict(qk_norm="full", rope_theta=10000.0)),
    "olmo3@3": ((4, 2, 16, None, "half", 16), dict(qk_norm="full", rope_theta=500000.0)),
    "flex_olmo@1": ((4, 2, 16, None, "half", 16), dict(qk_norm="full", qk_norm_eps=1e-6)),
    "minimax_m2@1": ((4, 2, 16, None, "half", 8), dict(qk_norm="full", qkv_bias=False)),
    "glm4_moe@1": ((4, 2, 16, None, "half", 8), dict(qk_norm="head", qkv_bias=True,
                                                     out_bias=False)),
    "ernie4_5_moe@1": ((4, 2, 16, None, "interleaved", 16), dict(qkv_bias=True, out_bias=True)),
    "cohere2@0": ((4, 2, 16, 4, "interleaved", 16), dict(qkv_bias=True, out_bias=True)),
    "cohere2@3": ((4, 2, 16, None, "none", None), {}),  # a NoPE full layer
    "exaone4@0": ((4, 2, 16, 4, "half", 16), dict(qk_norm="head", qkv_bias=False)),
    "exaone4@3": ((4, 2, 16, None, "none", None), dict(qk_norm="head")),
    "afmoe@0": ((4, 2, 16, 4, "half", 16), dict(qk_norm="head", output_gate=True)),
    "afmoe@1": ((4, 2, 16, None, "none", None), dict(output_gate=True)),
    "phi@1": ((4, 2, 16, None, "half", 8), dict(qk_norm="head", qk_norm_type="layer",
                                                qk_norm_bias=True, qk_norm_per_head=False)),
    "phi-plain@1": ((4, 2, 16, None, "half", 4), dict(qk_norm="none", out_bias=True)),
    "stablelm@1": ((4, 2, 16, None, "half", 4), dict(qk_norm_type="layer", qk_norm_bias=False,
                                                     qk_norm_per_head=True, qkv_bias=True)),
    "cohere@1": ((4, 2, 16, None, "interleaved", 16), dict(
        qk_norm_type="layer", qk_norm_per_head=True, qkv_bias=True, rope_theta=500000.0)),
    "hunyuan_v1_dense@1": ((4, 2, 16, None, "half", 16), dict(
        qk_norm="head", qk_norm_after_rope=True, rope_theta=10000.0 * 1000.0 ** (16 / 14))),
    "hunyuan_v1_moe@1": ((4, 2, 16, None, "half", 16), dict(qk_norm_after_rope=True)),
    "bitnet@1": ((4, 2, 16, None, "half", 16), dict(out_norm_eps=1e-5, rope_theta=500000.0)),
    "ministral3@1": ((4, 2, 16, 5, "half", 16), dict(query_scale_beta=0.5,
                                                     query_scale_length=4)),
    "phimoe@1": ((4, 2, 16, 6, "half", 16), dict(qkv_bias=True)),
    "llama4_text@1": ((4, 2, 16, None, "interleaved", 16), dict(
        attention_chunk=4, qk_norm="head", qk_norm_weightless=True, qk_norm_after_rope=True,
        qk_norm_eps=1e-5, query_scale_beta=None)),
    "llama4_text@3": ((4, 2, 16, None, "none", None), dict(
        attention_chunk=None, qk_norm="none", query_scale_beta=0.5, query_scale_length=2,
        query_scale_by="slot")),
    "mimo_v2_flash@0": ((4, 2, 24, None, "half", 8), dict(
        v_head_dim=8, value_multiplier=0.6, sinks=False, rope_theta=5e6, qkv_bias=True,
        out_bias=False)),
    "mimo_v2_flash@1": ((4, 4, 24, 4, "half", 8), dict(v_head_dim=8, sinks=True,
                                                       rope_theta=10000.0)),
    "bloom@1": ((6, 6, 16, None, "none", None), dict(alibi=True, qkv_bias=True,
                                                     out_bias=True)),
    "mpt@1": ((6, 6, 16, None, "none", None), dict(alibi=True, qkv_clip=0.5, qkv_bias=False,
                                                   out_bias=False)),
    "falcon-alibi@1": ((4, 4, 16, None, "none", None), dict(alibi=True, qkv_bias=True)),
    "granitemoe@1": ((4, 2, 16, None, "half", 16), dict(softmax_scale=0.3)),
    "granitemoeshared@1": ((4, 2, 16, None, "half", 16), dict(softmax_scale=0.3)),
    "olmoe@1": ((4, 2, 16, None, "half", 16), dict(qk_norm="full", qkv_clip=0.3)),
    "olmo@1": ((4, 2, 16, None, "half", 16), dict(qkv_clip=0.3, qkv_bias=True)),
    "dbrx@1": ((4, 2, 16, None, "half", 16), dict(qkv_clip=0.3, rope_theta=20000.0)),
    "gemma@1": ((4, 2, 16, None, "half", 16), {}),
    "gptj@1": ((4, 4, 16, None, "interleaved", 8), dict(qkv_bias=False, out_bias=False)),
    "gpt_neo@0": ((4, 4, 16, None, "none", None), dict(softmax_scale=1.0, out_bias=True)),
    "gpt_neo@1": ((4, 4, 16, 4, "none", None), dict(softmax_scale=1.0, qkv_bias=False)),
    "opt@1": ((4, 4, 16, None, "none", None), dict(qkv_bias=True, out_bias=True)),
    "gpt_bigcode@1": ((4, 1, 16, None, "none", None), dict(qkv_bias=True)),
    "gpt_bigcode-mha@1": ((4, 4, 16, None, "none", None), dict(out_bias=True)),
    "falcon@1": ((4, 1, 16, None, "half", 16), dict(qkv_bias=True, out_bias=True)),
    "falcon-new@1": ((4, 2, 16, None, "half", 16), dict(qkv_bias=False)),
    "falcon-mha@1": ((4, 4, 16, None, "half", 16), dict(out_bias=False)),
    "persimmon@1": ((4, 4, 16, None, "half", 8), dict(qk_norm_type="layer", qk_norm_bias=True)),
    "qwen3_next@1": ((4, 2, 16, None, "half", 4), dict(qk_norm="head", norm_offset=1.0,
                                                       output_gate=True)),
    "qwen3_next@3": ((4, 2, 16, None, "half", 4), dict(output_gate=True)),
    # MLA: one cache head, head_dim = qk_nope + qk_rope, the rope layout as rotary
    "deepseek_v2@1": ((4, 1, 24, None, "interleaved", 8), dict(qkv_bias=False)),
    "deepseek_v3@1": ((4, 1, 24, None, "deinterleaving", 8), dict(out_bias=False)),
    "glm4_moe_lite@1": ((4, 1, 24, None, "deinterleaving", 8), dict(out_bias=False)),
    "youtu@1": ((4, 1, 24, None, "deinterleaving", 8), dict(out_bias=False)),
    "kimi_linear@1": ((4, 1, 24, None, "unrotated", 8), dict(out_bias=False)),
    "deepseek_v32@1": ((4, 1, 24, None, "deinterleaving", 8), dict(out_bias=False)),
    "glm_moe_dsa@1": ((4, 1, 24, None, "deinterleaving", 8), dict(out_bias=False)),
    "deepseek_v3-halves-bias@0": ((4, 1, 24, None, "half", 8), dict(qkv_bias=True,
                                                                    out_bias=True)),
    "longcat_flash@0.1": ((4, 1, 24, None, "deinterleaving", 8), dict(qkv_bias=True,
                                                                      out_bias=True)),
    "longcat_flash@1.0": ((4, 1, 24, None, "deinterleaving", 8), dict(qkv_bias=True,
                                                                      out_bias=True)),
}


# the rope type each model (or case) reads; the others none
SCALED = {"llama-mqa-llama3": "llama3", "phi3": "longrope", "gpt_oss": "yarn",
          "ministral3": "yarn", "phimoe": "longrope", "deepseek_v3": "yarn", "apertus": "llama3",
          "longcat_flash": "yarn",
          "gemma4_text@1": "proportional", "gemma4_text@3": "proportional"}


def test_config_is_read_from_config_json_in_both_spellings(checkpoint, tmp_path):
    name, _, _, folder, layer = checkpoint
    c = read_artifact(export_onnx(weights=folder, layer=layer, output=tmp_path / "a",
                                  validate=False).path).config
    shape, options = EXPECT[f"{name}@{layer}"]
    assert (c.heads, c.kv_heads, c.head_dim, c.sliding_window, c.rotary, c.rotary_dim) == shape
    assert {k: getattr(c, k) for k in options} == pytest.approx(options)
    scaling = SCALED.get(f"{name}@{layer}", SCALED.get(name))
    assert (c.rope_scaling or {}).get("rope_type") == scaling
    if name == "llama-mqa-llama3":
        assert c.rope_theta == 500000.0


def test_transformers_4x_spellings(tmp_path):
    """rope_theta / rope_scaling / rotary_pct / rotary_emb_base, as 4.x checkpoints write them."""
    model = _plain("gpt_neox")
    model.save_pretrained(tmp_path / "neox")
    cfg = json.loads((tmp_path / "neox" / "config.json").read_text())
    cfg.pop("rope_parameters")
    cfg.update(rotary_pct=0.5, rotary_emb_base=1000.0,
               rope_scaling={"type": "linear", "factor": 2.0})
    (tmp_path / "neox" / "config.json").write_text(json.dumps(cfg))
    c = read_artifact(export_onnx(weights=tmp_path / "neox", layer=0, output=tmp_path / "a",
                                  validate=False).path).config
    assert (c.rotary_dim, c.rope_theta, c.rope_scaling) == (8, 1000.0, {"rope_type": "linear",
                                                                         "factor": 2.0})


# config.json as transformers 4.x wrote it, or with the keys transformers derives left out: the
# layer must still equal transformers' attention (transformers reading the same config.json).
RESPELLED = {
    "gemma3_text@0": dict(rope_parameters=None, rope_theta=5e5, rope_local_base_freq=2e4,
                          rope_scaling={"rope_type": "linear", "factor": 8.0}, layer_types=None),
    "gemma3_text@1": dict(rope_parameters=None, rope_theta=5e5, rope_local_base_freq=2e4,
                          rope_scaling={"rope_type": "linear", "factor": 8.0}, layer_types=None),
    "phi3@1": dict(rope_parameters=None, rope_theta=10000.0, partial_rotary_factor=0.5,
                   rope_scaling=LONGROPE),  # ("su" fails in transformers 5.23 itself)
    "qwen3@3": dict(layer_types=None),  # use_sliding_window + max_window_layers
    "gemma2@0": dict(layer_types=None),  # every 2nd layer full
    "smollm3@3": dict(layer_types=None, no_rope_layers=None),  # every 4th layer NoPE
    "gpt_oss@0": dict(layer_types=None, rope_parameters=None),  # gpt-oss's default yarn
    "qwen3_5_text@3": dict(layer_types=None, full_attention_interval=2),
    "qwen3_next@3": dict(layer_types=None, full_attention_interval=2),
    "internlm3@1": dict(attention_bias=None, mlp_bias=None, qkv_bias=True, bias=True),
    "olmo3@0": dict(rope_parameters=None, rope_theta=2e5, layer_types=None,
                    rope_scaling={"rope_type": "linear", "factor": 4.0}),  # full layers only
    "olmo3@3": dict(rope_parameters=None, rope_theta=2e5, layer_types=None,
                    rope_scaling={"rope_type": "linear", "factor": 4.0}),
    "minimax_m2@1": dict(rope_parameters=None, rope_theta=5e6, rotary_dim=8),  # legacy key
    "cohere2@3": dict(layer_types=None, sliding_window_pattern=2),  # every 2nd layer full
    "exaone4@0": dict(layer_types=None, sliding_window_pattern=2),
    "exaone4@3": dict(sliding_window=None),  # no window: every layer rotates
    "afmoe@1": dict(layer_types=None),  # every global_attn_every_n_layers-th full
    "lfm2@3": dict(layer_types=None, full_attn_idxs=[1, 3]),
    "hunyuan_v1_dense@1": dict(rope_parameters=None, rope_theta=10000.0, rope_scaling={
        "type": "dynamic", "alpha": 1000.0, "factor": 1.0}),  # as the checkpoints write it
    "gpt_neo@1": dict(attention_layers=None),  # attention_types expanded
}


@pytest.mark.parametrize("case", sorted(RESPELLED))
def test_older_spellings_and_derived_keys_equal_transformers(built, case, tmp_path):
    name, layer = case.split("@")
    _, saved = built(name)
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes((saved / "model.safetensors").read_bytes())
    cfg = json.loads((saved / "config.json").read_text())
    for key, value in RESPELLED[case].items():
        cfg.pop(key, None)
        if value is not None:
            cfg[key] = value
    (folder / "config.json").write_text(json.dumps(cfg))
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    ids, mask, pos = _batch()
    calls, handle = _capture(model, MODELS[name].kind, int(layer))
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=pos)
    handle.remove()
    art, runner = _export("onnx", folder, int(layer), tmp_path / "a", attention_mask=True)
    got = runner.run(_feeds(read_artifact(art).signature, x=calls[0][0],
                            attention_mask=mask.numpy(), position_ids=pos.numpy()))
    _close(got["y"], calls[0][1], mask.numpy().astype(bool), case)


def test_sharded_and_bin_checkpoints_read_only_the_layer(tmp_path, monkeypatch):
    model = _plain("llama")
    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    model.save_pretrained(tmp_path / "bin", safe_serialization=False)
    import safetensors
    read = []
    real_open = safetensors.safe_open

    class Counting:
        def __init__(self, *a, **k):
            self.f = real_open(*a, **k)

        def __enter__(self):
            self.f.__enter__()
            return self

        def __exit__(self, *a):
            return self.f.__exit__(*a)

        def keys(self):
            return self.f.keys()

        def get_tensor(self, k):
            read.append(k)
            return self.f.get_tensor(k)

    monkeypatch.setattr(safetensors, "safe_open", Counting)
    a = export_onnx(weights=tmp_path / "sharded", layer=2, output=tmp_path / "a")
    assert a.passed and read and all(".layers.2.self_attn." in k for k in read)
    b = export_onnx(weights=tmp_path / "bin", layer=2, output=tmp_path / "b")
    assert b.passed
    wa = (tmp_path / "a" / "weights.safetensors").read_bytes()
    assert wa == (tmp_path / "b" / "weights.safetensors").read_bytes()


@pytest.mark.parametrize("args, msg", [
    (dict(layer=3), "--layer 3 is out of range: the checkpoint has 3 layers"),
    (dict(layer=None), "pick one with --layer N"),
    (dict(layer=0, heads=8), "--heads 8 contradicts the checkpoint's config.json"),
    (dict(layer=0, rotary="interleaved"), "--rotary interleaved contradicts"),
])
def test_bad_checkpoint_requests_are_clear_errors(tmp_path, args, msg):
    folder = _saved(tmp_path, "llama", "ckpt")
    with pytest.raises(UsageError, match=msg):
        export_onnx(weights=folder, output=tmp_path / "x", validate=False, **args)
    assert not (tmp_path / "x").exists()


def test_unsupported_model_type_lists_the_registry(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(UsageError) as e:
        export_onnx(weights=tmp_path, layer=0, output=tmp_path / "x")
    assert str(e.value).endswith(f"unsupported model type 'bert' (supported: "
                                 f"{', '.join(FAMILIES)})")
    assert supported_types() == ", ".join(FAMILIES)


# the decoder families transformers 5.23 ships that were not read before issue 49 (the survey in
# ../shared/notes/families-transformers-5.23.md): each is read or refused naming what it needs
SURVEYED = (
    "arcee internlm3 mixtral ministral seed_oss solar_open nemotron helium glm4 glm4_moe ernie4_5 "
    "ernie4_5_moe apertus hy_v3 dots1 qwen2_moe qwen3_next olmo3 flex_olmo minimax_m2 exaone4 "
    "cohere2 afmoe lfm2 vaultgemma glm4_moe_lite youtu phi stablelm cohere ministral3 "
    "hunyuan_v1_dense phimoe bitnet dbrx falcon mimo_v2_flash longcat_flash kimi_linear "
    "llama4_text gemma3n_text gemma4_text deepseek_v32 glm_moe_dsa qwen4_exp_text "
    "deepseek_v4").split()


def test_every_surveyed_family_is_read_or_refused_naming_what_it_needs(tmp_path):
    from click.testing import CliRunner

    from mha_export.cli.commands import cli
    from mha_export.weights.families import NOT_YET
    assert not set(NOT_YET) & set(FAMILIES)
    assert set(SURVEYED) <= set(FAMILIES) | set(NOT_YET)
    for kind, needs in NOT_YET.items():
        folder = tmp_path / kind
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": kind}))
        r = CliRunner().invoke(cli, ["onnx", "--weights", str(folder), "--layer", "0", "-o",
                                     str(tmp_path / "x")])
        assert r.exit_code == 2 and not (tmp_path / "x").exists()
        assert r.stderr.splitlines() == [
            f"Error: {folder / 'config.json'}: model type {kind!r} is not read yet: its "
            f"attention needs {needs}"]


def test_readme_names_exactly_the_registrys_model_types():
    """(docs/checkpoints.md's table is generated from the registry: test_docs holds it.)"""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| Hugging Face model"))
    assert re.findall(r"`(\w+)`", row) == list(FAMILIES)


def test_families_is_torch_free():
    code = ("import sys, mha_export.weights.families; "
            "assert not {'torch', 'onnx', 'safetensors'} & set(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_layer_pattern_allows_any_prefix_and_only_that_layer():
    pattern = _layer_pattern(FAMILIES["qwen2"], 1)
    found = pattern.search("language_model.model.layers.1.self_attn.q_proj.bias")
    assert (found["module"], found["part"]) == ("q_proj", "bias")
    assert pattern.search("layers.1.self_attn.o_proj.weight")
    for other in ("model.layers.11.self_attn.q_proj.weight", "model.layers.1.mlp.up_proj.weight",
                  "model.xlayers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.q_proj.w"):
        assert not pattern.search(other), other


@pytest.mark.parametrize("kind, name, found", [
    ("gpt_oss", "model.layers.0.self_attn.sinks", ("sinks", None)),  # a bare parameter
    ("gemma3", "language_model.model.layers.0.self_attn.q_norm.weight", ("q_norm", "weight")),
    ("gemma3", "model.language_model.layers.0.self_attn.q_proj.weight", ("q_proj", "weight")),
    ("gemma3", "vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.weight", None),
    ("gemma3", "model.vision_tower.encoder.layers.0.self_attn.q_proj.weight", None),
    ("qwen3_5", "model.language_model.layers.0.self_attn.q_proj.bias", ("q_proj", "bias")),
    ("qwen3_5", "mtp.layers.0.self_attn.q_proj.weight", None),  # multi-token prediction head
    ("qwen3_5", "model.layers.0.self_attn.q_proj.weight", None),
    ("qwen3_5_text", "model.layers.0.self_attn.k_norm.weight", ("k_norm", "weight")),
    ("qwen3_5_text", "model.language_model.layers.0.self_attn.o_proj.weight", ("o_proj", "weight")),
    ("qwen3_5_text", "mtp.layers.0.self_attn.q_proj.weight", None),
])
def test_multimodal_layers_are_the_language_models_only(kind, name, found):
    """The vision tower and the MTP head have layers.N.self_attn too: never read."""
    match = _layer_pattern(FAMILIES[kind], 0).search(name)
    assert (match and (match["module"], match["part"])) == found or (match is None is found)


def test_either_spelling_of_the_language_model_prefix_reads_the_same_layer(built, tmp_path):
    """Gemma 3: save_pretrained writes 4.x names (language_model.model.layers.N), 5.x loads
    model.language_model.layers.N; a vision tower with layers.0.self_attn sits beside them."""
    from safetensors.torch import load_file, save_file
    _, folder = built("gemma3")
    state = load_file(str(folder / "model.safetensors"))
    assert any(re.match(r"vision_tower\..*layers\.0\.self_attn\.q_proj", k) for k in state)
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    (renamed / "config.json").write_text((folder / "config.json").read_text())
    save_file({re.sub(r"^language_model\.model\.", "model.language_model.", k): v
               for k, v in state.items()}, str(renamed / "model.safetensors"))
    paths = [export_onnx(weights=f, layer=0, output=tmp_path / f"o{i}", validate=False).path
             for i, f in enumerate((folder, renamed))]
    assert len({(p / "weights.safetensors").read_bytes() for p in paths}) == 1


def _assert_wrapper_reads_the_text_model(folder: Path, wrapper_type: str, layer: int,
                                         tmp_path: Path) -> None:
    """The text checkpoint as its multimodal wrapper saves it (text_config, tensors under
    model.language_model.) exports the same layer: the same config and weights."""
    from safetensors.torch import load_file, save_file
    wrapper = tmp_path / "wrapper"
    wrapper.mkdir()
    text_config = json.loads((folder / "config.json").read_text())
    (wrapper / "config.json").write_text(json.dumps({"model_type": wrapper_type,
                                                     "text_config": text_config}))
    save_file({re.sub(r"^model\.", "model.language_model.", k): v for k, v in
               load_file(str(folder / "model.safetensors")).items()},
              str(wrapper / "model.safetensors"))
    paths = [export_onnx(weights=f, layer=layer, output=tmp_path / f"o{i}", validate=False).path
             for i, f in enumerate((folder, wrapper))]
    assert len({(p / "weights.safetensors").read_bytes() for p in paths}) == 1
    configs = [read_artifact(p).config for p in paths]
    assert configs[0] == configs[1]


@pytest.mark.parametrize("layer", [1, 3])
def test_llama4_wrapper_reads_its_text_model(built, tmp_path, layer):
    """llama4: llama4_text's record from text_config (its vision tower is not built here: the
    wrapper's folder is the text checkpoint renamed), a chunked and a NoPE layer."""
    _, folder = built("llama4_text")
    _assert_wrapper_reads_the_text_model(folder, "llama4", layer, tmp_path)


@pytest.mark.parametrize("text, wrapper_type", [("gemma3n_text", "gemma3n"),
                                                ("gemma4_text", "gemma4")])
def test_gemma_wrappers_read_their_text_model_and_its_kv_shared_layers(built, tmp_path, text,
                                                                       wrapper_type):
    """gemma3n, gemma4: the text model's record from text_config, under model.language_model.
    (their vision towers need timm: the wrapper's folder is the text checkpoint renamed); a
    layer that attends with an earlier layer's keys and values is exported as a KV-shared
    layer naming its source, by `--layers all` too."""
    from mha_export.fanout import export_layers
    from mha_export.weights.source import non_attention_layers
    _, folder = built(text)
    _assert_wrapper_reads_the_text_model(folder, wrapper_type, 3, tmp_path)
    art = export_onnx(weights=folder, layer=4, output=tmp_path / "x", validate=False).path
    config = read_artifact(art).config
    assert (config.layout, config.kv_shared.kv_shared_layer, config.sliding_window) == (
        "shared", 2, 4)
    summary = export_layers("onnx", folder, "3-5", tmp_path / "run", validate=False)
    assert {r.layer: r.status for r in summary.records} == {
        3: "exported", 4: "exported", 5: "exported"} and summary.passed
    # eval leaves them to torch (their keys come from another layer), saying which
    assert non_attention_layers(folder, range(6), kv_shared=True) == {
        4: "kv_shared_attention (layer 2's keys and values)",
        5: "kv_shared_attention (layer 3's keys and values)"}


SHARED_CASES = ["gemma3n_text@4", "gemma3n_text@5", "gemma4_text@4", "gemma4_text@5"]


def _capture_shared(attn):
    """Every call's (input hidden states, attention output, the keys and values it attended
    with: transformers' shared_kv_states of its layer type)."""
    calls = []

    def hook(module, args, kwargs, out):
        k, v = kwargs["shared_kv_states"][module.layer_type]
        calls.append(tuple(t.detach().clone().numpy() for t in (
            kwargs["hidden_states"], out[0], k, v)))
    return calls, attn.register_forward_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])  # (its one form: standard ops)
@pytest.mark.parametrize("case", SHARED_CASES)
def test_kv_shared_layer_equals_transformers(built, case, fmt, tmp_path):
    """Gemma 3n / 4's KV-shared layers (a sliding one and a full one) given the keys and values
    their source layer stored: a left-padded full forward (masked), and a prefill + single-token
    steps (kv-cache: the source's present each call, a sliding one's last window - 1 entries
    and this call's), y at every real position."""
    name, layer = case.split("@")
    model, folder = built(name)
    ids, mask, pos = _batch()
    attn = _attention(model, name, int(layer))
    calls, handle = _capture_shared(attn)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=pos)
    handle.remove()
    art, runner = _export(fmt, folder, int(layer), tmp_path / "a", attention_mask=True)
    x, want, k, v = calls[0]
    got = runner.run(_feeds(read_artifact(art).signature, x=x, attention_mask=mask.numpy(),
                            shared_key=k, shared_value=v, position_ids=pos.numpy()))
    _close(got["y"], want, mask.numpy().astype(bool), f"{case} {fmt}")
    calls, handle = _capture_shared(attn)
    decode(model, torch.nn.Identity(), ids, mask, pos, PREFILL)
    handle.remove()
    art, runner = _export(fmt, folder, int(layer), tmp_path / "kv", kv_cache=True)
    sig, start = read_artifact(art).signature, 0
    for x, want, k, v in calls:
        end, keys = start + x.shape[1], k.shape[2]
        # the source's cache and this call's: a sliding source keeps its last window - 1
        window = read_artifact(art).config.sliding_window
        assert keys == (min(end, window - 1 + x.shape[1]) if window else end)
        got = runner.run(_feeds(sig, x=x, attention_mask=mask[:, end - keys:end].numpy(),
                                shared_key=k,
                                shared_value=v, position_ids=pos[:, start:end].numpy()))
        _close(got["y"], want, mask[:, start:end].numpy().astype(bool),
               f"{case} {fmt} tokens {start}-{end}")
        start = end
    assert start == L


HEADS_64 = {"hidden_size": 64, "num_attention_heads": 4}


LAYERS_8 = {**HEADS_64, "num_hidden_layers": 8}
FACTORS_8 = {"short_factor": [1.0] * 8, "long_factor": [2.0] * 8}


@pytest.mark.parametrize("kind, config, layer, expect", [
    ("gpt2", {}, 0, dict(heads=12, dim=768, head_dim=64)),
    ("llama", HEADS_64, 0, dict(qkv_bias=False, out_bias=False, rotary_dim=16, kv_heads=4,
                                rope_theta=10000.0)),
    ("gpt_neox", HEADS_64, 0, dict(qkv_bias=True, out_bias=True, rope_theta=10000.0)),
    ("qwen2", {**HEADS_64, "use_sliding_window": True}, 28, dict(qkv_bias=True, out_bias=False,
                                                                sliding_window=4096)),
    # Mistral's config ignores layer_types (transformers warns): every layer slides
    ("mistral", {**HEADS_64, "layer_types": ["full_attention"]}, 0, dict(sliding_window=4096)),
    ("qwen3", HEADS_64, 0, dict(head_dim=128, kv_heads=32, qk_norm="head", norm_offset=0.0,
                                qk_norm_eps=1e-6, qkv_bias=False, sliding_window=None)),
    ("qwen3_moe", {**HEADS_64, "use_sliding_window": True}, 0, dict(
        head_dim=16, kv_heads=4, sliding_window=4096, qk_norm="head")),
    ("qwen3_5_text", LAYERS_8, 7, dict(head_dim=256, kv_heads=4, rotary_dim=64, norm_offset=1.0,
                                       output_gate=True, rope_theta=10000.0)),
    ("gemma2", HEADS_64, 0, dict(head_dim=256, kv_heads=4, sliding_window=4096, softcap=50.0,
                                 softmax_scale=1 / 16)),
    ("gemma2", HEADS_64, 1, dict(sliding_window=None, softcap=50.0)),
    ("gemma3_text", {**LAYERS_8, "attn_logit_softcapping": 30.0}, 4, dict(  # never applied
        sliding_window=4096, rope_theta=10000.0, softmax_scale=1 / 16, norm_offset=1.0)),
    ("gemma3_text", LAYERS_8, 5, dict(sliding_window=None, rope_theta=1e6, rope_scaling=None)),
    # 4.x spellings: rope_theta, rope_local_base_freq, rope_scaling (full layers only)
    ("gemma3_text", {**LAYERS_8, "sliding_window_pattern": 2, "rope_theta": 5e5,
                     "rope_local_base_freq": 2e4, "rope_scaling": {"rope_type": "linear",
                                                                   "factor": 8.0}}, 1,
     dict(sliding_window=None, rope_theta=5e5, rope_scaling={"rope_type": "linear",
                                                             "factor": 8.0})),
    ("gemma3_text", {**LAYERS_8, "sliding_window_pattern": 2, "rope_local_base_freq": 2e4,
                     "rope_scaling": {"rope_type": "linear", "factor": 8.0}}, 0,
     dict(sliding_window=4096, rope_theta=2e4, rope_scaling=None)),
    # Phi-3's 4.x "su" is longrope; original_max_position_embeddings top-level (4096)
    ("phi3", {**HEADS_64, "max_position_embeddings": 131072,
              "rope_scaling": {"type": "su", **FACTORS_8}}, 0,
     dict(sliding_window=None, qkv_bias=False, rope_scaling={
         "rope_type": "longrope", **FACTORS_8, "original_max_position_embeddings": 4096,
         "factor": 32.0})),
    ("olmo2", HEADS_64, 0, dict(qk_norm="full", qk_norm_eps=1e-5, kv_heads=4)),
    ("granite", HEADS_64, 0, dict(softmax_scale=1.0, qkv_bias=False)),
    ("starcoder2", HEADS_64, 0, dict(qkv_bias=True, out_bias=True, kv_heads=2,
                                     sliding_window=None)),
    ("gpt_oss", HEADS_64, 0, dict(head_dim=64, kv_heads=8, sinks=True, qkv_bias=True,
                                  sliding_window=128, rope_theta=150000.0, rope_scaling={
                                      "rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                      "beta_slow": 1.0, "truncate": False,
                                      "original_max_position_embeddings": 4096})),
    ("gpt_oss", HEADS_64, 1, dict(sliding_window=None)),
    ("smollm3", LAYERS_8, 7, dict(rotary="none", kv_heads=4, sliding_window=None)),
    ("smollm3", {**LAYERS_8, "use_sliding_window": True, "sliding_window": 8}, 3,
     dict(rotary="none", sliding_window=8)),
    ("smollm3", LAYERS_8, 6, dict(rotary="half", rope_theta=2e6)),
])
def test_a_key_config_json_omits_takes_the_records_default(kind, config, layer, expect):
    """The registry alone, no checkpoint: omitted keys come from the record's defaults."""
    family = FAMILIES[kind]
    fields = family.fields(Settings(config, family.defaults), layer)
    assert {k: fields.get(k) for k in expect} == expect
    assert fields.get("softcap") == (50.0 if kind == "gemma2" else None)


def test_a_linear_attention_layer_is_a_one_line_error_naming_the_nearest_attention_layers(
        built, tmp_path):
    from click.testing import CliRunner

    from mha_export.cli.commands import cli
    _, folder = built("qwen3_5")
    r = CliRunner().invoke(cli, ["onnx", "--weights", str(folder), "--layer", "2", "-o",
                                 str(tmp_path / "x")])
    assert r.exit_code == 2 and not (tmp_path / "x").exists()
    line = ("Error: --layer 2 is a linear_attention layer, not softmax attention: the nearest "
            "are 1 and 3 (2 of its 4 layers are)")
    assert r.stderr.splitlines() == [line]


@pytest.mark.parametrize("kind, change, msg", [
    ("llama", dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}),
     "unsupported rope scaling type 'dynamic'"),
    ("gemma3_text", dict(rope_parameters={"full_attention": {"rope_type": "ntk"},
                                          "sliding_attention": {"rope_type": "default"}}),
     "unsupported rope scaling type 'ntk'"),  # layer 1 is a full-attention layer
    ("phi3", dict(rope_parameters={"rope_type": "longrope", "short_factor": [1.0] * 4}),
     "rope scaling 'longrope' needs long_factor"),
    ("qwen3", dict(hidden_size=None), "missing or malformed attention setting ('hidden_size')"),
    ("gemma3", dict(text_config=None), "no layer count (text_config.num_hidden_layers)"),
    ("gemma2", dict(use_bidirectional_attention=True), "use_bidirectional_attention"),
    ("mpt", dict(attn_config={"qk_ln": True}), "attn_config.qk_ln: transformers' MPT"),
    ("smollm3", dict(no_rope_layers=[1]), "no_rope_layers has no entry for layer 1"),
])
def test_what_cannot_be_built_is_a_one_line_error_naming_it(tmp_path, kind, change, msg):
    folder = _saved(tmp_path, kind, "bad", **change)
    with pytest.raises(UsageError) as e:
        export_onnx(weights=folder, layer=1, output=tmp_path / "x", validate=False)
    assert msg in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "x").exists()


def test_softcap_layers_take_the_default_form_and_sinks_layers_one_that_builds_them(built,
                                                                                  tmp_path):
    """The default form (auto) uses the Attention node: its softcap attribute builds Gemma 2's
    softcapping (ONNX Runtime applies it before the mask, as transformers); it has no sinks, so
    a gpt-oss layer gets blocked-plain, and asking for auto there is an error naming the forms
    that can."""
    _, gemma = built("gemma2")
    art = export_onnx(weights=gemma, layer=0, output=tmp_path / "g", validate=False).path
    assert json.loads((art / "config.json").read_text())["export"]["attention"] == "auto"
    _, oss = built("gpt_oss")
    art = export_onnx(weights=oss, layer=1, output=tmp_path / "a", validate=False).path
    assert json.loads((art / "config.json").read_text())["export"]["attention"] == "blocked-plain"
    with pytest.raises(UsageError, match=r"'auto' does not support sinks \(forms that can: "
                                         r"[^)]*blocked-plain"):
        export_onnx(weights=oss, layer=1, output=tmp_path / "x", attention="auto",
                    validate=False)


def test_cli_exports_a_checkpoint_layer_and_flags_only_need_to_agree(tmp_path):
    from click.testing import CliRunner

    from mha_export.cli.commands import cli
    folder = _saved(tmp_path, "qwen2", "ckpt")
    r = CliRunner().invoke(cli, ["onnx", "--weights", str(folder), "--layer", "2", "--kv-cache",
                                 "--kv-heads", "2", "-o", str(tmp_path / "q")])
    assert r.exit_code == 0, r.output
    assert "PASS" in r.output and "present_key" in r.output
    source = json.loads((tmp_path / "q" / "config.json").read_text())["weights"]["source"]
    assert source == {"kind": "huggingface", "path": str(folder), "model_type": "qwen2",
                      "layer": 2, "max_position_embeddings": 64, "layout": "split"}
    r = CliRunner().invoke(cli, ["onnx", "--weights", str(folder), "--layer", "2",
                                 "--kv-heads", "4", "-o", str(tmp_path / "bad")])
    assert r.exit_code == 2 and "--kv-heads 4 contradicts" in r.stderr


def test_bfloat16_checkpoints_are_upcast_for_a_float32_export(tmp_path):
    model = _plain("mistral")
    model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    r = export_onnx(weights=tmp_path / "bf16", layer=0, output=tmp_path / "a", kv_cache=True)
    assert r.passed
    from safetensors.torch import load_file
    stored = load_file(str(tmp_path / "a" / "weights.safetensors"))
    want = model.model.layers[0].self_attn.q_proj.weight.float()
    assert all(t.dtype == torch.float32 for t in stored.values())
    assert torch.equal(stored["W_query.weight"], want)  # bf16 -> fp32 is exact


def _plain(name):
    """The tiny model as transformers initialises it (nothing randomised)."""
    spec = MODELS[name]
    torch.manual_seed(0)
    auto = AutoModelForImageTextToText if spec.multimodal else AutoModelForCausalLM
    return auto.from_config(AutoConfig.for_model(spec.kind, **spec.config))


def _saved(tmp_path, kind, name, **changes):
    """MODELS[kind] saved to tmp_path/name, config.json changed (None: the key removed)."""
    _plain(kind).save_pretrained(tmp_path / name)
    cfg_path = tmp_path / name / "config.json"
    cfg = json.loads(cfg_path.read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    cfg_path.write_text(json.dumps(cfg))
    return tmp_path / name


@pytest.mark.parametrize("kind, flags, msg", [
    ("llama", dict(causal=False), "--causal False contradicts"),
    ("gpt2", dict(rotary="half"), "--rotary half contradicts"),
    ("gpt_neox", dict(sliding_window=2), "--sliding-window 2 contradicts"),
    ("llama", dict(seed=3, d_in=32), "--d-in 32 contradicts"),
])
def test_every_flag_is_checked_against_the_checkpoint(tmp_path, kind, flags, msg):
    folder = _saved(tmp_path, kind, "c")
    with pytest.raises(UsageError, match=msg):
        export_onnx(weights=folder, layer=0, output=tmp_path / "x", validate=False, **flags)


def test_omitted_keys_take_transformers_defaults(tmp_path):
    neox = _saved(tmp_path, "gpt_neox", "neox", rope_parameters=None, rotary_pct=None)
    mistral = _saved(tmp_path, "mistral", "mistral", sliding_window=None)
    qwen = _saved(tmp_path, "qwen2", "qwen", use_sliding_window=True, sliding_window=8,
                  max_window_layers=None, layer_types=None)
    configs = {name: read_artifact(export_onnx(weights=f, layer=1, output=tmp_path / f"o{name}",
                                               validate=False).path).config
               for name, f in (("neox", neox), ("mistral", mistral), ("qwen", qwen))}
    assert configs["neox"].rotary_dim == 4  # rotary_pct 0.25 of 16
    assert configs["mistral"].sliding_window == 4096
    assert configs["qwen"].sliding_window is None  # layer 1 < max_window_layers 28


def test_a_long_context_checkpoint_is_checked_over_1024_tokens(tmp_path):
    folder = _saved(tmp_path, "llama", "long", max_position_embeddings=131072)
    r = export_onnx(weights=folder, layer=0, output=tmp_path / "a", kv_cache=True)
    assert r.passed and read_artifact(r.path).config.max_seq_len == 1024
    meta = json.loads((r.path / "config.json").read_text())
    assert meta["weights"]["source"]["max_position_embeddings"] == 131072


def test_a_plain_weights_file_beside_an_artifacts_config_still_loads(tmp_path):
    first = export_onnx(heads=2, dim=16, output=tmp_path / "a1", validate=False).path
    again = export_onnx(heads=2, dim=16, weights=first / "weights.safetensors",
                        output=tmp_path / "a2", validate=False).path
    weights = (again / "weights.safetensors").read_bytes()
    assert weights == (first / "weights.safetensors").read_bytes()


def test_legacy_bin_loads_and_corrupt_files_are_one_line_errors(tmp_path):
    folder = _saved(tmp_path, "llama", "legacy")
    model = AutoModelForCausalLM.from_pretrained(folder)
    (folder / "model.safetensors").unlink()
    torch.save(model.state_dict(), folder / "pytorch_model.bin",
               _use_new_zipfile_serialization=False)
    assert export_onnx(weights=folder, layer=0, output=tmp_path / "a").passed
    (folder / "pytorch_model.bin").unlink()
    (folder / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(UsageError, match="not a readable checkpoint"):
        export_onnx(weights=folder, layer=0, output=tmp_path / "b")


@pytest.mark.parametrize("kind, change, msg", [
    ("mistral", dict(hidden_size=None), "missing or malformed attention setting"),
    ("qwen2", dict(layer_types=["full_attention"]), "layer_types has no entry for layer 1"),
    ("mistral", dict(num_hidden_layers=None), "no layer count"),
])
def test_malformed_config_json_is_a_clear_error(tmp_path, kind, change, msg):
    folder = _saved(tmp_path, kind, "bad", **change)
    with pytest.raises(UsageError, match=msg):
        export_onnx(weights=folder, layer=1, output=tmp_path / "x")
    (folder / "config.json").write_text("[1, 2]")
    with pytest.raises(UsageError):
        export_onnx(weights=folder, layer=1, output=tmp_path / "x")


# --- LongCat-Flash: two attention modules a layer, addressed L.M ---------------------------------

def _full_sequence_error(model, kind, folder, layer, output) -> float:
    """The largest difference of the layer's y from transformers' module on the padded batch."""
    ids, mask, pos = _batch()
    calls, handle = _capture(model, kind, layer)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=pos)
    handle.remove()
    art, runner = _export("onnx", folder, layer, output, attention_mask=True)
    got = runner.run(_feeds(read_artifact(art).signature, x=calls[0][0],
                            attention_mask=mask.numpy(), position_ids=pos.numpy()))["y"]
    return float(np.abs(got - calls[0][1])[mask.numpy().astype(bool)].max())


def _longcat_faults():
    """Planted faults of the LongCat record: a LoRA scale left out, the other module read."""
    import dataclasses

    from mha_export.weights.families.longcat import lora_scales
    record = FAMILIES["longcat_flash"]
    return {
        "q scale left out": dataclasses.replace(record, convert=lambda f, t: {
            **lora_scales(f, t), "q_b_proj.weight": t["q_b_proj.weight"]}),
        "kv scale left out": dataclasses.replace(record, convert=lambda f, t: {
            **lora_scales(f, t), "kv_a_layernorm.weight": t["kv_a_layernorm.weight"]}),
        "module 0 read for every address": dataclasses.replace(
            record, attention="layers.{layer}.self_attn.0"),
    }


@pytest.mark.parametrize("fault", ["q scale left out", "kv scale left out",
                                   "module 0 read for every address"])
def test_a_planted_longcat_fault_fails_against_transformers(built, fault, tmp_path,
                                                            monkeypatch):
    model, folder = built("longcat_flash")
    assert _full_sequence_error(model, "longcat_flash", folder, "0.1", tmp_path / "ok") <= 2e-5
    monkeypatch.setitem(FAMILIES, "longcat_flash", _longcat_faults()[fault])
    assert _full_sequence_error(model, "longcat_flash", folder, "0.1", tmp_path / "bad") > 1e-2


def test_layers_all_lists_every_attention_module_of_a_longcat_checkpoint(built, tmp_path):
    """`--layers all`: a row and a folder per module (layer-0.0 ... layer-1.1), in order; a list
    picks modules or whole layers; `check DIR` finds the folders again."""
    from mha_export.fanout import check_layers, export_layers
    _, folder = built("longcat_flash")
    summary = export_layers("onnx", folder, "all", tmp_path / "run", validate=False)
    assert summary.passed
    rows = json.loads((tmp_path / "run" / "layers.json").read_text())["layers"]
    assert [(r["layer"], r["status"], r["folder"]) for r in rows] == [
        (a, "exported", f"layer-{a}") for a in ("0.0", "0.1", "1.0", "1.1")]
    checked = check_layers(tmp_path / "run", seq_lens=[3], batch_sizes=[1])
    assert sorted(r.layer for r in checked.records) == ["0.0", "0.1", "1.0", "1.1"]
    assert checked.passed
    picked = export_layers("onnx", folder, "1,0.1", tmp_path / "some", validate=False)
    assert sorted(r.layer for r in picked.records) == ["0.1", "1.0", "1.1"]


@pytest.mark.parametrize("kind, args, msg", [
    ("longcat_flash", ["--layer", "1"], "--layer 1: each layer of a longcat_flash checkpoint "
     "holds 2 attention modules: --layer 1.0 to 1.1"),
    ("longcat_flash", ["--layer", "1.2"], "--layer 1.2: layer 1's attention modules are 1.0 to "
     "1.1"),
    ("longcat_flash", ["--layer", "2.0"], "--layer 2.0 is out of range: the checkpoint has 2 "
     "layers (0.0-1.1)"),
    ("longcat_flash", ["--layers", "0.2"], "--layers 0.2: the model has 2 layers of 2 "
     "attention modules (0.0-1.1)"),
    ("llama", ["--layer", "1.0"], "--layer 1.0: each layer of a llama checkpoint holds one "
     "attention module: --layer 1"),
    ("llama", ["--layers", "0,1.1"], "--layers 0,1.1: 1.1 picks a layer's attention module; "
     "the model's layers hold one each"),
    ("llama", ["--layer", "1.x"], "Invalid value for '--layer': expected N or N.M (3, 3.1), "
     "got '1.x'"),
])
def test_a_bad_layer_address_is_one_line_exit_2(built, tmp_path, kind, args, msg):
    from click.testing import CliRunner

    from mha_export.cli.commands import cli
    _, folder = built(kind)
    r = CliRunner().invoke(cli, ["onnx", "--weights", str(folder), *args, "-o",
                                 str(tmp_path / "x")])
    assert r.exit_code == 2 and not (tmp_path / "x").exists(), r.output
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and errors[0].startswith(f"Error: {msg}"), r.stderr


# --- the static cache against transformers --------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", ["llama@1", "mistral@1", "qwen3@1"])
def test_static_cache_ragged_batch_equals_transformers_on_each_sequence_alone(built, case, fmt,
                                                                              tmp_path):
    """Two sequences of different lengths (7 and 4 prompt tokens) in one static buffer: a
    right-padded prefill, past_lengths set to the real lengths, three single-token steps —
    equal transformers run on each sequence alone (y at every real token)."""
    name, layer = case.split("@")
    model, folder = built(name)
    kind, layer = MODELS[name].kind, int(layer)
    lengths, steps = (7, 4), 3
    ids = torch.randint(0, 60, (2, 7 + steps), generator=torch.Generator().manual_seed(3))
    alone = []
    for r, n in enumerate(lengths):  # the layer's input and output for each sequence alone
        calls, handle = _capture(model, kind, layer)
        with torch.no_grad():
            model(input_ids=torch.cat([ids[r, :n], ids[r, 7:]])[None])
        handle.remove()
        alone.append(calls[0])
    art, runner = _export(fmt, folder, layer, tmp_path / "s", static_cache=True)
    sig, c = read_artifact(art).signature, read_artifact(art).config
    buffers = {n: np.zeros((2, c.kv_heads, 16, c.head_dim), np.float32)
               for n in ("past_key", "past_value")}
    prefill = np.zeros((2, 7, c.d_in), np.float32)  # row 1 right-padded
    for r, n in enumerate(lengths):
        prefill[r, :n] = alone[r][0][0, :n]
    calls = [(prefill, np.zeros(2, np.int64))]
    calls += [(np.stack([alone[r][0][0, n + j] for r, n in enumerate(lengths)])[:, None],
               np.array(lengths) + j) for j in range(steps)]
    outs = []
    for x, past in calls:
        pos = past[:, None] + np.arange(x.shape[1])
        out = runner.run(_feeds(sig, x=x, **buffers, past_lengths=past, position_ids=pos))
        buffers = {"past_key": out["present_key"], "past_value": out["present_value"]}
        outs.append(out["y"])
    for r, n in enumerate(lengths):
        got = np.concatenate([outs[0][r, :n]] + [y[r] for y in outs[1:]])  # (n + steps, dim)
        _close(got, alone[r][1][0], slice(None), f"{case} {fmt} row {r}")


def test_int8_cache_generation_against_transformers_float_cache(built, tmp_path):
    """A qwen3 layer with an int8 static cache, its scales calibrated on the hidden states the
    model itself feeds that layer (captured from another batch): the generation's y (prefill +
    single-token steps) against transformers' own float cache is near but not equal (the cache's
    rounding, which the check reports apart), and the check passes on the runtime."""
    model, folder = built("qwen3")
    calibration_ids = torch.randint(0, 60, (4, 24), generator=torch.Generator().manual_seed(9))
    seen, handle = _capture(model, "qwen3", 1)
    with torch.no_grad():
        model(input_ids=calibration_ids)
    handle.remove()
    np.save(tmp_path / "hidden.npy", seen[0][0])  # (4, 24, hidden): the layer's real inputs
    ids, mask, pos = _batch()
    calls, _ = _decode_in_transformers(model, "qwen3", 1, ids[:1], mask[:1], pos[:1])
    result = export_onnx(weights=folder, layer=1, output=tmp_path / "kv8", static_cache=True,
                         kv_cache_dtype="int8", calibration=tmp_path / "hidden.npy",
                         check_options=dict(seq_lens=[1, 7], past_lens=[0, 5]))
    assert result.passed and not result.report.costs["kv_cache"].synthetic
    artifact = read_artifact(result.path)
    c, runner = artifact.config, OrtRunner(artifact.signature, result.path / "model.onnx")
    buffers = {n: np.zeros((1, c.kv_heads, L, c.head_dim), np.int8)
               for n in ("past_key", "past_value")}
    ys, start = [], 0
    for x, _ in calls:
        end = start + x.shape[1]
        out = runner.run({"x": x, **buffers, "past_lengths": np.array([start]),
                          "position_ids": pos[:1, start:end].numpy()})
        buffers = {"past_key": out["present_key"], "past_value": out["present_value"]}
        ys.append(out["y"])
        start = end
    got, want = np.concatenate(ys, axis=1), np.concatenate([w for _, w in calls], axis=1)
    rel = np.abs(got - want).max() / np.abs(want).max()
    print(f"qwen3 layer 1, int8 cache vs transformers' float cache: max|d|/max|y| {rel:.2e}")
    assert 1e-6 < rel < 5e-2, rel  # lossy, and by little (measured 1.2e-2)
