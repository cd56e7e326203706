"""What comes back from one layer (``LayerRecord``: small, whatever executor ran it) and the
run's summary, DIR/layers.json (``Summary``), with its terminal table.

    {"layers": [{"layer": L, "status": ..., "folder": "layer-L", ...}, ...], "passed": bool, ...}
    (L: the layer's address, 3 or "3.1": address.py)
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

from ..address import Address, address_key
from ..artifact import SUMMARY_FILE
from ..errors import UsageError

# what a layer's row may say; only "pass" (and "exported": --no-check) is a success;
# "unchecked": no runner under test could run it here (neither a pass nor a parity failure);
# "not-attention": a hybrid model's other layers (linear attention, convolution), left to it
PASS, FAIL, UNCHECKED, ERROR, OOM, CRASHED, TIMEOUT, INFEASIBLE, EXPORTED, NOT_ATTENTION = (
    "pass", "fail", "unchecked", "error", "oom", "crashed", "timeout", "infeasible",
    "exported", "not-attention")
STATUSES = (PASS, FAIL, UNCHECKED, ERROR, OOM, CRASHED, TIMEOUT, INFEASIBLE, EXPORTED,
            NOT_ATTENTION)
SUCCESS = (PASS, EXPORTED)


@dataclass
class LayerRecord:
    """One layer's outcome: its verdict, its worst error, its costs, what it took, where."""

    layer: Address
    status: str
    folder: str  # relative to DIR
    message: str = ""  # one line: why it failed, errored, crashed, ...
    worst_rel: Optional[float] = None  # max|d| / max|y| vs eager fp32 over the runners tested
    worst_runner: str = ""
    costs: list[str] = field(default_factory=list)  # the lossy steps' cost lines
    seconds: float = 0.0
    peak_mib: Optional[float] = None  # the worker process's peak resident memory
    estimate_mib: float = 0.0  # what the plan reserved for it
    worker: str = ""  # host and process id (Ray: and node id)
    fingerprint: str = ""  # options + weights it was made from (--resume)
    resumed: bool = False  # carried over from an earlier run (--resume)

    @classmethod
    def for_job(cls, job: Any, status: str, message: str = "") -> "LayerRecord":
        """The row of ``job`` (a plan.LayerJob) before or without its worker's record."""
        return cls(job.layer, status, Path(job.folder).name, message,
                   estimate_mib=round(job.memory / 2**20, 1), fingerprint=job.fingerprint)

    @classmethod
    def not_attention(cls, layer: Address, kind: str, why: str) -> "LayerRecord":
        """The row of a layer that is not exported (not softmax attention, or attention that
        reads another layer's keys and values): nothing exported, nothing run."""
        return cls(layer, NOT_ATTENTION, "", f"a {kind} layer, {why}: left to the model")

    @property
    def ok(self) -> bool:
        return self.status in SUCCESS

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "LayerRecord":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass
class Summary:
    """DIR/layers.json: the run's records (rewritten after every layer: ``complete`` False
    until the last), what made them, and the verdict."""

    action: str  # "export" | "check"
    target: str  # "onnx" | "torchscript" | "aoti"
    weights: Optional[str]
    options: dict  # the export options (JSON), the same for every layer
    check_options: dict  # the export's check (in each row's fingerprint)
    executor: dict  # {"name": ..., "jobs"/"address": ..., "threads": ...}
    records: list[LayerRecord] = field(default_factory=list)
    planned: int = 0  # layers asked for
    last_check: Optional[dict] = None  # the options of the latest `check DIR`
    complete: bool = False
    machine: dict = field(default_factory=dict)  # of the driver (its versions included)
    created: str = ""
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        """Complete, and every attention layer passed (at least one)."""
        attention = [r for r in self.records if r.status != NOT_ATTENTION]
        return self.complete and bool(attention) and all(r.ok for r in attention)

    @property
    def unchecked(self) -> bool:
        """Complete, nothing failed, but some attention layer could not be checked here."""
        attention = [r for r in self.records if r.status != NOT_ATTENTION]
        return (self.complete and any(r.status == UNCHECKED for r in attention)
                and all(r.ok or r.status == UNCHECKED for r in attention))

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.records:
            out[r.status] = out.get(r.status, 0) + 1
        return out

    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "records"}
        rows = sorted(self.records, key=lambda r: address_key(r.layer))
        return {**d, "layers": [r.to_dict() for r in rows],
                "counts": self.counts(), "passed": self.passed}

    @classmethod
    def from_dict(cls, d: dict) -> "Summary":
        known = {f.name for f in fields(cls)} - {"records"}
        return cls(**{k: v for k, v in d.items() if k in known},
                   records=[LayerRecord.from_dict(r) for r in d.get("layers", [])])


def read_summary(folder: str | Path, strict: bool = True) -> Optional[Summary]:
    """DIR/layers.json, or None where there is none; a damaged one is bad input (``strict``)
    or none (a check that rewrites it)."""
    path = Path(folder) / SUMMARY_FILE
    if not path.is_file():
        return None
    try:
        return Summary.from_dict(json.loads(path.read_text()))
    except (ValueError, TypeError, KeyError, AttributeError):
        if strict:
            raise UsageError(f"{path}: not a layers summary written by mha-export") from None
        return None


def first_line(e: BaseException, last: bool = False) -> str:
    """An error in one line (``last``: its last, where a traceback comes first, as Ray's)."""
    lines = [line for line in str(e).strip().splitlines() if line.strip()]
    return (lines[-1 if last else 0] if lines else type(e).__name__)[:300]


def _num(v: Optional[float], spec: str) -> str:
    return "-" if v is None else format(v, spec)


def format_summary(s: Summary) -> str:
    """The terminal table: one row per layer, then the counts and the verdict."""
    header = ("layer", "status", "worst rel", "lossy costs", "seconds", "peak MiB", "note")
    rows = [(str(r.layer), r.status + (" (resumed)" if r.resumed else ""),
             _num(r.worst_rel, ".2e"), (r.costs[0][:48] if r.costs else "-"),
             f"{r.seconds:.1f}", _num(r.peak_mib, ".0f"), r.message[:100])
            for r in sorted(s.records, key=lambda r: address_key(r.layer))]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()
             for row in [header, *rows]]
    lines.insert(1, "-" * len(lines[0]))
    counts = ", ".join(f"{n} {status}" for status, n in sorted(s.counts().items()))
    verdict = "PASS" if s.passed else "UNCHECKED" if s.unchecked else "FAIL"
    lines.append(f"{verdict}: {len(s.records)} layers ({counts}) in {s.seconds:.0f} s, "
                 f"executor {s.executor.get('name', '?')}")
    return "\n".join(lines)
