"""Human-readable rendering of a CheckReport (the JSON form is CheckReport.to_dict)."""
from __future__ import annotations

from .parity import CheckReport, ShapeResult

HEADER = ("runner", "B", "T", "max|d| eager", "max rel eager", "max|d| fp64", "tolerance",
          "result")


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.2e}"


def _row(r: ShapeResult) -> tuple[str, ...]:
    e, ref = r.vs_eager, r.vs_reference
    verdict = "PASS" if r.passed else "FAIL"
    return (r.runner, str(r.batch), str(r.seq), _num(e and e.max_abs), _num(e and e.max_rel),
            _num(ref and ref.max_abs), str(r.tolerance) if r.tolerance else "-", verdict)


def format_table(report: CheckReport) -> str:
    rows = [HEADER] + [_row(r) for r in report.results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    lines = ["  ".join(c.ljust(w) if i in (0, 6) else c.rjust(w)
                       for i, (c, w) in enumerate(zip(row, widths))).rstrip() for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    failures = [r for r in report.results if not r.passed]
    for r in failures[:10]:
        lines.append(f"FAIL {r.runner} B={r.batch} T={r.seq}: {r.error}")
    if len(failures) > 10:
        lines.append(f"... and {len(failures) - 10} more failures")
    lines.append("")
    for info in report.runners:
        if info.status == "ran":
            note = f" (WARNING: {info.reason})" if info.reason else ""
            lines.append(f"{info.name:12s} ran on {info.device}{note}")
        else:
            lines.append(f"{info.name:12s} {info.status.upper()}: {info.reason}")
    if not report.tested:
        lines.append("nothing under test ran (no model runner produced output)")
    n_pass = sum(r.passed for r in report.results)
    verdict = "PASS" if report.passed else "FAIL"
    lines.append(f"{verdict}: {n_pass}/{len(report.results)} comparisons within tolerance "
                 f"({report.artifact})")
    return "\n".join(lines)
