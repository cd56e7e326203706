"""The OpenVINO runners: model.onnx on OpenVINO's CPU plugin, with the precision it really used
(f32 asked for, or the plugin's default: bf16 on a CPU that has it) and that precision's
tolerance; a planted fault fails; without openvino the runner is SKIPPED with the install line."""
import shutil
import sys

import pytest

from mha_export import MHAConfig, check_parity, export_onnx
from mha_export.comparison.comparator import FP32
from mha_export.check.report import format_report
from mha_export.comparison.comparator import BFLOAT16
from faults import nudge_weight

ov = pytest.importorskip("openvino")

SWEEP = dict(seq_lens=[1, 7, 17], batch_sizes=[1, 3])
INSTALL = "pip install 'mha-export[openvino]'"


@pytest.fixture(scope="module")
def onnx_model(tmp_path_factory):
    """A small standard-form (auto) full-sequence model, exported once."""
    return export_onnx(MHAConfig(dim=32, heads=2, max_seq_len=16),
                       tmp_path_factory.mktemp("ov") / "a", validate=False).path


def _info(report, name):
    return next(i for i in report.runners if i.name == name)


def _version() -> str:
    return ov.get_version().split("-")[0]


def test_openvino_cpu_passes_in_f32_and_reports_precision_and_version(onnx_model):
    report = check_parity(onnx_model, runners=["openvino-cpu"], **SWEEP)
    assert report.passed, [r.error for r in report.results if not r.passed]
    info = _info(report, "openvino-cpu")
    assert info.status == "ran" and info.precision == "fp32"
    assert f"OpenVINO {_version()} CPU plugin" in info.device
    assert report.versions["openvino"] == _version()
    rows = [r for r in report.results if r.runner == "openvino-cpu"]
    assert rows and all(r.tolerance == FP32 for r in rows)
    assert max(r.vs_reference.max_abs for r in rows) < 1e-5


