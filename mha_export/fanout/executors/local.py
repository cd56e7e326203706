"""The local executor: each layer in its own fresh process (spawned: a crash, a leak or a
runtime's state stays with its layer; its peak memory is its own), at most ``jobs`` at once —
Python's thread pool waits on them, one thread per running layer.

A worker that dies (a segfault, ``os._exit``, the kernel's out-of-memory killer) is its layer's
``crashed`` row, with its exit code; one that outlives its --timeout by GRACE seconds (stuck
where the in-process deadline cannot reach) is killed: ``timeout``.
"""
from __future__ import annotations

import multiprocessing
import signal
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from multiprocessing.connection import Connection
from typing import Optional, Sequence

from ...check.sweep import available_bytes
from ...errors import raise_if_interrupted, require_positive
from ..plan import LAYER_FOLDER, LayerJob, cpu_count
from ..records import CRASHED, TIMEOUT, LayerRecord
from . import Capacity, Done, Started, Work

GRACE = 30.0  # seconds past --timeout before a worker is killed


def _child(work: Work, job: LayerJob, send: Connection) -> None:
    send.send(work(job))
    send.close()


class LocalExecutor:
    name = "local"

    def __init__(self, jobs: Optional[int] = None):
        if jobs is not None:
            require_positive("--jobs", jobs)
        self.jobs, self.workers = jobs, 1
        self._live: set = set()
        self._lock = threading.Lock()

    def __enter__(self) -> "LocalExecutor":
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:  # an interruption: no worker outlives the run
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
        return Capacity(cpus, memory, self.workers, "this machine")

    def run(self, jobs: Sequence[LayerJob], work: Work, started: Started, done: Done) -> None:
        with ThreadPoolExecutor(self.workers, thread_name_prefix="layer") as pool:
            futures = [pool.submit(self._in_process, work, job, started) for job in jobs]
            try:
                for future in as_completed(futures):
                    raise_if_interrupted()
                    done(future.result())
            finally:
                for f in futures:
                    f.cancel()

    def describe(self) -> dict:
        return {"name": self.name, "jobs": self.workers}

    def _in_process(self, work: Work, job: LayerJob, started: Started) -> LayerRecord:
        context = multiprocessing.get_context("spawn")
        receive, send = context.Pipe(duplex=False)
        proc = context.Process(target=_child, args=(work, job, send),
                               name=f"mha-export layer {job.layer}")
        with self._lock:
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
            if proc.is_alive():
                proc.kill()
            proc.join()
            with self._lock:
                self._live.discard(proc)
        return record or _lost(job, proc.exitcode, timed_out)


def _lost(job: LayerJob, exitcode: Optional[int], timed_out: bool) -> LayerRecord:
    """The row of a layer whose worker returned nothing."""
    if timed_out:
        status, why = TIMEOUT, f"killed {GRACE:g} s past --timeout {job.timeout:g} s"
    else:
        status = CRASHED
        why = f"the worker died (exit code {exitcode})"
        if exitcode is not None and exitcode < 0:
            name = signal.Signals(-exitcode).name
            why = f"the worker died ({name}" + (
                ": the kernel's out-of-memory killer?)" if name == "SIGKILL" else ")")
    return LayerRecord(job.layer, status, LAYER_FOLDER.format(layer=job.layer), why,
                       estimate_mib=round(job.memory / 2**20, 1), fingerprint=job.fingerprint)
