"""What a parity check runs, decided before any case: the runners (the registry's for the
folder's files, or those named; each opened, or why not), the sweep for the artifact's graph
form (its switch lengths, whether it materialises scores), the cases sized to fit in memory,
each (runner, output)'s tolerance, and the truth every case is judged by.

    artifact, options -> runner kinds -> opened runners -> sweep plan -> cases -> tolerances
    -> Plan (parity.py runs it)
"""
from __future__ import annotations


from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Sequence

import torch

from ..artifact import Artifact
from ..config import MHAConfig
from ..errors import UsageError, raise_if_interrupted
from ..kinds.registry import FORMS
from ..lossy import costs as lossy
from ..rope_types import switch_length
from ..signature import Signature
from . import scenarios
from ..comparison.comparator import FP32, Tolerance
from .real_inputs import RealInputs
from .runners import (RUNNERS, Runner, RunnerKind, RunnerUnavailable, RunOptions, get_runner,
                      ort_runner_names)
from ..comparison.torch_runners import EagerRunner
from .sweep import (BATCH_SIZES, SWEEPS, Case, case_bytes, default_past_lens, default_seq_lens,
                    make_cases, require_fits, require_runnable, static_capacity, window_cases,
                    within_bounds)

BASELINE = "eager-fp32"


@dataclass(frozen=True)
class CheckOptions:
    """check_parity's choices of runners, tolerances and sweep."""

    providers: Optional[Sequence[str]] = None
    atol: Optional[float] = None
    rtol: Optional[float] = None
    seq_lens: Optional[Sequence[int]] = None
    batch_sizes: Optional[Sequence[int]] = None  # None: sweep.BATCH_SIZES
    past_lens: Optional[Sequence[int]] = None
    require_cuda: bool = False
    tf32: bool = True
    runners: Optional[Sequence[str]] = None
    threads: Optional[int] = None  # intra-op threads of every runner (None: each runtime's)
    sweep: str = "full"  # sweep.SWEEPS: "quick" drops long calls' product with batch and cache


@dataclass
class RunnerInfo:
    name: str
    status: str  # "ran" | "skipped" | "failed"
    device: str = ""
    providers: list[str] = field(default_factory=list)  # what the ORT session really uses
    precision: str = ""  # the arithmetic it really used, e.g. "fp32, TF32 matmuls allowed"
    reason: str = ""
    kernels: str = ""  # which kernels ran its attention and MatMulNBits (Runner.kernels)


@dataclass(frozen=True)
class Truth:
    """What every case is judged by: the runners (eager fp32 first), the fp64 reference, how a
    call's truth is read where a lossy step says (an int8 cache: over each runtime's own
    codes), and the tolerance of each (runner, output)."""

    opened: list[Runner]
    reference: EagerRunner
    given: Any  # lossy/costs.py's given_of: None, or how y's truth is read per call
    tolerances: dict
    float_dtype: str = "float32"  # the file's: every runner is fed floats representable in it


@dataclass(frozen=True)
class Fallback:
    """When none of the runners asked for could run the file here: the runner picked in the
    default runners' place and why (one line), or, where the runners were named (none is run in
    their place), the others that can run the file here."""

    picked: str = ""
    runnable: tuple[str, ...] = ()


@dataclass
class Plan:
    """The check's whole plan: sweep, cases (single calls, multi-call scenarios, real inputs),
    what each runner really ran on, and the truth."""

    sweep: "SweepPlan"
    cases: list[Case]
    multi_call: list
    real_cases: list
    runners: list[RunnerInfo]
    truth: Truth
    fallback: Fallback = Fallback()


