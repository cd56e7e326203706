"""Runners: each executes one implementation on a numpy input and says what really ran it.

Runners only run; comparing is ``compare``'s job. A runner that cannot run where it was asked to
(the CUDA provider did not load, no GPU) raises ``RunnerUnavailable`` with the reason, so it is
reported as skipped (or failed with --require-cuda), never as a result of another device.
"""
from __future__ import annotations

import contextlib
import copy
import io
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
import torch

from .model import AttentionBase

ORT_PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


class RunnerUnavailable(Exception):
    """The runner cannot run on the device it names; str(e) is the reason."""


class EagerRunner:
    """The eager PyTorch module, in float32 (the parity baseline) or float64 (the reference)."""

    def __init__(self, module: AttentionBase, dtype: torch.dtype = torch.float32):
        self.name = "eager-fp64" if dtype == torch.float64 else "eager-fp32"
        self.device = "cpu (torch)"
        self.module = copy.deepcopy(module).to(dtype).eval()
        self.dtype = dtype

    def run(self, x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return self.module(torch.from_numpy(x).to(self.dtype)).numpy()


class TorchScriptRunner:
    def __init__(self, path: str | Path):
        self.name = "torchscript"
        self.device = "cpu (torch.jit)"
        self.module = torch.jit.load(str(path), map_location="cpu").eval()

    def run(self, x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return self.module(torch.from_numpy(x)).numpy()


@contextlib.contextmanager
def native_stderr() -> Iterator[dict]:
    """Capture what ONNX Runtime writes while loading providers: its native logger (file
    descriptor 2) and preload_dlls' Python prints."""
    out = {"text": ""}
    sys.stderr.flush()
    saved = os.dup(2)
    printed = io.StringIO()
    with tempfile.TemporaryFile() as buf:
        os.dup2(buf.fileno(), 2)
        try:
            with contextlib.redirect_stdout(printed):
                yield out
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            buf.seek(0)
            out["text"] = printed.getvalue() + buf.read().decode(errors="replace")


COMPUTE_OPS = {"MatMul", "Gemm", "Softmax", "Attention", "MultiHeadAttention",
               "GroupQueryAttention"}
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


def _load_failure(log: str) -> str:
    """The useful part of ORT's provider-load error line, e.g. 'libcublasLt.so.13: cannot open'."""
    m = re.search(r"with error: ([^\n]+)", log) or re.search(r"(Failed to load[^\n]+)", log)
    return m.group(1).strip()[:200] if m else ""


class OrtRunner:
    """An ONNX Runtime session on one execution provider ('cpu' or 'cuda')."""

    def __init__(self, path: str | Path, provider: str = "cpu", threads: Optional[int] = None,
                 tf32: bool = True):
        import onnxruntime as ort
        self.name = f"ort-{provider}"
        wanted = ORT_PROVIDERS[provider]
        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
        providers: list = [wanted]
        if provider == "cuda":
            if wanted not in ort.get_available_providers():
                raise RunnerUnavailable("this onnxruntime build has no CUDAExecutionProvider "
                                        "(install onnxruntime-gpu)")
            providers = [(wanted, {"use_tf32": "1" if tf32 else "0"})]
        with native_stderr() as log:
            if provider == "cuda" and hasattr(ort, "preload_dlls"):
                with contextlib.suppress(Exception):
                    ort.preload_dlls()
            # cuda: verbose, to read the load error and where each node was placed
            opts.log_severity_level = 3 if provider == "cpu" else 0
            try:
                self.session = ort.InferenceSession(str(path), opts, providers=providers)
            except Exception as e:
                if provider == "cpu":  # a model the CPU provider cannot load is a broken model
                    raise
                raise RunnerUnavailable(f"{wanted} could not start: {str(e).splitlines()[0]}")
        used = self.session.get_providers()
        if used[0] != wanted:
            cause = _load_failure(log["text"]) or "provider library or GPU not available"
            raise RunnerUnavailable(f"{wanted} did not load ({cause}); ONNX Runtime fell back "
                                    f"to {used[0]}, which is not reported as a {provider} result")
        self.providers = used
        self.device = f"{provider} ({used[0]})"
        # Nodes that do the arithmetic but were placed on the CPU provider: a CUDA session that
        # runs its MatMuls on the CPU is not a clean CUDA result (reported, fatal with --require-cuda).
        self.cpu_compute_nodes = [] if provider == "cpu" else [
            n for n in node_placements(log["text"]).get(ORT_PROVIDERS["cpu"], [])
            if n.split(" ", 1)[0] in COMPUTE_OPS]
        inp = self.session.get_inputs()[0]
        self.input_name = inp.name
        self.input_dtype = np.float16 if inp.type == "tensor(float16)" else np.float32

    def run(self, x: np.ndarray) -> np.ndarray:
        out = self.session.run(None, {self.input_name: x.astype(self.input_dtype)})[0]
        return out.astype(np.float32)
