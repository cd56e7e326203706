"""What a runner is: one implementation under test that takes and returns arrays by the
signature's names and says what really ran it; and ``RunnerKind``, the registry record of one
runner (``runners/__init__.py``). Imports neither torch nor an ONNX runtime.

Runners only run; comparing is ``compare``'s job. A runner that cannot run where it was asked to
(the CUDA provider did not load, no GPU) raises ``RunnerUnavailable`` with the reason, so it is
reported as skipped (or failed with --require-cuda), never as a result of another device.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from ..signature import Signature
from .comparator import Tolerance


class RunnerUnavailable(Exception):
    """The runner cannot run on the device it names; str(e) is the reason."""


Feeds = Dict[str, np.ndarray]


class Runner(ABC):
    """One implementation under test: takes and returns arrays by the signature's names."""

    name: str  # "eager-fp32", "torchscript", "ort-cpu", ...
    device: str  # what really runs it, e.g. "cuda (CUDAExecutionProvider)"
    precision: str = "fp32"  # the arithmetic it really uses, e.g. "fp32, TF32 matmuls allowed"
    providers: List[str] = []  # ONNX Runtime: the session's real providers
    warning: str = ""  # e.g. compute nodes a CUDA session placed on the CPU
    # the dtype its arithmetic really had when the runtime chose it (OpenVINO's bf16), for the
    # default tolerance; None: the model's
    tolerance_dtype: Optional[str] = None

    def __init__(self, signature: Signature):
        self.signature = signature

    def ran_note(self) -> str:
        """What the runner could say only after the cases ran (e.g. which shapes a CUDA graph
        replayed); the report appends it to the runner's line."""
        return ""

    def kernels(self) -> str:
        """Which kernels ran the attention and the quantized projections, where the runtime
        says (ONNX Runtime's runners: ort_kernels.py), after the cases ran; "" elsewhere."""
        return ""

    def ran_failure(self) -> str:
        """Why, after the cases ran, the runner did not do what it stands for (a graph runner
        that replayed no graph): its line fails, whatever its outputs."""
        return ""

    @abstractmethod
    def run(self, feeds: Feeds) -> Feeds:
        ...

    def prepare(self, feeds: Feeds) -> Any:
        """Inputs in the runtime's own form, made once (the bench times ``run_prepared``)."""
        return feeds

    def run_prepared(self, prepared: Any) -> Any:
        return self.run(prepared)

    def bind_cache(self, buffers: Feeds) -> Optional[Callable[[Feeds], np.ndarray]]:
        """A static-cache model run as an app runs it, step after step: ``buffers``
        (past_key, past_value: the app's arrays) bound once and written in place by every
        call; the call takes the other inputs and returns y. None: this runner has no such
        path (its ``run`` takes the buffers each call)."""
        return None


def require_in_place(signature: Signature, args: List[Any], outputs: List[Any]) -> None:
    """A static-cache call's present_* must be the very buffers passed as past_* (torch tensors:
    same data_ptr), written in place, never copies."""
    if not signature.static_cache:
        return
    given = dict(zip(signature.input_names, args))
    returned = dict(zip(signature.output_names, outputs))
    for present, past in (("present_key", "past_key"), ("present_value", "past_value")):
        if returned[present].data_ptr() != given[past].data_ptr():
            raise RuntimeError(f"{present} is a copy: the {past} buffer was not written in place")


@dataclass(frozen=True)
class RunOptions:
    """Settings a check passes to every runner it opens."""

    tf32: bool = True  # CUDA: allow TF32 matmuls for float32 models
    threads: Optional[int] = None  # intra-op threads (None: the runtime's default)
    mem_pattern: bool = True  # ONNX Runtime's memory-pattern planner (the bench turns it off)
    # how ONNX Runtime sessions share the cores (ort_threads.py): by default each session's
    # threads sleep after a run, so that many sessions in turn and torch beside them do not
    # compete with threads spinning for nothing
    thread_pool: str = "idle"
    # CUDA: the stream (a cudaStream_t's address) the sessions run their kernels on, ONNX
    # Runtime's ``user_compute_stream``; None: each session its own. The bench passes its own,
    # so that CUDA events recorded on it bracket the calls' work (a replayed graph's too)
    compute_stream: Optional[int] = None


@dataclass(frozen=True)
class RunnerKind:
    """One registry record: a runner under test, by name."""

    name: str  # "ort-cpu", the name ``check --runners`` selects
    model_file: str  # the artifact file it runs, e.g. "model.onnx"
    device: str  # "cpu" | "cuda": a cuda runner that cannot start fails --require-cuda
    runtime: str  # what runs the file, for help texts: "ONNX Runtime", "torch.jit"
    open: Callable[[Signature, Path, RunOptions], Runner]  # imports its runtime lazily
    tolerance: Callable[[str, RunOptions], Tolerance]  # (model dtype, options) -> default
    unavailable: Callable[[], Optional[str]] = lambda: None  # why it cannot run on this machine
    ort_provider: Optional[str] = None  # "cpu" | "cuda": the ``--providers`` shorthand
    by_default: bool = True  # False: runs only when named (another runtime than the file's own)
    # runs by default beside the runner named ``also_with`` (when that one is chosen) on the
    # artifacts whose config.json "export" ``also_for`` accepts; ``also_for_doc`` says which
    also_with: str = ""
    also_for: Callable[[dict], bool] = lambda export: False
    also_for_doc: str = ""


def positions(mask: np.ndarray) -> np.ndarray:
    """(B, S) int64 rotary positions from an attention_mask: each row's real tokens count 0, 1,
    ... (what transformers' generate does: cumsum - 1), padding at 0."""
    return np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int64)
