"""--kv-cache-dtype int8 end to end: the export declares int8 buffers and its scales, every graph
form that builds a static cache runs it (GroupQueryAttention's own int8 cache, or standard ops),
the check judges codes as codes and y over each runtime's own codes, reports what the int8
cache cost and how often it clipped, and fails on each planted fault."""
from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner

from faults import KV_FAULTS, NotApplicable
from mha_export import MHAConfig, export_onnx
from mha_export.artifact import default_folder, read_artifact
from mha_export.comparison.comparator import FP32
from mha_export.check.parity import check_parity
from mha_export.cli.commands import cli
from mha_export.kinds.registry import build_module
from mha_export.lossy.int8_cache.calibration import calibrate_cache, cache_entries
from mha_export.lossy.int8_cache.codes import KVScale
from mha_export.lossy.projections.rtn import QuantSpec

CONFIG = MHAConfig(dim=64, heads=4, kv_heads=2, rotary="half", max_seq_len=32)
# a sweep that reaches every code path of auto (GroupQueryAttention for T < 512 at batch 1 and
# for single tokens, the blocked loop for long calls and chunks at batch > 1) in little time
QUICK = dict(seq_lens=[1, 7, 600], past_lens=[0, 5])


def _export(tmp_path, name="m", **options):
    options.setdefault("check_options", QUICK)
    return export_onnx(CONFIG, tmp_path / name, static_cache=True, kv_cache_dtype="int8",
                       **options)


@pytest.fixture(scope="module")
def int8_auto(tmp_path_factory):
    """The default form's int8-cache export, checked at export with the quick sweep."""
    return _export(tmp_path_factory.mktemp("int8"))


def test_the_artifact_declares_int8_buffers_and_their_scales(int8_auto):
    assert int8_auto.passed
    meta = json.loads((int8_auto.path / "config.json").read_text())
    kv = meta["export"]["kv_cache"]
    assert kv["dtype"] == "int8" and kv["rounding"] == "half to even" and kv["synthetic"]
    assert kv["key"]["granularity"] == "channel" and kv["key"]["shape"] == [1, 2, 1, 16]
    io = {t["name"]: t["dtype"] for t in meta["io"]["inputs"] + meta["io"]["outputs"]}
    assert [io[n] for n in ("past_key", "past_value", "present_key", "present_value")] == \
        ["int8"] * 4
    assert io["x"] == io["y"] == "float"
    graph = onnx.load(str(int8_auto.path / "model.onnx")).graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.output]}
    assert types["past_key"] == types["present_value"] == onnx.TensorProto.INT8
    art = read_artifact(int8_auto.path)
    assert art.signature.cache_dtype == "int8" and art.spec("int8-cache").key.scale.shape == (1, 2, 1, 16)


def test_the_check_reports_what_the_int8_cache_cost_apart(int8_auto):
    kv = int8_auto.report.costs["kv_cache"]
    assert kv.synthetic and 0 < kv.deviation.rel < 0.1 and kv.deviation.cosine > 0.99
    assert set(kv.clip_rates) == {"present_key", "present_value"}
    assert all(0 < r < 0.01 for r in kv.clip_rates.values())  # random inputs beyond calibration
    runners = {r.runner for r in int8_auto.report.results}
    assert "ort-cpu" in runners
    codes = [r for r in int8_auto.report.results if r.output == "present_key"]
    assert codes and all(r.tolerance.changed is not None for r in codes)
    y = [r for r in int8_auto.report.results if r.output == "y" and r.runner == "ort-cpu"]
    assert y and all(r.tolerance == FP32 for r in y)  # fp32's, not int8 activations'



@pytest.mark.parametrize("form", ["contrib-gqa", "blocked", "blocked-plain", "decomposed"])
def test_every_static_form_runs_the_int8_cache(tmp_path, form):
    result = _export(tmp_path, attention=form)
    assert result.passed, [r.error for r in result.report.results if not r.passed][:3]


# where each fault shows: a wrong read in y (judged over the runtime's own codes), a wrong write
# in the codes
FAULT_SHOWS_IN = {"key scale x1.1 on read": "y",
                  "floor instead of round half to even on write": "present_key",
                  "no clipping (int8 wrap-around)": "present_key",
                  "per-channel scales applied per tensor": "present_key"}


