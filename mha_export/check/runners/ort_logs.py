"""What ONNX Runtime's native logs say of a session (torch-free): where its nodes were placed,
why a provider's library did not load, which compute nodes a CUDA session left to the CPU."""
from __future__ import annotations

import contextlib
import io
import re
from typing import Iterator

from ...env import captured_fd
from .ort_values import ORT_PROVIDERS


@contextlib.contextmanager
def native_stderr() -> Iterator[dict]:
    """Capture what ONNX Runtime writes while loading providers: its native logger (file
    descriptor 2) and preload_dlls' Python prints."""
    out = {"text": ""}
    printed = io.StringIO()
    try:
        with captured_fd(2) as caught, contextlib.redirect_stdout(printed):
            yield out
    finally:
        out["text"] = printed.getvalue() + caught["text"]

COMPUTE_OPS = {"MatMul", "Gemm", "Softmax", "Attention", "MultiHeadAttention",
               "GroupQueryAttention", "MatMulNBits"}

_PLACED = re.compile(r"(All nodes|Node\(s\)) placed on \[(\w+)\]\. Number of nodes: (\d+)")

def node_placements(log: str) -> dict[str, list[str]]:
    """{provider: ["OpType (node name)", ...]} from ONNX Runtime's verbose 'Node placements' log
    (one block per graph and subgraph). 'All nodes placed on [X]' lists no names."""
    placed: dict[str, list[str]] = {}
    lines = log.splitlines()
    for i, line in enumerate(lines):
        m = _PLACED.search(line)
        if not m:
            continue
        names = placed.setdefault(m.group(2), [])
        if m.group(1) == "All nodes":
            continue
        for follow in lines[i + 1: i + 1 + int(m.group(3))]:
            names.append(follow.split("]", 1)[-1].strip())
    return placed

# ONNX Runtime's line when a provider's own library does not load (then it falls back to the CPU)
_PROVIDER_NOT_LOADED = re.compile(r"Failed to load library \S*onnxruntime_providers_\w+\S* "
                                  r"with error: ([^\n]+)")

_COLOUR = re.compile(r"\x1b\[[0-9;]*m")  # the terminal colours of ONNX Runtime's log lines

def _provider_not_loaded(log: str) -> str:
    """The loader's reason when the provider's library did not load, e.g. 'libcublasLt.so.13:
    cannot open shared object file: ...', else ''."""
    m = _PROVIDER_NOT_LOADED.search(log)
    return _COLOUR.sub("", m.group(1)).strip()[:200] if m else ""

def load_failure(log: str) -> str:
    """The useful part of ORT's provider-load error line, e.g. 'libcublasLt.so.13: cannot open'
    (else preload_dlls' first 'Failed to load' line)."""
    if cause := _provider_not_loaded(log):
        return cause
    m = re.search(r"(Failed to load[^\n]+)", log)
    return _COLOUR.sub("", m.group(1)).strip()[:200] if m else ""

def start_failure(provider: str, error: Exception, log: str) -> str:
    """Why a session on ``provider`` could not be made, in one line: the provider's library did
    not load where ONNX Runtime logged so (it then falls back to the CPU provider, whose error,
    e.g. no bfloat16 MatMul, is not the cause), else the session's own error."""
    if cause := _provider_not_loaded(log):
        return f"{provider} could not load: {cause}"
    lines = str(error).strip().splitlines() or [type(error).__name__]
    return f"{provider} could not start: {lines[0][:300]}"

def cpu_compute_nodes(load_log: str) -> str:
    """Nodes that do the arithmetic but were placed on the CPU provider: a CUDA session that runs
    its MatMuls on the CPU is not a clean CUDA result (reported; fatal with --require-cuda)."""
    nodes = [n for n in node_placements(load_log).get(ORT_PROVIDERS["cpu"], [])
             if n.split(" ", 1)[0] in COMPUTE_OPS]
    if not nodes:
        return ""
    why = sorted({_NO_CUDA_KERNEL[op] for op in (n.split(" ", 1)[0] for n in nodes)
                  if op in _NO_CUDA_KERNEL})
    return (f"{len(nodes)} compute nodes ran on the CPU provider, not CUDA: "
            + ", ".join(nodes[:5]) + "".join(f" ({w})" for w in why))

# why ONNX Runtime's CUDA provider leaves an op to the CPU (its kernel registrations, 1.31)
_NO_CUDA_KERNEL = {"GroupQueryAttention": "its CUDA kernel takes float16 and bfloat16 only: "
                                          "export with --dtype float16 for CUDA"}
