"""The checking environment: package versions and the machine, recorded in every artifact and
report."""
from __future__ import annotations

import datetime
import platform
from importlib import metadata
from pathlib import Path

DISTRIBUTIONS = ("mha-export", "torch", "onnx", "onnxruntime-gpu", "onnxruntime", "openvino",
                 "numpy")


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in DISTRIBUTIONS:
        try:
            out[dist] = metadata.version(dist)
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


def machine_info() -> dict:
    return {"cpu": cpu_name(), "date": datetime.date.today().isoformat(), "versions": versions()}


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
