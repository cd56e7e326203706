"""Executors: what runs the layers' units of work (fanout/work.py's ``run_layer``), by name.

    local  a process per layer, at most --jobs at once, on this machine (the default)
    ray    a Ray task per layer, on a cluster (--ray-address) or a local Ray started for the run

Each is a context manager (what it starts it stops), says what one worker can have
(``capacity``: a layer that needs more is infeasible, said before anything starts) and runs the
jobs through ``work`` (fanout/work.py's ``run_layer``), handing each record to ``done`` as it arrives (in the caller's thread). Neither retries:
a layer's record is final, whatever happened to its worker.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Protocol, Sequence

from ...errors import UsageError
from ..plan import LayerJob
from ..records import LayerRecord

Started = Callable[[LayerJob], None]
Done = Callable[[LayerRecord], None]
Work = Callable[[LayerJob], LayerRecord]  # work.run_layer, or a caller's own (picklable)


@dataclass(frozen=True)
class Capacity:
    """What the largest worker can have, and how many layers run at once."""

    cpus: int
    memory: int  # bytes
    workers: int
    where: str  # for messages: "this machine", "Ray cluster at host:port (2 nodes)"


class Executor(Protocol):
    name: str

    def __enter__(self) -> "Executor": ...

    def __exit__(self, *exc) -> None: ...

    def capacity(self, jobs: Sequence[LayerJob]) -> Capacity: ...

    def run(self, jobs: Sequence[LayerJob], work: Work, started: Started, done: Done
            ) -> None: ...

    def describe(self) -> dict: ...


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
