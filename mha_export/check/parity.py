"""Parity check: rebuild the eager module from an artifact's config and source weights, run every
runner over a sweep of fresh random inputs, and compare each declared output with eager fp32 and
with a float64 eager reference, each with its own tolerance.

    artifact -> runners (runners/) -> cases (sweep.py, scenarios.py) -> compare (comparator.py)
    -> CheckReport (report.py renders it)
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from ..artifact import Artifact, read_artifact
from ..env import versions
from ..errors import UsageError, raise_if_interrupted
from ..kinds.registry import FORMS
from ..lossy import costs as lossy
from ..lossy.base import Cost
from ..rope_types import switch_length
from . import scenarios
from .comparator import FP32, Comparison, Tolerance, compare
from .runners import (RUNNERS, Feeds, Runner, RunnerKind, RunnerUnavailable, RunOptions,
                      get_runner, ort_runner_names)
from .real_inputs import RealInputs, read_real_inputs
from .runners.pytorch import EagerRunner
from .sweep import (Case, default_past_lens, default_seq_lens, make_cases, make_feeds,
                    require_fits, valid_entries, window_cases, written_key)

BASELINE = "eager-fp32"


@dataclass
class RunnerInfo:
    name: str
    status: str  # "ran" | "skipped" | "failed"
    device: str = ""
    providers: list[str] = field(default_factory=list)  # what the ORT session really uses
    precision: str = ""  # the arithmetic it really used, e.g. "fp32, TF32 matmuls allowed"
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
    positions_end: int = 0  # rotary: the call's max(position_ids) + 1 when the sweep set it
    inputs: str = "random"  # "real": a captured layer input (--inputs)

    @property
    def case(self) -> Case:
        return Case(self.batch, self.seq, self.past, self.padding, self.scenario,
                    self.positions_end, self.inputs)


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
    real_inputs: str = ""  # --inputs FILE (its cases are labelled inputs "real")
    # what each lossy step cost (lossy/costs.py), by report field: "quantization", "kv_cache",
    # and "real_" + each on the captured inputs; every field present (empty: no such step)
    costs: dict = field(default_factory=lambda: {**lossy.empty_fields(),
                                                 **lossy.empty_fields(real=True)})

    @property
    def passed(self) -> bool:
        return (all(r.passed for r in self.results) and self.tested
                and all(Cost.passed(result) for result in self.costs.values())
                and not any(r.status == "failed" for r in self.runners))

    @property
    def tested(self) -> bool:
        """Something other than the eager baseline ran: a check of nothing never passes."""
        return any(r.runner != BASELINE for r in self.results)

    def to_dict(self) -> dict:
        """parity.json: the fields, each cost's result under its own key."""
        d = asdict(self)
        del d["costs"]
        d.update({name: _plain(result) for name, result in self.costs.items()})
        d["passed"] = self.passed
        return d


def _plain(result):
    """A cost's result as JSON: its to_dict (with its verdict) where it has one."""
    if isinstance(result, list):
        return [_plain(r) for r in result]
    return result.to_dict() if hasattr(result, "to_dict") else (
        asdict(result) if result is not None else None)


def selected_kinds(artifact: Artifact, runners: Optional[Sequence[str]],
                   providers: Optional[Sequence[str]]) -> list[RunnerKind]:
    """The runner kinds to run: the ones named, else every registered default kind whose model
    file the folder holds (``providers`` narrows the ONNX Runtime ones: the --providers
    shorthand)."""
    if runners is not None and providers is not None:
        raise UsageError("pass either runners or providers (ONNX Runtime's shorthand), not both")
    if runners is not None:
        kinds = [get_runner(name) for name in runners]
        for kind in kinds:
            if not (artifact.path / kind.model_file).is_file():
                raise UsageError(f"runner {kind.name!r} runs {kind.model_file}, which "
                                 f"{artifact.path} does not hold")
    else:
        ort = set(ort_runner_names(list(providers))) if providers is not None else None
        kinds = [k for k in RUNNERS.values()
                 if k.by_default and (artifact.path / k.model_file).is_file()
                 and (ort is None or not k.ort_provider or k.name in ort)]
    chosen = {k.name for k in kinds}  # + the runners that accompany a chosen one on such files
    return kinds + [k for k in RUNNERS.values() if k.also_with in chosen
                    and k.name not in chosen and k.also_for(artifact.export)]


def _cuda_kinds(artifact: Artifact, chosen: list[RunnerKind]) -> list[RunnerKind]:
    """--require-cuda: the CUDA runners for the folder's files that were not chosen already; a
    folder no CUDA runner can run is bad input (a check that cannot reach CUDA never passes as
    one that did)."""
    able = [k for k in RUNNERS.values()
            if k.device == "cuda" and (artifact.path / k.model_file).is_file()]
    if not able:
        files = sorted({k.model_file for k in RUNNERS.values() if k.device == "cuda"})
        raise UsageError(f"--require-cuda: no CUDA runner runs this folder's files (CUDA "
                         f"runners run {', '.join(files)})")
    return [k for k in able if k not in chosen]


