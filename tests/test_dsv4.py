"""DeepSeek-V4's sliding_attention layer (mha_export/kinds/dsv4/) against transformers 5.23's own
DeepseekV4Attention: a tiny random checkpoint saved by transformers, the layer read from the
folder, y on a left-padded 40-token prompt (window 8: the window acts) equal to the y the
module gives inside transformers' model; a planted fault per feature fails; the compressed layer
types' full-sequence calls too (the indexer's top-k below the closed rows), and every type's
cached decode steps against transformers' cache. CSA's queries tied on the indexer's top-k
boundary are not compared with transformers (its torch.topk picks among equal scores in no
specified order; ours the earlier row: the selection is held to a stable sort's here, and to
ONNX TopK's on every query in test_dsv4_graph.py). (The registered kind's exports:
test_dsv4_kind.py.)"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from mha_export.errors import UsageError
from dsv4_layers import read_layer, with_ties
from mha_export.kinds.dsv4 import compressed
from mha_export.kinds.dsv4 import layer as dsv4_layer
from mha_export.weights.families import deepseek_v4

LAYER_TYPES = ["sliding_attention", "compressed_sparse_attention",
               "heavily_compressed_attention", "sliding_attention"]
LENGTH, PAD = 40, 7


# the released checkpoints' "compress" rope: YaRN (its attention_factor 1, as the config sets)
YARN = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 16,
        "beta_fast": 32, "beta_slow": 1}


def _config(**extra):
    from transformers import AutoConfig
    return AutoConfig.for_model(
        "deepseek_v4", hidden_size=64, num_attention_heads=4, head_dim=32, q_lora_rank=24,
        num_hidden_layers=len(LAYER_TYPES), vocab_size=50, moe_intermediate_size=16,
        n_routed_experts=4, num_experts_per_tok=2, o_groups=2, o_lora_rank=16,
        index_n_heads=2, index_head_dim=16, index_topk=3, sliding_window=8,
        partial_rotary_factor=0.25, layer_types=LAYER_TYPES, mlp_layer_types=["moe"] * 4,
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        hc_mult=2, max_position_embeddings=256, initializer_range=0.2, **extra)


def _saved(tmp_path_factory, **extra):
    """(model, folder): random weights; sinks and norm weights too (zeros and ones would hide
    a dropped sink or norm)."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_config(**extra)).eval()
    with torch.no_grad():
        for name, t in model.named_parameters():
            if name.endswith(("sinks", "norm.weight")):
                t.copy_(torch.randn_like(t) * 0.5 + (0 if name.endswith("sinks") else 1))
    folder = tmp_path_factory.mktemp("dsv4")
    model.save_pretrained(folder)
    return model, folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return _saved(tmp_path_factory)


@pytest.fixture(scope="module")
def tiny_yarn(tmp_path_factory):
    return _saved(tmp_path_factory, rope_parameters=YARN)


def _hooked(model, layer: int, **inputs):
    """(x, y): the attention module's input and output in one call of transformers' model."""
    seen = {}

    def hook(module, args, kwargs, out):
        seen["x"], seen["y"] = kwargs.get("hidden_states", args[0] if args else None), out[0]

    handle = model.model.layers[layer].self_attn.register_forward_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        handle.remove()
    return seen["x"], seen["y"]


def _prompt():
    """(ids, keep): a batch of two 40-token prompts, the second left-padded by PAD tokens."""
    torch.manual_seed(1)
    keep = torch.ones(2, LENGTH, dtype=torch.long)
    keep[1, :PAD] = 0
    return torch.randint(1, 50, (2, LENGTH)), keep


def _transformers_y(model, layer: int):
    """(x, keep, y) of the layer's module on the prompt."""
    ids, keep = _prompt()
    x, y = _hooked(model, layer, input_ids=ids, attention_mask=keep, use_cache=False)
    return x, keep, y


