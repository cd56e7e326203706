"""ONNX Runtime config entries an exported file needs from the app that runs it, recorded in
the file (metadata ``mha_export.session_options``: a flat JSON object of strings), so that the
Python runners, ``bench`` and the C++ programs (cpp/ort_session.hpp) open it alike. A file
without the record (written before 0.5, or elsewhere) is read from its graph, by both.

Two entries today: float8 weights (a kept FP8 checkpoint's ``DequantizeLinear`` of its codes)
ask for ``session.disable_quant_qdq`` = 1, which lets ONNX Runtime fold the dequantization at
load (a float MatMul, fp32's speed and memory); left off, it dequantizes at every call (0.10x
fp32, docs/quantized-checkpoints.md). A half-precision file's MatMulNBits without zero points
(int4/int8, symmetric) ask for ``ep.cuda.fpa_intb_gemm`` = 1: ONNX Runtime's CUDA provider runs
them on its fpA_intB kernels (TensorRT-LLM's weight-only GEMV) only when asked, else on a slower
GEMV (16-62 % of HBM bandwidth on an H100, onnxruntime issue #32382); ORT 1.31's default build
takes fp16, block 32, no zero points, no bias there (docs/contrib_ops/cuda/matmul_nbits.md), and
checks each node itself (an ineligible one keeps the stock kernel); the CPU provider ignores the
entry. Builds that read only the environment take ``ORT_FPA_INTB_GEMM`` = 1 (``ENVIRONMENT``).
Only the entries listed in ``KNOWN`` are accepted: a file must not override what the app chose
(its threads, say)."""
from __future__ import annotations

import json

import onnx

from ...errors import UsageError

KEY = "mha_export.session_options"
FOLD_FLOAT8 = {"session.disable_quant_qdq": "1"}
FPA_INTB = {"ep.cuda.fpa_intb_gemm": "1"}
KNOWN = frozenset(FOLD_FLOAT8) | frozenset(FPA_INTB)
# the environment variable an entry is also read from (older builds read only it), set by the
# runners before a CUDA session is made
ENVIRONMENT = {"ep.cuda.fpa_intb_gemm": "ORT_FPA_INTB_GEMM"}
FLOAT8_TYPES = frozenset({onnx.TensorProto.FLOAT8E4M3FN})
HALF_TYPES = frozenset({onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16})


def needed(model: onnx.ModelProto) -> dict[str, str]:
    """The entries this graph needs (from its initializers, inputs and MatMulNBits)."""
    from .kernels import matmul_nbits_kinds
    float8 = any(t.data_type in FLOAT8_TYPES for t in model.graph.initializer)
    half = any(i.type.tensor_type.elem_type in HALF_TYPES for i in model.graph.input)
    fpa_intb = half and any(zp == "default" for *_, zp in matmul_nbits_kinds(model))
    return {**(FOLD_FLOAT8 if float8 else {}), **(FPA_INTB if fpa_intb else {})}


def environment(entries: dict[str, str]) -> dict[str, str]:
    """The environment variables that say the same as ``entries`` to builds reading only them."""
    return {ENVIRONMENT[k]: v for k, v in entries.items() if k in ENVIRONMENT}


def declared(model: onnx.ModelProto) -> dict[str, str]:
    """The entries the file names; a file without the record (written elsewhere, or before
    0.5): what its graph needs. A record that is not a flat object of known entries is refused
    in one line."""
    props = {p.key: p.value for p in model.metadata_props}
    if KEY not in props:
        return needed(model)
    try:
        entries = json.loads(props[KEY])
    except ValueError:
        entries = None
    if not (isinstance(entries, dict) and all(isinstance(k, str) and isinstance(v, str)
                                              for k, v in entries.items())):
        raise UsageError(f"metadata {KEY} is not a flat JSON object of strings: "
                         f"{props[KEY][:80]!r}")
    unknown = sorted(set(entries) - KNOWN)
    if unknown:
        raise UsageError(f"metadata {KEY} names {unknown[0]!r}, which a file may not set "
                         f"(known: {', '.join(sorted(KNOWN))})")
    return entries


def folds_float8(entries: dict[str, str]) -> bool:
    return FOLD_FLOAT8.items() <= entries.items()
