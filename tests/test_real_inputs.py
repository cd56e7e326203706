"""Real inputs (issue 32): `capture` keeps what each chosen attention layer of the real model
receives (equal to transformers' own hidden states after the input norm), and `check --inputs`
adds those as real cases for every call kind, labelled as real, with the lossy steps' costs on
them reported apart; a real defect on a real layer fails; bad input is one line, exit 2."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.numpy import load_file

from conftest import REAL_LAYERS, REAL_TEXT, REAL_TOKENS, SMOLLM2_LAYERS
from mha_export import MHAConfig, check_parity, export_onnx
from mha_export.check.report import format_report
from mha_export.cli.commands import cli
from mha_export.lossy.projections.rtn import QuantSpec

SWEEP = dict(seq_lens=[1, 7, 64], batch_sizes=[1, 2], past_lens=[0, 5])
KINDS = {"full": {}, "attention_mask": {"attention_mask": True}, "kv_cache": {"kv_cache": True},
         "static_cache": {"static_cache": True}}


def test_capture_equals_transformers_hidden_states_after_the_input_norm(smollm2_model,
                                                                         smollm2_inputs):
    captured = load_file(str(smollm2_inputs))
    model = smollm2_model.model
    ids = torch.from_numpy(captured["token_ids"])
    assert ids.shape == (2, REAL_TOKENS)
    with torch.inference_mode():
        hidden = model(input_ids=ids, output_hidden_states=True).hidden_states
    for layer in REAL_LAYERS:
        norm = model.model.layers[layer].input_layernorm
        with torch.inference_mode():
            want = norm(hidden[layer]).numpy()
        np.testing.assert_array_equal(captured[f"layers.{layer}.x"], want)


def test_capture_takes_the_texts_first_tokens_with_the_tokenizers_defaults(smollm2_model,
                                                                          smollm2_inputs):
    ids = smollm2_model.tokenizer(open(REAL_TEXT, encoding="utf-8").read())["input_ids"]
    np.testing.assert_array_equal(load_file(str(smollm2_inputs))["token_ids"].ravel(),
                                  ids[:2 * REAL_TOKENS])


@pytest.fixture(scope="module")
def real_layer(smollm2_gguf, tmp_path_factory):
    """Layer 5 of SmolLM2 from its .gguf, per call kind (exported once)."""
    out = tmp_path_factory.mktemp("smol")
    return {kind: export_onnx(weights=smollm2_gguf, layer=5, output=out / kind, validate=False,
                              **flags).path for kind, flags in KINDS.items()}


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_call_kind_of_a_real_layer_passes_on_random_and_real_inputs(real_layer, kind,
                                                                         smollm2_inputs):
    report = check_parity(real_layer[kind], inputs=smollm2_inputs, **SWEEP)
    assert report.passed, format_report(report)
    real = [r for r in report.results if r.inputs == "real"]
    assert {r.runner for r in real} >= {"eager-fp32", "ort-cpu"}
    assert all(r.case.batch == 2 and r.case.seq == REAL_TOKENS for r in real)
    assert any(r.inputs == "random" for r in report.results)
    text = format_report(report)
    assert "ort-cpu [real inputs]" in text and "real inputs:" in format_report(report, True)
    assert report.to_dict()["real_inputs"] == str(smollm2_inputs)


def test_every_layer_exports_from_the_gguf_and_passes_on_random_and_real_inputs(
        smollm2_gguf, smollm2_inputs, tmp_path):
    """All 30 layers, the full-sequence call (every call kind: layer 5 above, and
    benchmarks/real_layers.py for every layer), a short sweep."""
    for layer in range(SMOLLM2_LAYERS):
        art = export_onnx(weights=smollm2_gguf, layer=layer, output=tmp_path / str(layer),
                          validate=False).path
        report = check_parity(art, inputs=smollm2_inputs, seq_lens=[1, 64], batch_sizes=[2])
        assert report.passed, (layer, format_report(report))
        assert {r.inputs for r in report.results} == {"random", "real"}


def _value_rows_off(path, head: int = 1, factor: float = 1.01) -> None:
    """One key-value head's value projection rows x 1.01: a real defect, 1% of one head."""
    import onnx
    from onnx import numpy_helper
    model = onnx.load(str(path))
    for i, t in enumerate(model.graph.initializer):
        if t.name == "v_proj.weight":
            w = numpy_helper.to_array(t).copy()  # (d_in, kv * H): the MatMul's [in, out] form
            rows = w.shape[1] // 3
            w[:, head * rows:(head + 1) * rows] *= factor
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(w, t.name))
            onnx.save(model, str(path))
            return
    raise AssertionError("no v_proj.weight initializer")


