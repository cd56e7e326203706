"""Executors: what runs the layers' units of work, by name.

    local  a process per layer, at most --jobs at once, on this machine (the default)
    ray    a Ray task per layer, on a cluster (--ray-address) or a local Ray started for the run

Each is a context manager (what it starts it stops), says what one worker can have
(``capacity``: a layer that needs more is infeasible, said before anything starts) and runs the
jobs through ``work`` (work.py's ``run_layer``) in the worker's runtime (worker.py: threads,
--timeout, the row of a worker lost), handing each record to ``done`` as it arrives (in the
caller's thread). Neither retries: a layer's record is final, whatever happened to its worker.
"""
from __future__ import annotations

from typing import Callable, Optional

from ...errors import UsageError
from .base import Capacity, Done, Executor, Started, Work

__all__ = ["EXECUTORS", "DEFAULT", "make_executor", "Capacity", "Executor", "Work", "Started",
           "Done"]

def _local(jobs: Optional[int], address: Optional[str]) -> Executor:
    from .local import LocalExecutor
    if address is not None:
        raise UsageError("--ray-address is the ray executor's: add --executor ray")
    return LocalExecutor(jobs)


def _ray(jobs: Optional[int], address: Optional[str]) -> Executor:
    from .ray_tasks import RayExecutor
    if jobs is not None:
        raise UsageError("--jobs is the local executor's: Ray runs as many layers at once as "
                         "the cluster's CPUs and memory allow")
    return RayExecutor(address)


EXECUTORS: dict[str, Callable[[Optional[int], Optional[str]], Executor]] = {
    "local": _local, "ray": _ray}
DEFAULT = "local"


def make_executor(name: str, jobs: Optional[int] = None,
                  address: Optional[str] = None) -> Executor:
    if name not in EXECUTORS:
        raise UsageError(f"unknown executor {name!r}: choose from {', '.join(EXECUTORS)}")
    return EXECUTORS[name](jobs, address)
