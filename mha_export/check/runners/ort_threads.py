"""How ONNX Runtime sessions share a small CPU with each other and with torch: a registry of
thread-pool policies, one record each, applied to a session's options.

A model runs one exported layer after another; each layer is its own session. ONNX Runtime's
default keeps every session's intra-op threads spinning for a while after its run, so on a
2-core machine the next layer's session (and torch's own threads, between layers) start on
cores that are busy doing nothing. Measured 2026-11-25 (SmolLM2-135M, 30 layer sessions,
``mha-export eval``): Intel Xeon 153 tokens/s with spinning against 378 without; AMD EPYC 118
against 330 (eager ~340); one shared pool that still spins: 151-186 (docs/performance.md).

    idle    each session its own pool; its threads sleep after a run
            (``session.intra_op.allow_spinning`` = 0): the default, for many sessions in turn
    shared  one process-wide pool for every session (``set_global_thread_pool_sizes`` before the
            first session, ``use_per_session_threads`` off); Python cannot stop its spinning
    spin    ONNX Runtime's own default: fastest for one session called back to back, and what
            starves every other session and torch

A C++ app sets the same (docs/cpp.md): ``AddConfigEntry("session.intra_op.allow_spinning",
"0")`` on each session's options, or ``CreateEnvWithGlobalThreadPools`` +
``DisablePerSessionThreads``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from ...errors import UsageError

SPINNING = "session.intra_op.allow_spinning"


@dataclass(frozen=True)
class ThreadPolicy:
    name: str
    summary: str
    apply: Callable[[Any, Optional[int]], None]  # (SessionOptions, intra-op threads or None)


def _per_session(spin: bool) -> Callable[[Any, Optional[int]], None]:
    def apply(opts: Any, threads: Optional[int]) -> None:
        if _global_pool:
            raise UsageError("this process already runs its ONNX Runtime sessions on one shared "
                             "pool (thread pool 'shared'); a session with its own pool cannot "
                             "join it: use one thread policy per process")
        if threads:
            opts.intra_op_num_threads = threads
        opts.add_session_config_entry(SPINNING, "1" if spin else "0")
    return apply


_global_pool: dict = {}  # the process-wide pool's sizes, once made


def _shared(opts: Any, threads: Optional[int]) -> None:
    """One pool for the process: sized by the first session that asks (ONNX Runtime makes it
    with its environment, once); a later session asking another size gets the first one's."""
    import onnxruntime as ort
    if not _global_pool:
        ort.set_global_thread_pool_sizes(threads or 0, 1)
        _global_pool["intra"] = threads or 0
    opts.use_per_session_threads = False


POLICIES = {p.name: p for p in (
    ThreadPolicy("idle", "each session its own pool, asleep between runs", _per_session(False)),
    ThreadPolicy("shared", "one process-wide pool for every session", _shared),
    ThreadPolicy("spin", "each session its own pool, spinning after a run (ONNX Runtime's "
                         "default)", _per_session(True)),
)}
DEFAULT = "idle"


def follow_process_pool(opts: Any) -> Any:
    """Options of a session the policies do not choose for (a kernel probe): on the shared
    pool once the process has one (ONNX Runtime refuses own threads then)."""
    if _global_pool:
        opts.use_per_session_threads = False
    return opts


def get_policy(name: str) -> ThreadPolicy:
    if name not in POLICIES:
        raise UsageError(f"unknown thread policy {name!r}: choose one of {', '.join(POLICIES)}")
    return POLICIES[name]
