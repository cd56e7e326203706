"""What rounding the weights to float16 / bfloat16 cost (lossy/base.py's ``Cost``): the layer
with rounded parameters (the function the file holds) against the float32 source layer, both
in fp64, over the check's single calls — apart from the runners' half-precision arithmetic,
which is judged against the rounded layer."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ...artifact import Artifact
from ...check.comparator import Deviation, deviation, worst
from ...check.runners.pytorch import EagerRunner
from ..base import Cost, check_budget, verdict, within
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


class HalfWeightsCost(Cost):
    field, empty, title = "half_weights", [], "weight rounding"
    budgets = {"max_rounding_error": "float16 / bfloat16 artifacts: fail (exit 1) when "
                                     "rounding the weights cost more than this max|d| / "
                                     "max|y| on any output (the rounded vs the float32 "
                                     "layer) [default: reported only]."}

    def __init__(self, artifact: Artifact, budget: Optional[float]):
        self.dtype, self.budget = artifact.spec(STEP.name), budget
        self.source = EagerRunner(artifact.signature, artifact.load_plain_module(),
                                  torch.float64)
        self.deviations: dict[str, list[Deviation]] = {
            n: [] for n in artifact.signature.output_names}

    @classmethod
    def of(cls, artifact: Artifact, budgets: dict) -> Optional["HalfWeightsCost"]:
        half = artifact.spec(STEP.name) is not None
        check_budget("--max-rounding-error", budgets.get("max_rounding_error"), half,
                     f"{artifact.path} holds float32 weights, or quantized ones (export "
                     "with --dtype float16|bfloat16)")
        return cls(artifact, budgets.get("max_rounding_error")) if half else None

    def add_case(self, feeds: dict, reference: dict, valid: dict, case) -> None:
        """``reference``: the check's fp64 reference (the rounded layer) on ``feeds``."""
        source = self.source.run(feeds)
        for n, found in self.deviations.items():
            found.append(deviation(reference[n], source[n], valid.get(n)))

    def result(self) -> list[RoundingError]:
        return [RoundingError(n, self.dtype, d := worst(found), self.budget,
                              within(d.rel, self.budget))
                for n, found in self.deviations.items()]

    @staticmethod
    def lines(result: list[RoundingError], over: str) -> list[str]:
        """What rounding the weights cost, per output, apart from the runners' parity."""
        if not result:
            return []
        lines = [f"weight rounding cost ({result[0].dtype}): the rounded vs the float32 "
                 f"layer, fp64, worst over {over}"]
        for r in result:
            d = r.deviation
            lines.append(f"  {r.output:13s} max|d| {d.max_abs:.2e}  {d.rel:.2e} of max|y|  "
                         f"cosine {d.cosine:.6f}  "
                         f"{verdict(r.passed, r.budget, '--max-rounding-error')}")
        return lines