@pytest.mark.parametrize("kind", ["full", "static_cache"])
def test_a_one_percent_defect_of_one_value_head_fails_on_the_real_layer(real_layer, kind,
                                                                       smollm2_inputs, tmp_path):
    faulty = tmp_path / "faulty"
    shutil.copytree(real_layer[kind], faulty)
    _value_rows_off(faulty / "model.onnx")
    report = check_parity(faulty, inputs=smollm2_inputs, **SWEEP)
    assert not report.passed
    for inputs in ("random", "real"):
        assert any(not r.passed for r in report.results
                   if r.runner == "ort-cpu" and r.inputs == inputs), inputs


def test_quantization_cost_on_real_inputs_is_reported_apart(smollm2_gguf, smollm2_inputs,
                                                           tmp_path):
    art = export_onnx(weights=smollm2_gguf, layer=5, output=tmp_path / "q", validate=False,
                      quantize=QuantSpec(bits=8, accuracy_level=1)).path
    report = check_parity(art, inputs=smollm2_inputs, seq_lens=[7], batch_sizes=[1])
    random_cost = {q.output: q.deviation for q in report.costs["quantization"]}["y"]
    real_cost = {q.output: q.deviation for q in report.costs["real_quantization"]}["y"]
    assert 0 < real_cost.rel < 0.5 and 0 < random_cost.rel < 0.5
    assert real_cost.rel != random_cost.rel
    assert "worst over the real inputs (--inputs)" in format_report(report)
    saved = json.loads(json.dumps(report.to_dict()))
    assert saved["real_quantization"][0]["output"] == "y"


def test_inputs_of_another_width_are_bad_input(smollm2_inputs, tmp_path):
    from safetensors.numpy import save_file
    art = export_onnx(MHAConfig(dim=32, heads=2, max_seq_len=16), tmp_path / "a",
                      validate=False).path
    one = tmp_path / "one.safetensors"  # one layer: an artifact without a layer takes it
    save_file({"layers.5.x": load_file(str(smollm2_inputs))["layers.5.x"]}, str(one))
    result = CliRunner().invoke(cli, ["check", str(art), "--inputs", str(one)])
    assert result.exit_code == 2, result.output
    assert "576" in result.output and "32" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_inputs_of_another_layer_are_bad_input(smollm2_gguf, smollm2_inputs, tmp_path):
    from safetensors.numpy import save_file
    art = export_onnx(weights=smollm2_gguf, layer=7, output=tmp_path / "l7", validate=False).path
    captured = load_file(str(smollm2_inputs))
    others = tmp_path / "others.safetensors"
    save_file({k: captured[k] for k in ("layers.0.x", "layers.5.x")}, str(others))
    result = CliRunner().invoke(cli, ["check", str(art), "--inputs", str(others)])
    assert result.exit_code == 2 and "not this artifact's layer 7" in result.output


def test_capture_bad_input_is_one_line_and_writes_nothing(smollm2_gguf, smollm2_model,
                                                         tmp_path):
    from mha_export.errors import UsageError
    from mha_export.model.capture import capture_text
    short = tmp_path / "short.txt"
    short.write_text("A short text.")
    with pytest.raises(UsageError, match="the text has .* tokens; --tokens 64"):
        capture_text(smollm2_gguf, short, [0], 64, loaded=smollm2_model)
    with pytest.raises(UsageError, match=f"--layers {SMOLLM2_LAYERS} is out of range"):
        capture_text(smollm2_gguf, REAL_TEXT, [SMOLLM2_LAYERS], 64, loaded=smollm2_model)
    out = tmp_path / "x.safetensors"
    for weights, layers in ((tmp_path / "missing", "0"), (smollm2_gguf, "x")):
        result = CliRunner().invoke(cli, ["capture", "--weights", str(weights), "--text",
                                          str(short), "--layers", layers, "-o", str(out)])
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert not out.exists() and not list(tmp_path.glob(".*partial"))


