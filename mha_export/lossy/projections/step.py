"""Quantized projections as a lossy step (lossy/base.py): weight-only MatMulNBits, round to
nearest (rtn.py) or a GGUF's own blocks (source.py)."""
from __future__ import annotations

from typing import Any

from ..base import LossyStep
from .records import quant_spec_from_record
from .reference import reference_module


class QuantizedProjections(LossyStep):
    name = "quantize"
    record_key = "quantize"
    target_option = "quant"

    def from_record(self, record: dict) -> Any:
        return quant_spec_from_record(dict(record))

    def reference(self, module: Any, spec: Any, export: dict) -> Any:
        """Round to nearest: the dequantized weights re-derived from the source weights with
        the recorded spec; a GGUF's kept blocks: the stored weights themselves."""
        return reference_module(module, spec, export.get("dtype", "float32"))

    def tag(self, spec: Any) -> str:
        return spec.tag


STEP = QuantizedProjections()
