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

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from mha_export import UsageError, export_onnx, export_torchscript
from mha_export.artifact import read_artifact
from mha_export.check.runners.ort import OrtRunner
from mha_export.check.runners.pytorch import TorchScriptRunner
from mha_export.check.sweep import positions
from mha_export.weights.families import FAMILIES, Settings, supported_types
from mha_export.weights.huggingface import _layer_pattern

COMMON = dict(num_hidden_layers=3, intermediate_size=32, vocab_size=60,
              max_position_embeddings=64)
MODELS = {
    "gpt2": dict(n_embd=64, n_head=4, n_layer=3, vocab_size=60, n_positions=64),
    "llama": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, **COMMON),
    "llama-mqa-llama3": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=1,
                             attention_bias=True, rope_parameters={
                                 "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 8}, **COMMON),
    "mistral": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                    sliding_window=4, **COMMON),  # shorter than the sequences below
    "qwen2": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, **COMMON),
    "gpt_neox": dict(hidden_size=64, num_attention_heads=4, rotary_pct=0.25, **COMMON),
}
LAYER = 1
B, L, PREFILL = 3, 11, 6


def _attention(model, kind: str, layer: int):
    if kind == "gpt2":
        return model.transformer.h[layer].attn
    if kind == "gpt_neox":
        return model.gpt_neox.layers[layer].attention
    return model.model.layers[layer].self_attn


@pytest.fixture(scope="module", params=sorted(MODELS))
def checkpoint(request, tmp_path_factory):
    name = request.param
    kind = name.split("-")[0]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(kind, **MODELS[name])).eval()
    folder = tmp_path_factory.mktemp(name) / "ckpt"
    model.save_pretrained(folder)
    return name, kind, model, folder


def _capture(model, kind):
    """Hooks recording every call's (input hidden states, attention output) of layer LAYER."""
    calls = []

    def hook(module, args, kwargs, out):
        x = kwargs.get("hidden_states", args[0] if args else None)
        calls.append((x.detach().clone().numpy(), out[0].detach().clone().numpy()))
    return calls, _attention(model, kind, LAYER).register_forward_hook(hook, with_kwargs=True)


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 60, (B, L), generator=g)
    mask = torch.ones(B, L, dtype=torch.long)
    mask[1, :3] = 0
    mask[2, :7] = 0  # left padding, longer than mistral's window before the real tokens
    return ids, mask, torch.from_numpy(positions(mask.numpy()))


def _feeds(sig, **arrays):
    return {k: v for k, v in arrays.items() if k in sig.input_names}