def _compared(model, folder, layer: int) -> tuple[float, torch.Tensor]:
    """(max |y - transformers' y| over the compared queries, those queries (B, T)): a padding
    query's row is its own business; a query tied on its indexer's top-k boundary is
    torch.topk's (transformers' picks among equal scores: no specified order; ours: the
    earlier row)."""
    x, keep, expected = _transformers_y(model, layer)
    (y, *_), tied = with_ties(read_layer(folder, layer), x, keep)
    rows = keep.bool() & ~tied
    return float((y - expected)[rows].abs().max()), rows


def _error(model, folder, layer: int) -> float:
    return _compared(model, folder, layer)[0]


@pytest.mark.parametrize("layer", [0, 1, 2, 3])
def test_each_layer_type_equals_transformers_on_a_left_padded_prompt(tiny, layer):
    """Sliding (0, 3), CSA (1: 10 closed rows, the indexer keeps 3; its tied queries not
    compared, most are), HCA (2: 5 closed rows)."""
    model, folder = tiny
    error, rows = _compared(model, folder, layer)
    assert error <= 2e-5 and rows.sum() >= 0.7 * (2 * LENGTH - PAD), int(rows.sum())


@pytest.mark.parametrize("layer", [1, 2])
def test_a_prompt_shorter_than_a_window_equals_transformers(tiny, layer):
    """3 tokens, one of them padding: no window closed, no pooled row, no top-k."""
    model, folder = tiny
    ids, keep = torch.tensor([[3, 4, 5], [6, 7, 8]]), torch.tensor([[1, 1, 1], [0, 1, 1]])
    x, expected = _hooked(model, layer, input_ids=ids, attention_mask=keep, use_cache=False)
    with torch.no_grad():
        y = read_layer(folder, layer)(x, keep)[0]
    assert float((y - expected)[keep.bool()].abs().max()) <= 2e-5


@pytest.mark.parametrize("layer", [0, 1, 2])
def test_a_yarn_compress_rope_equals_transformers(tiny_yarn, layer):
    """YaRN on the compressed layers' rope (queries, keys, pooled rows, index queries and
    keys); the sliding layer's stays default."""
    model, folder = tiny_yarn
    assert model.config.rope_parameters["compress"]["rope_type"] == "yarn"
    assert _error(model, folder, layer) <= 2e-5


def test_the_compress_rope_read_without_its_yarn_fails(tiny_yarn, monkeypatch):
    model, folder = tiny_yarn
    shape_of = deepseek_v4.shape_from_config
    monkeypatch.setattr(deepseek_v4, "shape_from_config", lambda cfg, layer: dataclasses.replace(
        shape_of(cfg, layer), rope_scaling=None))
    assert _error(model, folder, 1) > 1e-3


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
                        lambda qp, kp, keep, window: mask(qp, kp, keep, 10 ** 6))


def _pooled_rows_all_seen(monkeypatch):
    monkeypatch.setattr(compressed, "closed_by", lambda positions, rows, rate: torch.ones(
        positions.shape + (rows,), dtype=torch.bool))


def _indexer_ignored(monkeypatch):
    monkeypatch.setattr(compressed.Indexer, "forward", compressed.NoIndexer.forward)


def _overlap_dropped(monkeypatch):
    monkeypatch.setattr(compressed, "overlapped", lambda t, width, fill, prior=None: torch.cat(
        [torch.full_like(t[..., :width], fill), t[..., width:]], dim=2))


def _pooled_rotary_dropped(monkeypatch):
    monkeypatch.setattr(compressed, "rotate_tail", lambda x, cos, sin: x)


def _topk_one_less(monkeypatch):
    pick = compressed.top_rows
    monkeypatch.setattr(compressed, "top_rows", lambda scores, closed, k: pick(
        scores, closed, k - 1))


