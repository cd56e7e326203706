"""Which kernels ONNX Runtime really ran for the attention and the quantized projections, as a
runner's row says it (beside its provider). Torch-free.

On CUDA, read off ONNX Runtime's own debug lines, which its kernels print to std::cout (file
descriptor 1) while they run, when these variables are set before the session's kernels are
made (onnxruntime 1.31's sources):

* ``ORT_ENABLE_ATTENTION_KERNEL_DEBUG_INFO=1`` (contrib_ops/cuda/bert/attention_kernel_options.h):
  per attention node and run, ``Operator=GroupQueryAttention Node=<name> DataType=fp16
  SdpaKernel=XQA`` (XQA, CUDNN_FLASH_ATTENTION, FLASH_ATTENTION, EFFICIENT_ATTENTION, MATH, ...);
  older builds print the chosen kernel as ``FLASH_ATTENTION=1``.
* ``ORT_FPA_INTB_DEBUG=1`` (contrib_ops/cuda/quantization/matmul_nbits.cc): per MatMulNBits run
  on the fpA_intB path, ``[fpA_intB_debug] M=1 N=.. K=.. ... kernel=GEMV(cuda) tactic=..``
  (or ``CUTLASS(sm80 gemm)``); a node off that path prints nothing (the stock GEMV, or its
  weights dequantized and cuBLAS).

A replayed CUDA graph runs no host code: the lines come from the runs before capture. On the
CPU provider ONNX Runtime reports no kernel choice: the row names the op its CPU kernel ran.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Iterable

# set before a CUDA session is made: ONNX Runtime reads them when it builds its kernels (the
# attention options once per process)
DEBUG_ENV = {"ORT_ENABLE_ATTENTION_KERNEL_DEBUG_INFO": "1", "ORT_FPA_INTB_DEBUG": "1"}

ATTENTION_OPS = ("GroupQueryAttention", "MultiHeadAttention", "Attention")
# ONNX Runtime's SdpaKernel names -> the names the rows use
ATTENTION_KERNELS = {"XQA": "XQA", "CUDNN_FLASH_ATTENTION": "cuDNN", "FLASH_ATTENTION": "Flash",
                     "EFFICIENT_ATTENTION": "memory-efficient", "MATH": "unfused",
                     "LEAN_ATTENTION": "lean", "DECODER_ATTENTION": "decoder",
                     "TRT_FUSED_ATTENTION": "TensorRT fused",
                     "TRT_FLASH_ATTENTION": "TensorRT flash",
                     "TRT_CROSS_ATTENTION": "TensorRT cross",
                     "TRT_CAUSAL_ATTENTION": "TensorRT causal"}
FPA_INTB_KERNELS = {"GEMV(cuda)": "fpA_intB GEMV", "CUTLASS(sm80 gemm)": "fpA_intB CUTLASS sm80",
                    "CUTLASS(sm90 gemm)": "fpA_intB CUTLASS sm90"}
NO_FPA_INTB = "stock kernel (no fpA_intB line: its GEMV, or dequantize + cuBLAS)"

_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
_ATTENTION_LINE = re.compile(r"Operator=(\w+)(?: Node=\S*)? DataType=\w+(.*)")
_SDPA = re.compile(r"SdpaKernel=(\w+)")
_FLAG = re.compile(r"\b([A-Z_]+)=1\b")
_FPA_INTB_LINE = re.compile(r"\[fpA_intB_debug\].* kernel=(\S+)")


def enable_debug_lines() -> None:
    """ONNX Runtime's kernel debug lines on, for the sessions made from now on (a value the
    user set is kept)."""
    for name, value in DEBUG_ENV.items():
        os.environ.setdefault(name, value)


@dataclass(frozen=True)
class RanKernels:
    """The kernels one session's runs printed, and the ops its model has."""

    attention: dict  # op type -> sorted kernel names that ran it
    matmul_nbits: tuple  # the fpA_intB kernels that ran
    ops: frozenset  # the attention ops and MatMulNBits the model has

    def describe(self) -> str:
        """e.g. 'attention: GroupQueryAttention on XQA; MatMulNBits: fpA_intB GEMV'."""
        parts = []
        for op in (o for o in ATTENTION_OPS if o in self.ops):
            ran = self.attention.get(op)
            parts.append(f"attention: {op} on {'/'.join(ran)}" if ran
                         else f"attention: {op}, kernel not reported")
        if not any(o in self.ops for o in ATTENTION_OPS):
            parts.append("attention: decomposed (MatMul, Softmax)")
        if "MatMulNBits" in self.ops:
            parts.append("MatMulNBits: " + ("/".join(self.matmul_nbits) or NO_FPA_INTB))
        return "; ".join(parts)


def read_cuda_lines(text: str, ops: Iterable[str]) -> RanKernels:
    """The kernels named in ONNX Runtime's CUDA debug lines ``text`` (DEBUG_ENV)."""
    attention: dict[str, set] = {}
    fpa: list[str] = []
    for line in _COLOUR.sub("", text).splitlines():
        if m := _ATTENTION_LINE.search(line):
            rest = m.group(2)
            found = _SDPA.search(rest)
            names = [found.group(1)] if found else [f for f in _FLAG.findall(rest)
                                                    if f in ATTENTION_KERNELS]
            attention.setdefault(m.group(1), set()).update(
                ATTENTION_KERNELS.get(n, n) for n in names or ["MATH"])
        elif m := _FPA_INTB_LINE.search(line):
            name = FPA_INTB_KERNELS.get(m.group(1), f"fpA_intB {m.group(1)}")
            if name not in fpa:
                fpa.append(name)
    return RanKernels({op: tuple(sorted(k)) for op, k in attention.items()}, tuple(fpa),
                      frozenset(ops))


def describe_cpu(ops: Iterable[str]) -> str:
    """What can be said of a CPU session: ONNX Runtime names no kernel choice there; its CPU
    provider has one kernel per op (MatMulNBits: the path the runner probed, on its device)."""
    ops = frozenset(ops)
    attention = [o for o in ATTENTION_OPS if o in ops]
    parts = [f"attention: {', '.join(attention)}, the CPU provider's kernel (no kernel choice "
             "reported)" if attention else "attention: decomposed (MatMul, Softmax)"]
    if "MatMulNBits" in ops:
        parts.append("MatMulNBits: the CPU provider's kernel, its path as probed")
    return "; ".join(parts)


def model_ops(proto) -> frozenset:
    """The attention ops and MatMulNBits a model (ModelProto) has, subgraphs included."""
    from ...graph.nodes import all_nodes
    wanted = set(ATTENTION_OPS) | {"MatMulNBits"}
    return frozenset(n.op_type for n in all_nodes(proto.graph.node) if n.op_type in wanted)
