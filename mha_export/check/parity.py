"""Parity check: rebuild the eager module from an artifact's config and source weights, run every
runner over a sweep of fresh random inputs, and compare each declared output with eager fp32 and
with a float64 eager reference, each with its own tolerance.

    artifact -> plan (plan.py: runners, cases, tolerances, the truth) -> each case through every
    runner (sweep.py, scenarios.py) and into the lossy steps' costs (lossy/costs.py) -> compare
    (comparator.py) -> CheckReport (report.py renders it)
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from ..artifact import Artifact, read_artifact
from ..env import versions
from ..errors import raise_if_interrupted
from ..lossy import costs as lossy
from ..lossy.base import Cost
from ..rope_types import switch_length
from . import scenarios
from ..comparison.comparator import Comparison, Tolerance, compare
from .plan import BASELINE, CheckOptions, RunnerInfo, Truth, plan_check, with_ran_notes
from .real_inputs import RealInputs, read_real_inputs
from .runners import Feeds, Runner
from ..comparison.torch_runners import EagerRunner
from .sweep import Case, in_model_dtype, make_feeds, valid_entries, written_key

PASS, FAIL, UNCHECKED = "pass", "fail", "unchecked"  # a check's verdicts (CheckReport.verdict)
NOTHING_RAN = "nothing here could check it: no runner under test ran"


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


@dataclass(frozen=True)
class Outcome:
    """A check's verdict in one small record (a fan-out's row of it): the worst error on the
    output's scale over the runners tested and whose it is, the lossy steps' cost lines, and
    why it failed, in one line."""

    passed: bool
    worst_rel: Optional[float]  # max|d| / max|y| vs eager fp32; None: nothing compared
    worst_runner: str
    costs: tuple[str, ...]
    why_failed: str  # "" when it passed


@dataclass
class CheckReport:
    """A parity check's verdict (``verdict``: pass, fail, or unchecked where no runner under
    test ran; ``passed``) and everything behind it: the sweep, which runners ran where (or why
    not, and which was picked in the default runners' place), one OutputResult per (runner,
    case, output), and each lossy step's cost reported apart. ``to_dict`` is parity.json."""

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
    sweep: str = "full"  # sweep.SWEEPS: which cases of the batch x length x cache product ran
    export_versions: dict = field(default_factory=dict)  # recorded in the artifact at export
    real_inputs: str = ""  # --inputs FILE (its cases are labelled inputs "real")
    # what each lossy step cost (lossy/costs.py), by report field: "quantization", "kv_cache",
    # and "real_" + each on the captured inputs; every field present (empty: no such step)
    costs: dict = field(default_factory=lambda: {**lossy.empty_fields(),
                                                 **lossy.empty_fields(real=True)})
    # none of the runners asked for could run the file here (plan.Fallback): the runner picked
    # in the default runners' place and why, or (runners named) the others that can run it here
    picked: str = ""
    runnable_here: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.verdict == PASS

    @property
    def verdict(self) -> str:
        """PASS; FAIL: a comparison, a runner (--require-cuda) or a lossy step's budget failed;
        UNCHECKED: nothing under test ran, so nothing was compared (not a parity failure)."""
        if ((self.tested and not all(r.passed for r in self.results))
                or not all(Cost.passed(result) for result in self.costs.values())
                or any(r.status == "failed" for r in self.runners)):
            return FAIL
        return PASS if self.tested else UNCHECKED

    @property
    def tested(self) -> bool:
        """Something other than the eager baseline ran: a check of nothing never passes."""
        return any(r.runner != BASELINE for r in self.results)

    def outcome(self) -> Outcome:
        tested = [r for r in self.results if r.runner != BASELINE and r.vs_eager is not None]
        worst = max(tested, key=lambda r: r.vs_eager.rel, default=None)
        costs = [line.strip() for line in lossy.report_lines(self.costs, "real inputs")]
        return Outcome(self.passed, None if worst is None else float(worst.vs_eager.rel),
                       "" if worst is None else worst.runner, tuple(c for c in costs if c),
                       "" if self.passed else self._why_failed())

    def _why_failed(self) -> str:
        if self.verdict == UNCHECKED:
            return NOTHING_RAN
        failed = next((r for r in self.results if not r.passed), None)
        if failed is not None:
            rel = f" rel {failed.vs_eager.rel:.2e}" if failed.vs_eager else ""
            return (f"{failed.runner} {failed.output} {failed.case.label()}:{rel} "
                    f"{failed.error or 'outside ' + str(failed.tolerance)}")[:300]
        broken = [r.name for r in self.runners if r.status == "failed"]
        if broken:
            return f"runner failed: {', '.join(broken)}"
        titles = lossy.failed_titles(self.costs)
        return f"over budget: {', '.join(titles)}" if titles else NOTHING_RAN

    def to_dict(self) -> dict:
        """parity.json: the fields, each cost's result under its own key."""
        d, out = asdict(self), {}
        del d["costs"]
        later = {k: d.pop(k) for k in ("picked", "runnable_here")}  # 0.7's: after 0.3's keys
        for key, value in d.items():  # each cost beside its kind of inputs, as 0.3 wrote them
            if key == "real_inputs":
                out.update({n: _plain(r) for n, r in self.costs.items()
                            if not n.startswith(lossy.REAL)})
            out[key] = value
        out.update({n: _plain(r) for n, r in self.costs.items() if n.startswith(lossy.REAL)})
        return {**out, "passed": self.passed, **later, "verdict": self.verdict}


