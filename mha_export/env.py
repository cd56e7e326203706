"""The environment: package versions and the machine, recorded in every artifact and report,
and what this process may use of it (its cores, the memory available)."""
from __future__ import annotations

import contextlib
import datetime
import logging
import os
import platform
import re
import sys
import tempfile
import warnings
from importlib import metadata
from pathlib import Path
from typing import Iterator, Mapping, Optional, Sequence


DISTRIBUTIONS = ("mha-export", "torch", "onnx", "onnxruntime-gpu", "onnxruntime", "openvino",
                 "executorch", "numpy")


def versions() -> dict[str, str]:
    """mha-export's own version from the package (an editable install's metadata keeps the
    version it was installed at), the others' from their installed metadata."""
    from . import __version__
    out = {"python": platform.python_version()}
    for dist in DISTRIBUTIONS:
        try:
            out[dist] = __version__ if dist == "mha-export" else metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def last_level_cache_bytes() -> int:
    """The largest CPU cache cpu0 sees (sysfs), in bytes; 0 when unknown."""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = f.read_text().strip()
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * scale)
    return max(sizes, default=0)


def cpu_count() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def available_bytes() -> int:
    """The memory available to start new work (/proc/meminfo's MemAvailable); unbounded where
    unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 2**62


def machine_info() -> dict:
    gpu = gpu_name()
    torch = sys.modules.get("torch")
    on_gpu = {"gpu": gpu, "gpu_driver": gpu_driver(), "gpu_l2_mib": gpu_l2_bytes() / 2**20,
              "cuda": torch.version.cuda} if gpu else {}
    return {"cpu": cpu_name(), "date": datetime.date.today().isoformat(), "versions": versions(),
            "last_level_cache_mib": last_level_cache_bytes() / 2**20, **on_gpu}


def gpu_l2_bytes() -> int:
    """The L2 cache of the CUDA device torch sees, in bytes; 0 when unknown (no GPU): the cache
    a cold GPU row's ring of layers exceeds (an H200's ~60 MB holds most of one 8B layer)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return 0
    return int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0))


def gpu_driver() -> Optional[str]:
    """The NVIDIA driver's version line (/proc/driver/nvidia/version), else None."""
    try:
        first = Path("/proc/driver/nvidia/version").read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    found = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", first)
    return found.group(1) if found else first.strip()


def gpu_name() -> Optional[str]:
    """The CUDA device torch sees (where this process has imported torch), else None."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(0)


# what decides how long torch's OpenMP threads spin after each parallel region: read by the
# OpenMP runtime (libgomp, in torch's Linux CPU wheels) once, when torch loads; so the values
# this process started with, not later changes (LLVM/Intel OpenMP builds read KMP_BLOCKTIME,
# not recorded here)
OPENMP_WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
_STARTED_WITH = {v: os.environ[v] for v in OPENMP_WAIT_VARIABLES if v in os.environ}


def openmp_wait(environ: Optional[Mapping[str, str]] = None) -> str:
    """The OpenMP wait settings (of ``environ``; default: what this process started with),
    e.g. 'GOMP_SPINCOUNT=1000', or 'default' (libgomp spins ~300k iterations after each
    parallel region, holding a core meanwhile)."""
    env = _STARTED_WITH if environ is None else environ
    return ", ".join(f"{v}={env[v]}" for v in OPENMP_WAIT_VARIABLES if v in env) or "default"


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


# the libraries whose log lines below an error are chatter to a user (-v shows them): torch's
# (pytree's deprecations), torchao's (its CUDA-only kernels that fail to load on a CPU)
CHATTY_LOGGERS = ("torch", "torchao")


def quiet_libraries() -> None:
    """Library warnings off, and the chatty loggers' lines below errors: a command prints its
    own lines (an error is one line), not its libraries'."""
    warnings.filterwarnings("ignore")
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


@contextlib.contextmanager
def captured_fd(fd: int) -> Iterator[dict]:
    """What C/C++ code writes to file descriptor ``fd`` (1: stdout, 2: stderr) meanwhile, kept
    in ``out["text"]`` once the block ends and not passed through (e.g. ONNX Runtime's kernel
    debug lines, printed to std::cout)."""
    out = {"text": ""}
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), fd)
        try:
            yield out
        finally:
            os.dup2(saved, fd)
            os.close(saved)
            caught.seek(0)
            out["text"] = caught.read().decode(errors="replace")


@contextlib.contextmanager
def native_stderr_without(noise: Sequence[re.Pattern]) -> Iterator[None]:
    """What is written to stderr meanwhile, by C/C++ code (file descriptor 2, below Python's
    logging and warnings) or through Python's sys.stderr (ExecuTorch's binding logs there),
    written back to sys.stderr after it without the lines ``noise`` matches: a runtime's info
    lines go, its errors stay."""
    python_stderr = sys.stderr
    python_stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        sys.stderr = open(2, "w", closefd=False)
        try:
            yield
        finally:
            sys.stderr.flush()
            sys.stderr = python_stderr
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = [line for line in caught.read().decode(errors="replace").splitlines(True)
                    if not any(p.match(line) for p in noise)]
            python_stderr.write("".join(kept))
            python_stderr.flush()
