"""The C++ programs (cpp/): built once per session by `make cpp`, run on files exported here, and
compared with the Python ONNX Runtime / TorchScript / eager outputs of the same files.

Two command-line forms: MODEL CASE_DIR [...] (every declared input NAME read from CASE_DIR/NAME.npy,
every declared output written there) for any signature, and the legacy MODEL IN.npy OUT.npy [...]
for one-input, one-output models.

A build failure fails these tests (it never skips them): cmake and g++ are part of the set-up.
"""
from __future__ import annotations

import json
import re
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from mha_export import MHAConfig, export_onnx, export_torchscript
from mha_export.artifact import read_artifact
from mha_export.check.runners import RunnerUnavailable
from mha_export.check.runners.ort import OrtRunner
from mha_export.comparison.torch_runners import EagerRunner, TorchScriptRunner
from mha_export.signature import make_signature
from mha_export.check.sweep import Case, make_feeds, real_queries
from mha_export.lossy.projections.rtn import QuantSpec

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "cpp"
BUNDLE = ROOT / "build" / "cpp-bundle"
ATOL = 1e-5
# (batch, seq): T=1, and several T (and batch sizes) through one session / one loaded module.
SHAPES = [(2, 16), (1, 1), (3, 37), (1, 64), (2, 100)]
CONFIGS = {
    "split": MHAConfig(dim=64, heads=4, max_seq_len=64),
    "fused-in48": MHAConfig(dim=32, heads=2, d_in=48, qkv_bias=True, layout="fused", max_seq_len=64),
}
# The kv-cache (decode-step) export: prefill (past 0) and steps past a cache, T=1 and T>1, left
# padding (row 0 unpadded, the others start with pads), all through one process.
# Grouped-query (2 kv heads for 4 query heads) with partial rotary: position_ids is a 5th input.
KV_CONFIG = MHAConfig(dim=32, heads=4, kv_heads=2, d_in=48, qkv_bias=True, layout="fused",
                      rotary="half", rotary_dim=4, max_seq_len=64)
KV_CASES = [Case(3, 9, 0, "left"), Case(3, 1, 0, "left"), Case(3, 1, 7, "left"),
            Case(2, 5, 12, "left"), Case(1, 1, 4)]


def _env() -> dict:
    env = dict(os.environ)
    env.pop("LD_LIBRARY_PATH", None)  # the binaries must find their libraries on their own
    return env


def _make(*targets: str) -> subprocess.CompletedProcess:
    r = subprocess.run(["make", "-C", str(ROOT), *targets, f"PYTHON={sys.executable}"],
                       capture_output=True, text=True, env=_env())
    if r.returncode != 0:
        pytest.fail(f"make {' '.join(targets)} failed (exit {r.returncode}):\n"
                    f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}", pytrace=False)
    return r


@pytest.fixture(scope="session")
def binaries() -> dict:
    """build/cpp/mha_ort, mha_torch and mha_aoti; `make cpp` is incremental, so an up-to-date
    build is reused."""
    _make("cpp")
    bins = {"ort": BUILD / "mha_ort", "torch": BUILD / "mha_torch", "aoti": BUILD / "mha_aoti",
            "layers": BUILD / "mha_layers"}
    for path in bins.values():
        assert os.access(path, os.X_OK), f"{path} was not built"
    return bins


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory) -> dict:
    """{(config name, 'onnx' | 'torchscript'): artifact folder}."""
    root = tmp_path_factory.mktemp("cpp-artifacts")
    out = {}
    for name, config in CONFIGS.items():
        out[name, "onnx"] = export_onnx(config, root / f"{name}-onnx", validate=False).path
        out[name, "torchscript"] = export_torchscript(config, root / f"{name}-ts", validate=False).path
    out["kv", "onnx"] = export_onnx(KV_CONFIG, root / "kv-onnx", kv_cache=True, validate=False).path
    out["kv", "torchscript"] = export_torchscript(KV_CONFIG, root / "kv-ts", kv_cache=True,
                                                  validate=False).path
    return out


def run(binary: Path, *args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True,
                          env=_env(), cwd=cwd, timeout=120)


def make_inputs(folder: Path, d_in: int, shapes=SHAPES, seed: int = 0) -> list[tuple[Path, Path]]:
    rng = np.random.default_rng(seed)
    pairs = []
    for b, t in shapes:
        x = folder / f"x-{b}x{t}.npy"
        np.save(x, rng.standard_normal((b, t, d_in), dtype=np.float32))
        pairs.append((x, folder / f"y-{b}x{t}.npy"))
    return pairs


def flat(pairs) -> list[Path]:
    return [p for pair in pairs for p in pair]


def signature_of(folder: Path):
    return read_artifact(folder).signature


def write_case_dirs(root: Path, folder: Path, cases, seed: int = 0) -> list[tuple[Path, Case, dict]]:
    """One CASE_DIR per case holding NAME.npy for every declared input: [(dir, case, feeds)]."""
    art = read_artifact(folder)
    out = []
    for i, case in enumerate(cases):
        d = root / f"case{i}"
        d.mkdir(parents=True)
        feeds = make_feeds(art.signature, case, seed)
        for name, array in feeds.items():
            np.save(d / f"{name}.npy", array)
        out.append((d, case, feeds))
    return out


def read_outputs(case_dir: Path, sig) -> dict:
    return {name: np.load(case_dir / f"{name}.npy") for name in sig.output_names}


def assert_outputs_match(got: dict, want: dict, feeds: dict, case: Case, what: str) -> None:
    """Every declared output within ATOL; y only on real query rows (padding rows: finite)."""
    assert set(got) == set(want), (what, set(got), set(want))
    rows = real_queries(feeds, case)
    for name, expected in want.items():
        actual = got[name]
        assert actual.shape == expected.shape and actual.dtype == np.float32, (what, name)
        assert np.isfinite(actual).all(), (what, name, case)
        if name == "y" and rows is not None:
            actual, expected = np.where(rows, actual, 0), np.where(rows, expected, 0)
        np.testing.assert_allclose(actual, expected, rtol=0, atol=ATOL,
                                   err_msg=f"{what}: {name} at {case.label()}")


def assert_matches_python_and_eager(dirs, folder: Path, python, program: str) -> None:
    """Each case folder's outputs (written by ``program``) as the Python runner and the eager
    layer give them on the same inputs."""
    sig = signature_of(folder)
    eager = EagerRunner(sig, read_artifact(folder).load_source_module())
    for d, case, feeds in dirs:
        got = read_outputs(d, sig)
        assert_outputs_match(got, python.run(feeds), feeds, case, f"{program} vs python")
        assert_outputs_match(got, eager.run(feeds), feeds, case, f"{program} vs eager")


def one_error_line(r: subprocess.CompletedProcess, code: int = 2) -> str:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("Error: ")
    return lines[0]


# --- parity: same files, C++ vs Python -----------------------------------------------------------

@pytest.mark.parametrize("name", CONFIGS)
def test_ort_matches_python_ort_and_eager(binaries, artifacts, tmp_path, name):
    folder = artifacts[name, "onnx"]
    pairs = make_inputs(tmp_path, CONFIGS[name].d_in)
    r = run(binaries["ort"], folder / "model.onnx", *flat(pairs), "--threads", "2")
    assert r.returncode == 0, r.stderr
    assert "provider: CPUExecutionProvider" in r.stdout
    assert r.stderr == ""
    sig = signature_of(folder)
    python_ort = OrtRunner(sig, folder / "model.onnx", "cpu")
    eager = EagerRunner(sig, read_artifact(folder).load_source_module())
    for x_path, y_path in pairs:
        x, y = np.load(x_path), np.load(y_path)
        assert y.dtype == np.float32 and y.shape == x.shape[:2] + (CONFIGS[name].dim,)
        np.testing.assert_allclose(y, python_ort.run({"x": x})["y"], rtol=0, atol=ATOL)
        np.testing.assert_allclose(y, eager.run({"x": x})["y"], rtol=0, atol=ATOL)
    # The CASE_DIR form on the same one-input model: x.npy in, y.npy out.
    dirs = write_case_dirs(tmp_path / "cases", folder, [Case(2, 16), Case(1, 1)])
    r = run(binaries["ort"], folder / "model.onnx", *[d for d, _, _ in dirs])
    assert r.returncode == 0, r.stderr
    for d, case, feeds in dirs:
        assert_outputs_match(read_outputs(d, sig), python_ort.run(feeds), feeds, case, "mha_ort")


