"""What quantizing the projections cost (lossy/base.py's ``Cost``): the dequantized layer (the
function the file holds) against the unquantized one, both in fp64 with a float cache, over the
check's single calls — apart from the runners' kernel parity, judged only against
``max_quant_error`` (max|d| / max|y| per output)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ...comparison.comparator import Deviation
from ..base import CheckedArtifact, check_budget
from ..int8_cache.cost import float_cache_feeds, float_cache_layer
from ..source_cost import SourceLayerCost
from .step import STEP


@dataclass
class QuantizationError:
    """What quantizing the projections cost, for one output: the dequantized layer against
    the unquantized source layer, both in fp64, worst over the sweep's cases. A kernel question
    (does the runtime compute what the file holds) is the runners' rows; this is the other
    question, judged only against a budget the user sets."""

    output: str
    spec: str  # e.g. "int4 block 32 symmetric, fp32 compute (accuracy level 1)"
    deviation: Deviation
    budget: Optional[float]  # the largest rel allowed (--max-quant-error); None: reported only
    passed: bool

    @property
    def label(self) -> str:
        return self.spec


class QuantizationCost(SourceLayerCost):
    """How far the dequantized layer (the check's fp64 reference) is from the unquantized
    source layer run in fp64 on the same inputs."""

    field, empty, title = "quantization", [], "quantization"
    budgets = {"max_quant_error": "Quantized artifacts: fail (exit 1) when quantizing cost "
                                  "more than this max|d| / max|y| on any output (the "
                                  "dequantized vs the unquantized layer) [default: reported "
                                  "only]."}
    row, flag = QuantizationError, "--max-quant-error"
    header = "quantization cost ({label}): the dequantized layer vs the unquantized layer, " \
             "fp64, worst over {over}"

    def __init__(self, artifact: CheckedArtifact, budget: Optional[float]):
        super().__init__(artifact.signature.output_names, artifact.spec(STEP.name).label(),
                         budget, float_cache_layer(artifact, artifact.load_plain_module()))
        self.artifact = artifact
        # an int8 cache: the dequantized layer with a float cache, fed the codes dequantized
        # (what the cache costs is its own Cost's, apart)
        cached = artifact.spec("int8-cache") is not None
        self.lossy = float_cache_layer(artifact, artifact.load_source_module(
            without=("int8-cache",))) if cached else None

    @classmethod
    def of(cls, artifact: CheckedArtifact, budgets: dict) -> Optional["QuantizationCost"]:
        quantized = artifact.spec(STEP.name) is not None
        check_budget("--max-quant-error", budgets.get("max_quant_error"), quantized,
                     f"{artifact.path} has no quantized projections (export with --quantize "
                     "int4|int8)")
        return cls(artifact, budgets.get("max_quant_error")) if quantized else None

    def add_case(self, feeds: dict, reference: dict, valid: dict, case) -> None:
        """``reference``: the check's fp64 reference on ``feeds`` (re-run here with a float
        cache when the artifact's cache is int8)."""
        if self.lossy is not None:
            feeds = float_cache_feeds(self.artifact, feeds)
            reference = self.lossy.run(feeds)
        super().add_case(feeds, reference, valid, case)
