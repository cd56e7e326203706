"""Half-precision weights as a lossy step (lossy/base.py): a --dtype float16 / bfloat16 file
stores every parameter in that dtype, so the function it holds — what the check's eager
baseline and fp64 reference compute — is the layer with its parameters rounded to it. Not asked
for by an option of its own: the export record's ``dtype`` is its record. A quantized file's
reference is the projections step's (its scales already in the dtype); this step leaves it
alone."""
from __future__ import annotations

import copy
from typing import Any, Optional

import torch

from ..base import LossyStep

HALF = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def rounded(values: torch.Tensor, dtype: str) -> torch.Tensor:
    """``values`` rounded to ``dtype`` (nearest even), kept in their own dtype."""
    return values.to(HALF[dtype]).to(values.dtype)


class HalfWeights(LossyStep):
    name = "half-weights"
    record_key = "dtype"

    def spec(self, export: dict) -> Optional[str]:
        dtype = export.get("dtype", "float32")
        return dtype if dtype in HALF and export.get("quantize") is None else None

    def reference(self, module: Any, spec: str, export: dict) -> Any:
        """A copy with every floating parameter rounded to the file's dtype."""
        held = copy.deepcopy(module)
        with torch.no_grad():
            for p in held.parameters():
                if p.is_floating_point():
                    p.copy_(rounded(p, spec))
        return held

    def api_keys(self) -> tuple[str, ...]:
        return ()  # asked for by the export's dtype, which is no lossy step's option

    def asked(self, options: dict) -> bool:
        return False  # eval's attribution: the dtype is every run's, not a step of its own


STEP = HalfWeights()