@pytest.mark.parametrize("dtype, kind, runner", [("float16", "kv_cache", "ort-cpu"),
                                                 ("bfloat16", "full", "openvino-cpu")])
def test_a_half_precision_real_layer_passes_with_its_rounding_cost_apart(
        smollm2_gguf, smollm2_inputs, tmp_path, dtype, kind, runner):
    """The truth holds the file's rounded weights: the runtime's half-precision arithmetic
    passes on the real layer (it failed at 0.4-3.4% of max|y| when the rounding counted as
    kernel error), the rounding's cost is its own line, and 10% of one value head fails."""
    if runner.startswith("openvino"):
        pytest.importorskip("openvino")
    art = export_onnx(weights=smollm2_gguf, layer=5, output=tmp_path / "h", validate=False,
                      dtype=dtype, **KINDS[kind]).path
    report = check_parity(art, runners=[runner], inputs=smollm2_inputs, **SWEEP)
    assert report.passed, format_report(report)
    cost = {r.output: r.deviation for r in report.costs["half_weights"]}["y"]
    assert 1e-3 < cost.rel < 0.1  # the rounding is real, and reported apart
    assert f"weight rounding cost ({dtype})" in format_report(report)
    assert report.to_dict()["real_half_weights"][0]["output"] == "y"
    faulty = tmp_path / "faulty"
    shutil.copytree(art, faulty)
    _value_rows_off(faulty / "model.onnx", factor=1.1)
    assert not check_parity(faulty, runners=[runner], **SWEEP).passed


def test_capture_by_address_feeds_a_longcat_modules_check(tmp_path):
    """LongCat-Flash holds two attention modules a layer: `capture --layers 0.1,1.0` keeps what
    each of those modules receives (layers.0.1.x, layers.1.0.x), and `check --inputs` gives an
    export of layer 0.1 its own; an address past a layer's modules is one line."""
    pytest.importorskip("transformers")
    import hybrid
    from mha_export.model.capture import capture_text
    from mha_export.model.loading import attention_at, load_model, load_tokenizer
    ckpt = hybrid.save_tiny_longcat(tmp_path / "ckpt")
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog, again and again. " * 4)
    out = tmp_path / "inputs.safetensors"
    result = CliRunner().invoke(cli, ["capture", "--weights", str(ckpt), "--text", str(text),
                                      "--layers", "0.1,1.0", "--tokens", "40", "-o", str(out)])
    assert result.exit_code == 0, result.output
    captured = load_file(str(out))
    assert {"layers.0.1.x", "layers.1.0.x"} <= set(captured)
    loaded = load_model(ckpt, load_tokenizer(ckpt))
    seen = {}

    def keep(module, args, kwargs):
        seen.setdefault("x", kwargs["hidden_states"])
    hook = attention_at(loaded.model, "0.1").register_forward_pre_hook(keep, with_kwargs=True)
    with torch.inference_mode():
        loaded.model(input_ids=torch.from_numpy(captured["token_ids"]), use_cache=False)
    hook.remove()
    np.testing.assert_array_equal(captured["layers.0.1.x"], seen["x"].float().numpy())
    assert not np.array_equal(captured["layers.0.1.x"], captured["layers.1.0.x"])
    art = export_onnx(weights=ckpt, layer="0.1", output=tmp_path / "l01", validate=False).path
    checked = CliRunner().invoke(cli, ["check", str(art), "--inputs", str(out)])
    assert checked.exit_code == 0 and "real" in checked.output, checked.output
    from mha_export.errors import UsageError
    with pytest.raises(UsageError, match="--layers 0.2: the model's layer 0 holds no such"):
        capture_text(ckpt, text, ["0.2"], 40, loaded=loaded)
