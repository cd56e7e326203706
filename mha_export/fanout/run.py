"""A run over a checkpoint's layers: the plan's jobs through an executor, DIR/layers.json
rewritten as each layer's record arrives (an interrupted run leaves the layers done so far,
``complete`` False: ``--resume`` goes on from there).

    [LayerJob] -> resumed (a passing row made from the same options and weights) | infeasible
    (more than any worker has, said before anything starts) | run by the executor -> Summary
"""
from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from ..address import Address
from ..artifact import REPORT_FILE, write_json_atomic
from ..env import machine_info, utc_now
from .executors import Capacity, Executor, Work
from .plan import LayerJob
from .records import (CRASHED, INFEASIBLE, PASS, SUMMARY_FILE, TIMEOUT, LayerRecord, Summary,
                      read_summary)
from .work import run_layer

# (summary so far, layers running, the record that just arrived or None)
Progress = Callable[[Summary, int, Optional[LayerRecord]], None]


def run_jobs(jobs: Sequence[LayerJob], executor: Executor, summary: Summary,
             root: str | Path, kept: Optional[dict[Address, LayerRecord]] = None,
             progress: Progress = lambda s, running, r: None, work: Work = run_layer) -> Summary:
    """``kept``: rows carried over as they are (layers --resume keeps, or a check leaves)."""
    root, kept = Path(root), kept or {}
    summary.machine, summary.created = machine_info(), utc_now()
    start = time.perf_counter()
    summary.planned = len({j.layer for j in jobs} | set(kept))
    summary.records = list(kept.values())
    running, lock = [0], threading.Lock()
    at_once = [len(jobs)]  # Ray: submitted is not running; at most the cluster's workers are

    def save() -> None:
        summary.seconds = round(time.perf_counter() - start, 1)
        write_json_atomic(root / SUMMARY_FILE, summary.to_dict())

    def started(job: LayerJob) -> None:  # from the executor's threads (local)
        with lock:
            running[0] += 1
            progress(summary, min(running[0], at_once[0]), None)

    def add(record: LayerRecord) -> None:
        summary.records.append(record)
        save()
        progress(summary, min(running[0], at_once[0]), record)

    def done(record: LayerRecord) -> None:
        with lock:
            running[0] -= 1
            if record.status in (CRASHED, TIMEOUT):
                _tidy(root, record.folder)
            add(record)

    with executor:  # started (a Ray cluster reached) before anything is written
        root.mkdir(parents=True, exist_ok=True)
        todo = [j for j in jobs if j.layer not in kept]
        for job in todo:  # what a killed worker left (its staging folder, its stop marker)
            _tidy(root, Path(job.folder).name)
        capacity = executor.capacity(todo)
        at_once[0] = capacity.workers
        summary.executor = {**executor.describe(), "threads": max(
            (j.threads for j in jobs), default=1)}
        fits = [j for j in todo if not _infeasible(j, capacity, add)]
        save()
        executor.run(fits, work, started, done)
    summary.complete = True
    save()
    return summary


def _infeasible(job: LayerJob, capacity: Capacity, add: Callable) -> bool:
    """A layer more than any worker can hold is said now, never left waiting."""
    short = capacity.short_of(job.threads, job.memory)
    if short:
        add(LayerRecord.for_job(job, INFEASIBLE, short))
    return bool(short)


def _tidy(root: Path, name: str) -> None:
    for left in root.glob(f".{name}.*"):
        shutil.rmtree(left, ignore_errors=True) if left.is_dir() else left.unlink()


def resumable(root: Path, jobs: Sequence[LayerJob]) -> dict[Address, LayerRecord]:
    """The layers an earlier run left passing, made from the same options and weights, whose
    folder still holds its passing parity.json."""
    earlier = read_summary(root)
    if earlier is None:
        return {}
    wanted = {j.layer: j.fingerprint for j in jobs}
    kept = {}
    for r in earlier.records:
        report = root / r.folder / REPORT_FILE
        try:
            passed = json.loads(report.read_text()).get("passed") is True
        except (OSError, ValueError, AttributeError):
            passed = False
        if r.status == PASS and wanted.get(r.layer) == r.fingerprint and passed:
            r.resumed = True
            kept[r.layer] = r
    return kept
