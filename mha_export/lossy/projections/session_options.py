"""ONNX Runtime config entries an exported file needs from the app that runs it, recorded in
the file (metadata ``mha_export.session_options``: a flat JSON object of strings), so that the
Python runners, ``bench`` and the C++ programs (cpp/ort_session.hpp) open it alike. A file
without the record (written before 0.5, or elsewhere) is read from its graph, by both.

One entry today: float8 weights (a kept FP8 checkpoint's ``DequantizeLinear`` of its codes) ask
for ``session.disable_quant_qdq`` = 1, which lets ONNX Runtime fold the dequantization at load
(a float MatMul, fp32's speed and memory); left off, it dequantizes at every call (0.10x fp32,
docs/quantized-checkpoints.md). Only the entries listed in ``KNOWN`` are accepted: a file must
not override what the app chose (its threads, say)."""
from __future__ import annotations

import json

import onnx

from ...errors import UsageError

KEY = "mha_export.session_options"
FOLD_FLOAT8 = {"session.disable_quant_qdq": "1"}
KNOWN = frozenset(FOLD_FLOAT8)
FLOAT8_TYPES = frozenset({onnx.TensorProto.FLOAT8E4M3FN})


def needed(model: onnx.ModelProto) -> dict[str, str]:
    """The entries this graph needs (from its initializers)."""
    float8 = any(t.data_type in FLOAT8_TYPES for t in model.graph.initializer)
    return dict(FOLD_FLOAT8) if float8 else {}


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
