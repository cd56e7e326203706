"""ONNX Runtime config entries an exported file needs from the app that runs it, recorded in
the file (metadata ``mha_export.session_options``: a flat JSON object of strings), so that the
Python runners, ``bench`` and the C++ programs (cpp/ort_session.hpp) open it alike.

One entry today: float8 weights (a kept FP8 checkpoint's ``DequantizeLinear`` of its codes) ask
for ``session.disable_quant_qdq`` = 1, which lets ONNX Runtime fold the dequantization at load
(a float MatMul, fp32's speed and memory); left off, it dequantizes at every call (0.10x fp32,
docs/quantized-checkpoints.md)."""
from __future__ import annotations

import json

import onnx

KEY = "mha_export.session_options"
FOLD_FLOAT8 = {"session.disable_quant_qdq": "1"}
FLOAT8_TYPES = frozenset({onnx.TensorProto.FLOAT8E4M3FN})


def needed(model: onnx.ModelProto) -> dict[str, str]:
    """The entries this graph needs (from its initializers)."""
    float8 = any(t.data_type in FLOAT8_TYPES for t in model.graph.initializer)
    return dict(FOLD_FLOAT8) if float8 else {}


def declared(model: onnx.ModelProto) -> dict[str, str]:
    """The entries the file names; a file without the record (written elsewhere, or before
    0.5): what its graph needs."""
    props = {p.key: p.value for p in model.metadata_props}
    return json.loads(props[KEY]) if KEY in props else needed(model)


def folds_float8(entries: dict[str, str]) -> bool:
    return FOLD_FLOAT8.items() <= entries.items()
