"""A tiny hybrid checkpoint, Qwen3-Next-shaped (layers 0 and 2 gated-delta-net linear attention,
1 and 3 softmax attention), saved by transformers with a character-level tokenizer: what
`--layers all` and `eval` meet in a hybrid model (shared by the fan-out and eval tests); and a
tiny LongCat-Flash (two attention modules a layer) and GLM-5 (shared-top-k layers) with the same
tokenizer."""
from __future__ import annotations

from pathlib import Path

import torch

CHARS = "abcdefghijklmnopqrstuvwxyz .,'\n"
LAYER_TYPES = ["linear_attention", "full_attention"] * 2


def save_tokenizer(folder: Path) -> None:
    """One token per character of CHARS (anything else: <unk>)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {"<unk>": 0, **{c: i + 1 for i, c in enumerate(CHARS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>",
                            eos_token="<unk>").save_pretrained(folder)


def save_tiny_qwen3_next(folder: Path) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM
    torch.manual_seed(0)
    config = AutoConfig.for_model(
        "qwen3_next", hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, num_hidden_layers=4, intermediate_size=32, vocab_size=len(CHARS) + 1,
        max_position_embeddings=128, initializer_range=0.2, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
        linear_value_head_dim=8, layer_types=LAYER_TYPES, pad_token_id=None,
        bos_token_id=None, eos_token_id=0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    save_tokenizer(folder)
    return folder


def save_tiny_longcat(folder: Path) -> Path:
    """Two layers of two MLA modules each (self_attn.0, .1), q LoRA, yarn."""
    from transformers import AutoConfig, AutoModelForCausalLM
    torch.manual_seed(0)
    config = AutoConfig.for_model(
        "longcat_flash", hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
        num_layers=2, vocab_size=len(CHARS) + 1, max_position_embeddings=128,
        initializer_range=0.2, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8,
        qk_nope_head_dim=16, v_head_dim=24, head_dim=8, ffn_hidden_size=32,
        expert_ffn_hidden_size=16, n_routed_experts=4, zero_expert_num=2, moe_topk=2,
        pad_token_id=None, bos_token_id=None, eos_token_id=0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    save_tokenizer(folder)
    return folder


def save_tiny_glm5(folder: Path) -> Path:
    """Four MLA layers with the lightning indexer (top 4 keys), layers 1 and 2 reusing layer
    0's top-k (indexer_types "shared")."""
    from transformers import AutoConfig, AutoModelForCausalLM
    torch.manual_seed(0)
    config = AutoConfig.for_model(
        "glm_moe_dsa", hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
        num_hidden_layers=4, intermediate_size=32, vocab_size=len(CHARS) + 1,
        max_position_embeddings=128, initializer_range=0.2, kv_lora_rank=32, q_lora_rank=48,
        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=24, n_routed_experts=4,
        num_experts_per_tok=2, n_group=1, topk_group=1, moe_intermediate_size=16,
        first_k_dense_replace=1, index_topk=4, index_n_heads=8, index_head_dim=16,
        indexer_types=["full", "shared", "shared", "full"], pad_token_id=None,
        bos_token_id=None, eos_token_id=0)
    AutoModelForCausalLM.from_config(config, attn_implementation="eager").save_pretrained(folder)
    save_tokenizer(folder)
    return folder
