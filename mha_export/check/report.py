"""Human-readable rendering of a CheckReport (the JSON form is CheckReport.to_dict).

The summary has one line per (runner, output) with the worst error over the whole sweep, then
the runner status lines and the verdict; ``verbose`` adds every (case, output) row.
"""
from __future__ import annotations

from typing import Iterable, Optional

from ..lossy import costs as lossy
from .parity import NOTHING_RAN, UNCHECKED, CheckReport, OutputResult

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


def format_report(report: CheckReport, verbose: bool = False) -> str:
    lines = _table(ROWS, [_case_row(r) for r in report.results]) + [""] if verbose else []
    lines += _table(SUMMARY, _summary_rows(report))
    failures = [r for r in report.results if not r.passed]
    for r in failures[:MAX_FAILURE_LINES]:
        lines.append(f"FAIL {r.runner} {r.output} {r.case.label()}: {r.error}")
    if len(failures) > MAX_FAILURE_LINES:
        lines.append(f"... and {len(failures) - MAX_FAILURE_LINES} more failing rows "
                     "(-v or --json for all)")
    lines += lossy.report_lines(report.costs, "the real inputs (--inputs)")
    for info in report.runners:
        if info.status == "ran":
            note = f" (WARNING: {info.reason})" if info.reason else ""
            kernels = f"; kernels: {info.kernels}" if info.kernels else ""
            lines.append(f"{info.name:12s} ran on {info.device}{kernels}{note}")
        else:
            lines.append(f"{info.name:12s} {info.status.upper()}: {info.reason}")
    if report.picked:
        lines.append(report.picked)
    lines.append(_verdict_line(report))
    return "\n".join(lines)


def _verdict_line(report: CheckReport) -> str:
    """The last line: PASS / FAIL over the comparisons, or what failed when nothing under test
    ran, or UNCHECKED: nothing here could check it (never a pass, never a parity failure)."""
    where = f"({report.artifact})"
    failed = [f"{info.name} FAILED" for info in report.runners if info.status == "failed"]
    failed += [f"{title} cost FAILED" for title in lossy.failed_titles(report.costs)]
    if report.verdict == UNCHECKED:
        others = (f"runners that can run it here: {', '.join(report.runnable_here)}"
                  if report.runnable_here else "no runner installed here can run its file")
        return f"UNCHECKED: {NOTHING_RAN}; {others} {where}"
    if not report.tested:
        return f"FAIL: {'; '.join(failed)}; nothing under test ran {where}"
    n_pass = sum(r.passed for r in report.results)
    n_cases = len({r.case for r in report.results})
    quick = " (the quick sweep: `mha-export check` runs the full one)" * (report.sweep == "quick")
    over = "".join(f" — {title} cost FAILED" for title in lossy.failed_titles(report.costs))
    return (f"{report.verdict.upper()}: {n_pass}/{len(report.results)} comparisons within "
            f"tolerance over {n_cases} cases{quick}{over} {where}")