@pytest.mark.parametrize("name", CONFIGS)
def test_torch_matches_python_torchscript_and_eager(binaries, artifacts, tmp_path, name):
    folder = artifacts[name, "torchscript"]
    pairs = make_inputs(tmp_path, CONFIGS[name].d_in, seed=1)
    r = run(binaries["torch"], folder / "model.pt", *flat(pairs), "--threads", "2")
    assert r.returncode == 0, r.stderr
    assert "device: cpu" in r.stdout
    sig = signature_of(folder)
    python_ts = TorchScriptRunner(sig, folder / "model.pt")
    eager = EagerRunner(sig, read_artifact(folder).load_source_module())
    for x_path, y_path in pairs:
        x, y = np.load(x_path), np.load(y_path)
        assert y.shape == x.shape[:2] + (CONFIGS[name].dim,)
        np.testing.assert_allclose(y, python_ts.run({"x": x})["y"], rtol=0, atol=ATOL)
        np.testing.assert_allclose(y, eager.run({"x": x})["y"], rtol=0, atol=ATOL)
    dirs = write_case_dirs(tmp_path / "cases", folder, [Case(2, 16), Case(1, 1)], seed=1)
    r = run(binaries["torch"], folder / "model.pt", *[d for d, _, _ in dirs])
    assert r.returncode == 0, r.stderr
    for d, case, feeds in dirs:
        assert_outputs_match(read_outputs(d, sig), python_ts.run(feeds), feeds, case, "mha_torch")


def test_torch_model_without_declared_names_is_x_to_y(binaries, artifacts, tmp_path):
    """model.pt files written before named I/O have no input_names / output_names: x -> y."""
    folder = artifacts["split", "torchscript"]
    source = read_artifact(folder).load_source_module()
    old = tmp_path / "old.pt"
    torch.jit.script(source).save(str(old))
    assert not hasattr(torch.jit.load(str(old)), "input_names")
    dirs = write_case_dirs(tmp_path / "cases", folder, [Case(2, 7)])
    pairs = make_inputs(tmp_path, 64, shapes=[(1, 3)])
    r = run(binaries["torch"], old, *[d for d, _, _ in dirs])
    assert r.returncode == 0, r.stderr
    r2 = run(binaries["torch"], old, *flat(pairs))
    assert r2.returncode == 0, r2.stderr
    eager = EagerRunner(signature_of(folder), source)
    for d, case, feeds in dirs:
        assert_outputs_match({"y": np.load(d / "y.npy")}, eager.run(feeds), feeds, case, "old.pt")
    np.testing.assert_allclose(np.load(pairs[0][1]), eager.run({"x": np.load(pairs[0][0])})["y"],
                               rtol=0, atol=ATOL)


def test_ort_float16_model_matches_python_ort(binaries, tmp_path):
    """float16 exports take float32 .npy in and give float32 out; the math is ORT's float16."""
    folder = export_onnx(CONFIGS["split"], tmp_path / "fp16", dtype="float16", validate=False).path
    pairs = make_inputs(tmp_path, 64, shapes=[(2, 16), (1, 1)])
    r = run(binaries["ort"], folder / "model.onnx", *flat(pairs))
    assert r.returncode == 0, r.stderr
    python_ort = OrtRunner(signature_of(folder), folder / "model.onnx", "cpu")
    for x_path, y_path in pairs:
        np.testing.assert_allclose(np.load(y_path), python_ort.run({"x": np.load(x_path)})["y"],
                                   rtol=0, atol=ATOL)


def test_ort_info_prints_symbolic_dims_and_config(binaries, artifacts):
    r = run(binaries["ort"], artifacts["fused-in48", "onnx"] / "model.onnx", "--info")
    assert r.returncode == 0, r.stderr
    assert "x: float32 [batch, seq, 48]" in r.stdout
    assert "y: float32 [batch, seq, 32]" in r.stdout
    line = next(l for l in r.stdout.splitlines() if l.strip().startswith("mha_export.config:"))
    config = json.loads(line.split(":", 1)[1])
    assert MHAConfig.from_dict(config) == CONFIGS["fused-in48"]
    assert "mha_export.io:" in r.stdout


# --- kv-cache: four named inputs, three named outputs, one process for every case ---------------

def _kv_run(binaries, artifacts, tmp_path, program: str, seed: int):
    fmt = "onnx" if program == "ort" else "torchscript"
    folder = artifacts["kv", fmt]
    model = folder / ("model.onnx" if fmt == "onnx" else "model.pt")
    dirs = write_case_dirs(tmp_path, folder, KV_CASES, seed=seed)
    r = run(binaries[program], model, *[d for d, _, _ in dirs], "--threads", "2")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    return folder, model, dirs, r


def test_ort_kv_cache_matches_python_ort_and_eager(binaries, artifacts, tmp_path):
    folder, model, dirs, r = _kv_run(binaries, artifacts, tmp_path, "ort", seed=2)
    sig = signature_of(folder)
    assert sig.kind == "kv-cache"
    python_ort = OrtRunner(sig, model, "cpu")
    eager = EagerRunner(sig, read_artifact(folder).load_source_module())
    for d, case, feeds in dirs:
        got = read_outputs(d, sig)
        b, t, p = case.batch, case.seq, case.past
        assert got["y"].shape == (b, t, KV_CONFIG.dim)
        assert got["present_key"].shape == (b, KV_CONFIG.kv_heads, p + t, KV_CONFIG.head_dim)
        assert_outputs_match(got, python_ort.run(feeds), feeds, case, "mha_ort vs ort")
        assert_outputs_match(got, eager.run(feeds), feeds, case, "mha_ort vs eager")
        assert f"{d}: x [{b}, {t}, {KV_CONFIG.d_in}]" in r.stdout


def test_torch_kv_cache_matches_python_torchscript_and_eager(binaries, artifacts, tmp_path):
    folder, model, dirs, r = _kv_run(binaries, artifacts, tmp_path, "torch", seed=3)
    sig = signature_of(folder)
    python_ts = TorchScriptRunner(sig, model)
    eager = EagerRunner(sig, read_artifact(folder).load_source_module())
    for d, case, feeds in dirs:
        got = read_outputs(d, sig)
        assert_outputs_match(got, python_ts.run(feeds), feeds, case, "mha_torch vs torchscript")
        assert_outputs_match(got, eager.run(feeds), feeds, case, "mha_torch vs eager")


def test_info_lists_declared_names(binaries, artifacts):
    r = run(binaries["ort"], artifacts["kv", "onnx"] / "model.onnx", "--info")
    assert r.returncode == 0, r.stderr
    c = KV_CONFIG
    for line in (f"x: float32 [batch, seq, {c.d_in}]",
                 "attention_mask: int64 [batch, past_seq + seq]",
                 f"past_key: float32 [batch, {c.kv_heads}, past_seq, {c.head_dim}]",
                 f"past_value: float32 [batch, {c.kv_heads}, past_seq, {c.head_dim}]",
                 f"y: float32 [batch, seq, {c.dim}]",
                 f"present_key: float32 [batch, {c.kv_heads}, past_seq + seq, {c.head_dim}]",
                 f"present_value: float32 [batch, {c.kv_heads}, past_seq + seq, {c.head_dim}]",
                 "position_ids: int64 [batch, seq]"):
        assert f"  {line}\n" in r.stdout, (line, r.stdout)
    r = run(binaries["torch"], artifacts["kv", "torchscript"] / "model.pt", "--info")
    assert r.returncode == 0, r.stderr
    inputs, outputs = r.stdout.split("\ninputs:\n")[1].split("\noutputs:\n")
    assert [l.split(":")[0].strip() for l in inputs.splitlines()] == [
        "x", "attention_mask", "past_key", "past_value", "position_ids"]
    assert [l.split(":")[0].strip() for l in outputs.splitlines()] == [
        "y", "present_key", "present_value"]