def plan_check(artifact: Artifact, real: Optional[RealInputs], o: CheckOptions) -> Plan:
    """Runners chosen and opened, cases sized, tolerances set, before any case runs."""
    Tolerance(o.atol or 0.0, o.rtol or 0.0)  # a negative or NaN tolerance is bad input, now
    kinds = selected_kinds(artifact, o.runners, o.providers)
    if o.require_cuda:
        kinds += _cuda_kinds(artifact, kinds)
    sig, config, bounds = artifact.signature, artifact.config, artifact.export.get("bounds")
    require_runnable(sig, bounds, o.seq_lens, o.batch_sizes, o.past_lens)
    sweep = sweep_plan(config, artifact.export.get("attention"), o)
    if bounds and "rows" in bounds:  # a static batch (asked sizes were refused above)
        sweep = replace(sweep, batch_sizes=(bounds["rows"],))
    cases = within_bounds(_single_cases(config, sig, sweep),
                          bounds)  # the calls a bounded program takes
    require_fits(config, cases, sweep.scores_at, sig.has_mask)
    options = RunOptions(tf32=o.tf32, threads=o.threads)
    opened, infos, fallback = _open_runners(artifact, kinds, options, o)
    multi_call = [(case, split) for case, split in _multi_call(sig, sweep, config)
                  if within_bounds([case], bounds)
                  and (sweep.max_cache is None or case.seq + scenarios.SPARE <= sweep.max_cache)]
    if real and (sig.shared_kv or sig.reads_topk):
        raise UsageError("--inputs: capture records a layer's hidden states, not the "
                         + ("top-k selection a shared-top-k" if sig.reads_topk else
                            "keys and values a KV-shared")
                         + " layer reads from its source layer: check it with random inputs")
    real_cases = real.cases(sig.has_cache, sig.static_cache) if real else []
    if real_cases:
        require_fits(artifact.config, [case for case, _ in real_cases], sweep.scores_at,
                     sig.has_mask)
    reference = EagerRunner(sig, opened[0].source, torch.float64)
    truth = Truth(opened, reference, lossy.given_of(artifact, opened[0], reference),
                  _tolerances(opened, artifact, options, o.atol, o.rtol),
                  artifact.export.get("dtype", "float32"))
    return Plan(sweep, cases, multi_call, real_cases, infos, truth, fallback)


def _multi_call(sig: Signature, sweep: "SweepPlan", config: MHAConfig) -> list:
    """The multi-call scenarios of a cached signature (none where each call takes a selection
    made for it: a shared-top-k layer's)."""
    if sig.reads_topk:
        return []
    if sig.static_cache:
        return scenarios.static_scenario_cases(sweep.static_chunks, sweep.batch_prompts)
    if sig.has_cache:
        return scenarios.scenario_cases(sweep.switch, scenarios.padding_sides(config),
                                        scenarios.generate_padding(config))
    return []


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
    return kinds + _companions(artifact, kinds)


def _companions(artifact: Artifact, kinds: Sequence[RunnerKind]) -> list[RunnerKind]:
    """The runners that accompany a chosen one on such files (``also_with``)."""
    chosen = {k.name for k in kinds}
    return [k for k in RUNNERS.values() if k.also_with in chosen
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
                  o: CheckOptions) -> tuple[list[Runner], list[RunnerInfo], Fallback]:
    """The runners under test, eager fp32 first, and what each really ran on (or why not);
    where none of them can run the file here (and --require-cuda does not fail the check
    already): the default runners' stand-in, or the runners that could have run it."""
    eager = EagerRunner(artifact.signature, artifact.load_source_module())
    runners, infos = _opened(artifact, kinds, options, o.require_cuda)
    fallback = Fallback()
    if not runners and not o.require_cuda:
        if o.runners is None and o.providers is None:
            runners, tried, fallback = _stand_in(artifact, kinds, options)
            infos += tried
        else:
            fallback = Fallback(runnable=_runnable_here(artifact, kinds, options))
    return [eager, *runners], [_runner_info(eager, False), *infos], fallback


def _opened(artifact: Artifact, kinds: Sequence[RunnerKind], options: RunOptions,
            require_cuda: bool = False) -> tuple[list[Runner], list[RunnerInfo]]:
    """Each runner opened, and what it really runs on (or why it cannot run here)."""
    runners, infos = [], []
    for kind in kinds:
        strict = require_cuda and kind.device == "cuda"
        try:
            runner = _open(kind, artifact, options)
        except RunnerUnavailable as e:
            infos.append(RunnerInfo(kind.name, "failed" if strict else "skipped", reason=str(e)))
            continue
        runners.append(runner)
        infos.append(_runner_info(runner, strict))
    return runners, infos


def _others(artifact: Artifact, tried: Sequence[RunnerKind]) -> list[RunnerKind]:
    """The registry's other runners for the folder's files, in its order (not those that only
    accompany another: they come with it)."""
    names = {k.name for k in tried}
    return [k for k in RUNNERS.values() if k.name not in names and not k.also_with
            and (artifact.path / k.model_file).is_file()]


def _open_other(kind: RunnerKind, artifact: Artifact, options: RunOptions) -> Runner:
    """A runner not asked for, or RunnerUnavailable: a file only it cannot load is no bad
    input."""
    try:
        return _open(kind, artifact, options)
    except UsageError as e:
        raise RunnerUnavailable(str(e)) from None


