"""Human-readable rendering of a CheckReport (the JSON form is CheckReport.to_dict).

The summary has one line per (runner, output) with the worst error over the whole sweep, then
the runner status lines and the verdict; ``verbose`` adds every (case, output) row.
"""
from __future__ import annotations

from typing import Iterable, Optional

from .parity import CheckReport, OutputResult

SUMMARY = ("runner", "output", "max|d| eager", "rel eager", "max|d| fp64", "tolerance",
           "worst case", "result")
ROWS = ("runner", "output", "case", "max|d| eager", "rel eager", "max|d| fp64", "tolerance",
        "result")
MAX_FAILURE_LINES = 5


def _num(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.2e}"


def _worst(values: Iterable[Optional[float]]) -> Optional[float]:
    vals = [v for v in values if v is not None]
    return max(vals) if vals else None


def _table(header: tuple, rows: list[tuple]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows]]
    lines.insert(1, "-" * len(lines[0]))
    return lines


def _summary_rows(report: CheckReport) -> list[tuple]:
    groups: dict[tuple, list[OutputResult]] = {}
    for r in report.results:
        runner = r.runner + (" [real inputs]" if r.inputs == "real" else "")
        groups.setdefault((runner, r.output), []).append(r)
    rows = []
    for (runner, output), rs in groups.items():
        worst = max(rs, key=lambda r: (not r.passed, max(
            r.vs_eager.max_abs, r.vs_reference.max_abs) if r.vs_eager else 0))
        rows.append((runner, output,
                     _num(_worst(r.vs_eager and r.vs_eager.max_abs for r in rs)),
                     _num(_worst(r.vs_eager and r.vs_eager.rel for r in rs)),
                     _num(_worst(r.vs_reference and r.vs_reference.max_abs for r in rs)),
                     str(worst.tolerance), worst.case.label(),
                     "PASS" if all(r.passed for r in rs) else "FAIL"))
    return rows


def _case_row(r: OutputResult) -> tuple:
    e, ref = r.vs_eager, r.vs_reference
    return (r.runner, r.output, r.case.label(), _num(e and e.max_abs), _num(e and e.rel),
            _num(ref and ref.max_abs), str(r.tolerance), "PASS" if r.passed else "FAIL")


def _quantization_lines(costs: list, over: str = "the sweep") -> list[str]:
    """What quantizing cost, per output, apart from the runners' kernel parity above."""
    if not costs:
        return []
    lines = [f"quantization cost ({costs[0].spec}): the dequantized layer vs "
             f"the unquantized layer, fp64, worst over {over}"]
    for q in costs:
        d = q.deviation
        verdict = _verdict(q.passed, q.budget, "--max-quant-error")
        lines.append(f"  {q.output:13s} max|d| {d.max_abs:.2e}  {d.rel:.2e} of max|y|  "
                     f"cosine {d.cosine:.6f}  {verdict}")
    return lines


def _verdict(passed: bool, budget: Optional[float], flag: str) -> str:
    if budget is None:
        return "FAIL (not finite)" if not passed else f"reported (no {flag})"
    return f"{'PASS' if passed else 'FAIL'} (budget {budget:g})"


def _kv_cache_lines(kv, over: str = "the generate and ragged scenarios") -> list[str]:
    """What the int8 cache cost, apart from the runners' parity (which judges the runtime
    against the int8 function the file holds)."""
    if kv is None:
        return []
    d = kv.deviation
    lines = [f"int8 KV cache cost ({kv.spec}): the int8-cache layer vs the float-cache layer, "
             f"fp64, worst over {over}"]
    if kv.synthetic:
        lines.append("  (scales calibrated on random inputs, not the model's hidden states: "
                     "export with --calibration FILE for real ones)")
    lines.append(f"  {'y':13s} max|d| {d.max_abs:.2e}  {d.rel:.2e} of max|y|  cosine "
                 f"{d.cosine:.6f}  {_verdict(kv.error_passed, kv.budget, '--max-kv-error')}")
    for name, rate in kv.clip_rates.items():
        lines.append(f"  {name:13s} clipped {rate:.3%} of the entries written in the sweep  "
                     f"{_verdict(kv.clip_passed(name), kv.clip_budget, '--max-clip-rate')}")
    return lines


def format_report(report: CheckReport, verbose: bool = False) -> str:
    lines = _table(ROWS, [_case_row(r) for r in report.results]) + [""] if verbose else []
    lines += _table(SUMMARY, _summary_rows(report))
    failures = [r for r in report.results if not r.passed]
    for r in failures[:MAX_FAILURE_LINES]:
        lines.append(f"FAIL {r.runner} {r.output} {r.case.label()}: {r.error}")
    if len(failures) > MAX_FAILURE_LINES:
        lines.append(f"... and {len(failures) - MAX_FAILURE_LINES} more failing rows "
                     "(-v or --json for all)")
    real = "the real inputs (--inputs)"
    lines += (_quantization_lines(report.quantization)
              + _quantization_lines(report.real_quantization, real)
              + _kv_cache_lines(report.kv_cache) + _kv_cache_lines(report.real_kv_cache, real))
    for info in report.runners:
        if info.status == "ran":
            note = f" (WARNING: {info.reason})" if info.reason else ""
            lines.append(f"{info.name:12s} ran on {info.device}{note}")
        else:
            lines.append(f"{info.name:12s} {info.status.upper()}: {info.reason}")
    if not report.tested:
        lines.append("nothing under test ran (no model runner produced output)")
    n_pass = sum(r.passed for r in report.results)
    n_cases = len({r.case for r in report.results})
    quantization = report.quantization + report.real_quantization
    over = " — quantization cost FAILED" if not all(q.passed for q in quantization) else ""
    over += " — int8 KV cache cost FAILED" if any(
        kv and not kv.passed for kv in (report.kv_cache, report.real_kv_cache)) else ""
    lines.append(f"{'PASS' if report.passed else 'FAIL'}: {n_pass}/{len(report.results)} "
                 f"comparisons within tolerance over {n_cases} cases{over} ({report.artifact})")
    return "\n".join(lines)