@pytest.mark.parametrize("program", ["ort", "torch"])
def test_kv_cache_bad_case_dirs_exit_2(binaries, artifacts, tmp_path, program):
    """A missing or mistyped input in any case: exit 2, one line naming it, no output anywhere."""
    folder = artifacts["kv", "onnx" if program == "ort" else "torchscript"]
    model = folder / ("model.onnx" if program == "ort" else "model.pt")
    (good, _, _), (bad, _, feeds) = write_case_dirs(tmp_path, folder, KV_CASES[2:4])
    outputs = signature_of(folder).output_names

    def check(*args) -> str:
        line = one_error_line(run(binaries[program], model, *args))
        for d in (good, bad):
            assert not [n for n in outputs if (d / f"{n}.npy").exists()], line
            assert not list(d.glob("*.tmp")), line
        return line

    (bad / "past_value.npy").unlink()
    line = check(good, bad)
    assert f"{bad}: no past_value.npy" in line and "'past_value'" in line
    np.save(bad / "past_value.npy", feeds["past_value"])
    np.save(bad / "attention_mask.npy", feeds["attention_mask"].astype(np.int32))
    line = check(good, bad)
    assert "attention_mask.npy" in line and "'<i4'" in line
    if program == "ort":  # mha_torch only knows names: dtypes and shapes are ORT's declaration
        np.save(bad / "attention_mask.npy", feeds["attention_mask"].astype(np.float32))
        assert "int64" in check(good, bad)
        np.save(bad / "attention_mask.npy", feeds["attention_mask"][:, 1:])
        assert "past_seq + seq" in check(good, bad)
        np.save(bad / "attention_mask.npy", feeds["attention_mask"])
        np.save(bad / "past_key.npy", feeds["past_key"][0])
        assert "rank-4" in check(good, bad)
    # A mixed command line and the legacy pair form are refused for this 4-input model.
    line = check(good, bad / "x.npy")
    assert "not both" in line
    line = check(bad / "x.npy", tmp_path / "y.npy")
    assert "CASE_DIR" in line and f"{len(signature_of(folder).inputs)} inputs" in line
    assert not (tmp_path / "y.npy").exists()


# --- bad input: exit 2, one line, nothing written ------------------------------------------------

def _bad_inputs(folder: Path) -> dict:
    np.save(folder / "f64.npy", np.zeros((1, 4, 64)))
    np.save(folder / "rank2.npy", np.zeros((4, 64), np.float32))
    np.save(folder / "width32.npy", np.zeros((1, 4, 32), np.float32))
    np.save(folder / "empty.npy", np.zeros((1, 0, 64), np.float32))
    np.save(folder / "fortran.npy", np.asfortranarray(np.zeros((2, 4, 64), np.float32)))
    (folder / "text.npy").write_text("not numpy\n")
    np.save(folder / "ok.npy", np.zeros((1, 4, 64), np.float32))
    data = (folder / "ok.npy").read_bytes()
    (folder / "truncated.npy").write_bytes(data[:-10])
    return {"missing input": ["{model}", folder / "absent.npy", "{out}"],
            "not an npy": ["{model}", folder / "text.npy", "{out}"],
            "float64": ["{model}", folder / "f64.npy", "{out}"],
            "rank 2": ["{model}", folder / "rank2.npy", "{out}"],
            "wrong width": ["{model}", folder / "width32.npy", "{out}"],
            "no tokens": ["{model}", folder / "empty.npy", "{out}"],
            "fortran order": ["{model}", folder / "fortran.npy", "{out}"],
            "truncated": ["{model}", folder / "truncated.npy", "{out}"],
            "missing model": [folder / "absent.model", folder / "ok.npy", "{out}"],
            "model does not load": [folder / "text.npy", folder / "ok.npy", "{out}"],
            "odd pair": ["{model}", folder / "ok.npy"],
            "unknown option": ["{model}", folder / "ok.npy", "{out}", "--bogus"],
            "bad threads": ["{model}", folder / "ok.npy", "{out}", "--threads", "zero"],
            "second input bad": ["{model}", folder / "ok.npy", folder / "first-out.npy",
                                 folder / "width32.npy", "{out}"]}


@pytest.mark.parametrize("program", ["ort", "torch"])
def test_bad_input_exit_2_one_line(binaries, artifacts, tmp_path, program):
    model = (artifacts["split", "onnx"] / "model.onnx" if program == "ort"
             else artifacts["split", "torchscript"] / "model.pt")
    out = tmp_path / "out.npy"
    for case, args in _bad_inputs(tmp_path).items():
        argv = [str(model) if a == "{model}" else str(out) if a == "{out}" else a for a in args]
        r = run(binaries[program], *argv)
        line = one_error_line(r)
        assert "Traceback" not in line and len(line) < 400, (case, line)
        assert not out.exists() and not (tmp_path / "first-out.npy").exists(), case
        assert not list(tmp_path.glob("*.tmp")), case


def test_error_lines_name_the_cause(binaries, artifacts, tmp_path):
    cases = _bad_inputs(tmp_path)
    model = artifacts["split", "onnx"] / "model.onnx"

    def error(case):
        args = [str(model) if a == "{model}" else str(tmp_path / "o.npy") if a == "{out}" else a
                for a in cases[case]]
        return one_error_line(run(binaries["ort"], *args))

    assert "not found" in error("missing input")
    assert "not an .npy" in error("not an npy")
    assert "'<f8'" in error("float64") and "float32" in error("float64")
    assert "rank-3" in error("rank 2")
    assert "dimension 2 is 32, not 64" in error("wrong width")
    assert "axis 'seq' is 0" in error("no tokens")
    assert "cannot load model" in error("model does not load")


# --- CUDA: runs on CUDA or says why not; never a silent CPU run ----------------------------------

def _python_ort_cuda_reason(model: Path) -> str | None:
    try:
        OrtRunner(signature_of(model.parent), model, "cuda")
        return None
    except RunnerUnavailable as e:
        return str(e)


def test_ort_provider_cuda_runs_on_cuda_or_exits_3(binaries, artifacts, tmp_path):
    model = artifacts["split", "onnx"] / "model.onnx"
    [(x, y)] = make_inputs(tmp_path, 64, shapes=[(2, 16)])
    r = run(binaries["ort"], model, x, y, "--provider", "cuda")
    if _python_ort_cuda_reason(model) is None:  # a machine where CUDA works: it must be used
        assert r.returncode == 0, r.stderr
        assert "provider: CUDAExecutionProvider" in r.stdout
        cpu = OrtRunner(signature_of(model.parent), model, "cpu")
        np.testing.assert_allclose(np.load(y), cpu.run({"x": np.load(x)})["y"], rtol=0, atol=1e-4)
    else:
        line = one_error_line(r, code=3)
        assert "CUDAExecutionProvider" in line and "not falling back to CPU" in line
        assert "CPUExecutionProvider" not in r.stdout
        assert not y.exists()


def test_torch_device_cuda_runs_on_cuda_or_exits_3(binaries, artifacts, tmp_path):
    model = artifacts["split", "torchscript"] / "model.pt"
    [(x, y)] = make_inputs(tmp_path, 64, shapes=[(2, 16)])
    r = run(binaries["torch"], model, x, y, "--device", "cuda")
    if torch.cuda.is_available():
        assert r.returncode == 0, r.stderr
        assert "device: cuda" in r.stdout
        ts = TorchScriptRunner(signature_of(model.parent), model)
        np.testing.assert_allclose(np.load(y), ts.run({"x": np.load(x)})["y"], rtol=0, atol=1e-4)
    else:
        line = one_error_line(r, code=3)
        assert "cuda" in line and "not falling back to CPU" in line
        assert not y.exists()


# --- the relocatable bundle ----------------------------------------------------------------------