def _cpu_has_bf16() -> bool:
    """Decided without the runner under test: the plugin's own capability list."""
    return "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def test_plugin_default_precision_is_reported_with_its_tolerance(onnx_model):
    """bf16 where the CPU has it: reported as bf16, compared with the bf16 tolerance, and really
    less exact than fp32; on a CPU without bf16 the default is f32, reported as such."""
    report = check_parity(onnx_model, runners=["openvino-cpu-default"], **SWEEP)
    info = _info(report, "openvino-cpu-default")
    rows = [r for r in report.results if r.runner == "openvino-cpu-default"]
    assert report.passed and info.status == "ran" and rows
    if not _cpu_has_bf16():
        assert info.precision == "fp32" and all(r.tolerance == FP32 for r in rows)
        caps = ", ".join(ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
        pytest.skip(f"this CPU has no bf16 (OpenVINO's CPU capabilities: {caps}): the plugin's "
                    "default is f32 here")
    assert info.precision == "bf16" and all(r.tolerance == BFLOAT16 for r in rows)
    assert max(r.vs_reference.max_abs for r in rows) > 1e-5  # really ran in bf16


class _SaysBf16:
    """A compiled model whose plugin reports bf16 (what an AVX512_BF16/AMX CPU answers)."""

    def __init__(self, compiled):
        self._compiled = compiled

    def __getattr__(self, name):
        return getattr(self._compiled, name)

    def get_property(self, name):
        return ov.Type.bf16 if name == "INFERENCE_PRECISION_HINT" else \
            self._compiled.get_property(name)


def test_a_bf16_answer_is_never_an_fp32_result(onnx_model, monkeypatch):
    """On any CPU: when OpenVINO says it computes in bf16, the runner reports bf16 and the check
    applies the bf16 tolerance (the registry's tolerance sees the opened runner)."""
    real = ov.Core

    class Core(real):
        def compile_model(self, *args):
            return _SaysBf16(real.compile_model(self, *args))
    monkeypatch.setattr(ov, "Core", Core)
    report = check_parity(onnx_model, runners=["openvino-cpu-default"], seq_lens=[3],
                          batch_sizes=[1])
    assert _info(report, "openvino-cpu-default").precision == "bf16"
    rows = [r for r in report.results if r.runner == "openvino-cpu-default"]
    assert rows and all(r.tolerance == BFLOAT16 for r in rows)
    text = format_report(report)
    assert "OpenVINO" in text and "CPU plugin, bf16" in text and "atol 0.03 + 0.05 max|y|, rtol 0.05" in text


def test_a_nudged_weight_fails_openvino(onnx_model, tmp_path):
    faulty = tmp_path / "faulty"
    shutil.copytree(onnx_model, faulty)
    nudge_weight(faulty / "model.onnx")
    report = check_parity(faulty, runners=["openvino-cpu"], **SWEEP)
    assert _info(report, "openvino-cpu").status == "ran"
    assert not report.passed
    assert any(not r.passed for r in report.results if r.runner == "openvino-cpu")


def test_without_openvino_the_runner_is_skipped_with_the_install_command(onnx_model,
                                                                          monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)
    report = check_parity(onnx_model, seq_lens=[3], batch_sizes=[1],
                          runners=["ort-cpu", "openvino-cpu", "openvino-cpu-default"])
    for name in ("openvino-cpu", "openvino-cpu-default"):
        info = _info(report, name)
        assert info.status == "skipped" and INSTALL in info.reason
    assert report.passed  # ort-cpu ran; a runtime not installed is not a failure
    assert "openvino-cpu SKIPPED: openvino is not installed" in format_report(report)


def test_a_form_openvino_cannot_compile_is_skipped_with_its_reason(tmp_path):
    """contrib-gqa's full-sequence model (GroupQueryAttention without a past): OpenVINO's ONNX
    frontend refuses it; the check reports why in one line and goes on with the other runners."""
    path = export_onnx(MHAConfig(dim=32, heads=2, max_seq_len=16), tmp_path / "gqa",
                       attention="contrib-gqa", validate=False).path
    report = check_parity(path, runners=["openvino-cpu", "ort-cpu"], seq_lens=[3],
                          batch_sizes=[1])
    info = _info(report, "openvino-cpu")
    assert info.status == "skipped" and "\n" not in info.reason
    assert info.reason.startswith(f"OpenVINO {_version()} cannot compile model.onnx: "
                                  "GroupQueryAttention")
    assert report.passed and _info(report, "ort-cpu").status == "ran"


def test_openvino_runs_only_when_named(onnx_model):
    """Another runtime than the file was made for: never in the default selection (an export's
    own check must not fail on OpenVINO's bugs), always available by name."""
    report = check_parity(onnx_model, seq_lens=[3], batch_sizes=[1])
    assert not {"openvino-cpu", "openvino-cpu-default"} & {i.name for i in report.runners}


def test_openvino_runs_the_int8_cache_of_a_standard_ops_form(tmp_path):
    """--kv-cache-dtype int8 with --attention blocked: quantize-on-write and dequantize-on-read
    in standard ops, which OpenVINO runs to the same codes (the default auto holds
    GroupQueryAttention, whose static cache OpenVINO does not keep: docs/runtimes.md)."""
    folder = export_onnx(MHAConfig(dim=64, heads=4, kv_heads=2, rotary="half", max_seq_len=16),
                         tmp_path / "kv8", static_cache=True, kv_cache_dtype="int8",
                         attention="blocked", validate=False).path
    report = check_parity(folder, runners=["openvino-cpu"], seq_lens=[1, 7], past_lens=[0, 5])
    assert report.passed, [r.error for r in report.results if not r.passed][:3]
    assert {r.output for r in report.results if r.runner == "openvino-cpu"} == {
        "y", "present_key", "present_value"}


# --- weight-compressed MatMuls: OpenVINO's dynamic quantization of activations (issue 31) -------

@pytest.fixture(scope="module")
def quantized_model(tmp_path_factory):
    """int4 projections (accuracy level 4) with a growing cache: four outputs to judge."""
    from mha_export.lossy.projections.rtn import QuantSpec
    return export_onnx(MHAConfig(dim=64, heads=4, max_seq_len=32),
                       tmp_path_factory.mktemp("ovq") / "q", quantize=QuantSpec(bits=4),
                       kv_cache=True, validate=False).path


def _plugin_quantized_activations(path) -> bool:
    """Decided without the runner under test: the whole file compiled with f32 as the runner
    does, and again with dynamic quantization off, run on one input: do the outputs differ?"""
    import numpy as np
    from mha_export.artifact import read_artifact
    from mha_export.check.sweep import make_cases, make_feeds
    sig = read_artifact(path.parent).signature
    feeds = make_feeds(sig, make_cases(sig, [2], [9], [4])[0], seed=0)
    outs = []
    for extra in ({}, {"DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"}):
        compiled = ov.Core().compile_model(str(path), "CPU",
                                           {"INFERENCE_PRECISION_HINT": "f32", **extra})
        outs.append(compiled({n: feeds[n] for n in sig.input_names})[compiled.output("y")])
    return not np.array_equal(*outs)


def test_the_runner_reports_what_the_plugin_did_with_activations(quantized_model):
    """On every CPU: int8 activations reported (and judged at their tolerance) exactly where the
    plugin really quantized them (VNNI/AMX CPUs), fp32 where it did not (AVX2-only CPUs)."""
    from mha_export.artifact import read_artifact
    from mha_export.comparison.comparator import INT8_ACTIVATIONS
    from mha_export.check.runners.openvino import OpenVinoRunner
    path = quantized_model / "model.onnx"
    runner = OpenVinoRunner(read_artifact(quantized_model).signature, path)
    truth = _plugin_quantized_activations(path)
    assert runner.compressed is not None and runner.compressed.int8_activations == truth
    assert ("activations quantized to int8" in runner.device) == truth
    report = check_parity(quantized_model, runners=["openvino-cpu"], **SWEEP)
    assert report.passed, format_report(report)
    rows = [r for r in report.results if r.runner == "openvino-cpu"]
    assert rows and all(r.tolerance == (INT8_ACTIVATIONS if truth else FP32) for r in rows)


def test_quantized_files_get_an_exact_openvino_row(quantized_model):
    """Dynamic quantization off: the file's weights judged at fp32's tolerance, on every CPU."""
    report = check_parity(quantized_model, runners=["openvino-cpu"], **SWEEP)
    info = _info(report, "openvino-cpu-fp32-compute")
    assert info.status == "ran" and "dynamic quantization off" in info.device
    rows = [r for r in report.results if r.runner == "openvino-cpu-fp32-compute"]
    assert report.passed and rows and all(r.tolerance == FP32 for r in rows)
    assert max(r.vs_reference.rel for r in rows) < 1e-5


def test_a_flipped_code_fails_the_exact_openvino_row(quantized_model, tmp_path):
    """A wrong 4-bit code hides in int8 rounding no longer: the exact row fails."""
    from faults import nibble_flipped
    faulty = tmp_path / "faulty"
    shutil.copytree(quantized_model, faulty)
    nibble_flipped(faulty / "model.onnx")
    report = check_parity(faulty, runners=["openvino-cpu"], **SWEEP)
    assert any(not r.passed for r in report.results
               if r.runner == "openvino-cpu-fp32-compute"), format_report(report)


def test_quantized_activations_are_never_an_fp32_result(quantized_model, monkeypatch):
    """On any CPU: when the probe says the plugin quantized activations (what a VNNI CPU does),
    the runner says so and the check applies int8 activations' tolerance, not fp32's."""
    from mha_export.comparison.comparator import INT8_ACTIVATIONS
    from mha_export.check.runners import openvino as ov_runner
    monkeypatch.setattr(ov_runner, "activations_quantized", lambda *args: True)
    report = check_parity(quantized_model, runners=["openvino-cpu"], seq_lens=[3],
                          batch_sizes=[1])
    rows = [r for r in report.results if r.runner == "openvino-cpu"]
    assert rows and all(r.tolerance == INT8_ACTIVATIONS for r in rows)
    assert "activations quantized to int8 per group of" in format_report(report)


def test_projections_inside_if_branches_are_counted_and_judged(tmp_path):
    """A stacked layout has no output projection: its every MatMulNBits sits in auto's If
    branches, which the plugin's runtime model does not list at its top level; the runner still
    reports what the plugin did with their activations, and passes at that tolerance."""
    from mha_export.artifact import read_artifact
    from mha_export.check.runners.openvino import OpenVinoRunner
    from mha_export.lossy.projections.rtn import QuantSpec
    art = export_onnx(MHAConfig(dim=128, heads=4, max_seq_len=32, layout="stacked"),
                      tmp_path / "s", quantize=QuantSpec(bits=4), validate=False).path
    runner = OpenVinoRunner(read_artifact(art).signature, art / "model.onnx")
    assert runner.compressed is not None and runner.compressed.count == 6
    assert runner.compressed.int8_activations == _plugin_quantized_activations(
        art / "model.onnx")
    assert check_parity(art, runners=["openvino-cpu"], **SWEEP).passed
