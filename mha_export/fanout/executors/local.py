"""The local executor: each layer in its own fresh process (spawned: a crash, a leak or a
runtime's state stays with its layer; its peak memory is its own), at most ``jobs`` at once —
Python's thread pool waits on them, one thread per running layer.

A worker that dies (a segfault, ``os._exit``, the kernel's out-of-memory killer) is its layer's
``crashed`` row, with its exit code; one stuck past its --timeout ends itself (worker.py's
watchdog), and one that still outlives it by GRACE seconds is killed: ``timeout`` either way.
"""
from __future__ import annotations

import multiprocessing
import signal
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from multiprocessing.connection import Connection
from typing import Optional, Sequence

from ...env import available_bytes, cpu_count
from ...errors import raise_if_interrupted, require_positive
from ..plan import LayerJob
from ..records import CRASHED, LayerRecord
from .base import Capacity, Done, Started, Work
from .worker import STOPPED_PAST_TIMEOUT, WATCHDOG_GRACE, in_worker, lost

GRACE = 2 * WATCHDOG_GRACE  # seconds past --timeout before the executor kills a worker
EXIT_GRACE = 10.0  # seconds a worker that sent its record has to exit before it is killed


def _child(work: Work, job: LayerJob, send: Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it kills the workers
    send.send(in_worker(work, job))
    send.close()


class LocalExecutor:
    name = "local"

    def __init__(self, jobs: Optional[int] = None):
        if jobs is not None:
            require_positive("--jobs", jobs)
        self.jobs, self.workers = jobs, 1
        self._live: set = set()
        self._lock = threading.Lock()
        self._closing = False

    def __enter__(self) -> "LocalExecutor":
        return self

    def __exit__(self, *exc) -> None:
        self._kill_all()

    def _kill_all(self) -> None:
        """No worker outlives the run (an interruption, an error in the caller's callback),
        and none starts after."""
        with self._lock:
            self._closing = True
            for proc in self._live:
                proc.kill()

    def capacity(self, jobs: Sequence[LayerJob]) -> Capacity:
        """This machine: its cores and available memory; by default as many layers at once as
        both allow (each job's threads, each job's estimated memory)."""
        cpus, memory = cpu_count(), available_bytes()
        if self.jobs is not None:
            self.workers = self.jobs
        elif jobs:
            need = max(j.memory for j in jobs)
            self.workers = max(1, min(cpus // max(j.threads for j in jobs), memory // need))
        return Capacity([(cpus, memory)], self.workers, "this machine")

    def run(self, jobs: Sequence[LayerJob], work: Work, started: Started, done: Done) -> None:
        pool = ThreadPoolExecutor(self.workers, thread_name_prefix="layer")
        try:
            futures = [pool.submit(self._in_process, work, job, started) for job in jobs]
            for future in as_completed(futures):
                raise_if_interrupted()
                done(future.result())
        except BaseException:  # interrupted: the workers go first, then their threads
            self._kill_all()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def describe(self) -> dict:
        return {"name": self.name, "jobs": self.workers}

    def _in_process(self, work: Work, job: LayerJob, started: Started) -> LayerRecord:
        context = multiprocessing.get_context("spawn")
        receive, send = context.Pipe(duplex=False)
        proc = context.Process(target=_child, args=(work, job, send),
                               name=f"mha-export layer {job.layer}")
        with self._lock:
            if self._closing:
                return LayerRecord.for_job(job, CRASHED, "not started: the run was stopped")
            proc.start()
            self._live.add(proc)
        send.close()
        started(job)
        record: Optional[LayerRecord] = None
        limit = None if job.timeout is None else job.timeout + GRACE
        try:
            timed_out = not receive.poll(limit)
            if not timed_out:
                try:
                    record = receive.recv()
                except EOFError:  # the worker died before sending its record
                    pass
        finally:
            if record is not None:  # done: its exit runs its finalizers (a killed worker
                proc.join(EXIT_GRACE)  # leaves a library's semaphore to the run's tracker)
            if proc.is_alive():
                proc.kill()
            proc.join()
            with self._lock:
                self._live.discard(proc)
        return record or lost(job, _died_of(proc.exitcode),
                              timed_out or proc.exitcode == STOPPED_PAST_TIMEOUT)


def _died_of(exitcode: Optional[int]) -> str:
    """What a dead worker's exit code says: its code, or the signal that killed it."""
    if exitcode is None or exitcode >= 0:
        return f"exit code {exitcode}"
    name = signal.Signals(-exitcode).name
    return name + (": the kernel's out-of-memory killer?" if name == "SIGKILL" else "")
