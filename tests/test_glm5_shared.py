"""GLM-5's shared-top-k layers (glm_moe_dsa, indexer_types "shared"): MLA without an indexer,
attending with the nearest earlier "full" layer's top-k selection, given as the input
``topk_indices`` (kinds/dsa/settings.py). Against transformers' own GlmMoeDsaAttention: a
left-padded prompt of 40 tokens (index_topk 4: the selection acts), full and cached decode with
its cache, ONNX (both cores) and TorchScript; `--layers all`; a planted fault per feature fails;
what cannot be built is one line."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from transformers import AutoConfig, AutoModelForCausalLM

import faults
from mha_export import check_parity, export_onnx, export_torchscript
from mha_export.artifact import read_artifact
from mha_export.check.runners.ort import OrtRunner
from mha_export.cli.commands import cli
from mha_export.comparison.runner import positions
from mha_export.comparison.torch_runners import TorchScriptRunner
from mha_export.config import MHAConfig
from mha_export.errors import UsageError

# layer 2's source is layer 0 (through layer 1), layer 4's layer 3
KINDS = ["full", "shared", "shared", "full", "shared"]
GLM5 = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=5,
            intermediate_size=32, vocab_size=60, max_position_embeddings=64,
            initializer_range=0.2, kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16,
            v_head_dim=24, q_lora_rank=48, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
            topk_group=1, moe_intermediate_size=16, first_k_dense_replace=1, index_topk=4,
            index_n_heads=8, index_head_dim=16, indexer_types=KINDS)
B, L, PREFILL = 3, 40, 34
FORMATS = ["onnx", "onnx-standard", "torchscript"]


@pytest.fixture(scope="module")
def glm5(tmp_path_factory):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("glm_moe_dsa", **GLM5),
                                             attn_implementation="eager").eval()
    folder = tmp_path_factory.mktemp("glm5") / "ckpt"
    model.save_pretrained(folder)
    return model, folder


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 60, (B, L), generator=g)
    mask = torch.ones(B, L, dtype=torch.long)
    mask[1, :5], mask[2, :13] = 0, 0  # left padding
    return ids, mask, torch.from_numpy(positions(mask.numpy()))


def _hook(model, layer: int):
    """Each call of the layer's attention: (x, the top-k it was given, y)."""
    calls = []

    def hook(module, args, kwargs, out):
        calls.append((kwargs["hidden_states"].numpy().copy(),
                      kwargs["prev_topk_indices"].long().numpy().copy(), out[0].numpy().copy()))
    return calls, model.model.layers[layer].self_attn.register_forward_hook(hook,
                                                                          with_kwargs=True)


def _export(fmt: str, folder, layer: int, output, **options):
    if fmt == "torchscript":
        art = export_torchscript(weights=folder, layer=layer, output=output, validate=False,
                                 **options).path
        return art, TorchScriptRunner(read_artifact(art).signature, art / "model.pt")
    form = "latent-expanded" if fmt == "onnx-standard" else None
    art = export_onnx(weights=folder, layer=layer, output=output, validate=False,
                      attention=form, **options).path
    return art, OrtRunner(read_artifact(art).signature, art / "model.onnx")


def _feeds(sig, **arrays):
    return {k: v for k, v in arrays.items() if k in sig.input_names}


def _close(got, want, rows, what):
    diff = np.abs(got - want)[rows]
    assert np.isfinite(got).all() and diff.max() <= 2e-5, (what, float(diff.max()))


def _full_error(model, folder, layer: int, output, fmt: str = "onnx") -> float:
    ids, mask, pos = _batch()
    calls, handle = _hook(model, layer)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=pos)
    handle.remove()
    (x, topk, want), = calls
    assert topk.shape == (B, L, 4)  # index_topk below the length: the selection acts
    art, runner = _export(fmt, folder, layer, output, attention_mask=True)
    got = runner.run(_feeds(read_artifact(art).signature, x=x, attention_mask=mask.numpy(),
                            topk_indices=topk, position_ids=pos.numpy()))["y"]
    return float(np.abs(got - want)[mask.numpy().astype(bool)].max())


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("layer", [1, 2])
def test_a_shared_layer_equals_transformers_on_a_padded_prompt(glm5, fmt, layer, tmp_path):
    model, folder = glm5
    assert _full_error(model, folder, layer, tmp_path / "a", fmt) <= 2e-5