def _open(kind: RunnerKind, artifact: Artifact, options: RunOptions) -> Runner:
    """The runner, or RunnerUnavailable; a file the runtime cannot load is bad input."""
    if reason := kind.unavailable():
        raise RunnerUnavailable(reason)
    path = artifact.path / kind.model_file
    try:
        return kind.open(artifact.signature, path, options)
    except RunnerUnavailable:
        raise_if_interrupted()  # a runtime that failed because Ctrl-C hit it is not unavailable
        raise
    except Exception as e:
        raise_if_interrupted()  # ... nor a model that cannot load
        raise UsageError(f"cannot load {path}: {str(e).strip().splitlines()[0][:300]}") from None


def _open_runners(artifact: Artifact, kinds: Sequence[RunnerKind], options: RunOptions,
                  require_cuda: bool) -> tuple[list[Runner], list[RunnerInfo]]:
    """The runners under test, eager fp32 first, and what each really ran on (or why not)."""
    runners: list[Runner] = [EagerRunner(artifact.signature, artifact.load_source_module())]
    infos = [_runner_info(runners[0], False)]
    for kind in kinds:
        try:
            runner = _open(kind, artifact, options)
        except RunnerUnavailable as e:
            strict = require_cuda and kind.device == "cuda"
            infos.append(RunnerInfo(kind.name, "failed" if strict else "skipped", reason=str(e)))
            continue
        runners.append(runner)
        infos.append(_runner_info(runner, require_cuda and kind.device == "cuda"))
    return runners, infos


def _runner_info(r: Runner, strict: bool) -> RunnerInfo:
    status = "failed" if r.warning and strict else "ran"
    return RunnerInfo(r.name, status, r.device, list(r.providers), r.precision, r.warning)


@dataclass(frozen=True)
class SweepPlan:
    seq_lens: list[int]
    past_lens: list[int]
    switch: tuple  # the form's switch lengths (checked on both sides)
    scores_at: Callable[[int], bool]  # T -> whether the form materialises (N, T, S) scores
    static_chunks: bool  # a static cache: the form runs several tokens over a cache at B > 1


def _sweep_plan(artifact: Artifact, seq_lens, past_lens) -> SweepPlan:
    """The sweep for the artifact's form (TorchScript and unknown forms: scores at every T)."""
    config, form_name = artifact.config, artifact.export.get("attention")
    form = FORMS.get(form_name) if form_name else None
    switch = form.switch_seq_lens if form else ()
    return SweepPlan(
        list(seq_lens) if seq_lens else default_seq_lens(config.max_seq_len, switch),
        list(past_lens) if past_lens else default_past_lens(config.max_seq_len), switch,
        form.memory.quadratic_at if form else (lambda t: True),
        form.static_chunks if form else True)


