"""Parity check: rebuild the eager module from an artifact's config and source weights, run every
runner over a sweep of fresh random inputs, and compare each declared output with eager fp32 and
with a float64 eager reference, each with its own tolerance.

    artifact -> runners (runners.py) -> cases (sweep.py) -> compare (comparator.py) -> CheckReport
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import onnx
import torch

from ..graph import forms

from . import scenarios
from ..artifact import Artifact, read_artifact
from .comparator import Comparison, Tolerance, compare
from ..env import versions
from ..errors import UsageError
from ..signature import SEQ
from .runners.base import (EagerRunner, Feeds, OrtRunner, Runner, RunnerUnavailable,
                      TorchScriptRunner)
from .sweep import (Case, default_past_lens, default_seq_lens, make_cases, make_feeds,
                    real_queries, require_fits)

# Default per-runner tolerances, applied to both comparisons (vs eager fp32 and vs fp64).
FP32_CPU = Tolerance(atol=1e-5, rtol=1e-4)
# ONNX Runtime's CUDA provider may run fp32 MatMuls in TF32 (10-bit mantissa): pass --no-tf32
# (provider option use_tf32=0) for a strict check with the CPU tolerance.
FP32_CUDA_TF32 = Tolerance(atol=2e-3, rtol=1e-2)
FLOAT16 = Tolerance(atol=2e-3, rtol=2e-2)
PROVIDERS = ("cpu", "cuda")
BASELINE = "eager-fp32"


def default_tolerance(runner: str, output: str, model_dtype: str, tf32: bool) -> Tolerance:
    """Per runner and output (every output of this layer has the scale of its inputs today)."""
    if runner.startswith("ort") and model_dtype == "float16":
        return FLOAT16
    if runner == "ort-cuda" and tf32:
        return FP32_CUDA_TF32
    return FP32_CPU


@dataclass
class RunnerInfo:
    name: str
    status: str  # "ran" | "skipped" | "failed"
    device: str = ""
    providers: list[str] = field(default_factory=list)  # what the ORT session really uses
    reason: str = ""


@dataclass
class OutputResult:
    """One output of one runner on one case."""

    runner: str
    output: str
    batch: int
    seq: int
    past: int
    padding: str
    scenario: str
    passed: bool
    vs_eager: Optional[Comparison] = None
    vs_reference: Optional[Comparison] = None
    tolerance: Optional[Tolerance] = None
    error: str = ""

    @property
    def case(self) -> Case:
        return Case(self.batch, self.seq, self.past, self.padding, self.scenario)


@dataclass
class CheckReport:
    artifact: str
    seed: int
    batch_sizes: list[int]
    seq_lens: list[int]
    past_lens: list[int] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    runners: list[RunnerInfo] = field(default_factory=list)
    results: list[OutputResult] = field(default_factory=list)
    versions: dict = field(default_factory=dict)  # of this check's environment
    export_versions: dict = field(default_factory=dict)  # recorded in the artifact at export

    @property
    def passed(self) -> bool:
        return (all(r.passed for r in self.results) and self.tested
                and not any(r.status == "failed" for r in self.runners))

    @property
    def tested(self) -> bool:
        """Something other than the eager baseline ran: a check of nothing never passes."""
        return any(r.runner != BASELINE for r in self.results)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["passed"] = self.passed
        return d


def _load(make, path: Path):
    try:
        return make()
    except RunnerUnavailable:
        raise
    except Exception as e:
        raise UsageError(f"cannot load {path}: {str(e).strip().splitlines()[0][:300]}") from None


def _make_runners(artifact: Artifact, providers: Sequence[str], tf32: bool, require_cuda: bool
                  ) -> tuple[list[Runner], list[RunnerInfo]]:
    """The runners under test (eager fp32 first) and the ones that could not start."""
    sig = artifact.signature
    runners: list[Runner] = [EagerRunner(sig, artifact.load_source_module(), torch.float32)]
    unavailable: list[RunnerInfo] = []
    if ts := artifact.file("torchscript"):
        runners.append(_load(lambda: TorchScriptRunner(sig, ts), ts))
    if onnx_path := artifact.file("onnx"):
        _load(lambda: onnx.load(str(onnx_path), load_external_data=False), onnx_path)
        for provider in providers:
            try:
                runners.append(_load(lambda: OrtRunner(sig, onnx_path, provider, tf32=tf32),
                                     onnx_path))
            except RunnerUnavailable as e:
                status = "failed" if require_cuda else "skipped"
                unavailable.append(RunnerInfo(f"ort-{provider}", status, reason=str(e)))
    return runners, unavailable


def _runner_info(r: Runner, require_cuda: bool) -> RunnerInfo:
    status = "failed" if r.warning and require_cuda else "ran"
    return RunnerInfo(r.name, status, r.device, list(r.providers), r.warning)


def _sweep_options(artifact: Artifact, seq_lens, past_lens) -> tuple[list, list, tuple, bool]:
    config, form_name = artifact.config, artifact.export.get("attention")
    form = forms.FORMS.get(forms.ALIASES.get(form_name, form_name)) if form_name else None
    switch = form.switch_seq_lens if form else ()
    seq_lens = list(seq_lens) if seq_lens else default_seq_lens(config.max_seq_len, switch)
    past_lens = list(past_lens) if past_lens else default_past_lens(config.max_seq_len)
    quadratic = form is None or form.memory != "linear in T"
    return seq_lens, past_lens, switch, quadratic


def check_parity(artifact_dir: str | Path, providers: Sequence[str] = PROVIDERS,
                 atol: Optional[float] = None, rtol: Optional[float] = None,
                 seq_lens: Optional[Sequence[int]] = None, batch_sizes: Sequence[int] = (1, 3),
                 past_lens: Optional[Sequence[int]] = None, seed: int = 0,
                 require_cuda: bool = False, tf32: bool = True,
                 progress: Callable[[int, int, str], None] = lambda i, n, s: None
                 ) -> CheckReport:
    """Run the parity sweep on an artifact folder; see CheckReport.passed."""
    artifact = read_artifact(artifact_dir)
    unknown = set(providers) - set(PROVIDERS)
    if unknown:
        raise UsageError(f"unknown provider {sorted(unknown)[0]!r}: choose from cpu, cuda")
    Tolerance(atol or 0.0, rtol or 0.0)  # a negative or NaN tolerance is bad input, now
    if require_cuda and "cuda" not in providers:
        providers = [*providers, "cuda"]
    config, sig = artifact.config, artifact.signature
    seq_lens, past_lens, switch, quadratic = _sweep_options(artifact, seq_lens, past_lens)
    cases = make_cases(sig, batch_sizes, seq_lens, past_lens)
    require_fits(config, cases, quadratic, sig.has_mask)
    report = CheckReport(str(artifact_dir), seed, list(batch_sizes), seq_lens,
                         past_lens if sig.has_cache else [], sig.input_names, sig.output_names,
                         versions=versions(), export_versions=artifact.meta.get("versions", {}))
    runners, unavailable = _make_runners(artifact, providers, tf32, require_cuda)
    report.runners = [_runner_info(r, require_cuda) for r in runners] + unavailable
    reference = EagerRunner(sig, runners[0].source, torch.float64)
    dtype = artifact.export.get("dtype", "float32")
    tolerances = {(r.name, o): _override(default_tolerance(r.name, o, dtype, tf32), atol, rtol)
                  for r in runners for o in sig.output_names}
    multi_call = scenarios.scenario_cases(switch) if sig.has_cache else []
    total = len(cases) + len(multi_call)
    for i, case in enumerate(cases):
        progress(i, total, case.label())
        feeds = make_feeds(sig, case, seed)
        expected = {"eager": runners[0].run(feeds), "reference": reference.run(feeds)}
        valid = real_queries(feeds, case)
        for r in runners:
            out = expected["eager"] if r is runners[0] else None  # the baseline already ran
            report.results += _compared(r, case, lambda: out or r.run(feeds), expected, valid,
                                        tolerances)
    truths = {"eager": scenarios.eager_full(runners[0].source),
              "reference": scenarios.eager_full(reference.source)}
    for i, (case, split) in enumerate(multi_call, start=len(cases)):
        progress(i, total, case.label())
        x, mask = scenarios.scenario_inputs(config, case, seed)
        expected = {k: scenarios.expected(case, truth, x, mask) for k, truth in truths.items()}
        for r in runners:
            report.results += _compared(
                r, case, lambda: scenarios.generate(r, config, x, mask, split), expected,
                (mask == 1)[:, :, None], tolerances)
    progress(total, total, "")
    return report


def _override(default: Tolerance, atol: Optional[float], rtol: Optional[float]) -> Tolerance:
    return Tolerance(default.atol if atol is None else atol,
                     default.rtol if rtol is None else rtol)


def _compared(runner: Runner, case: Case, call: Callable[[], Feeds], expected: dict,
              valid: Optional[np.ndarray], tolerances: dict) -> list[OutputResult]:
    """Run ``call`` and compare each expected output with eager fp32 and the fp64 reference."""
    sig = runner.signature
    names = [n for n in sig.output_names if n in expected["eager"]]
    per_token = {t.name for t in sig.outputs if t.shape[1] == SEQ}  # (B, T, ...) outputs
    where = case.to_dict()
    try:
        out = call()
    except Exception as e:  # a model that cannot run this case (e.g. out of memory) fails its row
        error = (str(e).strip() or type(e).__name__).splitlines()[0][:300]
        return [OutputResult(runner.name, n, **where, passed=False,
                             tolerance=tolerances[runner.name, n], error=error) for n in names]
    results = []
    for n in names:
        tol = tolerances[runner.name, n]
        rows = valid if n in per_token else None  # padding query rows: only required finite
        vs_eager = compare(out[n], expected["eager"][n], tol, rows)
        vs_ref = compare(out[n], expected["reference"][n], tol, rows)
        results.append(OutputResult(runner.name, n, **where,
                                    passed=vs_eager.passed and vs_ref.passed, vs_eager=vs_eager,
                                    vs_reference=vs_ref, tolerance=tol,
                                    error=vs_eager.reason or vs_ref.reason))
    return results
