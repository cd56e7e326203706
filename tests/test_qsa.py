"""Qwen4-exp's QSA (kinds/qsa/) against transformers' own ``Qwen4ExpTextAttention``: a tiny
random qwen4_exp_text checkpoint (save_pretrained here), its indexed layer exported with
--weights DIR --layer 3, on a left-padded batch of 40 tokens whose queries see up to 10
complete blocks of 4 keys and keep 2 (the selection acts): the full sequence, cached decode
against transformers' cache (keys, values, indexer keys) and static-cache decode, eager,
TorchScript and ONNX (the form qsa-masked, run by ONNX Runtime). Planted faults, one per
feature, fail: in the eager layer against transformers, in the ONNX graph the check;
GatedDeltaNet layers are rows of --layers all; what is not built is one line."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import faults
from hf_decode import capture, decode
from mha_export import check_parity, export_to, export_torchscript
from mha_export.artifact import read_artifact
from mha_export.cli.commands import cli
from mha_export.comparison.runner import positions
from mha_export.check.runners.ort import OrtRunner
from mha_export.comparison.torch_runners import TorchScriptRunner
from mha_export.config import MHAConfig
from mha_export.errors import UsageError
from mha_export.kinds.qsa import indexer as qsa_indexer, layer as qsa_layer
from mha_export.kinds.registry import build_module
from mha_export.weights.huggingface import read_layer

transformers = pytest.importorskip("transformers")

HV, LAYER, B, L, PREFILL = 16, 3, 3, 40, 30
INDEX = dict(indexer_n_heads=8, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=8,
             indexer_compress_ratio=4)  # block_topk 2
CONFIG = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=HV,
              num_hidden_layers=4, vocab_size=60, max_position_embeddings=128,
              initializer_range=0.2, linear_num_key_heads=2, linear_num_value_heads=4,
              linear_key_head_dim=8, linear_value_head_dim=8, moe_intermediate_size=16,
              shared_expert_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
              hc_count=2, hc_lowrank=8, rope_parameters={
                  "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
              **INDEX)


@pytest.fixture(scope="module")
def qwen4(tmp_path_factory):
    """(model, folder): the norms of its attention and indexer randomised (they start at 0
    and are read as 1 + w: w read as is would pass on fresh weights)."""
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model("qwen4_exp_text", **CONFIG)
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="eager").eval()
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for key, p in model.named_parameters():
            if re.search(r"\.self_attn\..*(norm|layernorm)\.weight$", key):
                p.add_(torch.randn(p.shape, generator=g) * 0.5)
    folder = tmp_path_factory.mktemp("qwen4") / "ckpt"
    model.save_pretrained(folder)
    return model, folder


def _batch():
    ids = torch.randint(0, 60, (B, L), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(B, L, dtype=torch.long)
    mask[1, :3] = 0
    mask[2, :13] = 0  # left padding: the rows' blocks start at different slots
    return ids, mask, torch.from_numpy(positions(mask.numpy()))


def _full(model):
    """transformers' (x, y) of the layer over the batch."""
    ids, mask, pos = _batch()
    calls, handle = capture(model.model.layers[LAYER].self_attn)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=pos)
    handle.remove()
    return calls[0]


def _eager(folder):
    fields, state, _ = read_layer(folder, LAYER)
    module = build_module(MHAConfig(**fields))
    module.load_state_dict(state)
    return module


def _eager_runner(module):
    def run(feeds):
        args = {k: torch.as_tensor(feeds[k]) for k in ("x", "attention_mask", "position_ids")}
        past = [torch.as_tensor(feeds[k]) if k in feeds else None
                for k in ("past_key", "past_value")]
        with torch.no_grad():
            y, k, v = module.attend(args["x"], args["attention_mask"], *past,
                                    args["position_ids"])
        return {"y": y.numpy(), "present_key": k.numpy(), "present_value": v.numpy()}
    return run