@pytest.mark.parametrize("fault", list(KV_FAULTS))
def test_each_planted_fault_fails_the_check(int8_auto, tmp_path, fault):
    folder = tmp_path / "faulty"
    shutil.copytree(int8_auto.path, folder)
    try:
        KV_FAULTS[fault](folder / "model.onnx")
    except NotApplicable as e:
        pytest.fail(f"the default form must carry every fault: {e}")
    report = check_parity(folder, runners=["ort-cpu"], **QUICK)
    assert not report.passed
    failing = {r.output for r in report.results if not r.passed and r.runner == "ort-cpu"
               and not r.error.startswith("Error in execution")}
    assert FAULT_SHOWS_IN[fault] in failing, (fault, failing)


@pytest.mark.parametrize("level", [1, 4])
def test_int4_projections_and_an_int8_cache_are_costed_apart(tmp_path, level):
    """Level 4 (int8 activations): ort-cpu's keys err by ~1e-2 of their range, so its codes are
    held to that error in codes, and the fp32-compute twin holds the same file's codes to one
    code, rarely."""
    result = _export(tmp_path, quantize=QuantSpec(bits=4, accuracy_level=level))
    assert result.passed, [r.error for r in result.report.results if not r.passed][:3]
    codes = {r.runner: r.tolerance for r in result.report.results if r.output == "present_key"}
    assert codes["ort-cpu-fp32-compute" if level == 4 else "ort-cpu"].changed is not None
    assert (codes["ort-cpu"].scaled > 0) == (level == 4)
    report = result.report
    assert {q.output for q in report.costs["quantization"]} == {"y", "present_key", "present_value"}
    projections = {q.output: q.deviation.rel for q in report.costs["quantization"]}
    assert 0 < projections["y"] < 0.5
    assert report.costs["kv_cache"] is not None and 0 < report.costs["kv_cache"].deviation.rel < 0.1
    folder = default_folder(CONFIG, "onnx", "static-cache",
                            specs={"quantize": QuantSpec(bits=4, accuracy_level=4),
                                   "int8-cache": read_artifact(result.path).spec("int8-cache")})
    assert folder.name == f"{CONFIG.slug()}-static-int4-kv8-onnx"


def test_a_calibration_file_sets_the_scales(tmp_path):
    module = build_module(CONFIG, seed=0).eval()
    hidden = np.random.default_rng(1).standard_normal((3, 40, CONFIG.d_in)).astype(np.float32)
    hidden[:, :, 5] *= 20  # an outlier channel, as real hidden states have
    np.save(tmp_path / "h.npy", hidden)
    spec = calibrate_cache(module, tmp_path / "h.npy")
    assert not spec.synthetic and "h.npy (3 x 40 tokens)" in spec.calibration
    keys, values = cache_entries(module, hidden)
    assert spec.key.clipped(keys) == 0 and spec.value.clipped(values) == 0  # max -> 127
    assert np.abs(spec.key.quantize(keys)).max() > 100  # the range is used (pairs: <= 127)
    synthetic = calibrate_cache(module)
    assert synthetic.synthetic and (spec.key.scale > synthetic.key.scale).any()
    from safetensors.numpy import save_file
    save_file({"hidden_states": hidden}, str(tmp_path / "h.safetensors"))
    again = calibrate_cache(module, tmp_path / "h.safetensors", value="tensor")
    np.testing.assert_array_equal(again.key.scale, spec.key.scale)
    assert again.value.scale.shape == (1,)


def test_the_eager_module_writes_codes_and_reads_them_dequantized():
    module = build_module(CONFIG, seed=3).eval()
    k_scale = KVScale("channel", np.full((1, 2, 1, 16), 0.02, np.float32))
    v_scale = KVScale("tensor", np.array([0.03], np.float32))
    module.use_int8_cache(torch.from_numpy(k_scale.scale), torch.from_numpy(v_scale.scale))
    x = torch.randn(2, 5, CONFIG.d_in)
    past = [torch.zeros(2, 2, 9, 16, dtype=torch.int8) for _ in range(2)]
    lengths = torch.tensor([0, 3])
    with torch.inference_mode():
        y, pk, pv = module.forward_static(x, *past, lengths)
        k, v = module.keys_values(x, lengths.view(2, 1) + torch.arange(5))
        again = module.read_static(x, pk, pv, lengths)
    assert pk.dtype == torch.int8 and pk.data_ptr() == past[0].data_ptr()  # in place
    np.testing.assert_array_equal(pk[1, :, 3:8].numpy(), k_scale.quantize(k[1:2].numpy())[0])
    np.testing.assert_array_equal(pv[0, :, :5].numpy(), v_scale.quantize(v[:1].numpy())[0])
    torch.testing.assert_close(again, y, rtol=0, atol=0)  # the same codes read the same way