def test_the_given_selection_acts(glm5, tmp_path):
    """Another layer's selection (layer 3's own) gives another y: the input is read."""
    model, folder = glm5
    ids, mask, pos = _batch()
    calls, handle = _hook(model, 2)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=pos)
    handle.remove()
    (x, topk, want), = calls
    art, runner = _export("onnx", folder, 2, tmp_path / "a", attention_mask=True)
    other = np.minimum(topk + 1, np.arange(L)[None, :, None])  # each pick one key later
    got = runner.run(dict(x=x, attention_mask=mask.numpy(), topk_indices=other,
                          position_ids=pos.numpy()))["y"]
    assert np.abs(got - want)[mask.numpy().astype(bool)].max() > 1e-3


def _decode(model, ids, mask, pos):
    """transformers' model over the batch: a prefill of PREFILL tokens, then one-token steps
    with its cache; returns the cache."""
    cache = model(input_ids=ids[:, :PREFILL], attention_mask=mask[:, :PREFILL],
                  position_ids=pos[:, :PREFILL], use_cache=True).past_key_values
    for t in range(PREFILL, L):
        cache = model(input_ids=ids[:, t:t + 1], attention_mask=mask[:, :t + 1],
                      position_ids=pos[:, t:t + 1], past_key_values=cache,
                      use_cache=True).past_key_values
    return cache


@pytest.mark.parametrize("fmt", FORMATS)
def test_cached_decode_equals_transformers_with_its_cache(glm5, fmt, tmp_path):
    """Prefill 34 tokens, then single-token steps with transformers' cache (each step given
    the source layer's top-k over the whole cache), and the exported decode model's: y at every
    real position and the final latent and rotated-key caches."""
    model, folder = glm5
    ids, mask, pos = _batch()
    calls, handle = _hook(model, 2)
    with torch.no_grad():
        cache = _decode(model, ids, mask, pos)
    handle.remove()
    art, runner = _export(fmt, folder, 2, tmp_path / "kv", kv_cache=True)
    sig = read_artifact(art).signature
    out = {f"present_{n}": np.zeros(sig.cache_buffer(f"past_{n}", B, 0), np.float32)
           for n in ("key", "value")}
    start = 0
    for x, topk, want in calls:
        end = start + x.shape[1]
        assert topk.shape[-1] == min(4, end)
        out = runner.run(_feeds(sig, x=x, attention_mask=mask[:, :end].numpy(),
                                past_key=out["present_key"], past_value=out["present_value"],
                                topk_indices=topk, position_ids=pos[:, start:end].numpy()))
        _close(out["y"], want, mask[:, start:end].numpy().astype(bool), f"{fmt} {start}-{end}")
        start = end
    theirs = cache.layers[2]
    real = mask.numpy().astype(bool)
    for ours, cached in ((out["present_key"], theirs.keys), (out["present_value"],
                                                              theirs.values)):
        diff = np.abs(ours - cached.numpy()).transpose(0, 2, 1, 3)[real]
        assert diff.max() <= 2e-5, float(diff.max())


def _selections(model, layer: int, run) -> list:
    """Each call of the layer's attention under ``run()``: (its x, the top-k its module
    returned (B, T, K), its indexer's scores (B, T, S) (torch.topk's input, read there))."""
    calls, scores, real_topk = [], [], torch.Tensor.topk
    attention = model.model.layers[layer].self_attn
    inside = []  # set while the indexer runs (the MoE router calls topk too)

    def topk(self, *args, **kwargs):
        if inside:
            scores.append(self.float().numpy().copy())
        return real_topk(self, *args, **kwargs)

    def hook(module, args, kwargs, out):
        calls.append((kwargs["hidden_states"].numpy().copy(), out[2].long().numpy().copy(),
                      scores.pop()))
    handles = [attention.indexer.register_forward_pre_hook(lambda m, a: inside.append(1)),
               attention.indexer.register_forward_hook(lambda m, a, o: inside.clear()),
               attention.register_forward_hook(hook, with_kwargs=True)]
    torch.Tensor.topk = topk
    try:
        with torch.no_grad():
            run()
    finally:
        torch.Tensor.topk = real_topk
        for h in handles:
            h.remove()
    return calls