def _runner(fmt, folder, tmp_path, **call):
    if fmt == "eager":
        return _eager_runner(_eager(folder))
    if fmt == "onnx":
        art = export_to("onnx", weights=folder, layer=LAYER, output=tmp_path / "onnx",
                        validate=False, **call).path
        return OrtRunner(read_artifact(art).signature, art / "model.onnx", threads=1).run
    art = export_torchscript(weights=folder, layer=LAYER, output=tmp_path / "ts",
                             validate=False, **call).path
    runner = TorchScriptRunner(read_artifact(art).signature, art / "model.pt")
    return runner.run


def _worst(got, want, rows) -> float:
    assert np.isfinite(got).all()
    return float(np.abs(got - want)[rows].max())


def test_the_selection_acts_on_this_batch(qwen4):
    """transformers' y differs from the same layer without its indexer from the 12th real
    token on (3 complete blocks, 2 kept): the proofs below cover the sparse path."""
    model, folder = qwen4
    x, want = _full(model)
    module = _eager(folder)
    module.indexer.topk = 10**6  # every complete block kept: dense
    _, mask, pos = _batch()
    y = _eager_runner(module)({"x": x, "attention_mask": mask.numpy(),
                               "position_ids": pos.numpy()})["y"]
    diff = np.abs(y - want).max(axis=-1)  # (B, L)
    assert diff[0, :11].max() < 1e-5 and diff[0, 11:].min() > 1e-3


@pytest.mark.parametrize("fmt", ["eager", "torchscript", "onnx"])
def test_full_sequence_equals_transformers(qwen4, fmt, tmp_path):
    model, folder = qwen4
    x, want = _full(model)
    _, mask, pos = _batch()
    run = _runner(fmt, folder, tmp_path, attention_mask=True)
    got = run({"x": x, "attention_mask": mask.numpy(), "position_ids": pos.numpy()})["y"]
    assert _worst(got, want, mask.numpy().astype(bool)) <= 2e-5


def _decode(run, model):
    """Prefill PREFILL tokens, then single steps, in transformers and through ``run``: the
    worst y difference and our final cache; transformers' cache of the layer."""
    ids, mask, pos = _batch()
    calls, cache = decode(model, model.model.layers[LAYER].self_attn, ids, mask, pos, PREFILL)
    past, start, worst = {}, 0, 0.0
    for x, want in calls:
        end = start + x.shape[1]
        out = run({"x": x, "attention_mask": mask[:, :end].numpy(),
                   "position_ids": pos[:, start:end].numpy(), **past})
        worst = max(worst, _worst(out["y"], want, mask[:, start:end].numpy().astype(bool)))
        past = {"past_key": out["present_key"], "past_value": out["present_value"]}
        start = end
    return worst, past, cache.layers[LAYER]


@pytest.mark.parametrize("fmt", ["eager", "torchscript", "onnx"])
def test_cached_decode_equals_transformers_with_its_cache(qwen4, fmt, tmp_path):
    """y of every step, and the cache: keys, values and the raw index keys (each kv head's
    value then the index key) equal transformers' keys, values and indexer_keys."""
    model, folder = qwen4
    run = _runner(fmt, folder, tmp_path, kv_cache=True)
    if fmt != "eager":  # the signature's empty past first
        empty = {"past_key": np.zeros((B, 2, 0, HV), np.float32),
                 "past_value": np.zeros((B, 2, 0, HV + 16), np.float32)}
        first = run
        run = lambda feeds: first({**empty, **feeds})  # noqa: E731
    worst, past, theirs = _decode(run, model)
    assert worst <= 2e-5
    real = _batch()[1].numpy().astype(bool)
    pairs = [(past["past_key"], theirs.keys), (past["past_value"][..., :HV], theirs.values),
             (past["past_value"][:, :1, :, HV:], theirs.indexer_keys[:, None])]
    for ours, cached in pairs:
        assert ours.shape == tuple(cached.shape)
        assert _worst(ours.transpose(0, 2, 1, 3), cached.numpy().transpose(0, 2, 1, 3),
                      real) <= 2e-5