def _cli(*args):
    return CliRunner().invoke(cli, list(args))


@pytest.mark.parametrize("args, message", [
    (["onnx", "--kv-cache-dtype", "int8"], "needs --static-cache"),
    (["onnx", "--kv-cache-dtype", "int8", "--kv-cache"], "needs --static-cache"),
    (["torchscript", "--static-cache", "--kv-cache-dtype", "int8"], "ONNX-only"),
    (["aoti", "--static-cache", "--kv-cache-dtype", "int8"], "ONNX-only"),
    (["onnx", "--static-cache", "--calibration", "h.npy"], "--calibration needs"),
    (["onnx", "--static-cache", "--value-scale", "tensor"], "--value-scale needs"),
    (["onnx", "--static-cache", "--kv-cache-dtype", "int8", "--dtype", "float16"], "float32"),
    (["onnx", "--static-cache", "--kv-cache-dtype", "int8", "--calibration", "none.npy"],
     "no such file"),
])
def test_bad_requests_are_refused_in_one_line(tmp_path, args, message):
    r = _cli(*args, "--heads", "4", "--dim", "64", "-o", str(tmp_path / "o"))
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output
    assert not (tmp_path / "o").exists()


def _bad_files(tmp_path):
    np.save(tmp_path / "wrong.npy", np.zeros((2, 3, 7), np.float32))
    (tmp_path / "empty.npy").write_bytes(b"")
    (tmp_path / "corrupt.safetensors").write_bytes(b"not a safetensors file")
    np.savez(tmp_path / "archive.npz", x=np.zeros(3))
    (tmp_path / "archive.npz").rename(tmp_path / "archive.npy")
    np.save(tmp_path / "ints.npy", np.zeros((2, 3, 64), np.int32))
    return {"wrong.npy": "[n, T, d_in=64]", "empty.npy": "cannot read",
            "corrupt.safetensors": "cannot read", "archive.npy": "got NpzFile",
            "ints.npy": "finite floats", "h.txt": "expected a .npy or .safetensors"}


def test_bad_calibration_files_are_refused(tmp_path):
    (tmp_path / "h.txt").write_text("1 2 3")
    for name, message in _bad_files(tmp_path).items():
        r = _cli("onnx", "--heads", "4", "--dim", "64", "--static-cache", "--kv-cache-dtype",
                 "int8", "--calibration", str(tmp_path / name), "-o", str(tmp_path / "o"))
        assert r.exit_code == 2 and message in r.output, (name, r.output)
        assert "Traceback" not in r.output and not (tmp_path / "o").exists()


def test_budgets_fail_the_check_and_are_bad_input_on_a_float_cache(int8_auto, tmp_path):
    folder = str(int8_auto.path)
    quick = ["--seq-lens", "1,7", "--past-lens", "0,5", "--runners", "ort-cpu"]
    r = _cli("check", folder, *quick, "--max-clip-rate", "0")
    assert r.exit_code == 1 and "int8 KV cache cost FAILED" in r.output
    r = _cli("check", folder, *quick, "--max-kv-error", "1e-9")
    assert r.exit_code == 1 and "FAIL (budget 1e-09)" in r.output
    r = _cli("check", folder, *quick, "--max-kv-error", "0.5", "--max-clip-rate", "0.5")
    assert r.exit_code == 0, r.output
    assert "int8 KV cache cost" in r.output and "random inputs" in r.output
    plain = export_onnx(CONFIG, tmp_path / "float", static_cache=True, validate=False).path
    r = _cli("check", str(plain), *quick, "--max-clip-rate", "0.01")
    assert r.exit_code == 2 and "no int8 cache" in r.output