# fault -> (how it is planted, the layer where it acts)
FAULTS = {"sinks dropped": (_drop_sinks, 0), "inverse rotary dropped": (_drop_inverse_rotary, 0),
          "output groups swapped": (_swap_groups, 0), "window ignored": (_no_window, 0),
          "pooled rows' causality ignored": (_pooled_rows_all_seen, 2),
          "indexer ignored": (_indexer_ignored, 1), "top-k one less": (_topk_one_less, 1),
          "window overlap dropped": (_overlap_dropped, 1),
          "pooled rows' rotary dropped": (_pooled_rotary_dropped, 2)}


def _stable_top(scores: torch.Tensor, closed: torch.Tensor, k: int) -> torch.Tensor:
    """The reference: each query's first k closed rows in a stable descending sort (equal
    scores: the earlier row first), (B, T, n) bool."""
    order = scores.masked_fill(~closed, float("-inf")).sort(
        dim=-1, descending=True, stable=True).indices[..., :k]  # (B, T, min(k, n))
    return torch.zeros_like(closed).scatter(-1, order, True) & closed


def _later_ties(scores, closed, k, pick=compressed.top_rows):  # ties to the later row
    return pick(scores.flip(-1), closed.flip(-1), k).flip(-1)  # the rows' order reversed


@pytest.mark.parametrize("pick, equal", [(compressed.top_rows, True), (_later_ties, False),
                                         (lambda s, c, k: compressed.top_rows(s, c, k + 1),
                                          False)])
def test_the_indexers_selection_is_a_stable_top_k(pick, equal):
    """Scores of 5 values (many ties), random closed rows, n from 0 to 14 and k from 1 to 5
    (k above the closed rows too): top_rows keeps a stable sort's first k closed rows; a
    later-row tie-break or k + 1 (planted) does not."""
    torch.manual_seed(5)
    same = []
    for n in range(15):
        for k in range(1, 6):
            scores = torch.randint(-2, 3, (2, 8, n)).float()
            closed = torch.rand(2, 8, n) < 0.7
            same.append(torch.equal(pick(scores, closed, k), _stable_top(scores, closed, k)))
    assert all(same) if equal else not all(same)


@pytest.mark.parametrize("fault", FAULTS)
def test_a_planted_fault_fails_against_transformers(tiny, fault, monkeypatch):
    model, folder = tiny
    plant, layer = FAULTS[fault]
    plant(monkeypatch)
    assert _error(model, folder, layer) > 1e-3


@pytest.mark.parametrize("layer", [0, 1, 2])
def test_eight_cached_decode_steps_equal_transformers_with_its_cache(tiny, layer):
    """After the padded prompt, 8 one-token steps: windows close within them (CSA's every 4
    tokens, HCA's at the 8th); each step's y, and the pooled rows at the end, equal
    transformers' with its cache (its sliding, buffer, overlap and compressed states)."""
    model, folder = tiny
    ids, keep = _prompt()
    ours = read_layer(folder, layer)
    with torch.no_grad():
        cache = model(input_ids=ids, attention_mask=keep, use_cache=True).past_key_values
        x, _ = _hooked(model, layer, input_ids=ids, attention_mask=keep, use_cache=False)
        _, past, past_keep, state = ours(x, keep)
    for step in range(8):
        keep = torch.cat([keep, torch.ones(2, 1, dtype=torch.long)], 1)
        x1, y1 = _hooked(model, layer, input_ids=torch.tensor([[5 + step], [9]]),
                         past_key_values=cache, use_cache=True, attention_mask=keep)
        (y, past, past_keep, state), tied = with_ties(
            ours, x1, positions=torch.full((2, 1), LENGTH + step), past=past,
            past_keep=past_keep, state=state)
        assert float((y - y1).abs().masked_fill(tied.unsqueeze(-1), 0).max()) <= 2e-5, step
    held = getattr(cache.layers[layer], "compressed_kv", {})
    for name, rows in held.items():
        assert torch.allclose(state[f"{name}.compressed_kv"], rows, atol=1e-6), name


