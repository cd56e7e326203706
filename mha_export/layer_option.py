"""A layer option declared once, on its MHAConfig field: its default, its CLI flag's help, its
check and the attention kinds that refuse it. The config checks it, the CLI makes its flag and
each kind's section refuses it from this one record; what is left for a new option is what it
computes: the eager layer (layer/base.py) and the ONNX graph (graph/model.py).

    value_multiplier: float | None = option(None, "Values times this ...", positive=True,
                                            refused_by={"latent": "value_multiplier"})

Torch-free, and importing nothing of the package: config.py and the kinds' sections read it.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

from .errors import UsageError


@dataclass(frozen=True)
class Declared:
    help: str  # the --flag's help text
    type: type = float  # the flag's type
    positive: bool = False  # a set value must be a finite number > 0
    # attention kind (config.SECTIONS' key) -> how its refusal names the option
    refused_by: Mapping[str, str] = field(default_factory=dict)


def option(default: Any, help: str, **how: Any) -> Any:
    """The dataclass field of a declared option (``how``: Declared's other fields)."""
    return dataclasses.field(default=default, metadata={"option": Declared(help, **how)})


def declared(cls_or_config: Any) -> Iterator[tuple[dataclasses.Field, Declared]]:
    """The declared options of a config class (or instance), in field order."""
    for f in dataclasses.fields(cls_or_config):
        if "option" in f.metadata:
            yield f, f.metadata["option"]


def flag(f: dataclasses.Field) -> str:
    return "--" + f.name.replace("_", "-")


def check_declared(config: Any) -> None:
    """Each set option's declared check (positive: a finite number > 0)."""
    for f, how in declared(config):
        value = getattr(config, f.name)
        if how.positive and value is not None and not (
                isinstance(value, (int, float)) and not isinstance(value, bool)
                and math.isfinite(value) and value > 0):
            raise UsageError(f"{f.name} must be a positive number, got {value!r}")


def refused_by(config: Any, kind: str) -> dict[str, bool]:
    """The options ``kind`` refuses, by the name its refusal gives them -> whether set."""
    return {how.refused_by[kind]: bool(getattr(config, f.name))
            for f, how in declared(config) if kind in how.refused_by}