def _static_runner(module, capacity: int = 48):
    """The static-cache call over app-owned buffers (no attention mask: rows without padding
    compare)."""
    keys, values = torch.zeros(B, 2, capacity, HV), torch.zeros(B, 2, capacity, HV + 16)
    lengths = torch.zeros(B, dtype=torch.long)

    def run(feeds):
        nonlocal lengths
        x, pos = torch.as_tensor(feeds["x"]), torch.as_tensor(feeds["position_ids"])
        with torch.no_grad():
            y, _, _ = module.forward_static(x, keys, values, lengths, pos)
        lengths = lengths + x.size(1)
        return {"y": y.numpy(), "present_key": keys[:, :, :int(lengths[0])].numpy(),
                "present_value": values[:, :, :int(lengths[0])].numpy()}
    return run


def _onnx_static_runner(folder, tmp_path, capacity: int = 48):
    """The ONNX static-cache model over buffers the test keeps, fed back each call."""
    art = export_to("onnx", weights=folder, layer=LAYER, output=tmp_path / "static",
                    validate=False, static_cache=True).path
    session = OrtRunner(read_artifact(art).signature, art / "model.onnx", threads=1)
    state = {"past_key": np.zeros((B, 2, capacity, HV), np.float32),
             "past_value": np.zeros((B, 2, capacity, HV + 16), np.float32),
             "past_lengths": np.zeros(B, np.int64)}

    def run(feeds):
        out = session.run({"x": feeds["x"], "position_ids": feeds["position_ids"], **state})
        state.update(past_key=out["present_key"], past_value=out["present_value"],
                     past_lengths=state["past_lengths"] + feeds["x"].shape[1])
        end = int(state["past_lengths"][0])
        return {"y": out["y"], "present_value": out["present_value"][:, :, :end]}
    return run


@pytest.mark.parametrize("fmt", ["eager", "onnx"])
def test_static_cache_decode_of_an_unpadded_row_equals_transformers(qwen4, fmt, tmp_path):
    """The static call (buffers written in place at past_lengths): row 0 (no padding) through
    prefill and single steps, y and the cache against transformers'."""
    model, folder = qwen4
    ids, mask, pos = _batch()
    calls, cache = decode(model, model.model.layers[LAYER].self_attn, ids, mask, pos, PREFILL)
    run, start = (_static_runner(_eager(folder)) if fmt == "eager"
                  else _onnx_static_runner(folder, tmp_path)), 0
    for x, want in calls:
        out = run({"x": np.asarray(x), "position_ids": pos[:, start:start + x.shape[1]].numpy()})
        assert _worst(out["y"][:1], want[:1], np.s_[:]) <= 2e-5
        start += x.shape[1]
    theirs = cache.layers[LAYER]
    assert _worst(out["present_value"][:1, :1, :, HV:], theirs.indexer_keys[:1, None].numpy(),
                  np.s_[:]) <= 2e-5


def _shifted_blocks(visible, c):
    block, complete, count = ORIGINAL_LAYOUT(visible, c)
    rank = torch.cumsum(visible[:, -1].long(), dim=-1) - 1
    return torch.where(block >= 0, torch.div(rank + 1, c, rounding_mode="floor"),
                       block), complete, count


def _late_blocks(visible, c):
    block, complete, count = ORIGINAL_LAYOUT(visible, c)
    return block, complete, count - 1