def _stand_in(artifact: Artifact, defaults: Sequence[RunnerKind], options: RunOptions
              ) -> tuple[list[Runner], list[RunnerInfo], Fallback]:
    """None of the file's default runners can run it here (a bfloat16 file on a CPU: ONNX
    Runtime's CPU provider has no bf16 kernels): the first other runner that can (OpenVINO),
    with those that accompany it, and the line saying why; none can: each one's SKIPPED line."""
    skipped = []
    for kind in _others(artifact, defaults):
        try:
            runner = _open_other(kind, artifact, options)
        except RunnerUnavailable as e:
            skipped.append(RunnerInfo(kind.name, "skipped", reason=str(e)))
            continue
        runners, infos = _opened(artifact, _companions(artifact, [kind]), options)
        why = (f"{kind.name} picked in place of the file's default runners "
               f"({', '.join(k.name for k in defaults)}), which cannot run it here")
        return [runner, *runners], [_runner_info(runner, False), *infos], Fallback(picked=why)
    return [], skipped, Fallback()


def _runnable_here(artifact: Artifact, named: Sequence[RunnerKind], options: RunOptions
                   ) -> tuple[str, ...]:
    """The runners not named that can run the folder's files here (each opened to know)."""
    runnable = []
    for kind in _others(artifact, named):
        try:
            _open_other(kind, artifact, options)
        except RunnerUnavailable:
            continue
        runnable.append(kind.name)
    return tuple(runnable)


def with_ran_notes(infos: list[RunnerInfo], opened: list[Runner]) -> list[RunnerInfo]:
    """Each runner's line with what it could say only after the cases ran (``ran_note``), and
    failed where it did not do what it stands for (``ran_failure``)."""
    by_name = {r.name: r for r in opened}
    out = []
    for info in infos:
        runner = by_name.get(info.name)
        note, failure = (runner.ran_note(), runner.ran_failure()) if runner else ("", "")
        if note:
            info = replace(info, precision=f"{info.precision}; {note}")
        if runner and (kernels := runner.kernels()):
            info = replace(info, kernels=kernels)
        if failure:
            info = replace(info, status="failed", reason=failure)
        out.append(info)
    return out


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
    max_cache: Optional[int] = None  # the longest static buffer (and call) the form runs
    batch_prompts: bool = True  # the form runs T > 1 at B > 1 (over an empty cache too)
    sweep: str = "full"  # sweep.SWEEPS
    batch_sizes: tuple[int, ...] = BATCH_SIZES


def sweep_plan(config: MHAConfig, form_name: Optional[str], o: CheckOptions) -> SweepPlan:
    """The sweep for a graph form (TorchScript and unknown forms: scores at every T)."""
    if o.sweep not in SWEEPS:
        raise UsageError(f"sweep {o.sweep!r}: one of {', '.join(SWEEPS)}")
    form = FORMS.get(form_name) if form_name else None
    switch = form.switch_seq_lens if form else ()
    return SweepPlan(
        list(o.seq_lens) if o.seq_lens else default_seq_lens(config.max_seq_len, switch),
        list(o.past_lens) if o.past_lens else default_past_lens(config.max_seq_len), switch,
        form.memory.quadratic_at if form else (lambda t: True),
        form.static_chunks if form else True,
        form.max_cache(config) if form and form.max_cache else None,
        form.batch_prompts if form else True, o.sweep,
        tuple(o.batch_sizes or BATCH_SIZES))


def _single_cases(config: MHAConfig, sig: Signature, plan: SweepPlan) -> list[Case]:
    """The sweep's single calls (and a window-crossing call)."""
    cases = make_cases(sig, plan.batch_sizes, plan.seq_lens, plan.past_lens,
                       switch_length(config.rope_scaling) if config.rotary != "none" else 0,
                       plan.static_chunks, plan.sweep)
    if plan.max_cache is not None:  # the form's table of positions: longer buffers refused
        cases = [c for c in cases if static_capacity(c) <= plan.max_cache]
    if not plan.batch_prompts:  # NaN by design (the form's record)
        cases = [c for c in cases if c.batch == 1 or c.seq == 1]
    return cases + window_cases(config, sig, plan.seq_lens, plan.scores_at)


def largest_case_bytes(config: MHAConfig, sig: Signature, form_name: Optional[str],
                       o: CheckOptions = CheckOptions()) -> int:
    """What the sweep's largest single call needs (sweep.case_bytes), before anything is
    exported: how much memory a check of such a layer asks for."""
    plan = sweep_plan(config, form_name, o)
    return max(case_bytes(config, case, plan.scores_at, sig.has_mask)
               for case in _single_cases(config, sig, plan))


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