def check_parity(artifact_dir: str | Path, providers: Optional[Sequence[str]] = None,
                 atol: Optional[float] = None, rtol: Optional[float] = None,
                 seq_lens: Optional[Sequence[int]] = None, batch_sizes: Sequence[int] = (1, 3),
                 past_lens: Optional[Sequence[int]] = None, seed: int = 0,
                 require_cuda: bool = False, tf32: bool = True,
                 runners: Optional[Sequence[str]] = None,
                 inputs: Optional[str | Path] = None,
                 progress: Callable[[int, int, str], None] = lambda i, n, s: None,
                 **budgets: Optional[float]) -> CheckReport:
    """Run the parity sweep on an artifact folder; see CheckReport.passed.

    ``runners``: runner names (``RUNNERS``); default: every runner for the folder's files, those
    that cannot run here reported as skipped. ``providers``: ONNX Runtime's shorthand (cpu, cuda).
    ``require_cuda``: a CUDA runner that cannot run, or runs compute on the CPU, fails.
    ``budgets``: of the lossy steps' costs (lossy/costs.py's BUDGETS: ``max_quant_error``,
    ``max_kv_error``, ``max_clip_rate``). ``inputs``: a file of captured layer inputs
    (``mha-export capture``): real cases for the artifact's call kind, with the lossy steps'
    costs on them reported apart (real_inputs.py)."""
    lossy.require_known(budgets)
    artifact = read_artifact(artifact_dir)
    real = read_real_inputs(inputs, artifact) if inputs is not None else None
    Tolerance(atol or 0.0, rtol or 0.0)  # a negative or NaN tolerance is bad input, now
    costs = lossy.costs_of(artifact, budgets)
    kinds = selected_kinds(artifact, runners, providers)
    if require_cuda:
        kinds += _cuda_kinds(artifact, kinds)
    config, sig = artifact.config, artifact.signature
    plan = _sweep_plan(artifact, seq_lens, past_lens)
    cases = _single_cases(artifact, plan, batch_sizes)
    report = CheckReport(str(artifact_dir), seed, list(batch_sizes), plan.seq_lens,
                         plan.past_lens if sig.has_cache else [], sig.input_names,
                         sig.output_names,
                         versions=versions(), export_versions=artifact.meta.get("versions", {}))
    options = RunOptions(tf32=tf32)
    opened, report.runners = _open_runners(artifact, kinds, options, require_cuda)
    tolerances = _tolerances(opened, artifact, options, atol, rtol)
    multi_call = (scenarios.static_scenario_cases(plan.static_chunks) if sig.static_cache
                  else scenarios.scenario_cases(plan.switch) if sig.has_cache else [])
    real_cases = real.cases(sig.has_cache, sig.static_cache) if real else []
    if real_cases:
        require_fits(config, [case for case, _ in real_cases], plan.scores_at, sig.has_mask)
    total = len(cases) + len(multi_call) + len(real_cases)
    reference = EagerRunner(sig, opened[0].source, torch.float64)
    truth = Truth(opened, reference, lossy.given_of(artifact, opened[0], reference), tolerances)
    for i, case in enumerate(cases):
        progress(i, total, case.label())
        report.results += _single_call(truth, case, seed, costs)
    for i, (case, split) in enumerate(multi_call, start=len(cases)):
        progress(i, total, case.label())
        report.results += _scenario(truth, config, case, split, seed, costs)
    report.costs.update(lossy.results(costs))
    if real:
        _real_cases(report, artifact, real, real_cases, total, progress, truth, seed, budgets)
    progress(total, total, "")
    return report


@dataclass(frozen=True)
class Truth:
    """What every case is judged by: the runners (eager fp32 first), the fp64 reference, how a
    call's truth is read where a lossy step says (an int8 cache: over each runtime's own
    codes), and the tolerance of each (runner, output)."""

    opened: list[Runner]
    reference: EagerRunner
    given: Any  # lossy/costs.py's given_of: None, or how y's truth is read per call
    tolerances: dict


def _real_cases(report: CheckReport, artifact: Artifact, real: RealInputs, cases: list,
                total: int, progress: Callable, truth: Truth, seed: int, budgets: dict) -> None:
    """The captured inputs through every runner (the sweep's last ``len(cases)`` of ``total``),
    with the lossy steps' costs measured on them alone, beside the random-input ones."""
    report.real_inputs = real.path
    costs = lossy.costs_of(artifact, budgets)
    for i, (case, split) in enumerate(cases, start=total - len(cases)):
        progress(i, total, case.label())
        if split is None:
            report.results += _single_call(truth, case, seed, costs, real.x)
        else:
            report.results += _scenario(truth, artifact.config, case, split, seed, costs,
                                        real.x)
    report.costs.update(lossy.results(costs, real=True))


def _single_cases(artifact: Artifact, plan: "SweepPlan", batch_sizes: Sequence[int]
                  ) -> list[Case]:
    """The sweep's single calls (and a window-crossing call), sized to fit in memory."""
    config, sig = artifact.config, artifact.signature
    cases = make_cases(sig, batch_sizes, plan.seq_lens, plan.past_lens,
                       switch_length(config.rope_scaling) if config.rotary != "none" else 0,
                       plan.static_chunks)
    cases += window_cases(config, sig, plan.seq_lens, plan.scores_at)
    require_fits(config, cases, plan.scores_at, sig.has_mask)
    return cases


def _single_call(truth: Truth, case: Case, seed: int, costs: list[Cost],
                 x: Optional[np.ndarray] = None) -> list[OutputResult]:
    """One case of the sweep through every runner (and into the lossy steps' costs); ``x``:
    real inputs in place of the random ones."""
    baseline, sig = truth.opened[0], truth.reference.signature
    feeds = make_feeds(sig, case, seed)
    if x is not None:  # captured at positions 0 .. N-1: called there
        feeds["x"] = x
        if "position_ids" in feeds:
            feeds["position_ids"] = np.broadcast_to(np.arange(case.seq), (case.batch, case.seq)
                                                    ).copy()
    expected = {"eager": baseline.run(feeds), "reference": truth.reference.run(feeds)}
    valid = valid_entries(sig, feeds, case)
    for cost in costs:
        cost.add_case(feeds, expected["reference"], valid, case)
    # the baseline already ran: its own error is 0 (where the truth is read from what a runner
    # wrote, e.g. an int8 cache's codes, it runs again to be recorded)
    again = (lambda rec: rec.run(feeds)) if truth.given else (lambda rec: expected["eager"])
    results = _compared(truth, baseline, case, again, expected, valid)
    for r in truth.opened[1:]:
        results += _compared(truth, r, case, lambda rec: rec.run(feeds), expected, valid)
    return results