def _same_kept(ours, theirs, scores, mask, start: int) -> tuple[int, int]:
    """Each real query's kept keys it can see, as a set: ours equal transformers'. A query
    whose k-th and (k+1)-th visible scores are equal is not compared (torch.topk's pick between
    them is unspecified). Returns (queries compared, queries with such a tie)."""
    assert ours.shape == theirs.shape and ours.dtype == np.int64
    b, t, k = ours.shape
    keys = scores.shape[-1]
    visible = ((np.arange(keys)[None, None, :] <= start + np.arange(t)[None, :, None])
               & mask[:, None, :keys].astype(bool))  # (B, T, S)
    kept = []
    for picks in (ours, theirs):
        sets = np.zeros((b, t, keys), bool)
        np.put_along_axis(sets, picks, True, axis=-1)
        kept.append(sets & visible)  # (B, T, S)
    ranked = -np.sort(-np.where(visible, scores, -np.inf), axis=-1)  # (B, T, S) best first
    tie = (visible.sum(-1) > k) & (ranked[..., k - 1] == ranked[..., min(k, keys - 1)])
    rows = mask[:, start:start + t].astype(bool) & ~tie  # (B, T): the compared queries
    assert (kept[0] == kept[1]).all(-1)[rows].all(), np.argwhere(
        ~(kept[0] == kept[1]).all(-1) & rows)[:3]
    return int(rows.sum()), int(tie.sum())


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_source_layers_selection_equals_transformers(glm5, fmt, tmp_path):
    """Layer 0 (the shared layers' source) exported outputs topk_indices: on the left-padded
    40-token prompt (index_topk 4), each real query's kept keys are transformers' own
    (GlmMoeDsaAttention's returned top-k), as sets; y too."""
    model, folder = glm5
    ids, mask, pos = _batch()
    (x, theirs, scores), = _selections(model, 0, lambda: model(
        input_ids=ids, attention_mask=mask, position_ids=pos))
    art, runner = _export(fmt, folder, 0, tmp_path / "a", attention_mask=True)
    sig = read_artifact(art).signature
    assert sig.output_names == ["y", "topk_indices"] and read_artifact(
        art).config.latent.index.feeds
    out = runner.run(_feeds(sig, x=x, attention_mask=mask.numpy(), position_ids=pos.numpy()))
    compared, ties = _same_kept(out["topk_indices"], theirs, scores, mask.numpy(), 0)
    assert theirs.shape == (B, L, 4) and compared >= 0.9 * int(mask.sum()), (compared, ties)


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_source_layers_cached_selection_equals_transformers(glm5, fmt, tmp_path):
    """Prefill 34 tokens, then single-token steps with transformers' cache: each call's
    selection over the whole cache (K = min(4, keys)) is transformers' own, as sets."""
    model, folder = glm5
    ids, mask, pos = _batch()
    calls = _selections(model, 0, lambda: _decode(model, ids, mask, pos))
    art, runner = _export(fmt, folder, 0, tmp_path / "kv", kv_cache=True)
    sig = read_artifact(art).signature
    out = {f"present_{n}": np.zeros(sig.cache_buffer(f"past_{n}", B, 0), np.float32)
           for n in ("key", "value")}
    start, compared = 0, 0
    for x, theirs, scores in calls:
        end = start + x.shape[1]
        out = runner.run(_feeds(sig, x=x, attention_mask=mask[:, :end].numpy(),
                                past_key=out["present_key"], past_value=out["present_value"],
                                position_ids=pos[:, start:end].numpy()))
        assert out["topk_indices"].shape == theirs.shape == (B, end - start, min(4, end))
        compared += _same_kept(out["topk_indices"], theirs, scores, mask.numpy(), start)[0]
        start = end
    assert compared >= 0.9 * int(mask.sum())


def test_layers_all_lists_every_layer_and_the_shared_ones_pass(glm5, tmp_path):
    from mha_export.fanout import check_layers, export_layers
    _, folder = glm5
    summary = export_layers("onnx", folder, "all", tmp_path / "run", validate=False)
    assert summary.passed
    rows = json.loads((tmp_path / "run" / "layers.json").read_text())["layers"]
    assert [(r["layer"], r["status"]) for r in rows] == [(i, "exported") for i in range(5)]
    for layer in (0, 3):  # the layers they read: their selection an output
        art = read_artifact(tmp_path / "run" / f"layer-{layer}")
        assert art.config.latent.index.feeds and "topk_indices" in art.signature.output_names
    for layer, source in ((1, 0), (2, 0), (4, 3)):
        config = read_artifact(tmp_path / "run" / f"layer-{layer}").config
        assert config.latent.index.source == source
        assert "topk_indices" in read_artifact(tmp_path / "run" / f"layer-{layer}"
                                               ).signature.input_names
    assert check_layers(tmp_path / "run", seq_lens=[3, 9], batch_sizes=[2]).passed


