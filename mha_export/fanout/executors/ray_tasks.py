"""The Ray executor: one Ray task per layer (``run_layer`` in the worker's runtime, worker.py),
on the cluster at ``address`` or on a local Ray started for the run and stopped after it. Ray's
defaults work against a verdict per layer and are set here (measured with ray 2.60):

- no retries: a task is retried 3 times by default, one the memory monitor killed forever;
  ``max_retries=0`` makes a dead worker the layer's ``crashed`` row (``WorkerCrashedError``) and
  a killed one its ``oom`` row (``OutOfMemoryError``) at once;
- a fresh worker per layer (``max_calls=1``): its peak memory is its own, a leak stays with it;
- ``num_cpus`` = the layer's threads and ``memory`` = its estimate, so Ray places no more
  layers on a node than it holds; a task asking more than any node has would wait forever
  (``ray.get`` never raises), so such a layer is ``infeasible`` from ``ray.nodes()`` first;
- an unreachable address: ``ray.init`` keeps retrying for minutes (~40 s an attempt), so the
  address is probed with a bounded TCP connect first (bad input, in seconds);
- no address: a private local Ray (``address="local"``). ``ray.init()`` alone joins the
  machine's latest cluster (a user's ``ray start``, RAY_ADDRESS) and then refuses ``num_cpus``;
  a user's cluster is joined only when named (``--ray-address auto`` or host:port);
- a process that already has a Ray session runs on it (the Python API, the tests' cluster);
  an address naming another cluster is refused (reaching it would end the caller's session).

Artifacts are written by the workers into the run's folder: on a cluster it must be a filesystem
every node sees (NFS, a mounted bucket); only the small records come back.
"""
from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Any, Optional, Sequence

from ...env import cpu_count
from ...errors import UsageError, raise_if_interrupted
from ..plan import LayerJob
from ..records import ERROR, OOM, LayerRecord, first_line
from .base import Capacity, Done, Started, Work
from .worker import in_worker, lost

PROBE_SECONDS = 5.0
CURRENT_CLUSTER = Path("/tmp/ray/ray_current_cluster")  # where `ray start --head` writes it


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError("--executor ray needs ray: pip install 'mha-export[ray]'") from None
    return ray


def resolve_address(address: str) -> str:
    """``auto``: the cluster this machine runs (RAY_ADDRESS, else the one `ray start` wrote)."""
    if address != "auto":
        return address
    found = os.environ.get("RAY_ADDRESS") or (
        CURRENT_CLUSTER.read_text().strip() if CURRENT_CLUSTER.is_file() else "")
    if not found:
        raise UsageError("--ray-address auto: no Ray cluster runs on this machine (no "
                         "RAY_ADDRESS, no `ray start --head`)")
    return found


def probe(address: str, seconds: float = PROBE_SECONDS) -> None:
    """A bounded TCP connect to host:port (or ray://host:port): bad input when nothing answers."""
    hostport = address.split("://", 1)[-1]
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise UsageError(f"--ray-address {address!r}: expected host:port, ray://host:port "
                         "or auto")
    try:
        socket.create_connection((host, int(port)), timeout=seconds).close()
    except OSError as e:
        raise UsageError(f"--ray-address {address}: nothing answers there "
                         f"({e.strerror or e}; tried for {seconds:g} s)") from None


def require_session_at(address: str) -> None:
    """The process's Ray session must be the cluster at ``address``: reaching another would
    mean ending a session the caller owns."""
    ray = _ray()
    try:
        session = ray.get_runtime_context().gcs_address
    except Exception:  # a Ray Client connection: its cluster's GCS address is not known here
        session = None
    if session is None or address.startswith("ray://") or (
            _host_port(address) != _host_port(session)):
        raise UsageError(f"--ray-address {address}: this process already has a Ray session"
                         + (f", at {session}" if session else "") + "; pass no address to run "
                         "on it, or ray.shutdown() first")


def _host_port(address: str) -> tuple[str, str]:
    """(IP, port) of host:port; a loopback address is this node's own IP."""
    host, _, port = address.rpartition(":")
    try:
        ip = socket.gethostbyname(host)
    except OSError:
        ip = host
    if ip.startswith("127."):
        ip = _ray().util.get_node_ip_address()
    return ip, port


class RayExecutor:
    name = "ray"

    def __init__(self, address: Optional[str] = None):
        self.address = address
        self._owned = False
        self._where, self._workers = "", 1

    def __enter__(self) -> "RayExecutor":
        ray = _ray()
        quiet = dict(include_dashboard=False, log_to_driver=False,
                     logging_level=logging.ERROR)
        if ray.is_initialized():  # the caller's session (the Python API, the tests' cluster)
            if self.address is not None:
                require_session_at(resolve_address(self.address))
            self._where = "the Ray session of this process"
        elif self.address is not None:
            address = resolve_address(self.address)
            probe(address)
            ray.init(address=address, **quiet)
            self._owned, self._where = True, f"Ray cluster at {address}"
        else:  # never a cluster of the machine's joined unasked (module docstring)
            ray.init(address="local", num_cpus=cpu_count(), **quiet)
            self._owned, self._where = True, "a local Ray started for this run"
        return self

    def __exit__(self, *exc) -> None:
        if self._owned:
            _ray().shutdown()

    def capacity(self, jobs: Sequence[LayerJob]) -> Capacity:
        nodes = [n["Resources"] for n in _ray().nodes() if n.get("Alive")]
        threads = max((j.threads for j in jobs), default=1)
        self._workers = max(1, sum(int(n.get("CPU", 0)) // threads for n in nodes))
        return Capacity([(int(n.get("CPU", 0)), int(n.get("memory", 0))) for n in nodes],
                        self._workers, f"{self._where} ({len(nodes)} nodes)")

    def run(self, jobs: Sequence[LayerJob], work: Work, started: Started, done: Done) -> None:
        ray = _ray()
        task = ray.remote(max_retries=0, retry_exceptions=False, max_calls=1)(_call)
        pending = {task.options(num_cpus=job.threads, memory=job.memory,
                                name=f"mha-export layer {job.layer}").remote(work, job): job
                   for job in jobs}
        for job in jobs:  # submitted: Ray starts each as the cluster frees room
            started(job)
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
                raise_if_interrupted()
                for ref in ready:
                    done(self._record(ref, pending.pop(ref)))
        finally:
            for ref in pending:  # interrupted: nothing keeps running on the cluster
                ray.cancel(ref, force=True)

    def describe(self) -> dict:
        return {"name": self.name, "where": self._where, "at_once": self._workers}

    @staticmethod
    def _record(ref: Any, job: LayerJob) -> LayerRecord:
        """The task's record, or the row Ray's error makes of it (the tool decides; Ray
        retries nothing)."""
        ray = _ray()
        errors = ray.exceptions
        try:
            return ray.get(ref)
        except errors.OutOfMemoryError as e:
            return LayerRecord.for_job(job, OOM, "killed by Ray's memory monitor: "
                                       + first_line(e, last=True))
        except (errors.WorkerCrashedError, errors.NodeDiedError, errors.LocalRayletDiedError,
                errors.ObjectLostError) as e:
            return lost(job, type(e).__name__)
        except errors.RayError as e:
            return LayerRecord.for_job(job, ERROR, f"{type(e).__name__}: "
                                                   + first_line(e, last=True))


def _call(work: Work, job: LayerJob) -> LayerRecord:
    """The task: ``work`` travels as its argument (a partial or a closure too, which
    ``ray.remote`` itself refuses)."""
    return in_worker(work, job)
