"""Quantized projections (--quantize int4|int8): exported for every call kind, graph form, layout
and layer option; checked against the function the file holds (the dequantized weights) with
the quantization cost reported apart; planted faults and an over-budget layer fail the check;
a Qwen3 checkpoint layer equals transformers' attention run with the same dequantized weights."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from faults import QUANT_FAULTS, NotApplicable
from mha_export import MHAConfig, export_onnx
from mha_export.artifact import read_artifact
from mha_export.check.parity import check_parity
from mha_export.check.report import format_report
from mha_export.check.runners.ort import DEQUANTIZE_PATH, OrtRunner
from mha_export.cli.commands import cli
from mha_export.graph.forms import Feature
from mha_export.kinds.registry import FORMS
from mha_export.lossy.projections.reference import dequantized_module
from mha_export.lossy.projections.rtn import QuantSpec, quantize

SMALL = MHAConfig(dim=64, heads=4, max_seq_len=32)
QUICK = dict(seq_lens=(1, 7, 33), batch_sizes=(1, 2), past_lens=(0, 5))
INT4 = QuantSpec(bits=4, accuracy_level=4)  # block 32, symmetric (the default), level 4
EXACT = QuantSpec(bits=4, accuracy_level=1)


def _export(tmp_path, config=SMALL, spec=INT4, name="q", **options):
    return export_onnx(config, tmp_path / name, quantize=spec, validate=False, **options).path


def _ran(report) -> set:
    return {r.runner for r in report.results}


@pytest.mark.parametrize("kind", ["full", "attention_mask", "kv_cache", "static_cache"])
def test_every_call_kind_exports_and_passes(tmp_path, kind):
    flags = {} if kind == "full" else {kind: True}
    report = check_parity(_export(tmp_path, **flags), **QUICK)
    assert report.passed, format_report(report)
    # level 4's kernel (int8 activations) and the same file at fp32 compute, both judged
    assert {"ort-cpu", "ort-cpu-fp32-compute"} <= _ran(report)
    assert [q.output for q in report.costs["quantization"]] == read_artifact(
        tmp_path / "q").signature.output_names


@pytest.mark.parametrize("form", sorted(f for f in FORMS if FORMS[f].kind == "standard"))
def test_every_graph_form_with_projections_exports_and_passes(tmp_path, form):
    """(MLA's quantized projections: tests/test_mla.py; a KV-shared layer's:
    tests/test_kv_shared.py.)"""
    supports = FORMS[form].supports
    kind = (dict(kv_cache=True) if Feature.KV_CACHE in supports else
            dict(static_cache=True) if Feature.STATIC_CACHE in supports else {})
    report = check_parity(_export(tmp_path, spec=EXACT, attention=form, **kind), **QUICK)
    assert report.passed, format_report(report)


def test_auto_static_cache_runs_both_branches_over_the_full_sweep(tmp_path):
    """The default form's If branches each read the shared MatMulNBits weights (the QDQ
    fusion of ONNX Runtime 1.31 fails there; writing the kernel node directly does not)."""
    art = _export(tmp_path, static_cache=True)
    report = check_parity(art, seq_lens=(1, 7, 511, 512, 600), batch_sizes=(1, 2))
    assert report.passed, format_report(report)
    runner = OrtRunner(read_artifact(art).signature, art / "model.onnx")
    assert "MatMulNBits" in runner.device and runner.session.quantized.kernels == 7


@pytest.mark.parametrize("config", [
    SMALL.replace(layout="fused", qkv_bias=True),
    MHAConfig(dim=32, heads=1, layout="single", max_seq_len=32),
    MHAConfig(dim=64, heads=4, layout="stacked", max_seq_len=32),
    SMALL.replace(kv_heads=2, rotary="half", qk_norm="head", output_gate=True, softcap=30.0,
                  d_in=96),
    SMALL.replace(sinks=True, sliding_window=5, rotary="interleaved", qk_norm="full"),
], ids=["fused-bias", "single", "stacked", "gqa-rope-norm-gate-cap", "sinks-window"])
def test_layouts_and_layer_options(tmp_path, config):
    art = _export(tmp_path, config, QuantSpec(bits=8, block_size=16, symmetric=False))
    report = check_parity(art, **QUICK)
    assert report.passed, format_report(report)
    recorded = read_artifact(art).export["quantize"]
    assert recorded["projections"][:3] == ["q_proj", "k_proj", "v_proj"]
    assert ("gate_proj" in recorded["projections"]) == config.output_gate


def test_float16_model(tmp_path):
    report = check_parity(_export(tmp_path, dtype="float16"), **QUICK)
    assert report.passed, format_report(report)


def test_the_reference_holds_exactly_the_dequantized_weights(tmp_path):
    art = read_artifact(_export(tmp_path))
    source, held = art.load_plain_module(), art.load_source_module()
    w = source.to_weights()
    expected = quantize(w.wq.numpy(), INT4).dequantized()
    assert np.array_equal(held.to_weights().wq.numpy(), expected)
    assert not np.array_equal(expected, w.wq.numpy())
    assert torch.equal(held.to_weights().bo, w.bo)  # biases stay float, untouched
    assert dequantized_module(source, INT4).to_weights().wg is None


def test_the_file_records_the_quantization(tmp_path):
    art = read_artifact(_export(tmp_path, spec=QuantSpec(bits=8, block_size=64,
                                                           symmetric=False)))
    assert art.export["quantize"] == {
        "bits": 8, "block_size": 64, "symmetric": False, "quantizer": "rtn", "accuracy_level": 4,
        "format": "com.microsoft.MatMulNBits",
        "projections": ["q_proj", "k_proj", "v_proj", "out_proj"]}
    assert art.spec("quantize") == QuantSpec(bits=8, block_size=64, symmetric=False)


@pytest.mark.parametrize("fault", sorted(QUANT_FAULTS))
@pytest.mark.parametrize("spec", [INT4, EXACT], ids=["level4", "level1"])
def test_planted_quantization_fault_is_caught(tmp_path, fault, spec):
    """At level 4 the kernel's own int8 rounding hides a wrong weight from ort-cpu; the same
    file at fp32 compute (ort-cpu-fp32-compute) catches it."""
    if fault == "a zero point off by one":
        spec = QuantSpec(bits=4, symmetric=False, accuracy_level=spec.accuracy_level)
    art = _export(tmp_path, spec=spec)
    assert check_parity(art, **QUICK).passed
    try:
        QUANT_FAULTS[fault](art / "model.onnx")
    except NotApplicable as e:
        pytest.skip(str(e))
    report = check_parity(art, **QUICK)
    assert not report.passed
    exact = "ort-cpu-fp32-compute" if spec.accuracy_level == 4 else "ort-cpu"
    assert any(not r.passed for r in report.results if r.runner == exact)


def test_quantization_cost_is_reported_apart_and_fails_only_over_its_budget(tmp_path):
    art = _export(tmp_path)
    report = check_parity(art, **QUICK)
    cost = {q.output: q for q in report.costs["quantization"]}["y"]
    assert report.passed and cost.budget is None
    assert 1e-3 < cost.deviation.rel < 0.5 and 0.9 < cost.deviation.cosine < 1.0
    text = format_report(report)
    assert "quantization cost (int4 block 32 symmetric, int8-activation compute" in text
    assert "reported (no --max-quant-error)" in text
    over = check_parity(art, max_quant_error=cost.deviation.rel / 2, **QUICK)
    assert not over.passed and all(r.passed for r in over.results)  # the kernel is fine
    assert "FAIL (budget" in format_report(over)
    assert check_parity(art, max_quant_error=cost.deviation.rel * 1.01, **QUICK).passed
    saved = over.to_dict()["quantization"][0]
    assert saved["output"] == "y" and saved["passed"] is False
    assert set(saved["deviation"]) == {"max_abs", "rel", "cosine"}


def test_int8_is_more_accurate_than_int4_and_smaller_blocks_than_larger(tmp_path):
    def rel(spec, name):
        report = check_parity(_export(tmp_path, spec=spec, name=name), **QUICK)
        return {q.output: q.deviation.rel for q in report.costs["quantization"]}["y"]
    assert rel(QuantSpec(bits=8), "i8") < rel(QuantSpec(bits=4, block_size=16), "b16") \
        < rel(QuantSpec(bits=4, block_size=128), "b128")


def test_int8_at_fp32_compute_warns_that_it_is_dequantized_every_call(tmp_path):
    art = _export(tmp_path, spec=QuantSpec(bits=8, accuracy_level=1))
    runner = OrtRunner(read_artifact(art).signature, art / "model.onnx")
    assert DEQUANTIZE_PATH in runner.device and "at every call" in runner.warning
    info = {r.name: r for r in check_parity(art, **QUICK).runners}["ort-cpu"]
    assert info.status == "ran" and "accuracy level 4 has one" in info.reason


def test_openvino_reads_the_quantized_file(tmp_path):
    pytest.importorskip("openvino")
    """Whatever this CPU makes the plugin do with the activations (tests/test_openvino.py),
    the file passes, and its weights are also judged exactly (dynamic quantization off)."""
    report = check_parity(_export(tmp_path, kv_cache=True), runners=["openvino-cpu"], **QUICK)
    assert report.passed, format_report(report)
    assert {"openvino-cpu", "openvino-cpu-fp32-compute"} <= _ran(report)


@pytest.mark.parametrize("args, message", [
    (["torchscript", "--quantize", "int4"], "--quantize is ONNX-only"),
    (["aoti", "--quantize", "int8"], "--quantize is ONNX-only"),
    (["onnx", "--block-size", "64"], "--block-size needs --quantize"),
    (["onnx", "--quantize", "int3"], "'int3' is not one of"),
    (["onnx", "--quantize", "int4", "--block-size", "48"], "'48' is not one of"),
])
def test_bad_quantization_requests_exit_2_in_one_line(tmp_path, args, message):
    result = CliRunner().invoke(cli, args + ["--heads", "2", "--dim", "16", "-o",
                                             str(tmp_path / "out")])
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "out").exists()


def test_cli_exports_to_its_own_folder_and_the_budget_is_exit_1(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = CliRunner().invoke(cli, ["onnx", "--heads", "4", "--dim", "64", "--max-seq-len", "16",
                                   "--static-cache", "--quantize", "int4", "--accuracy-level", "4",
                                   "--no-check"])
    assert run.exit_code == 0, run.output
    folder = tmp_path / "models" / "split-h4-d64-static-int4-onnx"  # level 4 (1: -int4-fp32)
    quick = ["--seq-lens", "1,7", "--batch-sizes", "1", "--past-lens", "0,3"]
    ok = CliRunner().invoke(cli, ["check", str(folder), *quick, "--json", "r.json"])
    assert ok.exit_code == 0, ok.output
    assert "quantization cost" in ok.output and "ort-cpu-fp32-compute" in ok.output
    assert json.loads((tmp_path / "r.json").read_text())["quantization"]
    over = CliRunner().invoke(cli, ["check", str(folder), *quick, "--max-quant-error", "1e-6"])
    assert over.exit_code == 1, over.output
    plain = export_onnx(SMALL, tmp_path / "plain", validate=False).path
    bad = CliRunner().invoke(cli, ["check", str(plain), "--max-quant-error", "0.1"])
    assert bad.exit_code == 2 and "has no quantized projections" in bad.output


def test_a_qwen3_checkpoint_layer_equals_transformers_with_the_same_dequantized_weights(
        tmp_path):
    """transformers' own attention module, its projection weights replaced by the
    dequantized ones, against ONNX Runtime running the quantized file (fp32 compute: exact;
    level 4: within the int8-activation tolerance)."""
    from test_checkpoints import B, _batch, _build, _capture, _feeds

    model = _build("qwen3")
    folder = tmp_path / "ckpt"
    model.save_pretrained(folder)
    layer = 1
    attention = model.model.layers[layer].self_attn
    for spec, rel in ((EXACT, 2e-5), (INT4, 3e-2)):
        art = export_onnx(weights=folder, layer=layer, output=tmp_path / f"l{spec.accuracy_level}",
                          attention_mask=True, quantize=spec, validate=False).path
        runner = OrtRunner(read_artifact(art).signature, art / "model.onnx")
        saved = {n: getattr(attention, n).weight.detach().clone()
                 for n in ("q_proj", "k_proj", "v_proj", "o_proj")}
        with torch.no_grad():
            for n, w in saved.items():
                getattr(attention, n).weight.copy_(torch.from_numpy(
                    quantize(w.numpy(), spec).dequantized()))
        ids, mask, pos = _batch()
        calls, handle = _capture(model, "qwen3", layer)
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, position_ids=pos)
        handle.remove()
        with torch.no_grad():
            for n, w in saved.items():
                getattr(attention, n).weight.copy_(w)
        x, want = calls[0]
        got = runner.run(_feeds(runner.signature, x=x, attention_mask=mask.numpy(),
                                position_ids=pos.numpy()))["y"]
        rows = mask.numpy().astype(bool)
        assert got.shape[0] == B and np.isfinite(got).all()
        assert np.abs(got - want)[rows].max() <= rel * np.abs(want).max(), spec.label()


@pytest.mark.parametrize("name", ["gpt2", "llama-mqa-llama3", "gpt_neox", "qwen3_5_text",
                                  "gemma2", "phi3", "olmo2", "granite", "gpt_oss", "smollm3"])
def test_checkpoint_families_export_quantized_and_pass(tmp_path, name):
    """Families whose layers differ in what the quantized graph must keep float (biases, q/k
    norms, sinks, softcapping, partial rotary, the output gate of qwen3_5's layers)."""
    from test_checkpoints import MODELS, _build
    _build(name).save_pretrained(tmp_path / "ckpt")
    art = export_onnx(weights=tmp_path / "ckpt", layer=MODELS[name].layers[0],
                      output=tmp_path / "q", kv_cache=True, quantize=INT4, validate=False).path
    report = check_parity(art, **QUICK)
    assert report.passed, format_report(report)


def test_the_fp32_compute_twin_accompanies_ort_cpu_only(tmp_path):
    """It runs where ort-cpu runs (never as a stand-in: --providers cuda without a GPU is still
    a check of nothing), and not beside a level-1 file, whose ort-cpu is exact already."""
    art = _export(tmp_path)
    assert "ort-cpu-fp32-compute" in _ran(check_parity(art, providers=["cpu"], **QUICK))
    cuda_only = check_parity(art, providers=["cuda"], **QUICK)
    assert "ort-cpu-fp32-compute" not in _ran(cuda_only)
    assert cuda_only.passed == ("ort-cuda" in _ran(cuda_only))
    exact = _export(tmp_path, spec=EXACT, name="exact")
    assert "ort-cpu-fp32-compute" not in _ran(check_parity(exact, **QUICK))


def test_nan_weights_are_refused_and_a_nan_cost_never_passes(tmp_path):
    from mha_export.errors import UsageError
    from mha_export.comparison.comparator import Deviation
    from mha_export.lossy.projections.cost import QuantizationCost
    with pytest.raises(UsageError, match="NaN or Inf"):
        quantize(np.array([[np.nan, 1.0]], np.float32), INT4)
    cost = QuantizationCost.of(read_artifact(_export(tmp_path)), {})
    cost.deviations = {"y": [Deviation(float("nan"), float("nan"), float("nan"))], "z": []}
    assert [q.passed for q in cost.result()] == [False, False]  # NaN, or no case at all


def test_naming_ort_cpu_brings_its_fp32_compute_twin(tmp_path):
    report = check_parity(_export(tmp_path), runners=["ort-cpu"], **QUICK)
    assert _ran(report) == {"eager-fp32", "ort-cpu", "ort-cpu-fp32-compute"}


def test_a_float16_models_reference_holds_its_float16_scales(tmp_path):
    art = read_artifact(_export(tmp_path, dtype="float16"))
    w = art.load_plain_module().to_weights().wq.numpy()
    held = art.load_source_module().to_weights().wq.numpy()
    assert np.array_equal(held, quantize(w, INT4).dequantized(np.float16))
    assert not np.array_equal(held, quantize(w, INT4).dequantized())