LATENT = dict(kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=24,
              q_lora_rank=48, index={"topk": 4, "heads": 8, "head_dim": 16, "source": 0})
SWEEP = dict(seq_lens=[1, 3, 9], past_lens=[0, 6], batch_sizes=[1, 2], providers=["cpu"])
# the layer they read: its own indexer, its selection an output (index feeds)
SOURCE = dict(LATENT, index={"topk": 4, "heads": 8, "head_dim": 16, "feeds": True})
SHARED_FAULTS = {"the key after each given one kept": faults.shared_topk_off_by_one,
                 "the given selection never acts": faults.shared_topk_ignored}


@pytest.mark.parametrize("fault", sorted(SHARED_FAULTS))
@pytest.mark.parametrize("call", ["masked", "kv-cache", "static-cache"])
def test_a_planted_shared_topk_fault_is_caught(tmp_path, fault, call):
    c = MHAConfig(dim=64, heads=4, max_seq_len=16, rotary="deinterleaving", latent=LATENT)
    path = export_onnx(c, tmp_path / "a", validate=False, attention_mask=call == "masked",
                       kv_cache=call == "kv-cache", static_cache=call == "static-cache").path
    assert check_parity(path, **SWEEP).passed
    SHARED_FAULTS[fault](path / "model.onnx")
    assert not check_parity(path, **SWEEP).passed


def _sources_of_transformers(model) -> dict[int, int]:
    """Each shared layer's source, as transformers' decoder loop decides it: the layer whose
    own (indexer) selection is the very tensor the shared layer is given."""
    made, given = {}, {}

    def hook(layer):
        def fn(module, args, kwargs, out):
            if module.indexer is not None:
                made[layer] = out[2]
            else:
                given[layer] = kwargs["prev_topk_indices"]
        return fn
    handles = [m.self_attn.register_forward_hook(hook(i), with_kwargs=True)
               for i, m in enumerate(model.model.layers)]
    ids, mask, pos = _batch()
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=pos)
    for h in handles:
        h.remove()
    return {layer: next(s for s, t in made.items() if t is topk)
            for layer, topk in given.items()}


def _sources_read(folder) -> dict[int, int]:
    from mha_export.weights.huggingface import read_layer
    read = {i: read_layer(folder, i)[0]["latent"]["index"] for i in range(len(KINDS))}
    return {i: index["source"] for i, index in read.items() if "source" in index}


def test_each_shared_layer_reads_the_source_transformers_gives_it(glm5, monkeypatch):
    """Layer 2 follows layer 1 (itself shared): its source is layer 0; layer 4's is layer 3.
    Planted: the first full layer named for every shared one (layer 4's then wrong)."""
    from mha_export.weights.families import deepseek
    model, folder = glm5
    assert _sources_of_transformers(model) == _sources_read(folder) == {1: 0, 2: 0, 4: 3}
    monkeypatch.setattr(deepseek, "topk_source", lambda s, layer: (
        None if s["indexer_types"][layer] == "full" else 0))
    assert _sources_read(folder) != _sources_of_transformers(model)


@pytest.mark.parametrize("kinds, layer, msg", [
    (["shared", "full"], 0, "layer 0 reuses an earlier layer's top-k selection (indexer_types "
                            "'shared'), but no earlier layer is 'full'"),
    (["full", "sparse"], 1, "layer 1: unknown indexer_types entry 'sparse' (full or shared)"),
])
def test_a_bad_indexer_types_entry_is_one_line_exit_2(tmp_path, kinds, layer, msg):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "glm_moe_dsa", "num_hidden_layers": 2, "hidden_size": 64,
        "num_attention_heads": 4, "indexer_types": kinds}))
    r = CliRunner().invoke(cli, ["onnx", "--weights", str(tmp_path), "--layer", str(layer),
                                 "-o", str(tmp_path / "x")])
    assert r.exit_code == 2 and r.stderr.splitlines() == [f"Error: {msg}"], r.stderr


def test_a_bad_source_is_one_line():
    with pytest.raises(UsageError, match="index source must be a layer index >= 0"):
        MHAConfig(dim=64, heads=4, latent={**LATENT, "index": {"topk": 4, "source": -1}})