ORIGINAL_LAYOUT = qsa_indexer.block_layout
FAULTS = {  # feature -> how the eager layer is broken
    "indexer: top-k one short": lambda m, mp: setattr(m.indexer, "topk", 1),
    "indexer: the selection never acts": lambda m, mp: setattr(m.indexer, "topk", 10**6),
    "indexer: scores of the lowest kept": lambda m, mp: m.indexer.index_qk_proj.weight.data[
        :8 * 16].neg_(),
    "indexer: blocks start one key late": lambda m, mp: mp.setattr(
        qsa_layer, "block_layout", _shifted_blocks),
    "indexer norm: the block key's read as w, not 1 + w": lambda m, mp: setattr(
        m.indexer.k_layernorm, "offset", 0.0),
    "indexer norm: the index query's left out": lambda m, mp: setattr(
        m.indexer, "q_layernorm", torch.nn.Identity()),
    "rotary: index queries not rotated": lambda m, mp: setattr(m, "_rotate", lambda x, p: x),
    "rotary: blocks rotated one position late": lambda m, mp: mp.setattr(
        qsa_layer, "block_layout", _late_blocks),
    "norms: q/k norm read as w, not 1 + w": lambda m, mp: setattr(m.q_norm, "offset", 0.0),
    "output gate left out": lambda m, mp: setattr(m, "gated", False),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_planted_fault_fails_against_transformers(qwen4, fault, monkeypatch):
    """Each fault, planted in the eager layer, moves the full sequence's or the cached
    decode's y past the tolerance the proofs above hold."""
    model, folder = qwen4
    module = _eager(folder)
    FAULTS[fault](module, monkeypatch)
    x, want = _full(model)
    _, mask, pos = _batch()
    run = _eager_runner(module)
    full = _worst(run({"x": x, "attention_mask": mask.numpy(), "position_ids": pos.numpy()})[
        "y"], want, mask.numpy().astype(bool))
    cached, _, _ = _decode(run, model)
    assert max(full, cached) > 1e-3, (fault, full, cached)


@pytest.mark.parametrize("target", ["torchscript", "onnx"])
def test_layers_all_lists_every_layer(qwen4, tmp_path, target):
    """The GatedDeltaNet layers are rows saying why they are left to the model; the indexed
    layer is exported and passes its check."""
    from mha_export.fanout import export_layers
    _, folder = qwen4
    summary = export_layers(target, folder, "all", tmp_path / "run")
    assert summary.passed
    rows = json.loads((tmp_path / "run" / "layers.json").read_text())["layers"]
    assert [(r["layer"], r["status"]) for r in rows] == [
        (0, "not-attention"), (1, "not-attention"), (2, "not-attention"), (3, "pass")]
    assert all("GatedDeltaNet" in r["message"] for r in rows[:3])


def test_the_wrapper_reads_its_text_model(qwen4, tmp_path):
    """qwen4_exp: qwen4_exp_text's record from text_config, tensors under
    model.language_model. (its vision tower is not built here)."""
    from safetensors.torch import load_file, save_file
    _, folder = qwen4
    wrapper = tmp_path / "wrapper"
    wrapper.mkdir()
    text = json.loads((folder / "config.json").read_text())
    (wrapper / "config.json").write_text(json.dumps({"model_type": "qwen4_exp",
                                                     "text_config": text}))
    save_file({re.sub(r"^model\.", "model.language_model.", k): v for k, v in
               load_file(str(folder / "model.safetensors")).items()},
              str(wrapper / "model.safetensors"))
    (fa, sa, _), (fb, sb, _) = read_layer(folder, LAYER), read_layer(wrapper, LAYER)
    assert fa == fb and sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("target, call", [("aoti", "--attention-mask"),
                                          ("executorch", "--static-cache")])
def test_aoti_and_executorch_programs_pass_their_checks(qwen4, tmp_path, target, call):
    """The check's sweep runs up to 128 tokens: more complete blocks than a query keeps."""
    _, folder = qwen4
    r = CliRunner().invoke(cli, [target, "--weights", str(folder), "--layer", str(LAYER), call,
                                 "-o", str(tmp_path / "x")])
    assert r.exit_code == 0 and "PASS" in r.output, r.output


def test_a_linear_attention_layer_is_one_line_naming_the_indexed_ones(qwen4, tmp_path):
    _, folder = qwen4
    r = CliRunner().invoke(cli, ["onnx", "--weights", str(folder), "--layer", "1", "-o",
                                 str(tmp_path / "x")])
    assert r.exit_code == 2 and r.stderr.splitlines() == [
        "Error: --layer 1 is a linear_attention (GatedDeltaNet) layer, not softmax attention: "
        "the nearest are 3 (1 of its 4 layers are)"], r.stderr


@pytest.mark.parametrize("change, msg", [
    (dict(budget=6), "qsa budget 6 is not a multiple of its compress_ratio 4"),
    (dict(heads=0), "qsa heads must be a positive integer"),
    (dict(head_dim=4), "qsa head_dim 4 is narrower than rotary_dim 8"),
])
def test_bad_qsa_settings_are_one_line(change, msg):
    qsa = {"heads": 8, "head_dim": 16, "budget": 8, "compress_ratio": 4, **change}
    with pytest.raises(UsageError, match=msg):
        MHAConfig(dim=64, heads=4, kv_heads=2, rotary="half", rotary_dim=8, qsa=qsa)


@pytest.mark.parametrize("key, value, msg", [
    ("indexer_kv_heads", 2, "indexer_kv_heads is 2: Qwen4-exp's QSA has one index key head"),
    ("indexer_budget", None, "needs its QSA indexer's settings: indexer_budget not given"),
])
def test_a_config_json_without_a_usable_indexer_is_one_line(qwen4, tmp_path, key, value, msg):
    _, folder = qwen4
    config = json.loads((folder / "config.json").read_text())
    config[key] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").symlink_to(folder / "model.safetensors")
    r = CliRunner().invoke(cli, ["onnx", "--weights", str(tmp_path), "--layer", "3", "-o",
                                 str(tmp_path / "x")])
    assert r.exit_code == 2 and len(r.stderr.splitlines()) == 1 and msg in r.stderr, r.stderr


SWEEP = dict(seq_lens=[1, 5, 14], past_lens=[0, 13], batch_sizes=[1, 2], providers=["cpu"])
GRAPH_FAULTS = {  # planted in the exported graph (tests/faults.py); each fails the check
    "top-k one short": lambda p: faults.rope_initializer_set(p, "kept_k", [1]),
    "the indexer ignored": faults.qsa_indexer_ignored,
    "index scores negated (the lowest blocks kept)": lambda p: faults.rope_initializer_set(
        p, "index_score_div", -4.0),
    "blocks start one key late": faults.qsa_blocks_start_late,
    "blocks rotated one position late": faults.qsa_blocks_rotated_late,
    "block keys not normed": lambda p: faults.norm_skipped(p, "index_k_norm"),
    "the tail dropped": faults.qsa_tail_dropped,
}


@pytest.mark.parametrize("call", ["attention_mask", "kv_cache", "static_cache"])
def test_the_check_passes_on_every_call_of_the_onnx_export(qwen4, tmp_path, call):
    """The project's check (ONNX Runtime against the eager layer, random inputs) over lengths
    that cross block_topk complete blocks (14 and 13 + 14 keys: 3 and 6 blocks, 2 kept)."""
    _, folder = qwen4
    path = export_to("onnx", weights=folder, layer=LAYER, output=tmp_path / "a",
                     validate=False, **{call: True}).path
    assert check_parity(path, **SWEEP).passed


@pytest.mark.parametrize("fault", sorted(GRAPH_FAULTS))
def test_a_planted_graph_fault_fails_the_check(qwen4, tmp_path, fault):
    _, folder = qwen4
    path = export_to("onnx", weights=folder, layer=LAYER, output=tmp_path / "a",
                     validate=False, kv_cache=True).path
    GRAPH_FAULTS[fault](path / "model.onnx")
    assert not check_parity(path, **SWEEP).passed