def _close(got, want, rows, what):
    diff = np.abs(got - want)[rows]
    assert np.isfinite(got).all() and diff.max() <= 2e-5, (what, float(diff.max()))


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_full_sequence_layer_equals_transformers(checkpoint, fmt, tmp_path):
    name, kind, model, folder = checkpoint
    ids, mask, pos = _batch()
    calls, handle = _capture(model, kind)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=pos)
    handle.remove()
    export = export_onnx if fmt == "onnx" else export_torchscript
    art = export(weights=folder, layer=LAYER, attention_mask=True, output=tmp_path / "a",
                 validate=False).path
    sig = read_artifact(art).signature
    runner = (OrtRunner(sig, art / "model.onnx") if fmt == "onnx"
              else TorchScriptRunner(sig, art / "model.pt"))
    x, want = calls[0]
    got = runner.run(_feeds(sig, x=x, attention_mask=mask.numpy(), position_ids=pos.numpy()))
    _close(got["y"], want, mask.numpy().astype(bool), f"{name} {fmt}")


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_cached_decode_equals_transformers_with_its_own_cache(checkpoint, fmt, tmp_path):
    """Prefill PREFILL tokens, then single-token steps, in transformers (its DynamicCache) and
    in the exported decode model (our present -> past), on a left-padded batch."""
    name, kind, model, folder = checkpoint
    ids, mask, pos = _batch()
    calls, handle = _capture(model, kind)
    with torch.no_grad():
        out = model(input_ids=ids[:, :PREFILL], attention_mask=mask[:, :PREFILL],
                    position_ids=pos[:, :PREFILL], use_cache=True)
        cache = out.past_key_values
        for t in range(PREFILL, L):
            cache = model(input_ids=ids[:, t:t + 1], attention_mask=mask[:, :t + 1],
                          position_ids=pos[:, t:t + 1], past_key_values=cache,
                          use_cache=True).past_key_values
    handle.remove()
    export = export_onnx if fmt == "onnx" else export_torchscript
    art = export(weights=folder, layer=LAYER, kv_cache=True, output=tmp_path / "kv",
                 validate=False).path
    artifact = read_artifact(art)
    sig, c = artifact.signature, artifact.config
    runner = (OrtRunner(sig, art / "model.onnx") if fmt == "onnx"
              else TorchScriptRunner(sig, art / "model.pt"))
    past = np.zeros((B, c.kv_heads, 0, c.head_dim), np.float32)
    present = {"present_key": past, "present_value": past}
    start = 0
    for x, want in calls:
        end = start + x.shape[1]
        present = runner.run(_feeds(sig, x=x, attention_mask=mask[:, :end].numpy(),
                                    past_key=present["present_key"],
                                    past_value=present["present_value"],
                                    position_ids=pos[:, start:end].numpy()))
        rows = mask[:, start:end].numpy().astype(bool)
        _close(present["y"], want, rows, f"{name} {fmt} tokens {start}-{end}")
        start = end
    assert start == L
    layer_cache = cache.layers[LAYER]
    if layer_cache.keys.shape[2] == L:  # a sliding-window cache keeps only the window
        real = mask.numpy().astype(bool)
        for ours, theirs in ((present["present_key"], layer_cache.keys),
                             (present["present_value"], layer_cache.values)):
            diff = np.abs(ours - theirs.numpy()).transpose(0, 2, 1, 3)[real]
            assert diff.max() <= 2e-5, (name, "present vs transformers' cache")


def test_config_is_read_from_config_json_in_both_spellings(checkpoint, tmp_path):
    name, kind, model, folder = checkpoint
    c = read_artifact(export_onnx(weights=folder, layer=LAYER, output=tmp_path / "a",
                                  validate=False).path).config
    expect = {"gpt2": (4, 4, None, "none"), "llama": (4, 2, None, "half"),
              "llama-mqa-llama3": (4, 1, None, "half"), "mistral": (4, 2, 4, "half"),
              "qwen2": (4, 2, None, "half"), "gpt_neox": (4, 4, None, "half")}[name]
    assert (c.heads, c.kv_heads, c.sliding_window, c.rotary) == expect
    if name == "gpt_neox":
        assert c.rotary_dim == 4  # 25% of 16
    if name == "llama-mqa-llama3":
        assert c.rope_scaling["rope_type"] == "llama3" and c.rope_theta == 500000.0
        assert c.qkv_bias and c.out_bias


