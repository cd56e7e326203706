"""What a lossy step is to every stage: ``LossyStep`` (its record in config.json, the function
the file holds, its CLI options and export hooks) and ``Cost`` (what it cost, measured by the
check apart from the runners' kernel parity, judged only against a budget the user sets).

    CLI       options() -> click options; from_cli(kw) -> the export API's keywords
    export    request(kw, target, kind, dtype) -> what was asked or None (refusals first);
              prepare(source, wanted, held, ...) -> the spec the file is built with;
              graph_args(spec) -> the ONNX graph's; folder tag; the signature's cache dtype
              (a torch program builds the steps its target ``builds`` itself: targets/)
    record    config.json export[record_key]: spec(export) reads it back, validate() checks it
    reference reference(module, spec, export) -> the eager module of the function the file holds
    check     its Cost (lossy/costs.py): per case / scenario, a result in the report's field
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional, Protocol

import numpy as np

from ..errors import UsageError


class LossyHost(Protocol):
    """An export target, as a step sees it (targets/base.py's ExportTarget): it says which steps
    it writes."""

    def refuse_lossy(self, step: str, spec: Any, unbuilt: str) -> None:
        """A step (by name, with what was asked) it cannot write: a UsageError (``unbuilt``:
        the step's own words for a target that does not build it, its title in ``{title}``)."""


class LossyStep:
    """A lossy step's hooks; the defaults are those of a step that changes nothing there."""

    name: str = ""  # "quantize" | "int8-cache" (an attention kind's ``unbuilt`` keys)
    label: str = ""  # its run in eval's attribution, e.g. "int8 cache"
    record_key: str = ""  # config.json export[...]
    signature_dtype: Optional[str] = None  # the cache dtype its signature declares
    # why a target that does not build it refuses it ({title}: the target's), in one line
    unbuilt: str = "{title} cannot hold this lossy step"

    def spec(self, export: dict) -> Any:
        """The spec an artifact's export record holds, or None."""
        record = export.get(self.record_key)
        return None if record is None else self.from_record(record)

    def from_record(self, record: dict) -> Any:
        raise NotImplementedError

    def validate(self, export: dict, config: Any, signature: Any) -> None:
        """A record that cannot be read, or that does not fit the layer: an error, now."""
        self.spec(export)

    def reference(self, module: Any, spec: Any, export: dict) -> Any:
        """The eager module of the function a file with this step holds."""
        return module

    def tag(self, spec: Any) -> str:
        """Its part of a default folder's name (models/<slug>-<kind>-<tag>-<format>)."""
        return ""

    def options(self) -> list[Callable]:
        """Its click options (cli/options.py applies them to the export commands)."""
        return []

    def from_cli(self, kw: dict) -> dict:
        """The export API's keywords from the CLI's (the options' values gathered)."""
        return kw

    def request(self, kw: dict, target: "LossyHost", kind: str, dtype: str) -> Any:
        """What was asked for through the export API's keywords (popped), or None; what
        cannot be built (this target: its ``refuse_lossy``; call kind, dtype) is refused here,
        before any work."""
        return None

    def prepare(self, source: Any, wanted: Any, held: Any, seed: int, dtype: str) -> Any:
        """The spec the file is built with, once the source is loaded (``held``: the eager
        module with the steps before it applied)."""
        return wanted

    def graph_args(self, spec: Any) -> dict:
        """What the ONNX graph is built with (graph/model.py's build_model keywords)."""
        return {}

    def record(self, spec: Any, config: Any) -> dict:
        """config.json's export[record_key]."""
        return spec.to_dict()

    def api_keys(self) -> tuple[str, ...]:
        """The export API's keywords it reads."""
        return (self.record_key,)

    def files(self, options: dict) -> dict[str, Any]:
        """The files an export with the API's keywords ``options`` reads, by keyword."""
        return {}

    def asked(self, options: dict) -> bool:
        """Whether the export API's keywords ``options`` ask for this step."""
        return options.get(self.api_keys()[0]) is not None

    def attribution(self, options: dict, plain: dict, runner: str) -> list[tuple[str, dict]]:
        """(label, export options) of the runs that measure this step alone over ``plain``
        (the options without any lossy step); ``runner``: what the evaluation runs."""
        return [(self.label or self.name, {**plain, **{k: options[k] for k in self.api_keys()
                                                       if k in options}})]

    def weight_bytes(self, config: Any, spec: Any) -> Optional[int]:
        """Bytes of the projections' weights as the file stores them (None: fp32's)."""
        return None

    def cache_entry_bytes(self) -> Optional[int]:
        """Bytes of one cached number (None: the model's float, 4)."""
        return None


def within(value: float, budget: Optional[float]) -> bool:
    """A measured figure passes: finite (a NaN or empty measurement never does), and within
    the budget where one is set."""
    return bool(np.isfinite(value) and (budget is None or value <= budget))


def check_budget(name: str, value: Optional[float], applies: bool, why_not: str) -> None:
    """A budget must be a finite number >= 0, and given only where it measures something."""
    if value is None:
        return
    if not (value >= 0 and np.isfinite(value)):
        raise UsageError(f"{name} must be a finite number >= 0, got {value}")
    if not applies:
        raise UsageError(f"{name}: {why_not}")


def verdict(passed: bool, budget: Optional[float], flag: str, percent: bool = False) -> str:
    """PASS / FAIL against a budget, in the figure's own unit (``percent``: a rate shown as
    0.082%, its budget as 0.010%)."""
    if budget is None:
        return "FAIL (not finite)" if not passed else f"reported (no {flag})"
    shown = f"{budget:.3%}" if percent else f"{budget:g}"
    return f"{'PASS' if passed else 'FAIL'} (budget {shown})"


class CheckedArtifact(Protocol):
    """What a Cost reads of the artifact under check (artifact.Artifact; the artifact reads
    the lossy steps' records, so they know it by this protocol, never by import)."""

    path: Path
    config: Any  # MHAConfig
    signature: Any  # Signature

    def spec(self, step: str) -> Any: ...

    def load_source_module(self, without: tuple[str, ...] = ()) -> Any: ...

    def load_plain_module(self) -> Any: ...


class Cost:
    """What one lossy step of an artifact cost over the check's cases: collected case by case
    and scenario by scenario, reported in the CheckReport's ``field`` (``real_`` + field for the
    captured inputs), judged only against its budgets (check_parity's keywords)."""

    field: str = ""  # CheckReport / parity.json key of its result
    empty: Any = None  # that key's value for an artifact without the step
    title: str = ""  # in the summary line: "<title> cost FAILED"
    over: str = "the sweep"  # what its result is the worst over (random inputs)
    budgets: dict[str, str] = {}  # check_parity keyword -> its CLI help

    @classmethod
    def of(cls, artifact: Any, budgets: dict) -> Optional["Cost"]:
        """None for an artifact without the step (where a budget of it is bad input)."""
        raise NotImplementedError

    @classmethod
    def given(cls, artifact: Any, baseline: Any, reference: Any) -> Any:
        """How the truth of a runner's call is read (e.g. over the codes it wrote), or None."""
        return None

    @classmethod
    def tolerance(cls, artifact: Any, output: str, default: Any) -> Any:
        """Its own tolerance of an output (e.g. codes compared as codes), or None."""
        return None

    def add_case(self, feeds: dict, reference: dict, valid: dict, case: Any) -> None:
        """A single call: its feeds, the check's fp64 reference outputs, the valid entries."""

    def add_scenario(self, x: np.ndarray, mask: np.ndarray, reference_y: np.ndarray,
                     truth: Callable) -> None:
        """A multi-call scenario: ``truth`` runs a layer through it as the check's truth does."""

    def result(self) -> Any:
        raise NotImplementedError

    @staticmethod
    def passed(result: Any) -> bool:
        """Whether a result (this field's value) passes."""
        return all(r.passed for r in result) if isinstance(result, list) else (
            result is None or result.passed)

    @staticmethod
    def lines(result: Any, over: str) -> list[str]:
        """The report's lines of a result (none for the empty one)."""
        return []