def test_bad_input_is_a_short_error(tiny, tmp_path):
    _, folder = tiny
    with pytest.raises(UsageError, match="--layer 9 is out of range"):
        read_layer(folder, 9)
    with pytest.raises(UsageError, match="without a Hugging Face config.json"):
        read_layer(tmp_path, 0)
    with pytest.raises(UsageError, match="o_groups 3 must divide"):
        deepseek_v4.shape_from_config({**_config().to_dict(), "o_groups": 3}, 0)


def test_a_cached_decode_step_equals_transformers_with_its_cache(tiny):
    """Prefill the padded prompt, then one token: y and the sliding cache (the last window - 1
    rotated key = value rows) equal transformers' with its DynamicCache."""
    model, folder = tiny
    ids, keep = _prompt()
    ours = read_layer(folder, 0)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=keep, use_cache=True)
        x, _ = _hooked(model, 0, input_ids=ids, attention_mask=keep, use_cache=False)
        _, present, present_keep, _ = ours(x, keep)
    cache = out.past_key_values
    assert torch.allclose(present, cache.layers[0].keys, atol=1e-6)
    step = torch.tensor([[5], [9]])
    x1, y1 = _hooked(model, 0, input_ids=step, past_key_values=cache, use_cache=True,
                     attention_mask=torch.cat([keep, torch.ones(2, 1, dtype=torch.long)], 1))
    with torch.no_grad():
        y, after, _, _ = ours(x1, positions=torch.full((2, 1), LENGTH), past=present,
                              past_keep=present_keep)
    assert float((y - y1).abs().max()) <= 2e-5
    assert after.shape[2] == 7 and torch.equal(after[:, :, :-1], present[:, :, 1:])


def test_torchscript_of_the_layer_equals_eager(tiny, tmp_path):
    """torch.jit.script compiles the layer (full sequence and cached step); saved and loaded,
    it gives the eager layer's y and cache."""
    model, folder = tiny
    x, keep, expected = _transformers_y(model, 0)
    eager = read_layer(folder, 0)
    torch.jit.script(eager).save(str(tmp_path / "model.pt"))
    loaded = torch.jit.load(str(tmp_path / "model.pt"))
    with torch.no_grad():
        y, present, present_keep, _ = loaded(x, keep)
        step = loaded(x[:, -1:], None, torch.full((2, 1), LENGTH), present, present_keep)
        want = eager(x[:, -1:], None, torch.full((2, 1), LENGTH), *eager(x, keep)[1:3])
    rows = keep.bool()
    assert float((y - expected)[rows].abs().max()) <= 2e-5
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(step[:3], want[:3]))


@pytest.mark.parametrize("layer", [1, 2])
def test_torchscript_of_a_compressed_layer_equals_eager(tiny, layer, tmp_path):
    """The compressed layers script too (their state a dict of tensors): the full sequence,
    then a decode step that closes a window, as the eager layer gives them."""
    model, folder = tiny
    x, keep, expected = _transformers_y(model, layer)
    eager = read_layer(folder, layer)
    torch.jit.script(eager).save(str(tmp_path / "model.pt"))
    loaded = torch.jit.load(str(tmp_path / "model.pt"))
    with torch.no_grad():
        ours, want = loaded(x, keep), eager(x, keep)
        for _ in range(8):
            step = x[:, -1:]
            positions = torch.full((2, 1), ours[1].size(2) + LENGTH)
            ours = loaded(step, None, positions, ours[1], ours[2], ours[3])
            want = eager(step, None, positions, want[1], want[2], want[3])
    tied = with_ties(eager, x, keep)[1]
    rows = keep.bool() & ~tied
    assert float((loaded(x, keep)[0] - expected)[rows].abs().max()) <= 2e-5
    assert torch.allclose(ours[0], want[0], atol=1e-6)
    assert ours[3].keys() == want[3].keys()
    assert all(torch.allclose(ours[3][k], want[3][k], atol=1e-6) for k in want[3])
