"""One unit of work: one layer exported and checked (or checked), in whatever process the
executor gives it. A pure function of its job — the same for every executor — that never
raises for the layer's own failures: each is a status of its record.

    LayerJob -> threads pinned -> export_artifact / check_parity (under --timeout) -> LayerRecord
"""
from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import socket
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Iterator, Optional

from ..check.plan import BASELINE
from ..errors import UsageError
from ..lossy import costs as lossy
from .plan import EXPORT, LayerJob
from .records import ERROR, EXPORTED, FAIL, OOM, PASS, TIMEOUT, LayerRecord, first_line

# what runtimes say when an allocation fails (ONNX Runtime, torch, OpenVINO, the C++ runtime)
OUT_OF_MEMORY = ("failed to allocate memory", "bad_alloc", "out of memory",
                 "defaultcpuallocator: can't allocate")


WATCHDOG_GRACE = 30.0  # seconds past --timeout before a stuck worker ends itself
STOPPED_PAST_TIMEOUT = 124  # its exit code (timeout(1)'s)
_disposable = [False]  # this process is a worker of its own (executors set it): it may exit


def in_worker(work, job: LayerJob) -> LayerRecord:
    """An executor's worker entry: ``work(job)`` in a process that may end itself when a
    layer is stuck past its timeout where the in-process deadline cannot reach."""
    _disposable[0] = True
    return work(job)


class LayerTimeout(BaseException):
    """Unwinds past every ``except Exception`` (a reader that turns any error into bad input),
    as an interruption does: staging folders are removed on the way out."""


def run_layer(job: LayerJob) -> LayerRecord:
    """The layer's record: pass / fail (parity) / exported (no check) / error / oom / timeout.
    (crashed and infeasible are said by the executor and the plan: a dead worker returns
    nothing.)"""
    warnings.filterwarnings("ignore")  # library chatter; the record says what matters
    start = time.perf_counter()
    pin_threads(job.threads)
    record = LayerRecord.for_job(job, ERROR)
    record.worker = worker_name()
    try:
        with deadline(job.timeout, stop_marker(job)):
            report = _export(job) if job.action == EXPORT else _check(job)
        _verdict(record, report)
    except LayerTimeout:
        record.status, record.message = TIMEOUT, f"over --timeout {job.timeout:g} s"
    except MemoryError:
        record.status, record.message = OOM, "out of memory (MemoryError)"
    except UsageError as e:
        record.message = first_line(e)
    except Exception as e:  # the layer's failure, whatever raised it, is its row
        record.message = f"{type(e).__name__}: {first_line(e)}"
        if any(s in str(e).lower() for s in OUT_OF_MEMORY):
            record.status = OOM
    record.seconds = round(time.perf_counter() - start, 2)
    record.peak_mib = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return record


def _export(job: LayerJob):
    """The layer's folder made anew: an earlier one goes first, so that a failed export never
    leaves an artifact of other options under this run's row."""
    from ..export.pipeline import EXPORTERS
    shutil.rmtree(job.folder, ignore_errors=True)
    check = None if job.check_options is None else {**job.check_options, "threads": job.threads}
    return EXPORTERS[job.target](output=job.folder, weights=job.weights, layer=job.layer,
                                 force=True, validate=check is not None, check_options=check,
                                 **job.options).report


def _check(job: LayerJob):
    from ..check.parity import check_parity
    return check_parity(job.folder, threads=job.threads, **(job.check_options or {}))


def _verdict(record: LayerRecord, report) -> None:
    """The check's verdict, its worst error on the output's scale, its cost lines."""
    if report is None:
        record.status = EXPORTED
        return
    record.status = PASS if report.passed else FAIL
    tested = [r for r in report.results if r.runner != BASELINE and r.vs_eager is not None]
    if tested:
        worst = max(tested, key=lambda r: r.vs_eager.rel)
        record.worst_rel, record.worst_runner = float(worst.vs_eager.rel), worst.runner
    record.costs = [line.strip() for line in lossy.report_lines(report.costs, "real inputs")
                    if line.strip()]
    if not report.passed:
        record.message = _why_failed(report)


def _why_failed(report) -> str:
    failed = next((r for r in report.results if not r.passed), None)
    if failed is not None:
        rel = f" rel {failed.vs_eager.rel:.2e}" if failed.vs_eager else ""
        return (f"{failed.runner} {failed.output} {failed.case.label()}:{rel} "
                f"{failed.error or 'outside ' + str(failed.tolerance)}")[:300]
    broken = [r.name for r in report.runners if r.status == "failed"]
    if broken:
        return f"runner failed: {', '.join(broken)}"
    titles = lossy.failed_titles(report.costs)
    return f"over budget: {', '.join(titles)}" if titles else "nothing was tested"


def pin_threads(threads: int) -> None:
    """torch's intra-op threads; the runtimes' come from the check's ``threads``."""
    import torch
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)  # for libraries that start pools later


@contextlib.contextmanager
def deadline(seconds: Optional[float], marker: Path) -> Iterator[None]:
    """Raise LayerTimeout in this (main) thread after ``seconds``. A runtime's C++ call delays
    it until the call returns: in a worker of its own (``in_worker``) a watchdog ends the
    process WATCHDOG_GRACE seconds later (exit code STOPPED_PAST_TIMEOUT), leaving ``marker``
    for the executor (``stopped_past_timeout``)."""
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise LayerTimeout()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    watchdog = threading.Timer(seconds + WATCHDOG_GRACE, _stop, (marker,))
    watchdog.daemon = True
    if _disposable[0]:
        watchdog.start()
    try:
        yield
    finally:
        watchdog.cancel()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _stop(marker: Path) -> None:
    with contextlib.suppress(OSError):
        marker.touch()
    os._exit(STOPPED_PAST_TIMEOUT)


def stop_marker(job: LayerJob) -> Path:
    folder = Path(job.folder)
    return folder.with_name(f".{folder.name}.stopped")


def stopped_past_timeout(job: LayerJob) -> bool:
    """Whether the job's worker ended itself past its timeout (the marker taken away)."""
    marker = stop_marker(job)
    found = marker.exists()
    with contextlib.suppress(OSError):
        marker.unlink()
    return found


def worker_name() -> str:
    """host:pid, and the Ray node where Ray runs it."""
    name = f"{socket.gethostname()}:{os.getpid()}"
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        name += f" node {ray.get_runtime_context().get_node_id()[:8]}"
    return name
