"""What ONNX Runtime's CPU provider really ran for quantized projections (torch-free): the
MatMulNBits kernels of a session's optimized graph, each kind's path probed on one small matmul
on this machine (int8 activations, fp32, or dequantized every call), never assumed."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...graph.nodes import all_nodes
from ...lossy.projections.kernels import matmul_nbits_kinds, matmul_nbits_probe
from .ort_logs import native_stderr
from .ort_threads import follow_process_pool


@dataclass(frozen=True)
class QuantizedKernels:
    """The weight-only quantized matmuls of a session's optimized graph, and the path ONNX
    Runtime's CPU kernel really takes for them on this machine (``kernel_path``)."""

    kernels: int  # MatMulNBits nodes
    paths: tuple  # (bits, accuracy level, zero points, path) of each distinct kind of node
    unfused: int  # DequantizeLinear nodes left in the optimized graph

    @property
    def int8_activations(self) -> bool:
        return any(path == INT8_PATH for *_, path in self.paths)

    @property
    def slow(self) -> list[str]:
        """Why some projections run slowly (dequantized to float at every call)."""
        why = [f"int{b} MatMulNBits at accuracy level {lvl}" + (
               f" with {zp} zero points" if zp != "default" else "") + ": ONNX Runtime "
               "dequantizes the weights to fp32 at every call (" + (
                   "no packed kernel takes float zero points" if zp == "float" else
                   "no such fast kernel on this CPU; accuracy level 4 has one") + ")"
               for b, lvl, zp, path in self.paths if path == DEQUANTIZE_PATH]
        if self.unfused:
            why.append(f"{self.unfused} DequantizeLinear nodes were not fused into MatMulNBits: "
                       "their weights are dequantized to float at every call")
        return why

    def describe(self) -> str:
        kinds = ", ".join(f"int{b} level {lvl}{'' if zp == 'default' else f', {zp} zero points'}"
                          f": {path}" for b, lvl, zp, path in self.paths)
        return f"{self.kernels} MatMulNBits nodes ({kinds})"

INT8_PATH, FP32_PATH, DEQUANTIZE_PATH = ("int8-activation compute", "fp32 compute",
                                         "dequantized to fp32 every call")

_FALLBACK_LOG = "Falling back to using unpacked compute mode"

def at_fp32_compute(path: str | Path) -> bytes:
    """The model with every MatMulNBits at accuracy level 1 (fp32 compute), serialized."""
    import onnx
    model = onnx.load(str(path))
    for node in all_nodes(model.graph.node):
        if node.op_type == "MatMulNBits":
            for attr in node.attribute:
                if attr.name == "accuracy_level":
                    attr.i = 1
    return model.SerializeToString()

def quantized_kernels(optimized_path: str, provider: str) -> QuantizedKernels:
    import onnx
    model = onnx.load(optimized_path, load_external_data=False)
    nodes = list(all_nodes(model.graph.node))
    kinds = matmul_nbits_kinds(model)
    paths = tuple(dict.fromkeys(
        (bits, level, zp, kernel_path(bits, block, level, zp) if provider == "cpu"
         else f"{provider} kernel, not probed")
        for bits, block, level, zp in kinds))
    return QuantizedKernels(sum(n.op_type == "MatMulNBits" for n in nodes), paths,
                            sum(n.op_type == "DequantizeLinear" for n in nodes))

@functools.lru_cache(maxsize=None)
def kernel_path(bits: int, block_size: int, accuracy_level: int,
                zero_points: str = "default") -> str:
    """The path ONNX Runtime's CPU MatMulNBits really takes here, probed on one small matmul,
    not assumed: a kernel without a packed path for this (bits, block, level) logs that it
    falls back to dequantizing B (8 bits at fp32 compute, in 1.31); level 4 quantizes the
    activations only where MLAS has an int8 kernel for this CPU, else it computes in fp32
    silently (outputs identical to level 1's; so does it for float zero points)."""
    out, logs = {}, {}
    for level in sorted({1, accuracy_level}):
        out[level], logs[level] = _probe(bits, block_size, level, zero_points)
    if _FALLBACK_LOG in logs[accuracy_level]:
        return DEQUANTIZE_PATH
    if accuracy_level == 4 and not np.array_equal(out[1], out[4]):
        return INT8_PATH
    return FP32_PATH

def _probe(bits: int, block_size: int, level: int, zero_points: str
           ) -> tuple[np.ndarray, str]:
    """The probe matmul's output and the kernel's verbose log of one run."""
    import onnxruntime as ort
    model, a = matmul_nbits_probe(bits, block_size, level, zero_points)
    opts = follow_process_pool(ort.SessionOptions())
    opts.log_severity_level = 0
    with native_stderr() as log:
        session = ort.InferenceSession(model.SerializeToString(), opts,
                                       providers=["CPUExecutionProvider"])
        y = session.run(None, {"A": a})[0]
    return y, log["text"]
