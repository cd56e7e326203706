"""A run over a checkpoint's layers: the plan's jobs through an executor, DIR/layers.json
rewritten as each layer's record arrives (an interrupted run leaves the layers done so far,
``complete`` False: ``--resume`` goes on from there).

    [LayerJob] -> resumed (a passing row made from the same options and weights) | infeasible
    (more than any worker has, said before anything starts) | run by the executor -> Summary
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from ..artifact import REPORT_FILE, write_json_atomic
from ..env import machine_info, utc_now
from .executors import Capacity, Executor, Work
from .plan import LayerJob
from .work import run_layer
from .records import INFEASIBLE, PASS, SUMMARY_FILE, LayerRecord, Summary, read_summary

# (summary so far, layers running, the record that just arrived or None)
Progress = Callable[[Summary, int, Optional[LayerRecord]], None]


def run_jobs(jobs: Sequence[LayerJob], executor: Executor, summary: Summary,
             root: str | Path, resume: bool = False,
             progress: Progress = lambda s, running, r: None, work: Work = run_layer) -> Summary:
    root = Path(root)
    summary.machine, summary.created = machine_info(), utc_now()
    start = time.perf_counter()
    summary.planned = len(jobs)
    kept = _resumable(root, jobs) if resume else {}
    summary.records = list(kept.values())
    running = [0]

    def save() -> None:
        summary.seconds = round(time.perf_counter() - start, 1)
        write_json_atomic(root / SUMMARY_FILE, summary.to_dict())

    def started(job: LayerJob) -> None:
        running[0] += 1
        progress(summary, running[0], None)

    def add(record: LayerRecord) -> None:
        summary.records.append(record)
        save()
        progress(summary, running[0], record)

    def done(record: LayerRecord) -> None:
        running[0] -= 1
        add(record)

    with executor:  # started (a Ray cluster reached) before anything is written
        root.mkdir(parents=True, exist_ok=True)
        todo = [j for j in jobs if j.layer not in kept]
        capacity = executor.capacity(todo)
        summary.executor = {**executor.describe(), "threads": max(
            (j.threads for j in jobs), default=1)}
        fits = [j for j in todo if not _infeasible(j, capacity, add)]
        save()
        executor.run(fits, work, started, done)
    summary.complete = True
    save()
    return summary


def _infeasible(job: LayerJob, capacity: Capacity, done: Callable) -> bool:
    """A layer more than any worker can hold is said now, never left waiting."""
    short = [f"{job.memory / 2**30:.1f} GiB (the largest worker has "
             f"{capacity.memory / 2**30:.1f})"] if job.memory > capacity.memory else []
    short += [f"{job.threads} CPUs (the largest worker has {capacity.cpus})"
              ] if job.threads > capacity.cpus else []
    if short:
        done(LayerRecord(job.layer, INFEASIBLE, Path(job.folder).name,
                         f"needs {' and '.join(short)} on {capacity.where}",
                         estimate_mib=round(job.memory / 2**20, 1),
                         fingerprint=job.fingerprint))
    return bool(short)


def _resumable(root: Path, jobs: Sequence[LayerJob]) -> dict[int, LayerRecord]:
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
