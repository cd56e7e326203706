"""The registry of lossy steps, in the order an export applies them (the int8 cache's scales
are calibrated on the function with quantized projections).

Adding a lossy step: a package here with its ``LossyStep`` (step.py) and its ``Cost``
(cost.py), one entry in ``STEPS`` below and one in lossy/costs.py's ``COSTS``.
"""
from __future__ import annotations

from typing import Any

from .base import LossyStep
from .int8_cache import step as int8_cache
from .projections import step as projections

STEPS: tuple[LossyStep, ...] = (projections.STEP, int8_cache.STEP)
BY_NAME: dict[str, LossyStep] = {s.name: s for s in STEPS}


def recorded(export: dict) -> dict[str, Any]:
    """The specs an artifact's export record holds, by step name (steps it lacks left out)."""
    return {s.name: spec for s in STEPS if (spec := s.spec(export)) is not None}


def folder_tag(specs: dict[str, Any]) -> str:
    """The steps' part of a default folder's name, e.g. "-int4-kv8"."""
    return "".join(f"-{s.tag(specs[s.name])}" for s in STEPS if specs.get(s.name) is not None)