def test_transformers_4x_spellings(tmp_path):
    """rope_theta / rope_scaling / rotary_pct / rotary_emb_base, as 4.x checkpoints write them."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("gpt_neox", **MODELS["gpt_neox"]))
    model.save_pretrained(tmp_path / "neox")
    cfg = json.loads((tmp_path / "neox" / "config.json").read_text())
    cfg.pop("rope_parameters")
    cfg.update(rotary_pct=0.5, rotary_emb_base=1000.0, rope_scaling={"type": "linear", "factor": 2.0})
    (tmp_path / "neox" / "config.json").write_text(json.dumps(cfg))
    c = read_artifact(export_onnx(weights=tmp_path / "neox", layer=0, output=tmp_path / "a",
                                  validate=False).path).config
    assert (c.rotary_dim, c.rope_theta, c.rope_scaling) == (8, 1000.0, {"rope_type": "linear",
                                                                         "factor": 2.0})


def test_sharded_and_bin_checkpoints_read_only_the_layer(tmp_path, monkeypatch):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **MODELS["llama"]))
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


def test_readme_table_names_exactly_the_registrys_model_types():
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = text[text.index("| `model_type` |"):].split("\n\n")[0].splitlines()[2:]
    named = [t for row in table for t in re.findall(r"`(\w+)`", row.split("|")[1])]
    assert sorted(named) == sorted(FAMILIES)


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


HEADS_64 = {"hidden_size": 64, "num_attention_heads": 4}


@pytest.mark.parametrize("kind, config, layer, expect", [
    ("gpt2", {}, 0, dict(heads=12, dim=768, head_dim=64)),
    ("llama", HEADS_64, 0, dict(qkv_bias=False, out_bias=False, rotary_dim=16, kv_heads=4,
                                rope_theta=10000.0)),
    ("gpt_neox", HEADS_64, 0, dict(qkv_bias=True, out_bias=True, rope_theta=10000.0)),
    ("qwen2", {**HEADS_64, "use_sliding_window": True}, 28, dict(qkv_bias=True, out_bias=False,
                                                                sliding_window=4096)),
])
def test_a_key_config_json_omits_takes_the_records_default(kind, config, layer, expect):
    """The registry alone, no checkpoint: omitted keys come from the record's defaults."""
    family = FAMILIES[kind]
    fields = family.fields(Settings(config, family.defaults), layer)
    assert {k: fields[k] for k in expect} == expect


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
                      "layer": 2, "max_position_embeddings": 64}
    r = CliRunner().invoke(cli, ["onnx", "--weights", str(folder), "--layer", "2",
                                 "--kv-heads", "4", "-o", str(tmp_path / "bad")])
    assert r.exit_code == 2 and "--kv-heads 4 contradicts" in r.stderr


def test_bfloat16_checkpoints_are_upcast_for_a_float32_export(tmp_path):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("mistral", **MODELS["mistral"]))
    model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    r = export_onnx(weights=tmp_path / "bf16", layer=0, output=tmp_path / "a", kv_cache=True)
    assert r.passed
    from safetensors.torch import load_file
    stored = load_file(str(tmp_path / "a" / "weights.safetensors"))
    want = model.model.layers[0].self_attn.q_proj.weight.float()
    assert all(t.dtype == torch.float32 for t in stored.values())
    assert torch.equal(stored["W_query.weight"], want)  # bf16 -> fp32 is exact


def _saved(tmp_path, kind, name, **changes):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(kind, **MODELS[kind]))
    model.save_pretrained(tmp_path / name)
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
    assert (again / "weights.safetensors").read_bytes() == (first / "weights.safetensors").read_bytes()


def test_legacy_bin_loads_and_corrupt_files_are_one_line_errors(tmp_path):
    folder = _saved(tmp_path, "llama", "legacy")
    model = AutoModelForCausalLM.from_pretrained(folder)
    (folder / "model.safetensors").unlink()
    torch.save(model.state_dict(), folder / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    assert export_onnx(weights=folder, layer=0, output=tmp_path / "a").passed
    (folder / "pytorch_model.bin").unlink()
    (folder / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(UsageError, match="not a readable checkpoint"):
        export_onnx(weights=folder, layer=0, output=tmp_path / "b")


@pytest.mark.parametrize("change, msg", [
    (dict(hidden_size=None), "missing or malformed attention setting"),
    (dict(layer_types=["full_attention"]), "layer_types has no entry for layer 1"),
    (dict(num_hidden_layers=None), "no layer count"),
])
def test_malformed_config_json_is_a_clear_error(tmp_path, change, msg):
    folder = _saved(tmp_path, "mistral", "bad", **change)
    with pytest.raises(UsageError, match=msg):
        export_onnx(weights=folder, layer=1, output=tmp_path / "x")
    (folder / "config.json").write_text("[1, 2]")
    with pytest.raises(UsageError):
        export_onnx(weights=folder, layer=1, output=tmp_path / "x")
