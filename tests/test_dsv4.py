"""DeepSeek-V4's sliding_attention layer (mha_export/kinds/dsv4/) against transformers 5.23's own
DeepseekV4Attention: a tiny random checkpoint saved by transformers, the layer read from the
folder, y on a left-padded 40-token prompt (window 8: the window acts) equal to the y the
module gives inside transformers' model; a planted fault per feature fails; the compressed layer
types are refused in one line."""
from __future__ import annotations

import pytest
import torch

from mha_export.errors import UsageError
from mha_export.kinds.dsv4 import layer as dsv4_layer
from mha_export.kinds.dsv4.checkpoint import read_layer
from mha_export.kinds.dsv4.settings import shape_from_config

LAYER_TYPES = ["sliding_attention", "compressed_sparse_attention",
               "heavily_compressed_attention", "sliding_attention"]
LENGTH, PAD = 40, 7


def _config():
    from transformers import AutoConfig
    return AutoConfig.for_model(
        "deepseek_v4", hidden_size=64, num_attention_heads=4, head_dim=32, q_lora_rank=24,
        num_hidden_layers=len(LAYER_TYPES), vocab_size=50, moe_intermediate_size=16,
        n_routed_experts=4, num_experts_per_tok=2, o_groups=2, o_lora_rank=16,
        index_n_heads=2, index_head_dim=16, index_topk=3, sliding_window=8,
        partial_rotary_factor=0.25, layer_types=LAYER_TYPES, mlp_layer_types=["moe"] * 4,
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        hc_mult=2, max_position_embeddings=256, initializer_range=0.2)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(model, folder): random weights; sinks and norm weights too (zeros and ones would hide
    a dropped sink or norm)."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_config()).eval()
    with torch.no_grad():
        for name, t in model.named_parameters():
            if name.endswith(("sinks", "norm.weight")):
                t.copy_(torch.randn_like(t) * 0.5 + (0 if name.endswith("sinks") else 1))
    folder = tmp_path_factory.mktemp("dsv4")
    model.save_pretrained(folder)
    return model, folder


def _transformers_y(model, layer: int):
    """(x, keep, y): the attention module's input and output in transformers' model on a
    batch of two prompts, the second left-padded by PAD tokens."""
    torch.manual_seed(1)
    ids = torch.randint(1, 50, (2, LENGTH))
    keep = torch.ones(2, LENGTH, dtype=torch.long)
    keep[1, :PAD] = 0
    seen = {}

    def hook(module, args, kwargs, out):
        seen["x"], seen["y"] = kwargs.get("hidden_states", args[0] if args else None), out[0]

    attention = model.model.layers[layer].self_attn
    handle = attention.register_forward_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=keep, use_cache=False)
    finally:
        handle.remove()
    return seen["x"], keep, seen["y"]


def _error(model, folder, layer: int) -> float:
    x, keep, expected = _transformers_y(model, layer)
    ours = read_layer(folder, layer)
    with torch.no_grad():
        y = ours(x, keep)
    rows = keep.bool()  # a padding query's row is its own business
    return float((y - expected)[rows].abs().max())


@pytest.mark.parametrize("layer", [0, 3])
def test_a_sliding_layer_equals_transformers_on_a_left_padded_prompt(tiny, layer):
    model, folder = tiny
    assert _error(model, folder, layer) <= 2e-5


def _drop_sinks(monkeypatch):
    attend = dsv4_layer.attend_with_sinks
    monkeypatch.setattr(dsv4_layer, "attend_with_sinks",
                        lambda q, kv, mask, sinks, scale: attend(
                            q, kv, mask, torch.full_like(sinks, float("-inf")), scale))


def _drop_inverse_rotary(monkeypatch):
    monkeypatch.setattr(dsv4_layer, "unrotate_output", lambda o, cos, sin: o)


def _swap_groups(monkeypatch):
    grouped = dsv4_layer.DSV4SlidingAttention.grouped_output

    def swapped(self, o):  # o (B, T, H, d): the two groups of heads swapped
        return grouped(self, torch.cat(o.chunk(2, dim=2)[::-1], dim=2))
    monkeypatch.setattr(dsv4_layer.DSV4SlidingAttention, "grouped_output", swapped)


def _no_window(monkeypatch):
    mask = dsv4_layer.sliding_mask
    monkeypatch.setattr(dsv4_layer, "sliding_mask",
                        lambda positions, keep, window: mask(positions, keep, 10 ** 6))


FAULTS = {"sinks dropped": _drop_sinks, "inverse rotary dropped": _drop_inverse_rotary,
          "output groups swapped": _swap_groups, "window ignored": _no_window}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_planted_fault_fails_against_transformers(tiny, fault, monkeypatch):
    model, folder = tiny
    FAULTS[fault](monkeypatch)
    assert _error(model, folder, 0) > 1e-3


@pytest.mark.parametrize("layer, kind", [(1, "compressed_sparse_attention"),
                                         (2, "heavily_compressed_attention")])
def test_a_compressed_layer_is_refused_in_one_line(tiny, layer, kind):
    _, folder = tiny
    with pytest.raises(UsageError) as e:
        read_layer(folder, layer)
    assert kind in str(e.value) and "not built" in str(e.value) and "\n" not in str(e.value)


def test_bad_input_is_a_short_error(tiny, tmp_path):
    _, folder = tiny
    with pytest.raises(UsageError, match="not in this checkpoint"):
        read_layer(folder, 9)
    with pytest.raises(UsageError, match="no config.json"):
        read_layer(tmp_path, 0)
    with pytest.raises(UsageError, match="o_groups 3 must divide"):
        shape_from_config({**_config().to_dict(), "o_groups": 3}, 0)
