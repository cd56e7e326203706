"""The worker's runtime: what an executor's worker process does around one unit of work
(work.py's ``run_layer``, or a caller's own), the same for every executor, and the row of a
layer whose worker returned nothing.

    in_worker(work, job): threads pinned -> work(job) under the job's --timeout -> its record,
    with the seconds, the worker's peak memory and its name
    lost(job, why): crashed, or timeout where the worker was stopped past its --timeout

A --timeout is SIGALRM in the worker's main thread; a runtime's C++ call delays it until the call
returns, so a watchdog ends the process (``os._exit``) WATCHDOG_GRACE seconds later, leaving a
stop marker beside the layer's folder for the executor (``stopped_past_timeout``). A worker is a
process of its own (local: spawned; Ray: a task's worker used once): ending it ends nothing else.
"""
from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Iterator, Optional

from ...env import quiet_libraries
from ..plan import LayerJob
from ..records import CRASHED, TIMEOUT, LayerRecord
from .base import Work

WATCHDOG_GRACE = 30.0  # seconds past --timeout before a stuck worker ends itself
STOPPED_PAST_TIMEOUT = 124  # its exit code (timeout(1)'s)


class LayerTimeout(BaseException):
    """Unwinds past every ``except Exception`` (a reader that turns any error into bad input),
    as an interruption does: staging folders are removed on the way out."""


def in_worker(work: Work, job: LayerJob) -> LayerRecord:
    """An executor's worker entry: ``work(job)``'s record, or the layer's timeout row."""
    quiet_libraries()  # library chatter; the record says what matters
    start = time.perf_counter()
    pin_threads(job.threads)
    try:
        with deadline(job.timeout, stop_marker(job)):
            record = work(job)
    except LayerTimeout:
        record = LayerRecord.for_job(job, TIMEOUT, f"over --timeout {job.timeout:g} s")
    record.worker = worker_name()
    record.seconds = round(time.perf_counter() - start, 2)
    record.peak_mib = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return record


def lost(job: LayerJob, why: str, timed_out: bool = False) -> LayerRecord:
    """The row of a layer whose worker returned nothing: ``timeout`` where it was stopped
    past its --timeout (``timed_out``: the executor saw it, or the worker left its marker),
    else ``crashed``, ``why`` (what its executor knows of its death)."""
    if stopped_past_timeout(job) or timed_out:
        return LayerRecord.for_job(job, TIMEOUT, f"stuck past --timeout {job.timeout:g} s: "
                                                 "the worker was stopped")
    return LayerRecord.for_job(job, CRASHED, f"the worker died ({why})")


def pin_threads(threads: int) -> None:
    """torch's intra-op threads; the runtimes' come from the check's ``threads``."""
    import torch
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)  # for libraries that start pools later


@contextlib.contextmanager
def deadline(seconds: Optional[float], marker: Path) -> Iterator[None]:
    """Raise LayerTimeout in this (main) thread after ``seconds``; the watchdog ends the
    process WATCHDOG_GRACE seconds later (exit code STOPPED_PAST_TIMEOUT), leaving
    ``marker``."""
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise LayerTimeout()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    watchdog = threading.Timer(seconds + WATCHDOG_GRACE, _stop, (marker,))
    watchdog.daemon = True
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
