"""One unit of work: one layer exported and checked (or checked), in the shape of a Ray task —
a pure function of its job, the same for every executor, whose only effect is the layer's folder.

    LayerJob -> export_artifact (its check included) | check_parity -> the check's Outcome
    -> LayerRecord

It never raises for the layer's own failures: each is a status of its record (crashed, timeout
and infeasible are said by the executor and the plan). What its process does around it (threads
pinned, --timeout, the worker's name and peak memory) is the executors' (executors/worker.py).
"""
from __future__ import annotations

import shutil
from typing import TYPE_CHECKING, Optional

from ..errors import UsageError
from .plan import EXPORT, LayerJob
from .records import ERROR, EXPORTED, FAIL, OOM, PASS, UNCHECKED, LayerRecord, first_line

if TYPE_CHECKING:
    from ..check.parity import CheckReport

# a layer's row by its check's verdict (check/parity.py's CheckReport.verdict)
STATUS_OF = {"pass": PASS, "fail": FAIL, "unchecked": UNCHECKED}
# what runtimes say when an allocation fails (ONNX Runtime, torch, OpenVINO, the C++ runtime)
OUT_OF_MEMORY = ("failed to allocate memory", "bad_alloc", "out of memory",
                 "defaultcpuallocator: can't allocate")


def run_layer(job: LayerJob) -> LayerRecord:
    """The layer's record: pass / fail (parity) / exported (no check) / error / oom."""
    try:
        report = _export(job) if job.action == EXPORT else _check(job)
    except MemoryError:
        return LayerRecord.for_job(job, OOM, "out of memory (MemoryError)")
    except UsageError as e:
        return LayerRecord.for_job(job, ERROR, first_line(e))
    except Exception as e:  # the layer's failure, whatever raised it, is its row
        status = OOM if any(s in str(e).lower() for s in OUT_OF_MEMORY) else ERROR
        return LayerRecord.for_job(job, status, f"{type(e).__name__}: {first_line(e)}")
    return _record(job, report)


def _export(job: LayerJob) -> Optional[CheckReport]:
    """The layer's folder made anew: an earlier one goes first, so that a failed export never
    leaves an artifact of other options under this run's row."""
    from ..export.pipeline import export_to
    shutil.rmtree(job.folder, ignore_errors=True)
    check = None if job.check_options is None else {**job.check_options, "threads": job.threads}
    return export_to(job.target, output=job.folder, weights=job.weights, layer=job.layer,
                  force=True, validate=check is not None, check_options=check,
                  **job.options).report


def _check(job: LayerJob) -> CheckReport:
    from ..check.parity import check_parity
    return check_parity(job.folder, threads=job.threads, **(job.check_options or {}))


def _record(job: LayerJob, report: Optional[CheckReport]) -> LayerRecord:
    """The check's verdict as the layer's row (exported: no check was asked for)."""
    if report is None:
        return LayerRecord.for_job(job, EXPORTED)
    outcome = report.outcome()
    record = LayerRecord.for_job(job, STATUS_OF[report.verdict], outcome.why_failed)
    record.worst_rel, record.worst_runner = outcome.worst_rel, outcome.worst_runner
    record.costs = list(outcome.costs)
    return record
