"""ONNX Runtime runners (one per execution provider). Imports no torch, so that the bench
worker measures a session with this same set-up in a torch-free process."""
from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from ...signature import Signature
from .base import Feeds, Runner, RunnerUnavailable

ORT_PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


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
                 threads: Optional[int] = None, tf32: bool = True, mem_pattern: bool = True):
        super().__init__(signature)
        self.name = f"ort-{provider}"
        self.session = _session(path, provider, threads, tf32, mem_pattern)
        self.providers = self.session.get_providers()
        self.device = f"{provider} ({self.providers[0]})"
        declared = {i.name: i for i in self.session.get_inputs()}
        missing = [n for n in signature.input_names if n not in declared]
        if missing:
            raise ValueError(f"the model has no input named {missing[0]!r} "
                             f"(it declares {', '.join(declared)})")
        self.dtypes = {n: _NUMPY.get(declared[n].type, np.float32) for n in declared}
        half = any(t == np.float16 for t in self.dtypes.values())
        self.precision = "fp16" if half else (
            "fp32, TF32 matmuls allowed" if provider == "cuda" and tf32 else "fp32")
        if provider != "cpu":
            self.warning = _cpu_compute_nodes(self.session.load_log)

    def prepare(self, feeds: Feeds):
        """The inputs in the model's dtypes, made once per case (the bench times run_prepared);
        a static cache: an IO binding whose present_* are bound to past_*'s own memory."""
        inputs = {n: np.ascontiguousarray(feeds[n].astype(self.dtypes[n]))
                  for n in self.signature.input_names}
        return InPlaceCall(self.session, self.signature, inputs) if self.signature.static_cache \
            else inputs

    def run_prepared(self, prepared) -> list[np.ndarray]:
        if isinstance(prepared, InPlaceCall):
            return prepared.run()
        return self.session.run(self.signature.output_names, prepared)

    def run(self, feeds: Feeds) -> Feeds:
        outs = self.run_prepared(self.prepare(feeds))
        return {n: (o.astype(np.float32) if o.dtype == np.float16 else o)
                for n, o in zip(self.signature.output_names, outs)}


class InPlaceCall:
    """One static-cache call through an IO binding: past_key/past_value live in OrtValues that
    are also bound as present_key/present_value, so the model writes the app's buffer itself.
    After the run the outputs must BE those buffers (same memory): a copy is an error."""

    CACHE = {"present_key": "past_key", "present_value": "past_value"}

    def __init__(self, session, signature: Signature, inputs: Feeds):
        import onnxruntime as ort
        self.session, self.signature, self.inputs = session, signature, inputs
        self.buffers = {n: ort.OrtValue.ortvalue_from_numpy(inputs[n]) for n in self.CACHE.values()}
        self.binding = session.io_binding()
        for name, value in inputs.items():
            if name in self.buffers:
                self.binding.bind_ortvalue_input(name, self.buffers[name])
            else:
                self.binding.bind_cpu_input(name, value)
        for name in signature.output_names:
            if name in self.CACHE:
                self.binding.bind_ortvalue_output(name, self.buffers[self.CACHE[name]])
            else:
                self.binding.bind_output(name, "cpu")

    def run(self) -> list[np.ndarray]:
        self.session.run_with_iobinding(self.binding)
        outs = dict(zip(self.signature.output_names, self.binding.get_outputs()))
        for name, past in self.CACHE.items():
            if outs[name].data_ptr() != self.buffers[past].data_ptr():
                raise RuntimeError(f"{name} is a copy: the model did not write the bound "
                                   f"{past} buffer in place")
        return [outs[n].numpy() if n not in self.CACHE else self.inputs[self.CACHE[n]]
                for n in self.signature.output_names]


_NUMPY = {"tensor(float)": np.float32, "tensor(float16)": np.float16,
          "tensor(int64)": np.int64}


def _cpu_compute_nodes(load_log: str) -> str:
    """Nodes that do the arithmetic but were placed on the CPU provider: a CUDA session that runs
    its MatMuls on the CPU is not a clean CUDA result (reported; fatal with --require-cuda)."""
    nodes = [n for n in node_placements(load_log).get(ORT_PROVIDERS["cpu"], [])
             if n.split(" ", 1)[0] in COMPUTE_OPS]
    if not nodes:
        return ""
    return (f"{len(nodes)} compute nodes ran on the CPU provider, not CUDA: "
            + ", ".join(nodes[:5]))


def cuda_provider_missing() -> Optional[str]:
    """Why this onnxruntime build cannot run CUDA at all (cheap: no session), or None."""
    import onnxruntime as ort
    if ORT_PROVIDERS["cuda"] not in ort.get_available_providers():
        return "this onnxruntime build has no CUDAExecutionProvider (install onnxruntime-gpu)"
    return None


def _session(path: str | Path, provider: str, threads: Optional[int], tf32: bool,
             mem_pattern: bool = True):
    """An InferenceSession that really runs on ``provider`` (else RunnerUnavailable); its load
    log is kept as ``session.load_log`` (CUDA: verbose, with the node placements)."""
    import onnxruntime as ort
    wanted = ORT_PROVIDERS[provider]
    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = threads
    opts.enable_mem_pattern = mem_pattern
    providers: list = [wanted]
    if provider == "cuda":
        if missing := cuda_provider_missing():
            raise RunnerUnavailable(missing)
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
