"""The lossy steps' costs as the check asks for them (lossy/base.py's ``Cost``): one class per
step, its report field, its budgets (check_parity's keywords, the CLI's --max-* options).

Adding a step's cost: its module's ``Cost`` subclass and one entry in ``COSTS``.
"""
from __future__ import annotations

import copy
from typing import Any, Optional

from ..errors import UsageError
from .base import Cost
from .half_weights.cost import HalfWeightsCost
from .int8_cache.cost import KVCacheCost
from .projections.cost import QuantizationCost

COSTS: tuple[type[Cost], ...] = (QuantizationCost, KVCacheCost, HalfWeightsCost)
BUDGETS: dict[str, str] = {name: text for c in COSTS for name, text in c.budgets.items()}
REAL = "real_"  # the field of a cost measured on captured inputs (check --inputs)


def require_known(budgets: dict[str, Any]) -> None:
    if unknown := set(budgets) - set(BUDGETS):
        raise UsageError(f"unknown budget {', '.join(sorted(unknown))}: choose from "
                         f"{', '.join(BUDGETS)}")


def costs_of(artifact: Any, budgets: dict[str, Optional[float]]) -> list[Cost]:
    """The costs of the artifact's lossy steps (a budget of a step it lacks: bad input)."""
    return [c for cls in COSTS if (c := cls.of(artifact, budgets)) is not None]


def given_of(artifact: Any, baseline: Any, reference: Any) -> Any:
    """How the truth of a runner's call is read, where a step says (an int8 cache's codes)."""
    return next((g for cls in COSTS if (g := cls.given(artifact, baseline, reference))), None)


def own_tolerance(artifact: Any, output: str, default: Any) -> Any:
    """A step's own tolerance of an output, or None (the runner's default then)."""
    return next((t for cls in COSTS if (t := cls.tolerance(artifact, output, default))), None)


def empty_fields(real: bool = False) -> dict[str, Any]:
    """Every cost's report field at its empty value (an artifact without the step)."""
    return {(REAL if real else "") + c.field: copy.copy(c.empty) for c in COSTS}


def results(costs: list[Cost], real: bool = False) -> dict[str, Any]:
    """The report fields of measured costs."""
    return {(REAL if real else "") + c.field: c.result() for c in costs}


def report_lines(fields: dict[str, Any], real_over: str) -> list[str]:
    """Each cost's lines: the sweep's, then the real inputs' (measured over ``real_over``)."""
    out = []
    for cls in COSTS:
        for prefix in ("", REAL):
            out += cls.lines(fields.get(prefix + cls.field, cls.empty),
                             real_over if prefix else cls.over)
    return out


def failed_titles(fields: dict[str, Any]) -> list[str]:
    """The titles of the costs over budget (sweep or real inputs)."""
    return [cls.title for cls in COSTS
            if not all(cls.passed(fields.get(p + cls.field, cls.empty)) for p in ("", REAL))]
