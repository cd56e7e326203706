"""Runners: each executes one implementation on named numpy inputs and says what really ran it.

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
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import numpy as np
import torch

from ...layer.entry import entry_module
from ...layer.layouts import AttentionBase
from ...signature import Signature

ORT_PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


class RunnerUnavailable(Exception):
    """The runner cannot run on the device it names; str(e) is the reason."""


Feeds = Dict[str, np.ndarray]


class Runner(ABC):
    """One implementation under test: takes and returns arrays by the signature's names."""

    name: str  # "eager-fp32", "torchscript", "ort-cpu", ...
    device: str  # what really runs it, e.g. "cuda (CUDAExecutionProvider)"
    providers: List[str] = []  # ONNX Runtime: the session's real providers
    warning: str = ""  # e.g. compute nodes a CUDA session placed on the CPU

    def __init__(self, signature: Signature):
        self.signature = signature

    @abstractmethod
    def run(self, feeds: Feeds) -> Feeds:
        ...


class TorchRunner(Runner):
    """A torch module called positionally in the signature's input order."""

    def __init__(self, signature: Signature, module: torch.nn.Module, dtype: torch.dtype):
        super().__init__(signature)
        self.module, self.dtype = module, dtype

    def run(self, feeds: Feeds) -> Feeds:
        args = [torch.from_numpy(feeds[t.name]) for t in self.signature.inputs]
        args = [a.to(self.dtype) if a.is_floating_point() else a for a in args]
        with torch.inference_mode():
            out = self.module(*args)
        out = out if isinstance(out, tuple) else (out,)
        return {name: o.numpy() for name, o in zip(self.signature.output_names, out)}


class EagerRunner(TorchRunner):
    """The eager PyTorch module, in float32 (the parity baseline) or float64 (the reference)."""

    def __init__(self, signature: Signature, module: AttentionBase,
                 dtype: torch.dtype = torch.float32):
        self.name = "eager-fp64" if dtype == torch.float64 else "eager-fp32"
        self.device = "cpu (torch)"
        self.source = copy.deepcopy(module).to(dtype).eval()
        super().__init__(signature, entry_module(self.source, signature.kind, signature.input_names,
                                                  signature.output_names), dtype)


class TorchScriptRunner(TorchRunner):
    def __init__(self, signature: Signature, path: str | Path):
        self.name = "torchscript"
        self.device = "cpu (torch.jit)"
        super().__init__(signature, torch.jit.load(str(path), map_location="cpu").eval(),
                         torch.float32)


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


class OrtRunner(Runner):
    """An ONNX Runtime session on one execution provider ('cpu' or 'cuda'), fed by name."""

    def __init__(self, signature: Signature, path: str | Path, provider: str = "cpu",
                 threads: Optional[int] = None, tf32: bool = True):
        super().__init__(signature)
        self.name = f"ort-{provider}"
        self.session = _session(path, provider, threads, tf32)
        used = self.session.get_providers()
        self.providers = used
        self.device = f"{provider} ({used[0]})"
        # Nodes that do the arithmetic but were placed on the CPU provider: a CUDA session that
        # runs its MatMuls on the CPU is not a clean CUDA result (reported, fatal with --require-cuda).
        cpu_nodes = [] if provider == "cpu" else [
            n for n in node_placements(self.session.load_log).get(ORT_PROVIDERS["cpu"], [])
            if n.split(" ", 1)[0] in COMPUTE_OPS]
        if cpu_nodes:
            self.warning = (f"{len(cpu_nodes)} compute nodes ran on the CPU provider, not CUDA: "
                            + ", ".join(cpu_nodes[:5]))
        declared = {i.name: i for i in self.session.get_inputs()}
        missing = [n for n in signature.input_names if n not in declared]
        if missing:
            raise ValueError(f"the model has no input named {missing[0]!r} "
                             f"(it declares {', '.join(declared)})")
        self.dtypes = {n: _NUMPY.get(declared[n].type, np.float32) for n in declared}

    def run(self, feeds: Feeds) -> Feeds:
        inputs = {n: feeds[n].astype(self.dtypes[n]) for n in self.signature.input_names}
        outs = self.session.run(self.signature.output_names, inputs)
        return {n: (o.astype(np.float32) if o.dtype == np.float16 else o)
                for n, o in zip(self.signature.output_names, outs)}


_NUMPY = {"tensor(float)": np.float32, "tensor(float16)": np.float16,
          "tensor(int64)": np.int64}


def _session(path: str | Path, provider: str, threads: Optional[int], tf32: bool):
    """An InferenceSession that really runs on ``provider`` (else RunnerUnavailable); its load
    log is kept as ``session.load_log`` (CUDA: verbose, with the node placements)."""
    import onnxruntime as ort
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
        opts.log_severity_level = 3 if provider == "cpu" else 0
        try:
            session = ort.InferenceSession(str(path), opts, providers=providers)
        except Exception as e:
            if provider == "cpu":  # a model the CPU provider cannot load is a broken model
                raise
            raise RunnerUnavailable(f"{wanted} could not start: {str(e).splitlines()[0]}")
    used = session.get_providers()
    if used[0] != wanted:
        cause = _load_failure(log["text"]) or "provider library or GPU not available"
        raise RunnerUnavailable(f"{wanted} did not load ({cause}); ONNX Runtime fell back "
                                f"to {used[0]}, which is not reported as a {provider} result")
    session.load_log = log["text"]
    return session
