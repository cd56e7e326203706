"""What every executor is (``Executor``) and says (``Capacity``); the callbacks it takes."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from ..plan import LayerJob
from ..records import LayerRecord

Started = Callable[[LayerJob], None]
Done = Callable[[LayerRecord], None]
Work = Callable[[LayerJob], LayerRecord]  # work.run_layer, or a caller's own (picklable)


@dataclass(frozen=True)
class Capacity:
    """What each node offers one worker, and how many layers run at once."""

    nodes: list[tuple[int, int]]  # (CPUs, memory bytes) per node
    workers: int
    where: str  # for messages: "this machine", "Ray cluster at host:port (2 nodes)"

    def short_of(self, threads: int, memory: int) -> str:
        """Why no node can hold a worker of ``threads`` CPUs and ``memory`` bytes ("" when
        one can): both on one node, never the largest of each from two."""
        if any(cpus >= threads and have >= memory for cpus, have in self.nodes):
            return ""
        offers = ", ".join(f"{cpus} CPUs and {have / 2**30:.1f} GiB"
                           for cpus, have in self.nodes[:4]) or "nothing"
        return (f"needs {threads} CPUs and {memory / 2**30:.1f} GiB on one node; "
                f"{self.where} offers {offers}")


class Executor(Protocol):
    name: str

    def __enter__(self) -> "Executor": ...

    def __exit__(self, *exc) -> None: ...

    def capacity(self, jobs: Sequence[LayerJob]) -> Capacity: ...

    def run(self, jobs: Sequence[LayerJob], work: Work, started: Started, done: Done
            ) -> None: ...

    def describe(self) -> dict: ...