def _plain(result):
    """A cost's result as JSON: its to_dict (with its verdict) where it has one."""
    if isinstance(result, list):
        return [_plain(r) for r in result]
    return result.to_dict() if hasattr(result, "to_dict") else (
        asdict(result) if result is not None else None)


def check_parity(artifact_dir: str | Path, providers: Optional[Sequence[str]] = None,
                 atol: Optional[float] = None, rtol: Optional[float] = None,
                 seq_lens: Optional[Sequence[int]] = None,
                 batch_sizes: Optional[Sequence[int]] = None,
                 past_lens: Optional[Sequence[int]] = None, seed: int = 0,
                 require_cuda: bool = False, tf32: bool = True,
                 runners: Optional[Sequence[str]] = None,
                 inputs: Optional[str | Path] = None, threads: Optional[int] = None,
                 sweep: str = "full",
                 progress: Callable[[int, int, str], None] = lambda i, n, s: None,
                 **budgets: Optional[float]) -> CheckReport:
    """Run the parity sweep on an artifact folder; see CheckReport.passed.

    ``runners``: runner names (``RUNNERS``); default: every runner for the folder's files, those
    that cannot run here reported as skipped. ``sweep``: "full" (every batch x length x cache
    length) or "quick" (the export-time check's: sweep.in_quick_sweep). ``providers``: ONNX
    Runtime's shorthand (cpu, cuda).
    ``require_cuda``: a CUDA runner that cannot run, or runs compute on the CPU, fails.
    ``budgets``: of the lossy steps' costs (lossy/costs.py's BUDGETS: ``max_quant_error``,
    ``max_kv_error``, ``max_clip_rate``). ``inputs``: a file of captured layer inputs
    (``mha-export capture``): real cases for the artifact's call kind, with the lossy steps'
    costs on them reported apart (real_inputs.py). ``threads``: every runner's intra-op threads
    (the runtimes' defaults when None)."""
    lossy.require_known(budgets)
    artifact = read_artifact(artifact_dir)
    real = read_real_inputs(inputs, artifact) if inputs is not None else None
    costs = lossy.costs_of(artifact, budgets)
    plan = plan_check(artifact, real, CheckOptions(
        providers, atol, rtol, seq_lens, batch_sizes, past_lens, require_cuda, tf32, runners,
        threads, sweep))
    sig = artifact.signature
    report = CheckReport(str(artifact_dir), seed, list(plan.sweep.batch_sizes),
                         plan.sweep.seq_lens,
                         plan.sweep.past_lens if sig.follows_past else [], sig.input_names,
                         sig.output_names, plan.runners, versions=versions(),
                         export_versions=artifact.meta.get("versions", {}), sweep=sweep)
    total = len(plan.cases) + len(plan.multi_call) + len(plan.real_cases)
    for i, case in enumerate(plan.cases):
        progress(i, total, case.label())
        report.results += _single_call(plan.truth, case, seed, costs)
    for i, (case, split) in enumerate(plan.multi_call, start=len(plan.cases)):
        progress(i, total, case.label())
        report.results += _scenario(plan.truth, artifact.config, case, split, seed, costs)
    report.costs.update(lossy.results(costs))
    if real:
        _real_cases(report, artifact, real, plan.real_cases, total, progress, plan.truth, seed,
                    budgets)
    progress(total, total, "")
    report.runners = with_ran_notes(plan.runners, plan.truth.opened)
    report.picked, report.runnable_here = plan.fallback.picked, list(plan.fallback.runnable)
    return report


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
    feeds = in_model_dtype(feeds, truth.float_dtype)
    expected = {"eager": baseline.run(feeds), "reference": truth.reference.run(feeds)}
    valid = valid_entries(sig, feeds, case)
    for cost in costs:
        cost.add_case(feeds, expected["reference"], valid, case)
    # the baseline already ran: its own error is 0 (where the truth is read from what a runner
    # wrote, e.g. an int8 cache's codes, its call is recorded as it ran)
    again = ((lambda rec: rec.replay(feeds, expected["eager"])) if truth.given
             else (lambda rec: expected["eager"]))
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
    x = in_model_dtype({"x": x if real_x is None else real_x}, truth.float_dtype)["x"]
    stepwise = bool(switch_length(config.rope_scaling)) and config.rotary != "none"

    def run_truth(r: EagerRunner) -> dict:
        if stepwise:
            return scenarios.run(r, case, x, mask, split)
        return scenarios.expected(case, scenarios.expect_of(r), x, mask)

    expected = {"eager": run_truth(truth.opened[0]), "reference": run_truth(truth.reference)}
    for cost in costs:  # e.g. the same scenario's truth with a float cache
        cost.add_scenario(x, mask, expected["reference"]["y"], run_truth)
    results = []
    for r in truth.opened:
        results += _compared(truth, r, case, lambda rec: scenarios.run(rec, case, x, mask, split),
                             expected, scenarios.valid(case, mask))
    return results


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
