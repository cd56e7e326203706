"""The cost of a lossy step that changes the weights (quantized projections, half-precision
weights): the check's fp64 reference, the layer the file holds, against the source layer
without the step, also fp64, on the same inputs; per output, worst over the check's single
calls, judged only against the budget the user sets (lossy/base.py's ``Cost``)."""
from __future__ import annotations

from typing import Any, Optional

from ..comparison.comparator import Deviation, deviation, worst
from .base import Cost, verdict, within


class SourceLayerCost(Cost):
    """Collects, case by case, how far the layer the file holds is from ``source`` (a runner
    of the layer without the step); a subclass gives its result record ``row`` (output, label,
    deviation, budget, passed), its budget's ``flag`` and its report ``header``."""

    row: type = type(None)
    flag: str = ""  # the budget's CLI flag
    header: str = ""  # "... ({label}) ... worst over {over}"

    def __init__(self, output_names: list[str], label: str, budget: Optional[float],
                 source: Any):
        self.label, self.budget, self.source = label, budget, source
        self.deviations: dict[str, list[Deviation]] = {n: [] for n in output_names}

    def add_case(self, feeds: dict, reference: dict, valid: dict, case: Any) -> None:
        """``reference``: the check's fp64 reference (the layer the file holds) on ``feeds``."""
        self.compare(reference, self.source.run(feeds), valid)

    def compare(self, reference: dict, source: dict, valid: dict) -> None:
        for n, found in self.deviations.items():
            found.append(deviation(reference[n], source[n], valid.get(n)))

    def result(self) -> list:
        return [self.row(n, self.label, d := worst(found), self.budget,
                         within(d.rel, self.budget))
                for n, found in self.deviations.items()]

    @classmethod
    def lines(cls, result: list, over: str) -> list[str]:
        """What the step cost, per output, apart from the runners' parity."""
        if not result:
            return []
        lines = [cls.header.format(label=result[0].label, over=over)]
        for r in result:
            d = r.deviation
            lines.append(f"  {r.output:13s} max|d| {d.max_abs:.2e}  {d.rel:.2e} of max|y|  "
                         f"cosine {d.cosine:.6f}  {verdict(r.passed, r.budget, cls.flag)}")
        return lines