def _scenario(truth: Truth, config, case: Case, split: list, seed: int, costs: list[Cost],
              real_x: Optional[np.ndarray] = None) -> list[OutputResult]:
    """One multi-call scenario through every runner. Its truth is one full forward (or each row
    alone) of the eager module — but for a longrope layer the eager module run call by call:
    each call picks its frequency table from its own largest position, as transformers does,
    so one full call is legitimately another function there."""
    x, mask = scenarios.scenario_inputs(config, case, seed)
    x = x if real_x is None else real_x
    stepwise = bool(switch_length(config.rope_scaling)) and config.rotary != "none"

    def run_truth(r: EagerRunner) -> dict:
        if stepwise:
            return scenarios.run(r, case, x, mask, split)
        return scenarios.expected(case, scenarios.eager_full(r.source), x, mask)

    expected = {"eager": run_truth(truth.opened[0]), "reference": run_truth(truth.reference)}
    for cost in costs:  # e.g. the same scenario's truth with a float cache
        cost.add_scenario(x, mask, expected["reference"]["y"], run_truth)
    results = []
    for r in truth.opened:
        results += _compared(truth, r, case, lambda rec: scenarios.run(rec, case, x, mask, split),
                             expected, scenarios.valid(case, mask))
    return results


def _tolerances(opened: list[Runner], artifact: Artifact, options: RunOptions,
                atol: Optional[float], rtol: Optional[float]) -> dict:
    """(runner, output) -> tolerance: the runner's default for the dtype it computed in, with
    --atol / --rtol; a lossy step's own where it says (an int8 cache's codes compared as codes,
    never overridden)."""
    dtype, out = artifact.export.get("dtype", "float32"), {}
    for r in opened:
        default = _default_tolerance(r, dtype, options)
        for o in artifact.signature.output_names:
            own = lossy.own_tolerance(artifact, o, default)
            out[r.name, o] = own if own is not None else _override(default, atol, rtol)
    return out


def _default_tolerance(runner: Runner, dtype: str, options: RunOptions) -> Tolerance:
    """The registry's tolerance of a runner under test, for the dtype it really computed in (a
    runner whose runtime picks its own arithmetic, e.g. OpenVINO in bf16, says so in
    ``tolerance_dtype``), else the model's; the eager baseline's is fp32's."""
    kind = RUNNERS.get(runner.name)
    real = runner.tolerance_dtype or dtype
    return kind.tolerance(real, options) if kind else FP32


def _override(default: Tolerance, atol: Optional[float], rtol: Optional[float]) -> Tolerance:
    """--atol / --rtol replace the default's; --atol also its output-scaled part."""
    if atol is None and rtol is None:
        return default
    return Tolerance(default.atol if atol is None else atol,
                     default.rtol if rtol is None else rtol,
                     default.scaled if atol is None else 0.0)


def _compared(truth: Truth, runner: Runner, case: Case, call: Callable[[Runner], Feeds],
              expected: dict, valid: dict[str, Optional[np.ndarray]]) -> list[OutputResult]:
    """Run ``call`` on the runner and compare each expected output with eager fp32 and the fp64
    reference, on the elements ``valid`` names per output (the rest only required finite);
    ``truth.given``: y's truth read from what the runner wrote (an int8 cache's codes)."""
    sig, tolerances = runner.signature, truth.tolerances
    names = [n for n in sig.output_names if n in expected["eager"]]
    where = case.to_dict()
    target = truth.given.watch(runner) if truth.given is not None else runner
    try:
        out = call(target)
        if truth.given is not None:
            expected = truth.given.expected(expected, target)
    except Exception as e:  # a model that cannot run this case (e.g. out of memory) fails its row
        raise_if_interrupted()  # ... but an interruption is no row
        error = (str(e).strip() or type(e).__name__).splitlines()[0][:300]
        return [OutputResult(runner.name, n, **where, passed=False,
                             tolerance=tolerances[runner.name, n], error=error) for n in names]
    results = []
    for n in names:
        tol = tolerances[runner.name, n]
        rows, written = valid.get(n), valid.get(written_key(n))
        vs_eager = compare(out[n], expected["eager"][n], tol, rows, written)
        vs_ref = compare(out[n], expected["reference"][n], tol, rows, written)
        results.append(OutputResult(runner.name, n, **where,
                                    passed=vs_eager.passed and vs_ref.passed, vs_eager=vs_eager,
                                    vs_reference=vs_ref, tolerance=tol,
                                    error=vs_eager.reason or vs_ref.reason))
    return results
