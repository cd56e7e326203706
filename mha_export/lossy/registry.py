"""The registry of lossy steps, in the order an export applies them (the int8 cache's scales
are calibrated on the function with quantized projections).

Adding a lossy step: a package here with its ``LossyStep`` (step.py) and its ``Cost``
(cost.py), one entry in ``STEPS`` below and one in lossy/costs.py's ``COSTS``.
"""
from __future__ import annotations

from typing import Any

from ..kinds.registry import kind_of
from .base import LossyHost, LossyStep
from .half_weights import step as half_weights
from .int8_cache import step as int8_cache
from .projections import step as projections

# half_weights: a float16 / bfloat16 file's rounded parameters (the export's --dtype asks)
STEPS: tuple[LossyStep, ...] = (half_weights.STEP, projections.STEP, int8_cache.STEP)


def recorded(export: dict) -> dict[str, Any]:
    """The specs an artifact's export record holds, by step name (steps it lacks left out)."""
    return {s.name: spec for s in STEPS if (spec := s.spec(export)) is not None}


def folder_tag(specs: dict[str, Any]) -> str:
    """The steps' part of a default folder's name, e.g. "-int4-kv8"."""
    tags = (s.tag(specs[s.name]) for s in STEPS if specs.get(s.name) is not None)
    return "".join(f"-{tag}" for tag in tags if tag)


def options() -> list:
    """Every step's click options, in order."""
    return [o for s in STEPS for o in s.options()]


def from_cli(kw: dict) -> dict:
    """The export API's keywords from the CLI's: each step gathers its own options."""
    for s in STEPS:
        kw = s.from_cli(kw)
    return kw


def requested(kw: dict, target: LossyHost, kind: str, dtype: str) -> dict[str, Any]:
    """What the export API's keywords ask of each step (popped from ``kw``), by name; a step
    ``target`` cannot write is refused (its ``refuse_lossy``)."""
    asked = {s.name: s.request(kw, target, kind, dtype) for s in STEPS}
    return {name: wanted for name, wanted in asked.items() if wanted is not None}


def prepared(source: Any, asked: dict[str, Any], seed: int, dtype: str) -> dict[str, Any]:
    """The specs the file is built with, each step prepared on the function the ones before it
    give; a step the layer's attention kind does not build is refused."""
    chosen = [s for s in STEPS if s.name in asked]
    refuse_unbuilt(source.config, asked)  # every refusal before any work
    held, specs = source.module, {}
    for i, step in enumerate(chosen):
        specs[step.name] = step.prepare(source, asked[step.name], held, seed, dtype)
        if i + 1 < len(chosen):
            held = step.reference(held, specs[step.name], {"dtype": dtype})
    return specs


def refuse_unbuilt(config: Any, asked: dict[str, Any]) -> None:
    """A step asked for that the layer's attention kind does not build: an error."""
    for step in STEPS:
        if step.name in asked:
            kind_of(config).refuse(step.name)


def cache_dtype(specs: dict[str, Any], default: str) -> str:
    """The signature's cache dtype: a step's that declares one (an int8 cache), else
    ``default``."""
    return next((s.signature_dtype for s in STEPS if s.name in specs and s.signature_dtype),
                default)


def graph_args(specs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for s in STEPS if s.name in specs for k, v in s.graph_args(specs[s.name]).items()}


def records(specs: dict[str, Any], config: Any) -> dict[str, Any]:
    """config.json's export entries of the steps."""
    return {s.record_key: s.record(specs[s.name], config) for s in STEPS if s.name in specs}


def weight_bytes(config: Any, specs: dict[str, Any], float_bytes: int = 4) -> int:
    """Bytes of the projections' weights as the steps store them, else floats of
    ``float_bytes`` (4: float32, 2: float16 / bfloat16)."""
    stored = [b for s in STEPS if s.name in specs
              if (b := s.weight_bytes(config, specs[s.name])) is not None]
    return stored[0] if stored else sum(
        float_bytes * out * inp for out, inp in kind_of(config).projections(config).values())


def cache_entry_bytes(specs: dict[str, Any], float_bytes: int = 4) -> int:
    """Bytes of one cached number: a step's (an int8 cache's 1), else ``float_bytes``."""
    return next((b for s in STEPS if s.name in specs
                 if (b := s.cache_entry_bytes()) is not None), float_bytes)


def switch_keys() -> tuple[str, ...]:
    """The keyword that asks for each step (``quantize``, ``kv_cache_dtype``)."""
    return tuple(s.api_keys()[0] for s in STEPS if s.api_keys())


def api_keys() -> tuple[str, ...]:
    """Every step's export API keywords."""
    return tuple(k for s in STEPS for k in s.api_keys())


def as_json(options: dict) -> dict:
    """Export options as JSON (a lossy step's spec by its record); unset switches left out."""
    return {k: (v.to_dict() if hasattr(v, "to_dict") else v) for k, v in options.items()
            if not (v is None and k in switch_keys())}


def files(options: dict) -> dict[str, Any]:
    """The files an export with the API's keywords ``options`` reads (e.g. a calibration
    file), by keyword."""
    return {k: v for s in STEPS for k, v in s.files(options).items()}


def attribution(options: dict, runner: str) -> list[tuple[str, dict]]:
    """(label, export options) of the plain export, of each lossy step ``options`` asks for
    alone, and of all of them together (when more than one)."""
    plain = {k: v for k, v in options.items() if k not in api_keys()}
    asked = [s for s in STEPS if s.asked(options)]
    runs = [("fp32 export", plain)]
    for step in asked:
        runs += step.attribution(options, plain, runner)
    return runs + ([("all together", options)] if len(asked) > 1 else [])
