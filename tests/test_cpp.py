"""The C++ programs (cpp/): built once per session by `make cpp`, run on files exported here, and
compared with the Python ONNX Runtime / TorchScript / eager outputs of the same files.

A build failure fails these tests (it never skips them): cmake and g++ are part of the set-up.
"""
from __future__ import annotations

import json
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
from mha_export.runners import EagerRunner, OrtRunner, RunnerUnavailable, TorchScriptRunner

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
    """build/cpp/mha_ort and mha_torch; `make cpp` is incremental, so an up-to-date build is reused."""
    _make("cpp")
    bins = {"ort": BUILD / "mha_ort", "torch": BUILD / "mha_torch"}
    for path in bins.values():
        assert os.access(path, os.X_OK), f"{path} was not built"
    return bins


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory) -> dict:
    """{(config name, 'onnx' | 'torchscript'): artifact folder}."""
    root = tmp_path_factory.mktemp("cpp-artifacts")
    out = {}
    for name, config in CONFIGS.items():
        out[name, "onnx"] = export_onnx(config, root / f"{name}-onnx", check=False).path
        out[name, "torchscript"] = export_torchscript(config, root / f"{name}-ts", check=False).path
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
    python_ort = OrtRunner(folder / "model.onnx", "cpu")
    eager = EagerRunner(read_artifact(folder).load_source_module())
    for x_path, y_path in pairs:
        x, y = np.load(x_path), np.load(y_path)
        assert y.dtype == np.float32 and y.shape == x.shape[:2] + (CONFIGS[name].dim,)
        np.testing.assert_allclose(y, python_ort.run(x), rtol=0, atol=ATOL)
        np.testing.assert_allclose(y, eager.run(x), rtol=0, atol=ATOL)


@pytest.mark.parametrize("name", CONFIGS)
def test_torch_matches_python_torchscript_and_eager(binaries, artifacts, tmp_path, name):
    folder = artifacts[name, "torchscript"]
    pairs = make_inputs(tmp_path, CONFIGS[name].d_in, seed=1)
    r = run(binaries["torch"], folder / "model.pt", *flat(pairs), "--threads", "2")
    assert r.returncode == 0, r.stderr
    assert "device: cpu" in r.stdout
    python_ts = TorchScriptRunner(folder / "model.pt")
    eager = EagerRunner(read_artifact(folder).load_source_module())
    for x_path, y_path in pairs:
        x, y = np.load(x_path), np.load(y_path)
        assert y.shape == x.shape[:2] + (CONFIGS[name].dim,)
        np.testing.assert_allclose(y, python_ts.run(x), rtol=0, atol=ATOL)
        np.testing.assert_allclose(y, eager.run(x), rtol=0, atol=ATOL)


def test_ort_float16_model_matches_python_ort(binaries, tmp_path):
    """float16 exports take float32 .npy in and give float32 out; the math is ORT's float16."""
    folder = export_onnx(CONFIGS["split"], tmp_path / "fp16", dtype="float16", check=False).path
    pairs = make_inputs(tmp_path, 64, shapes=[(2, 16), (1, 1)])
    r = run(binaries["ort"], folder / "model.onnx", *flat(pairs))
    assert r.returncode == 0, r.stderr
    python_ort = OrtRunner(folder / "model.onnx", "cpu")
    for x_path, y_path in pairs:
        np.testing.assert_allclose(np.load(y_path), python_ort.run(np.load(x_path)), rtol=0,
                                   atol=ATOL)


def test_ort_info_prints_symbolic_dims_and_config(binaries, artifacts):
    r = run(binaries["ort"], artifacts["fused-in48", "onnx"] / "model.onnx", "--info")
    assert r.returncode == 0, r.stderr
    assert "x: float32 [batch, seq, 48]" in r.stdout
    assert "y: float32 [batch, seq, 32]" in r.stdout
    line = next(l for l in r.stdout.splitlines() if l.strip().startswith("mha_export.config:"))
    config = json.loads(line.split(":", 1)[1])
    assert MHAConfig.from_dict(config) == CONFIGS["fused-in48"]
    assert "mha_export.dynamic_axes:" in r.stdout


# --- bad input: exit 2, one line, nothing written ------------------------------------------------

def _bad_inputs(folder: Path) -> dict:
    np.save(folder / "f64.npy", np.zeros((1, 4, 64)))
    np.save(folder / "rank2.npy", np.zeros((4, 64), np.float32))
    np.save(folder / "width32.npy", np.zeros((1, 4, 32), np.float32))
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
    assert "width 32" in error("wrong width") and "64" in error("wrong width")
    assert "cannot load model" in error("model does not load")


# --- CUDA: runs on CUDA or says why not; never a silent CPU run ----------------------------------

def _python_ort_cuda_reason(model: Path) -> str | None:
    try:
        OrtRunner(model, "cuda")
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
        np.testing.assert_allclose(np.load(y), OrtRunner(model, "cpu").run(np.load(x)), rtol=0,
                                   atol=1e-4)
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
        np.testing.assert_allclose(np.load(y), TorchScriptRunner(model).run(np.load(x)),
                                   rtol=0, atol=1e-4)
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
    expected = OrtRunner(moved / "model.onnx", "cpu").run(np.load(moved / "x.npy"))
    np.testing.assert_allclose(y, expected, rtol=0, atol=ATOL)

    pairs = make_inputs(tmp_path, 64, shapes=[(1, 1), (2, 9)])
    r = run(moved / "mha_ort", moved / "model.onnx", *flat(pairs), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for x_path, y_path in pairs:
        np.testing.assert_allclose(np.load(y_path), OrtRunner(moved / "model.onnx", "cpu").run(
            np.load(x_path)), rtol=0, atol=ATOL)