def test_bundle_runs_after_being_moved(binaries, tmp_path):
    _make("cpp-bundle")
    moved = tmp_path / "elsewhere" / "mha-bundle"
    shutil.copytree(BUNDLE, moved, symlinks=False)
    assert not any(p.is_symlink() for p in moved.iterdir())
    for lib in ("libonnxruntime.so.1", "libonnxruntime_providers_shared.so"):
        assert (moved / lib).is_file(), lib
    # The moved binary resolves ONNX Runtime from its own folder ($ORIGIN), not the build tree.
    ldd = subprocess.run(["ldd", str(moved / "mha_ort")], capture_output=True, text=True,
                         env=_env()).stdout
    assert f"libonnxruntime.so.1 => {moved}/libonnxruntime.so.1" in ldd, ldd

    r = subprocess.run([str(moved / "run.sh")], capture_output=True, text=True, cwd=tmp_path,
                       env=_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    y = np.load(moved / "y.npy")
    # The bundle's sample model: the Makefile's MHAConfig(dim=64, heads=4), full signature.
    python_ort = OrtRunner(make_signature(CONFIGS["split"], "full"), moved / "model.onnx", "cpu")
    np.testing.assert_allclose(y, python_ort.run({"x": np.load(moved / "x.npy")})["y"], rtol=0,
                               atol=ATOL)

    pairs = make_inputs(tmp_path, 64, shapes=[(1, 1), (2, 9)])
    r = run(moved / "mha_ort", moved / "model.onnx", *flat(pairs), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for x_path, y_path in pairs:
        np.testing.assert_allclose(np.load(y_path), python_ort.run({"x": np.load(x_path)})["y"],
                                   rtol=0, atol=ATOL)


# --- static cache: a generation loop over one buffer bound as past and present -------------------

STATIC_CONFIG = MHAConfig(dim=64, heads=4, kv_heads=2, rotary="half", max_seq_len=64)


# Multi-head Latent Attention: the buffers hold latents [B, 1, C, R] and rotated keys [B, 1, C, Hr]
MLA_CONFIG = MHAConfig(dim=64, heads=4, max_seq_len=64, latent=dict(
    kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=24, q_lora_rank=48))


@pytest.mark.parametrize("config, form", [(STATIC_CONFIG, "auto"), (STATIC_CONFIG, "contrib-gqa"),
                                          (STATIC_CONFIG, "decomposed"), (MLA_CONFIG, "latent")],
                         ids=["auto", "contrib-gqa", "decomposed", "mla-latent"])
def test_ort_generate_writes_one_buffer_in_place(binaries, tmp_path, config, form):
    """mha_ort --generate 5,1,1,1: Ort::IoBinding binds the case's buffers as past and present;
    y equals one full forward of the sequence, the buffer's first 8 entries its keys/values
    (an MLA layer's: its latents and rotated keys)."""
    from mha_export import export_onnx
    from mha_export.check.scenarios import eager_full
    folder = export_onnx(config, tmp_path / "m", attention=form, static_cache=True,
                         validate=False).path
    sig = read_artifact(folder).signature
    rng = np.random.default_rng(4)
    case = tmp_path / "case"
    case.mkdir()
    x = rng.standard_normal((2, 8, 64)).astype(np.float32)
    key_buffer, value_buffer = (rng.standard_normal(sig.cache_buffer(n, 2, 20)).astype(
        np.float32) for n in ("past_key", "past_value"))  # never read beyond the writes
    for name, a in (("x", x), ("past_key", key_buffer), ("past_value", value_buffer)):
        np.save(case / f"{name}.npy", a)
    r = run(binaries["ort"], folder / "model.onnx", case, "--generate", "5,1,1,1")
    assert r.returncode == 0, r.stderr
    want = eager_full(read_artifact(folder).load_source_module())(x, np.ones((2, 8), np.int64))
    np.testing.assert_allclose(np.load(case / "y.npy"), want["y"], rtol=0, atol=ATOL)
    for name, buffer in (("present_key", key_buffer), ("present_value", value_buffer)):
        got = np.load(case / f"{name}.npy")
        assert got.shape == buffer.shape
        np.testing.assert_allclose(got[:, :, :8], want[name], rtol=0, atol=ATOL)
        np.testing.assert_array_equal(got[:, :, 8:], buffer[:, :, 8:])  # untouched beyond
    bad = run(binaries["ort"], folder / "model.onnx", case, "--generate", "5,1")
    assert bad.returncode == 2 and "steps sum to 6" in bad.stderr


@pytest.mark.parametrize("form", ["auto", "contrib-gqa", "decomposed"])
def test_ort_generate_int8_cache_matches_python(binaries, tmp_path, form):
    """An int8-cache export (--kv-cache-dtype int8) through mha_ort --generate 5,1,1,1: int8
    buffers in, bound in place, int8 codes out. Python ONNX Runtime running the same calls gives
    the same y (ATOL) and the same codes bit for bit (same kernel, same machine); the eager
    reference's codes differ by at most 1 in very few entries; nothing beyond the writes moves."""
    from mha_export.check.scenarios import eager_full
    folder = export_onnx(STATIC_CONFIG, tmp_path / "m", attention=form, static_cache=True,
                         kv_cache_dtype="int8", validate=False).path
    model = folder / "model.onnx"
    c = STATIC_CONFIG
    rng = np.random.default_rng(7)
    case = tmp_path / "case"
    case.mkdir()
    x = rng.standard_normal((2, 8, c.d_in)).astype(np.float32)
    shape = (2, c.kv_heads, 20, c.head_dim)
    buffers = {n: rng.integers(-128, 128, shape, dtype=np.int8) for n in ("past_key", "past_value")}
    for name, a in (("x", x), *buffers.items()):
        np.save(case / f"{name}.npy", a)
    r = run(binaries["ort"], model, case, "--generate", "5,1,1,1")
    assert r.returncode == 0, r.stderr
    got = {n: np.load(case / f"{n}.npy") for n in ("y", "present_key", "present_value")}
    for name in ("present_key", "present_value"):
        assert got[name].dtype == np.int8 and got[name].shape == shape, name

    # (a) Python ONNX Runtime, call by call over copies of the same buffers (bound in place too).
    sig = signature_of(folder)
    python_ort = OrtRunner(sig, model, "cpu")
    cache = {n: a.copy() for n, a in buffers.items()}
    ys, start = [], 0
    for n in (5, 1, 1, 1):
        positions = np.tile(np.arange(start, start + n), (2, 1))
        rope = {"position_ids": positions} if "position_ids" in sig.input_names else {}
        out = python_ort.run({"x": x[:, start:start + n], **cache,
                              "past_lengths": np.full(2, start, np.int64), **rope})
        ys.append(out["y"])
        cache = {"past_key": out["present_key"], "past_value": out["present_value"]}
        start += n
    np.testing.assert_allclose(got["y"], np.concatenate(ys, axis=1), rtol=0, atol=ATOL)
    np.testing.assert_array_equal(got["present_key"], cache["past_key"])
    np.testing.assert_array_equal(got["present_value"], cache["past_value"])

    # (b) the eager reference: codes of one full forward, rounding apart; (c) untouched beyond.
    want = eager_full(read_artifact(folder).load_source_module())(x, np.ones((2, 8), np.int64))
    np.testing.assert_allclose(got["y"], want["y"], rtol=0, atol=1e-2)
    for name, past in (("present_key", "past_key"), ("present_value", "past_value")):
        written = got[name][:, :, :8].astype(np.int16)
        diff = np.abs(written - want[name].astype(np.int16))
        assert want[name].dtype == np.int8 and diff.max() <= 1, name
        assert np.count_nonzero(diff) <= diff.size // 100, (name, np.count_nonzero(diff))
        np.testing.assert_array_equal(got[name][:, :, 8:], buffers[past][:, :, 8:])

    # (d) a float32 buffer for the int8 model, or no --generate: exit 2, one line, nothing written.
    bad = tmp_path / "bad"
    bad.mkdir()
    np.save(bad / "x.npy", x)
    np.save(bad / "past_key.npy", buffers["past_key"].astype(np.float32))
    np.save(bad / "past_value.npy", buffers["past_value"])
    line = one_error_line(run(binaries["ort"], model, bad, "--generate", "5,1,1,1"))
    assert "past_key.npy" in line and "'<f4'" in line and "int8" in line, line
    assert not list(bad.glob("y.npy*")) and not list(bad.glob("present_*"))
    line = one_error_line(run(binaries["ort"], model, case))
    assert "'past_key' is int8" in line and "--generate" in line, line


# --- --cuda-graph: the static step replayed as a CUDA graph (mha_ort, mha_layers) ---------------

# the last: the second's shape again (its buffers refreshed, the call replayed), other values
GRAPH_CASES = [Case(2, 5, 3), Case(2, 1, 7), Case(2, 1, 4), Case(2, 1, 7, "left")]


@pytest.fixture(scope="module")
def graph_model(tmp_path_factory) -> Path:
    """A static-cache export (x, past_key, past_value, past_lengths, position_ids)."""
    root = tmp_path_factory.mktemp("graph")
    return export_onnx(STATIC_CONFIG, root / "m", static_cache=True, validate=False).path


def _cuda_graph_reason(folder: Path) -> str | None:
    """Why Python ONNX Runtime cannot run this file on CUDA here, or None (it can)."""
    return _python_ort_cuda_reason(folder / "model.onnx")


def test_cuda_graph_needs_the_cuda_provider(binaries, graph_model, tmp_path):
    [(d, _, _)] = write_case_dirs(tmp_path, graph_model, GRAPH_CASES[:1])
    r = run(binaries["ort"], graph_model / "model.onnx", d, "--cuda-graph")
    assert "--cuda-graph needs --provider cuda" in one_error_line(r)
    assert not (d / "y.npy").exists()
    r = run(binaries["layers"], graph_model / "model.onnx", "--cuda-graph", "--pool", "busy")
    assert "--pool must be" in one_error_line(r)


def test_cuda_graph_refuses_a_model_without_a_static_cache(binaries, artifacts, tmp_path):
    """A kv-cache (growing) model: refused before CUDA is tried, so exit 2 on any machine."""
    folder = artifacts["kv", "onnx"]
    [(d, _, _)] = write_case_dirs(tmp_path, folder, KV_CASES[:1])
    r = run(binaries["ort"], folder / "model.onnx", d, "--provider", "cuda", "--cuda-graph")
    line = one_error_line(r)
    assert "only the static-cache step" in line and "no input 'past_lengths'" in line
    assert not (d / "y.npy").exists()
    r = run(binaries["layers"], folder / "model.onnx", "--cuda-graph")
    assert "not a static-cache model" in one_error_line(r)


def test_cuda_graph_replays_on_cuda_or_exits_3(binaries, graph_model, tmp_path):
    """mha_ort --provider cuda --cuda-graph: where CUDA runs, each case's outputs (those of a
    replay) are Python ONNX Runtime's on the CPU; elsewhere exit 3 with the CUDA reason, one
    line, nothing written."""
    dirs = write_case_dirs(tmp_path, graph_model, GRAPH_CASES)
    r = run(binaries["ort"], graph_model / "model.onnx", *(d for d, _, _ in dirs),
            "--provider", "cuda", "--cuda-graph")
    if _cuda_graph_reason(graph_model) is not None:
        line = one_error_line(r, code=3)
        assert "CUDAExecutionProvider" in line and "not falling back to CPU" in line
        assert not any((d / "y.npy").exists() for d, _, _ in dirs)
        return
    assert r.returncode == 0, r.stderr
    assert "replayed as a CUDA graph" in r.stdout or "without a graph (" in r.stderr
    _assert_graph_outputs(graph_model, dirs, atol=1e-4)


def test_the_cuda_runtime_loader_needs_a_device_or_exits_3(tmp_path):
    """--cuda-graph's CUDA runtime (cpp/cuda_runtime_loader.hpp), found at run time: where a
    device runs, a usable one; elsewhere exit 3 in one line (no libcudart, no driver, or no
    device: CUDA's own words), never a crash. Here a libcudart without a driver says error 35."""
    program = tmp_path / "cuda_runtime_probe"
    r = subprocess.run(["g++", "-std=c++17", f"-I{ROOT / 'cpp'}",
                        str(ROOT / "tests" / "cpp" / f"{program.name}.cpp"), "-o", str(program),
                        "-ldl"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    r = run(program)
    if torch.cuda.is_available():
        assert r.returncode == 0 and "a CUDA device through libcudart.so" in r.stdout, r.stderr
        return
    assert one_error_line(r, code=3).startswith("Error: --cuda-graph: ")


def test_cuda_graph_generate_on_cuda_or_exits_3(binaries, graph_model, tmp_path):
    """mha_ort --provider cuda --cuda-graph --generate 5,1,1,1: where CUDA runs, y and the
    buffers as mha_ort --generate's on the CPU (the T=1 step replayed); elsewhere exit 3."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 8, STATIC_CONFIG.d_in)).astype(np.float32)
    shape = signature_of(graph_model).cache_buffer("past_key", 1, 20)
    feeds = {"x": x, **{n: rng.standard_normal(shape).astype(np.float32)
                        for n in ("past_key", "past_value")}}
    folders = {k: tmp_path / k for k in ("cpu", "cuda")}
    for folder in folders.values():
        folder.mkdir()
        for name, a in feeds.items():
            np.save(folder / f"{name}.npy", a)
    model = graph_model / "model.onnx"
    r = run(binaries["ort"], model, folders["cuda"], "--provider", "cuda", "--cuda-graph",
            "--generate", "5,1,1,1")
    if _cuda_graph_reason(graph_model) is not None:
        assert "not falling back to CPU" in one_error_line(r, code=3)
        assert not (folders["cuda"] / "y.npy").exists()
        return
    assert r.returncode == 0, r.stderr
    assert run(binaries["ort"], model, folders["cpu"], "--generate", "5,1,1,1").returncode == 0
    for name in ("y", "present_key", "present_value"):
        np.testing.assert_allclose(np.load(folders["cuda"] / f"{name}.npy"),
                                   np.load(folders["cpu"] / f"{name}.npy"), rtol=0, atol=1e-4,
                                   err_msg=name)


def _assert_graph_outputs(graph_model: Path, dirs, atol: float) -> None:
    """y as Python ORT's on the CPU; the buffers as its present up to past + T, and untouched
    beyond (written in place: the out-of-place reference leaves that part undefined)."""
    cpu = OrtRunner(signature_of(graph_model), graph_model / "model.onnx", "cpu")
    for d, case, feeds in dirs:
        want = cpu.run(feeds)
        np.testing.assert_allclose(np.load(d / "y.npy"), want["y"], rtol=0, atol=atol,
                                   err_msg=f"y at {case.label()}")
        for name, past in (("present_key", "past_key"), ("present_value", "past_value")):
            got = np.load(d / f"{name}.npy")
            for b, start in enumerate(feeds["past_lengths"]):  # written: up to start + T
                end = start + feeds["x"].shape[1]
                np.testing.assert_allclose(got[b, :, :end], want[name][b, :, :end], rtol=0,
                                           atol=atol, err_msg=f"{name} at {case.label()}")
                np.testing.assert_array_equal(got[b, :, end:], feeds[past][b, :, end:])


@pytest.fixture(scope="module")
def graph_on_cpu(binaries, tmp_path_factory) -> Path:
    """tests/cpp/graph_replays_on_cpu.cpp built against build/cpp's ONNX Runtime: mha_ort's own
    --cuda-graph code (GraphReplays) on the CPU provider, its buffers on the host."""
    program = tmp_path_factory.mktemp("graph-on-cpu") / "graph_replays_on_cpu"
    ort = BUILD / "ort"
    r = subprocess.run(["g++", "-std=c++17", "-O1", f"-I{ort / 'include' / 'onnxruntime'}",
                        f"-I{ROOT / 'cpp'}", str(ROOT / "tests" / "cpp" / f"{program.name}.cpp"),
                        "-o", str(program), str(ort / "lib" / "libonnxruntime.so.1"), "-ldl",
                        f"-Wl,-rpath,{ort / 'lib'}"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return program


def test_cuda_graph_bindings_run_on_the_cpu(graph_on_cpu, graph_model, tmp_path):
    """mha_ort's --cuda-graph path on the CPU provider's buffers: a session per shape with its
    dims fixed, everything bound once, the cache written in place; outputs as Python ORT's, a
    repeated shape refreshed (its inputs copied into the same buffers). The capture and the
    device copies need a GPU."""
    dirs = write_case_dirs(tmp_path / "cases", graph_model, GRAPH_CASES)
    r = run(graph_on_cpu, graph_model / "model.onnx", *(d for d, _, _ in dirs))
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("without a graph (the CPU provider)") == 3  # 4 cases, 3 shapes
    _assert_graph_outputs(graph_model, dirs, atol=ATOL)


def test_cuda_graph_generate_binds_one_cache_on_the_cpu(binaries, graph_on_cpu, graph_model,
                                                        tmp_path):
    """--generate 5,1,1,1 under --cuda-graph's code: one cache of the app's bound by both step
    shapes' sessions (T=5, T=1: two sessions, the T=1 one called three times); y and the buffers
    as mha_ort --generate's on the CPU."""
    rng = np.random.default_rng(4)
    cases = {}
    for name in ("plain", "graph"):
        cases[name] = tmp_path / name
        cases[name].mkdir()
    x = rng.standard_normal((2, 8, STATIC_CONFIG.d_in)).astype(np.float32)
    shape = signature_of(graph_model).cache_buffer("past_key", 2, 20)
    buffers = {n: rng.standard_normal(shape).astype(np.float32) for n in ("past_key", "past_value")}
    for folder in cases.values():
        for name, a in (("x", x), *buffers.items()):
            np.save(folder / f"{name}.npy", a)
    model = graph_model / "model.onnx"
    plain = run(binaries["ort"], model, cases["plain"], "--generate", "5,1,1,1")
    graph = run(graph_on_cpu, model, cases["graph"], "--generate", "5,1,1,1")
    assert plain.returncode == 0 and graph.returncode == 0, plain.stderr + graph.stderr
    assert graph.stderr.count("without a graph (the CPU provider)") == 2, graph.stderr
    for name in ("y", "present_key", "present_value"):
        np.testing.assert_allclose(np.load(cases["graph"] / f"{name}.npy"),
                                   np.load(cases["plain"] / f"{name}.npy"), rtol=0, atol=ATOL,
                                   err_msg=name)


def test_layers_cuda_graph_times_replays_on_cuda_or_exits_3(binaries, graph_model):
    r = run(binaries["layers"], graph_model / "model.onnx", "--cuda-graph", "--copies", 2,
            "--past", 8, "--steps", 4)
    if _cuda_graph_reason(graph_model) is not None:
        line = one_error_line(r, code=3)
        assert "CUDAExecutionProvider" in line and "not falling back to CPU" in line
        return
    assert r.returncode == 0, r.stderr
    assert "CUDA events" in r.stdout and "ms a step" in r.stdout


# --- quantized projections: MatMulNBits (com.microsoft) through mha_ort --------------------------

# Small on purpose; each export quantizes q, k, v (inside the If branches) and the out projection.
QUANT_CONFIG = MHAConfig(dim=64, heads=4, max_seq_len=32)  # x -> y: both command-line forms
QUANT_STATIC_CONFIG = MHAConfig(dim=64, heads=4, kv_heads=2, rotary="half", max_seq_len=32)


def _matmul_nbits(model: Path) -> int:
    """MatMulNBits nodes in the model file, those inside If branches included."""
    import onnx
    from faults import all_nodes
    return sum(n.op_type == "MatMulNBits" for n in all_nodes(onnx.load(str(model)).graph))


def test_ort_int4_model_matches_python_ort(binaries, tmp_path):
    """An int4 export (block 32, symmetric, accuracy level 4: int8 activations) runs in mha_ort
    as MatMulNBits and gives Python ONNX Runtime's outputs (same kernel, same machine: ATOL), in
    both command-line forms; and they are not the float weights' outputs."""
    folder = export_onnx(QUANT_CONFIG, tmp_path / "int4", quantize=QuantSpec(bits=4),
                         validate=False).path
    model = folder / "model.onnx"
    assert _matmul_nbits(model) >= 4  # q, k, v (in the If branches) and out
    sig = signature_of(folder)
    python_ort = OrtRunner(sig, model, "cpu")
    float_eager = EagerRunner(sig, read_artifact(folder).load_plain_module())
    pairs = make_inputs(tmp_path, QUANT_CONFIG.d_in, shapes=[(2, 16), (1, 1), (3, 7)], seed=5)
    r = run(binaries["ort"], model, *flat(pairs), "--threads", "2")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    for x_path, y_path in pairs:
        x, y = np.load(x_path), np.load(y_path)
        assert y.dtype == np.float32 and y.shape == x.shape[:2] + (QUANT_CONFIG.dim,)
        np.testing.assert_allclose(y, python_ort.run({"x": x})["y"], rtol=0, atol=ATOL)
        assert np.abs(y - float_eager.run({"x": x})["y"]).max() > 100 * ATOL  # int4 for real
    dirs = write_case_dirs(tmp_path / "cases", folder, [Case(2, 16), Case(1, 1)], seed=5)
    r = run(binaries["ort"], model, *[d for d, _, _ in dirs])
    assert r.returncode == 0, r.stderr
    for d, case, feeds in dirs:
        assert_outputs_match(read_outputs(d, sig), python_ort.run(feeds), feeds, case,
                             "mha_ort int4")


def test_ort_generate_int4_static_cache_matches_eager(binaries, tmp_path):
    """mha_ort --generate over a quantized static-cache export: accuracy level 1 (fp32 compute),
    so y and the written keys/values equal one full forward of the eager module with the dequantized
    weights within ATOL, as the float static cache's test above."""
    from mha_export.check.scenarios import eager_full
    folder = export_onnx(QUANT_STATIC_CONFIG, tmp_path / "m", static_cache=True,
                         quantize=QuantSpec(bits=4, accuracy_level=1), validate=False).path
    model = folder / "model.onnx"
    assert _matmul_nbits(model) >= 4
    c = QUANT_STATIC_CONFIG
    rng = np.random.default_rng(6)
    case = tmp_path / "case"
    case.mkdir()
    x = rng.standard_normal((2, 8, c.d_in)).astype(np.float32)
    buffers = rng.standard_normal((2, c.kv_heads, 20, c.head_dim)).astype(np.float32)
    for name, a in (("x", x), ("past_key", buffers), ("past_value", buffers * 2)):
        np.save(case / f"{name}.npy", a)
    r = run(binaries["ort"], model, case, "--generate", "5,1,1,1")
    assert r.returncode == 0, r.stderr
    art = read_artifact(folder)
    mask = np.ones((2, 8), np.int64)
    want = eager_full(art.load_source_module())(x, mask)
    np.testing.assert_allclose(np.load(case / "y.npy"), want["y"], rtol=0, atol=ATOL)
    for name in ("present_key", "present_value"):
        got = np.load(case / f"{name}.npy")
        assert got.shape == buffers.shape
        np.testing.assert_allclose(got[:, :, :8], want[name], rtol=0, atol=ATOL, err_msg=name)
    np.testing.assert_array_equal(np.load(case / "present_key.npy")[:, :, 8:], buffers[:, :, 8:])
    float_y = eager_full(art.load_plain_module())(x, mask)["y"]
    assert np.abs(want["y"] - float_y).max() > 100 * ATOL  # the reference is the int4 function


# --- AOTInductor: model.pt2 through libtorch's AOTIModelPackageLoader ----------------------------

def test_aoti_matches_python_and_eager(binaries, kv_package, tmp_path):
    """mha_aoti runs the package without Python: the decode-step model at T=1 and T>1, past 0
    and past > 0, batch 1 and 3, left padding — the same CASE_DIR contract as mha_ort."""
    from mha_export.targets.aoti.runner import AotiRunner
    sig = signature_of(kv_package)
    dirs = write_case_dirs(tmp_path, kv_package, [Case(3, 9, 0, "left"), Case(1, 1, 4),
                                                  Case(3, 1, 7, "left")], seed=5)
    r = run(binaries["aoti"], kv_package / "model.pt2", *[d for d, _, _ in dirs], "--info")
    assert r.returncode == 0, r.stderr
    assert "AOTInductor" in r.stdout and "position_ids" in r.stdout
    assert_matches_python_and_eager(dirs, kv_package, AotiRunner(sig, kv_package / "model.pt2"),
                                    "mha_aoti")
    bad = run(binaries["aoti"], kv_package / "config.json", dirs[0][0])
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def test_aoti_static_cache_and_repeat_timing(binaries, static_package, tmp_path):
    """The static-cache package in C++: the buffers written at each row's past_lengths, equal to
    Python; --repeat times the call alone and prints its median (the bench reads that line)."""
    from mha_export.targets.aoti.runner import AotiRunner
    sig = signature_of(static_package)
    dirs = write_case_dirs(tmp_path, static_package, [Case(3, 2, 5), Case(1, 1, 0)], seed=2)
    r = run(binaries["aoti"], static_package / "model.pt2", *[d for d, _, _ in dirs],
            "--repeat", "3")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("3 calls, median ") == 2, r.stdout
    python = AotiRunner(sig, static_package / "model.pt2")
    for d, case, feeds in dirs:
        assert_outputs_match(read_outputs(d, sig), python.run(feeds), feeds, case,
                             "mha_aoti vs python (static cache)")
    bad = run(binaries["aoti"], static_package / "model.pt2", dirs[0][0], "--repeat", "0")
    assert bad.returncode == 2 and "--repeat" in bad.stderr


def test_bench_times_the_cpp_programs_beside_python(binaries):
    """bench --cpp: the C++ program's --repeat median lands in its own row, from the same files
    and inputs as the Python rows."""
    from mha_export.bench.driver import run_bench
    report = run_bench(KV_CONFIG, seq_lens=[1], past_lens=[4], kv_cache=True, providers=["cpu"],
                       forms=["auto"], budget_s=0.01, cpp=BUILD.resolve())
    rows = {r.variant: r for r in report.rows}
    assert rows["cpp-mha_torch"].median_ms and rows["cpp-mha_torch"].reps >= 5, rows
    assert not rows["cpp-mha_torch"].error and rows["cpp-mha_torch"].peak_rss_mib > 0


# --- several layers' sessions in one process (issue 40) -------------------------------------------

@pytest.mark.parametrize("pool", ["idle", "spin", "shared", "shared-spin"])
def test_layers_step_in_turn_under_each_thread_pool(binaries, tmp_path, pool):
    """mha_layers: one static-cache model loaded as several sessions (own weights each), a
    decode step through all of them in turn, timed; each way of sharing threads runs."""
    art = export_onnx(KV_CONFIG, tmp_path / "static", static_cache=True, validate=False).path
    r = run(binaries["layers"], art / "model.onnx", "--copies", 3, "--past", 8, "--steps", 4,
            "--pool", pool)
    assert r.returncode == 0, r.stderr
    assert f"3 sessions (1 model(s) x 3), pool {pool}" in r.stdout
    assert "ms a step" in r.stdout and "ms a layer" in r.stdout


@pytest.mark.parametrize("args, message", [
    (["--pool", "busy"], "--pool must be"),
    (["--copies", "0"], "--copies"),
    (["--frobnicate", "1"], "unknown option"),
])
def test_layers_bad_input_is_one_line_exit_2(binaries, artifacts, args, message):
    r = run(binaries["layers"], artifacts["kv", "onnx"] / "model.onnx", *args)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_layers_refuses_a_model_without_a_static_cache(binaries, artifacts):
    r = run(binaries["layers"], artifacts["kv", "onnx"] / "model.onnx")
    assert r.returncode == 2 and "not a static-cache model" in r.stderr


# --- the session options a file names (metadata mha_export.session_options) ------------------

@pytest.fixture(scope="module")
def float8_artifact(tmp_path_factory) -> Path:
    """A kept FP8-blocks checkpoint's layer (transformers' tiny llama, every projection in
    float8 with 32 x 48 block scales), exported with --quantize source."""
    pytest.importorskip("transformers")
    from quant_writers import fp8_tensors, quantized_folder
    from test_checkpoints import _plain
    from mha_export.lossy.projections.source import SourceQuantSpec
    root = tmp_path_factory.mktemp("fp8")
    _plain("llama").save_pretrained(root / "llama")
    quantized_folder(root / "llama", root / "fp8",
                     {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                      "weight_block_size": [32, 48]}, lambda module, w: fp8_tensors(w, (32, 48)))
    return {cache: export_onnx(weights=root / "fp8", layer=1, quantize=SourceQuantSpec(),
                               static_cache=cache, output=root / f"art-{cache}",
                               validate=False).path for cache in (False, True)}


def test_a_float8_file_is_opened_with_the_options_it_names(binaries, float8_artifact, tmp_path):
    """The file asks for session.disable_quant_qdq (ONNX Runtime then folds its
    DequantizeLinear at load, as the Python runners do); mha_ort applies it, says so, and
    gives the Python runner's outputs."""
    float8_artifact = float8_artifact[False]
    r = run(binaries["ort"], float8_artifact / "model.onnx", "--info")
    assert r.returncode == 0, r.stderr
    assert "session.disable_quant_qdq=1 (the file asks for it" in r.stdout.splitlines()[0]
    assert 'mha_export.session_options: {"session.disable_quant_qdq": "1"}' in r.stdout
    sig = read_artifact(float8_artifact).signature
    python = OrtRunner(sig, float8_artifact / "model.onnx")
    assert python.session.float8_folded
    for d, case, feeds in write_case_dirs(tmp_path, float8_artifact, [Case(2, 7), Case(1, 1)]):
        r = run(binaries["ort"], float8_artifact / "model.onnx", d)
        assert r.returncode == 0, r.stderr
        assert_outputs_match(read_outputs(d, sig), python.run(feeds), feeds, case, "float8")


def test_mha_layers_applies_the_entries_once_per_file(binaries, float8_artifact):
    """Every copy of the file runs with its entries; the metadata is read from the first."""
    r = run(binaries["layers"], float8_artifact[True] / "model.onnx", "--copies", 2, "--past", 8,
            "--steps", 2)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("session.disable_quant_qdq=1 (the file asks for it)") == 1


def test_an_fp16_int4_file_asking_for_fpa_intb_runs_on_the_cpu(binaries, tmp_path):
    """ep.cuda.fpa_intb_gemm (CUDA's fpA_intB kernels) is a known entry: applied, said, and
    ignored by the CPU provider, whose outputs stay the Python runner's."""
    art = export_onnx(MHAConfig(dim=64, heads=4), tmp_path / "a", dtype="float16",
                      quantize=QuantSpec(bits=4), validate=False).path
    r = run(binaries["ort"], art / "model.onnx", "--info")
    assert r.returncode == 0, r.stderr
    assert "ep.cuda.fpa_intb_gemm=1 (the file asks for it" in r.stdout.splitlines()[0]
    sig = read_artifact(art).signature
    python = OrtRunner(sig, art / "model.onnx")
    for d, case, feeds in write_case_dirs(tmp_path, art, [Case(1, 3)]):
        r = run(binaries["ort"], art / "model.onnx", d)
        assert r.returncode == 0, r.stderr
        assert_outputs_match(read_outputs(d, sig), python.run(feeds), feeds, case, "fp16 int4")


def _without_record(artifact: Path, to: Path) -> Path:
    """The file as 0.4 wrote it: no metadata mha_export.session_options."""
    import onnx
    from mha_export.lossy.projections import session_options
    model = onnx.load(str(artifact / "model.onnx"))
    kept = {p.key: p.value for p in model.metadata_props if p.key != session_options.KEY}
    del model.metadata_props[:]
    onnx.helper.set_model_props(model, kept)
    onnx.save(model, str(to))
    assert session_options.declared(model) == session_options.FOLD_FLOAT8  # Python's fallback
    return to


def test_a_float8_file_without_the_record_is_folded_as_python_does(binaries, float8_artifact,
                                                                    tmp_path):
    """A float8 file exported before 0.5 names no options: both programs read its float8
    initializers and fold them, as the Python runners do, and say why."""
    plain = _without_record(float8_artifact[False], tmp_path / "plain.onnx")
    r = run(binaries["ort"], plain, "--info")
    assert r.returncode == 0, r.stderr
    assert ("session.disable_quant_qdq=1 (its float8 weights need it; the file, written "
            "before 0.5 or elsewhere, names no options" in r.stdout.splitlines()[0])
    static = _without_record(float8_artifact[True], tmp_path / "static.onnx")
    r = run(binaries["layers"], static, "--copies", 2, "--past", 8, "--steps", 1)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("session.disable_quant_qdq=1 (its float8 weights need it") == 1


def test_a_file_naming_no_options_runs_with_the_apps_options_only(binaries, artifacts):
    r = run(binaries["ort"], artifacts["split", "onnx"] / "model.onnx", "--info")
    assert r.returncode == 0 and "disable_quant_qdq" not in r.stdout  # nor from its graph


@pytest.mark.parametrize("record, message", [
    ("[1, 2]", "not a flat JSON object"),
    ('{"session.disable_quant_qdq": "1"} and more', "not a flat JSON object"),
    ('{"session.disable_quant_qdq": "1\\"}', "not a flat JSON object"),
    ('{"session.intra_op.allow_spinning": "1"}', "which a file may not set"),
])
def test_a_bad_session_options_record_is_one_line_exit_2(binaries, artifacts, tmp_path, record,
                                                         message):
    """C++ and Python refuse alike: malformed, or an entry a file may not set (it would
    override the app's own choice, e.g. its threads)."""
    import onnx
    from mha_export.errors import UsageError
    from mha_export.lossy.projections import session_options
    model = onnx.load(str(artifacts["split", "onnx"] / "model.onnx"))
    onnx.helper.set_model_props(model, {**{p.key: p.value for p in model.metadata_props},
                                        session_options.KEY: record})
    onnx.save(model, str(tmp_path / "bad.onnx"))
    r = run(binaries["ort"], tmp_path / "bad.onnx", "--info")
    assert r.returncode == 2 and message in r.stderr and "bad.onnx" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    with pytest.raises(UsageError, match="flat JSON object|may not set"):
        session_options.declared(model)


def _docs_block(language: str, containing: str) -> str:
    text = (ROOT / "docs" / "cpp.md").read_text()
    blocks = re.findall(rf"^```{language}\n(.*?)^```", text, re.S | re.M)
    return next(b for b in blocks if containing in b)


MAIN_CPP = """#include <onnxruntime_cxx_api.h>
#include <iostream>
int main(int argc, char** argv) {
    Ort::Env env(ORT_LOGGING_LEVEL_WARNING, "my_app");
    Ort::Session session(env, argv[1], Ort::SessionOptions());
    std::cout << session.GetInputCount() << " inputs" << std::endl;
}
"""


def test_the_docs_own_project_and_case_folder_recipes_work(binaries, artifacts, tmp_path):
    """docs/cpp.md: its CMake project links the prepared ONNX Runtime folder and runs; its
    Python snippet writes a case folder that mha_ort runs."""
    project = tmp_path / "my_app"
    project.mkdir()
    (project / "CMakeLists.txt").write_text(_docs_block("cmake", "find_library(ORT_LIBRARY"))
    (project / "main.cpp").write_text(MAIN_CPP)
    ort_root = BUILD / "ort"  # what `make cpp` prepared with fetch_ort_headers.sh
    for cmd in (["cmake", "-S", ".", "-B", "build", f"-DORT_ROOT={ort_root}"],
                ["cmake", "--build", "build"]):
        r = subprocess.run(cmd, cwd=project, capture_output=True, text=True, env=_env())
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    r = run(project / "build" / "my_app", artifacts["kv", "onnx"] / "model.onnx")
    assert r.returncode == 0 and r.stdout.strip() == "5 inputs", r.stdout + r.stderr
    shutil.copytree(artifacts["kv", "onnx"], tmp_path / "out" / "kv")
    snippet = _docs_block("python", "make_feeds")
    r = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    case = tmp_path / "case1"
    assert {p.stem for p in case.iterdir()} == set(signature_of(tmp_path / "out" / "kv")
                                                   .input_names)
    r = run(binaries["ort"], tmp_path / "out" / "kv" / "model.onnx", case)
    assert r.returncode == 0 and (case / "y.npy").is_file(), r.stderr


# --- mha_executorch: model.pte with the executorch wheel's runtime ------------------------------

ROWS = 2  # the static-cache programs' rows (a static batch)
STATIC_CASES = [Case(ROWS, 5, 3), Case(ROWS, 1, 7), Case(ROWS, 4, 0)]


@pytest.fixture(scope="session")
def static_program(binaries, tmp_path_factory) -> Path:
    """A grouped-query, rotary layer's program with its static cache inside (the wheel is an
    extra: without it, these tests skip)."""
    pytest.importorskip("executorch.runtime")
    from mha_export import export_executorch
    return export_executorch(KV_CONFIG, tmp_path_factory.mktemp("et") / "static",
                             static_cache=True, max_batch=ROWS, validate=False).path


def test_executorch_matches_python_executorch_and_eager(binaries, static_program, tmp_path):
    """Each case folder's buffers set into the program, the step, the buffers read back: as
    Python's executorch.runtime gives them, and as the eager layer writes them."""
    from mha_export.targets.executorch.runner import ExecuTorchRunner
    sig = signature_of(static_program)
    dirs = write_case_dirs(tmp_path, static_program, STATIC_CASES, seed=3)
    r = run(BUILD / "mha_executorch", static_program / "model.pte", *[d for d, _, _ in dirs])
    assert r.returncode == 0 and "the cache inside the program" in r.stdout, r.stderr
    assert_matches_python_and_eager(dirs, static_program,
                                    ExecuTorchRunner(sig, static_program / "model.pte"),
                                    "mha_executorch")


def test_executorch_steps_a_prefill_on_the_cache_it_holds(binaries, static_program, tmp_path):
    """--carry: the first folder's buffers set, then a prefill of 5 and three steps on what the
    program holds (the later folders' buffers are zeros the program must not take): each y and
    the last buffers as the eager layer steps them."""
    sig = signature_of(static_program)
    rng = np.random.default_rng(4)
    module = read_artifact(static_program).load_source_module().eval()
    key, value = (torch.zeros(sig.cache_buffer(n, ROWS, 12)) for n in ("past_key",
                                                                        "past_value"))
    dirs, want, length = [], [], 0
    for i, t in enumerate((5, 1, 1, 1)):
        d = tmp_path / f"step{i}"
        d.mkdir()
        x = rng.standard_normal((ROWS, t, KV_CONFIG.d_in), dtype=np.float32)
        feeds = {"x": x, "past_lengths": np.full(ROWS, length),
                 "position_ids": np.tile(np.arange(length, length + t), (ROWS, 1)),
                 "past_key": np.zeros_like(key.numpy()), "past_value": np.zeros_like(key.numpy())}
        for name, array in feeds.items():
            np.save(d / f"{name}.npy", array)
        with torch.inference_mode():
            want.append(module.forward_static(torch.from_numpy(x), key, value,
                                              torch.full((ROWS,), length))[0].numpy())
        dirs.append(d)
        length += t
    r = run(BUILD / "mha_executorch", static_program / "model.pte", *dirs, "--carry")
    assert r.returncode == 0, r.stderr
    for d, y in zip(dirs, want):
        np.testing.assert_allclose(np.load(d / "y.npy"), y, rtol=0, atol=ATOL, err_msg=str(d))
    for name, buffer in (("present_key", key), ("present_value", value)):
        np.testing.assert_allclose(np.load(dirs[-1] / f"{name}.npy")[:, :, :length],
                                   buffer[:, :, :length].numpy(), rtol=0, atol=ATOL)


def test_executorch_runs_an_int4_program_as_python_does(binaries, tmp_path):
    """--quantize int4 with the cache inside: XNNPACK's int8 x int4 kernel (8da4w) in the
    wheel's runtime gives what Python's executorch.runtime gives, case by case (the kernel's
    parity against eager is the check's, at the int8-activation tolerance)."""
    pytest.importorskip("executorch.runtime")
    from mha_export import export_executorch
    from mha_export.targets.executorch.runner import ExecuTorchRunner
    from mha_export.lossy.projections.rtn import QuantSpec
    config = MHAConfig(dim=64, heads=4, kv_heads=2, rotary="half", max_seq_len=64)
    folder = export_executorch(config, tmp_path / "int4", static_cache=True, validate=False,
                               max_batch=ROWS, quantize=QuantSpec(bits=4)).path
    python = ExecuTorchRunner(signature_of(folder), folder / "model.pte")
    dirs = write_case_dirs(tmp_path / "cases", folder, STATIC_CASES, seed=5)
    r = run(BUILD / "mha_executorch", folder / "model.pte", *[d for d, _, _ in dirs])
    assert r.returncode == 0, r.stderr
    for d, case, feeds in dirs:
        assert_outputs_match(read_outputs(d, signature_of(folder)), python.run(feeds), feeds,
                             case, "mha_executorch (int4) vs python")


def test_executorch_refuses_a_program_of_the_llm_kernels_in_one_line(binaries, tmp_path):
    """--kernels llm: the llama:: operators live in executorch's custom_ops library, which the
    wheel's C++ SDK does not ship: one line naming them, exit 2."""
    pytest.importorskip("executorch.runtime")
    from mha_export import export_executorch
    folder = export_executorch(KV_CONFIG, tmp_path / "llm", static_cache=True, kernels="llm",
                               validate=False).path
    dirs = write_case_dirs(tmp_path / "cases", folder, [Case(1, 1, 3)], seed=6)
    line = one_error_line(run(BUILD / "mha_executorch", folder / "model.pte", dirs[0][0]))
    assert "--kernels llm" in line and "custom_ops" in line


def test_executorch_carry_without_a_cache_is_one_line(binaries, tmp_path):
    pytest.importorskip("executorch.runtime")
    from mha_export import export_executorch
    folder = export_executorch(CONFIGS["split"], tmp_path / "full", validate=False).path
    d = tmp_path / "case"
    d.mkdir()
    np.save(d / "x.npy", np.zeros((1, 2, 64), np.float32))
    line = one_error_line(run(BUILD / "mha_executorch", folder / "model.pte", d, "--carry"))
    assert "holds no cache" in line

