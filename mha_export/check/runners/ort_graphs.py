"""A static-cache step replayed as CUDA graphs (torch-free): a session per input shape with its
symbolic dimensions fixed, its buffers bound once, captured on its first runs and replayed."""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ...comparison.runner import Feeds, RunnerUnavailable
from ...signature import Signature
from .ort_calls import InPlaceCall, quiet_runs


def cuda_graph_refusal(signature: Signature, provider: str) -> Optional[str]:
    """Why a session cannot replay this file as a CUDA graph, or None."""
    if provider != "cuda":
        return "a CUDA graph needs the CUDA provider"
    if not signature.static_cache:
        return ("a CUDA graph replays fixed shapes and addresses: only the static-cache step "
                "(--static-cache) has them")
    return None

class GraphReplays:
    """A static-cache step replayed as CUDA graphs, as an app steps one: per input shape a
    session whose symbolic dimensions are fixed at that shape (so ONNX Runtime folds every
    shape computation away and no node is left on the CPU) and whose buffers are bound once
    on the device; a call copies its fresh inputs into them and replays. ONNX Runtime captures
    on a shape's first runs and replays from then on, so a graph that read a stale or host-side
    value would give the case's wrong answer, which the check catches."""

    CAPTURE_RUNS = 3  # ONNX Runtime runs a shape twice before it captures (1.31)

    def __init__(self, open_session: Callable[[dict[str, int], bool], object], declared,
                 signature: Signature, device: str = "cuda"):
        """``open_session(dims, graph)``: a session with those symbolic dimensions fixed (and
        graph capture on, or off for a shape ONNX Runtime will not capture);
        ``declared``: a session of the same model, whose inputs name the dimensions."""
        self.open_session, self.signature, self.device = open_session, signature, device
        self.dims = {i.name: i.shape for i in declared.get_inputs()}
        self.calls: dict[tuple, InPlaceCall] = {}
        self.uncaptured: dict[str, str] = {}  # shape -> why ONNX Runtime would not capture it

    def call(self, inputs: Feeds) -> InPlaceCall:
        """The shape's bound call with these inputs in its buffers; a new shape is captured
        first (its runs repeat the same writes into the cache: idempotent), so the call the
        caller makes is a replay."""
        shape = tuple((n, a.shape) for n, a in sorted(inputs.items()))
        if shape in self.calls:
            return self.calls[shape].refresh(inputs)
        dims = fixed_dims(self.dims, inputs)
        try:
            session = self.open_session(dims, True)
        except RunnerUnavailable as e:  # run as an app runs it: this shape without a graph
            if CAPTURE_REFUSED not in str(e):
                raise
            self.uncaptured[_shape_label(dims)] = str(e).split(CAPTURE_REFUSED, 1)[1].strip()
            session = self.open_session(dims, False)
        made = self.calls[shape] = InPlaceCall(session, self.signature, inputs, self.device,
                                               quiet_runs())
        for _ in range(self.CAPTURE_RUNS):
            made.step()
        return made

    def captured(self) -> list[str]:
        """The shapes replayed as CUDA graphs."""
        shapes = [_shape_label(fixed_dims(self.dims, {n: np.empty(s) for n, s in shape}))
                  for shape in self.calls]
        return [s for s in shapes if s not in self.uncaptured]

    def describe(self) -> str:
        """Which shapes were replayed as CUDA graphs and which ran without one, and why."""
        captured = self.captured()
        why = sorted(set(self.uncaptured.values()))
        return (f"replayed as CUDA graphs: {', '.join(captured) or 'none'}" + (
            f"; without a graph (ONNX Runtime would not capture them: {'; '.join(why)}): "
            f"{', '.join(self.uncaptured)}" if self.uncaptured else ""))

# the words of ONNX Runtime's refusal to capture a session (1.31), before its reason
CAPTURE_REFUSED = "This session cannot use the graph capture feature as requested by the user"

def _shape_label(dims: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in dims.items() if k != "max_cache")

def fixed_dims(declared: dict[str, list], inputs: Feeds) -> dict[str, int]:
    """{symbolic dimension name: its size in ``inputs``} (e.g. batch, seq, max_cache)."""
    return {d: inputs[name].shape[i] for name, dims in declared.items() if name in inputs
            for i, d in enumerate(dims) if isinstance(d, str)}
