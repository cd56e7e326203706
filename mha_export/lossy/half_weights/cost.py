"""What rounding the weights to float16 / bfloat16 cost (lossy/base.py's ``Cost``): the layer
with rounded parameters (the function the file holds) against the float32 source layer, both
in fp64, over the check's single calls — apart from the runners' half-precision arithmetic,
which is judged against the rounded layer."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ...comparison.comparator import Deviation
from ...comparison.torch_runners import EagerRunner
from ..base import CheckedArtifact, check_budget
from ..source_cost import SourceLayerCost
from .step import STEP

import torch


@dataclass
class RoundingError:
    """For one output: the rounded-weights layer against the source layer, fp64, worst over
    the sweep's cases."""

    output: str
    dtype: str
    deviation: Deviation
    budget: Optional[float]  # the largest rel allowed (--max-rounding-error); None: reported
    passed: bool

    @property
    def label(self) -> str:
        return self.dtype


class HalfWeightsCost(SourceLayerCost):
    field, empty, title = "half_weights", [], "weight rounding"
    budgets = {"max_rounding_error": "float16 / bfloat16 artifacts: fail (exit 1) when "
                                     "rounding the weights cost more than this max|d| / "
                                     "max|y| on any output (the rounded vs the float32 "
                                     "layer) [default: reported only]."}
    row, flag = RoundingError, "--max-rounding-error"
    header = "weight rounding cost ({label}): the rounded vs the float32 layer, fp64, worst " \
             "over {over}"

    def __init__(self, artifact: CheckedArtifact, budget: Optional[float]):
        super().__init__(artifact.signature.output_names, artifact.spec(STEP.name), budget,
                         EagerRunner(artifact.signature, artifact.load_plain_module(),
                                     torch.float64))

    @classmethod
    def of(cls, artifact: CheckedArtifact, budgets: dict) -> Optional["HalfWeightsCost"]:
        half = artifact.spec(STEP.name) is not None
        check_budget("--max-rounding-error", budgets.get("max_rounding_error"), half,
                     f"{artifact.path} holds float32 weights, or quantized ones (export "
                     "with --dtype float16|bfloat16)")
        return cls(artifact, budgets.get("max_rounding_error")) if half else None
