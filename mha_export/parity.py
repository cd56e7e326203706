"""Parity check: rebuild the eager module from an artifact's config and source weights, run every
runner over a (batch, seq) sweep of fresh random inputs, and compare each output with eager fp32
and with a float64 eager reference.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import onnx
import torch

from .artifact import read_artifact
from .comparator import Comparison, Tolerance, compare
from .errors import UsageError
from .export import versions
from .runners import EagerRunner, OrtRunner, RunnerUnavailable, TorchScriptRunner

# Default per-runner tolerances, applied to both comparisons (vs eager fp32 and vs fp64).
FP32_CPU = Tolerance(atol=1e-5, rtol=1e-4)
# ONNX Runtime's CUDA provider may run fp32 MatMuls in TF32 (10-bit mantissa): pass --no-tf32
# (provider option use_tf32=0) for a strict check with the CPU tolerance.
FP32_CUDA_TF32 = Tolerance(atol=2e-3, rtol=1e-2)
FLOAT16 = Tolerance(atol=2e-3, rtol=2e-2)
PROVIDERS = ("cpu", "cuda")


def default_tolerance(runner: str, model_dtype: str, tf32: bool) -> Tolerance:
    if runner.startswith("ort") and model_dtype == "float16":
        return FLOAT16
    if runner == "ort-cuda" and tf32:
        return FP32_CUDA_TF32
    return FP32_CPU


def default_seq_lens(max_seq_len: int, form: str = "") -> list[int]:
    """T=1, lengths never used at export (there is no example input), T=max_seq_len and one past
    it (longer inputs are supported: the mask comes from the runtime length), and both sides of
    every length where the graph form switches code path (auto's threshold, block edges)."""
    from .onnx_graph import SWITCH_SEQ_LENS
    m = max_seq_len
    base = {t for t in (1, 2, 7, 64, 100, 257, m - 1, m, m + 1) if 1 <= t <= m + 1}
    return sorted(base | set(SWITCH_SEQ_LENS.get(form, [])))


@dataclass
class RunnerInfo:
    name: str
    status: str  # "ran" | "skipped" | "failed"
    device: str = ""
    providers: list[str] = field(default_factory=list)  # what the ORT session really uses
    reason: str = ""
    tolerance: Optional[Tolerance] = None


@dataclass
class ShapeResult:
    runner: str
    batch: int
    seq: int
    passed: bool
    vs_eager: Optional[Comparison] = None
    vs_reference: Optional[Comparison] = None
    tolerance: Optional[Tolerance] = None
    error: str = ""


@dataclass
class CheckReport:
    artifact: str
    seed: int
    batch_sizes: list[int]
    seq_lens: list[int]
    runners: list[RunnerInfo] = field(default_factory=list)
    results: list[ShapeResult] = field(default_factory=list)
    versions: dict = field(default_factory=dict)  # of this check's environment
    export_versions: dict = field(default_factory=dict)  # recorded in the artifact at export

    @property
    def passed(self) -> bool:
        return (all(r.passed for r in self.results) and self.tested
                and not any(r.status == "failed" for r in self.runners))

    @property
    def tested(self) -> bool:
        """Something other than the eager baseline ran: a check of nothing never passes."""
        return any(r.runner != "eager-fp32" for r in self.results)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["passed"] = self.passed
        return d


def _make_runners(artifact, providers: Sequence[str], tf32: bool, require_cuda: bool,
                  infos: list[RunnerInfo]) -> list:
    module = artifact.load_source_module()
    runners: list = [EagerRunner(module, torch.float32)]
    if ts := artifact.file("torchscript"):
        runners.append(_load(lambda: TorchScriptRunner(ts), ts))
    if onnx_path := artifact.file("onnx"):
        _load(lambda: onnx.load(str(onnx_path), load_external_data=False), onnx_path)
        for provider in providers:
            try:
                runners.append(_load(lambda: OrtRunner(onnx_path, provider, tf32=tf32), onnx_path))
            except RunnerUnavailable as e:
                status = "failed" if require_cuda else "skipped"
                infos.append(RunnerInfo(f"ort-{provider}", status, reason=str(e)))
    return runners


def _load(make, path: Path):
    try:
        return make()
    except RunnerUnavailable:
        raise
    except Exception as e:
        raise UsageError(f"cannot load {path}: {str(e).strip().splitlines()[0][:300]}") from None


def check(artifact_dir: str | Path, providers: Sequence[str] = PROVIDERS,
          atol: Optional[float] = None, rtol: Optional[float] = None,
          seq_lens: Optional[Sequence[int]] = None, batch_sizes: Sequence[int] = (1, 3),
          seed: int = 0, require_cuda: bool = False, tf32: bool = True) -> CheckReport:
    """Run the parity sweep on an artifact folder; see CheckReport.passed."""
    artifact = read_artifact(artifact_dir)
    unknown = set(providers) - set(PROVIDERS)
    if unknown:
        raise UsageError(f"unknown provider {sorted(unknown)[0]!r}: choose from cpu, cuda")
    if require_cuda and "cuda" not in providers:
        providers = [*providers, "cuda"]
    config = artifact.config
    form = artifact.meta["export"].get("attention", "")
    seq_lens = list(seq_lens) if seq_lens else default_seq_lens(config.max_seq_len, form)
    report = CheckReport(str(artifact_dir), seed, list(batch_sizes), seq_lens,
                         versions=versions(), export_versions=artifact.meta.get("versions", {}))
    skipped: list[RunnerInfo] = []
    runners = _make_runners(artifact, providers, tf32, require_cuda, skipped)
    reference = EagerRunner(runners[0].module, torch.float64)
    model_dtype = artifact.meta["export"].get("dtype", "float32")
    tolerances = {}
    for r in runners:
        default = default_tolerance(r.name, model_dtype, tf32)
        tolerances[r.name] = Tolerance(default.atol if atol is None else atol,
                                       default.rtol if rtol is None else rtol)
        info = RunnerInfo(r.name, "ran", r.device, getattr(r, "providers", []),
                          tolerance=tolerances[r.name])
        if cpu_nodes := getattr(r, "cpu_compute_nodes", []):
            info.status = "failed" if require_cuda else "ran"
            info.reason = (f"{len(cpu_nodes)} compute nodes ran on the CPU provider, not CUDA: "
                           + ", ".join(cpu_nodes[:5]))
        report.runners.append(info)
    report.runners.extend(skipped)

    for b in batch_sizes:
        for t in seq_lens:
            x = np.random.default_rng([seed, b, t]).standard_normal(
                (b, t, config.d_in)).astype(np.float32)
            ref = reference.run(x.astype(np.float64))
            eager = runners[0].run(x)
            for r in runners:
                out = eager if r is runners[0] else None  # the baseline already ran
                report.results.append(_run_one(r, x, eager, ref, tolerances[r.name], b, t, out))
    return report


def _run_one(runner, x: np.ndarray, eager: np.ndarray, ref: np.ndarray, tol: Tolerance,
             b: int, t: int, out: Optional[np.ndarray] = None) -> ShapeResult:
    try:
        out = runner.run(x) if out is None else out
    except Exception as e:  # a model that cannot run this shape fails this row
        return ShapeResult(runner.name, b, t, False, tolerance=tol,
                           error=str(e).strip().splitlines()[0][:300])
    vs_eager, vs_ref = compare(out, eager, tol), compare(out, ref, tol)
    error = vs_eager.reason or vs_ref.reason
    return ShapeResult(runner.name, b, t, vs_eager.passed and vs_ref.passed, vs_eager, vs_ref,
                       tol, error)