@pytest.mark.parametrize("target, call", [("aoti", "kv-cache"), ("executorch", "static-cache")])
def test_aoti_and_executorch_pass_their_checks(tmp_path, target, call):
    """AOTInductor's growing-cache call and ExecuTorch's static-cache program (its cache
    inside), each given the selection, pass the parity check."""
    from mha_export import export_aoti, export_executorch
    c = MHAConfig(dim=64, heads=4, max_seq_len=16, latent=LATENT)
    export = export_aoti if target == "aoti" else export_executorch
    path = export(c, tmp_path / "a", validate=False, kv_cache=call == "kv-cache",
                  static_cache=call == "static-cache").path
    sweep = dict(SWEEP, batch_sizes=[1]) if target == "executorch" else SWEEP
    assert check_parity(path, **sweep).passed


@pytest.mark.parametrize("call", ["masked", "static-cache"])
def test_the_source_layer_on_aoti_passes_its_check(tmp_path, call):
    """AOTInductor's program of a layer whose selection shared layers read outputs it in every
    call (K = min(index_topk, keys) without a guard on the keys: the sweep's calls read 1 to 15),
    and its check passes, topk_indices compared."""
    from mha_export import export_aoti
    c = MHAConfig(dim=64, heads=4, max_seq_len=16, latent=SOURCE)
    path = export_aoti(c, tmp_path / "a", validate=False, attention_mask=call == "masked",
                       static_cache=call == "static-cache").path
    report = check_parity(path, **SWEEP)
    assert report.passed and "topk_indices" in {r.output for r in report.results}


def test_executorch_refuses_the_source_layer_in_one_line(tmp_path):
    from mha_export import export_executorch
    c = MHAConfig(dim=64, heads=4, max_seq_len=16, latent=SOURCE)
    with pytest.raises(UsageError, match="is not built for ExecuTorch: its indexer keeps each "
                                         "query's top keys by a stable sort"):
        export_executorch(c, tmp_path / "a", validate=False, static_cache=True)


def test_eval_runs_every_layer_inside_the_model(tmp_path):
    """eval of a tiny GLM-5 with every attention layer exported: layer 0, whose selection the
    shared layers 1 and 2 read, hands them its artifact's topk_indices (prefill and cached
    generation); layer 3 too; none left to the model, nothing a model would notice."""
    import hybrid
    from mha_export.model.eval import evaluate
    ckpt = hybrid.save_tiny_glm5(tmp_path / "ckpt")
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog, again and again. " * 4)
    d = evaluate(ckpt, text, 40, "all", generate=3, folder=tmp_path / "exports").to_dict()
    assert [x["layer"] for x in d["layers"]] == [0, 1, 2, 3]
    assert d["left_to_model"] == {}
    assert d["exported"]["kl_max"] < 1e-6 and d["generation"]["matched"] == 3
    assert all(x["rel"] < 1e-4 for x in d["layers"])


def test_eval_hands_the_shared_layers_the_exported_selection(tmp_path, monkeypatch):
    """Planted: the stand-in of layer 0 hands on its artifact's selection each one key earlier;
    the shared layers read it, and the model notices."""
    import hybrid
    from mha_export.model import eval as model_eval
    ckpt = hybrid.save_tiny_glm5(tmp_path / "ckpt")
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog, again and again. " * 4)
    passed = model_eval.ExportedAttention._passed
    monkeypatch.setattr(model_eval.ExportedAttention, "_passed", lambda self, given, own: tuple(
        (t - 1).clamp(min=0) if self.gives_topk else t for t in passed(self, given, own)))
    d = model_eval.evaluate(ckpt, text, 40, "all", folder=tmp_path / "exports").to_dict()
    assert d["left_to_model"] == {} and d["exported"]["kl_max"] > 1e-2


def test_the_cli_builds_a_shared_layer_and_checks_it(tmp_path):
    r = CliRunner().invoke(cli, [
        "onnx", "--heads", "4", "--dim", "64", "--kv-lora-rank", "32", "--q-lora-rank", "48",
        "--qk-rope-head-dim", "8", "--index-topk", "4", "--index-source", "0", "--kv-cache",
        "--max-seq-len", "16", "-o", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    art = read_artifact(tmp_path / "a")
    assert art.config.latent.index.source == 0 and art.signature.reads_topk
    r = CliRunner().invoke(cli, ["onnx", "--heads", "4", "--dim", "64", "--kv-lora-rank", "32",
                                 "--index-source", "0", "-o", str(tmp_path / "x")])
    assert r.exit_code == 2 and r.stderr.splitlines() == [
        "Error: --index-source needs --index-topk"], r.stderr
