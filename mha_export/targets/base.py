"""What an export target is (``ExportTarget``: one record per file format, registry.py lists
them) and what its ``prepare`` returns (``Prepared``).

    export    prepare / check (its own ``options``), bounds, folder_tag, stages, missing
    CLI       its command: ``summary`` (help and examples), ``options``, ``notice``
    lossy     builds: the lossy steps it writes, each with what of a spec it refuses (the
              others refused in their step's words: ``refuse_lossy``)
    layers    lacks: the operators it has no kernel for, by name, against what a layer's
              attention kind needs (kinds/base.py's ``needs``)
    check     runners: the runner records of its file (comparison/runner.py's RunnerKind)
    bench     programs: the files a bench run times (``BenchRun``); cpp_program: the C++ app
              (cpp/) that loads its file
    fan-out   worker_bytes: what a worker exporting one layer to it holds beyond the estimate
"""
from __future__ import annotations

from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from ..comparison.runner import RunnerKind
from ..config import MHAConfig
from ..errors import UsageError


@dataclass(frozen=True)
class Prepared:
    """A model built in memory, before anything is written: its config.json "export" entry
    and the function that writes its file into the staging folder."""

    export: dict[str, Any]
    write: Callable[[Path], None]


def require_no_lossy_steps(specs: Optional[dict], model_file: str) -> None:
    """A target that writes no lossy step must never get one (its record's ``builds`` says
    which it writes: a step reaching prepare past that would write a float file under its
    name)."""
    if specs:
        raise UsageError(f"{model_file} cannot hold {', '.join(specs)} (no lossy step is built "
                         "for this target)")


def refuse_lacking(needs: Mapping[str, tuple[str, str]], title: str,
                   lacks: Mapping[str, str]) -> None:
    """A layer that needs an operator the target has no kernel for (``needs``: the layer
    kind's, operator -> (feature, how it uses it)): one line naming both."""
    for op, (feature, how) in needs.items():
        if op in lacks:
            raise UsageError(f"{feature} is not built for {title}: {how}, and {lacks[op]}")


# (module, config, signature, target options) -> Prepared; bad options raise UsageError here
Prepare = Callable[..., Prepared]
# (config, signature, target options) -> None: what prepare would refuse, before anything is
# built (export/pipeline.py's request checks; prepare checks it again)
Check = Callable[..., Any]
# (config, signature, target options) -> the axis bounds of the file it would write (None:
# none), so that a check asked past them is refused before anything is built
Bounds = Callable[..., Optional[dict]]
# a lossy step's spec -> why this target cannot write it, or None
LossyCheck = Callable[[Any], Optional[str]]


def lazy(module: str, name: str) -> Callable[..., Any]:
    """``module``'s function ``name``, imported at its first call: a record is read without its
    target's libraries (torch, ExecuTorch), as the ONNX Runtime runners' registry reads it."""
    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(import_module(module), name)(*args, **kwargs)
    call.__name__ = call.__qualname__ = name
    return call


def unbounded(*args: Any, **options: Any) -> None:
    """A target whose file takes any batch and length."""
    return None


def untagged(*args: Any, **options: Any) -> str:
    """A target whose options (none, or only how the file is built) leave its name alone."""
    return ""


def available() -> Optional[str]:
    """A target whose libraries are this package's own requirements."""
    return None


def accepted(spec: Any) -> Optional[str]:
    """A lossy step the target writes whatever its spec."""
    return None


class _EveryStep(dict):
    """``builds`` of a target that writes every lossy step, whatever its spec."""

    def __contains__(self, step: object) -> bool:
        return True

    def __missing__(self, step: str) -> Callable[[Any], Optional[str]]:
        return accepted


EVERY_STEP: Mapping[str, "LossyCheck"] = _EveryStep()


@dataclass(frozen=True)
class TargetOption:
    """One of a target's own options: the export API's keyword, the command's flag
    (``--max-batch`` for max_batch)."""

    name: str
    default: Any = None
    # its values, or what lists them when asked (the CLI is built: a record stays torch-free)
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] | None = None
    type: Any = None  # a click type where it is not a choice (int)
    help: str | Callable[[], str] = ""
    show_default: bool = False
    in_eval: bool = False  # `eval` takes it too: every exported layer's, with a runner of its file

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def text(self) -> str:
        return self.help() if callable(self.help) else self.help

    def click_option(self, prefix: str = "") -> Callable:
        """Its click option (``prefix``: words before its help, e.g. the runners it needs)."""
        import click
        choices = self.choices() if callable(self.choices) else self.choices
        return click.option(self.flag, self.name, type=click.Choice(choices) if choices
                            else self.type, default=self.default,
                            show_default=self.show_default, help=prefix + self.text or None)


@dataclass(frozen=True)
class BenchRun:
    """What a bench run measures, for a target's ``programs``: the layer, its eager module,
    its call (signature kind and signature), the ONNX variants (bench/driver.py's
    ``model_variants``: key -> {"form", "specs", "record"}), the rows' batch, the (T, past)
    points, the static cache's capacity (0: none) and the folder the files go in."""

    config: MHAConfig
    module: Any
    kind: str
    sig: Any
    variants: Mapping[str, dict]
    batch: int
    points: Sequence[tuple[int, int]]
    capacity: int
    folder: Path


def one_program(target: "ExportTarget", run: BenchRun) -> dict[str, tuple[Path, dict]]:
    """A target's file for a bench run, by model key (its name) -> (path, its row's record):
    the layer as an export would write it, at the target's defaults."""
    path = run.folder / target.model_file
    target.prepare(run.module, run.config, run.sig).write(path)
    return {target.name: (path, {})}


@dataclass(frozen=True)
class ExportTarget:
    name: str  # config.json "format", its command, the default folder's suffix
    model_file: str  # the file it writes into the artifact folder
    prepare: Prepare  # takes ``specs``: the lossy steps' (``builds`` says which it writes)
    check: Check  # takes ``specs`` too: the lossy steps asked for
    stages: tuple[str, str] = ("preparing", "writing")  # what prepare and write do, for errors
    bounds: Bounds = unbounded
    # why this machine cannot build it (an extra not installed), or None: asked after the
    # request's own refusals, which need none of its libraries (an import can take seconds)
    missing: Callable[[], Optional[str]] = available
    # what a worker exporting one layer to it holds beyond the common estimate (fanout/plan.py:
    # torch, ONNX Runtime, the module's copies and the check's largest case): its libraries and
    # the memory its file plans for the largest call
    worker_bytes: int = 0
    # (config, signature, target options) -> the options' part of a default folder's name,
    # "" at their defaults ("-bf16", "-portable-b8"): files that differ in them land apart
    folder_tag: Callable[..., str] = untagged
    title: str = ""  # its name in sentences ("ExecuTorch")
    summary: str = ""  # its command's help: what it writes, then examples (click's \b blocks)
    options: tuple[TargetOption, ...] = ()  # its own: prepare's keywords and the flags
    notice: str = ""  # a line its command prints on stderr first (a deprecation)
    builds: Mapping[str, LossyCheck] = field(default_factory=dict)  # lossy step -> its check
    lacks: Mapping[str, str] = field(default_factory=dict)  # operator -> why it has none
    runners: tuple[RunnerKind, ...] = ()  # the runners of its file (the ONNX file's: check/)
    # (target, run) -> model key -> (path, record): what a bench run times of it
    programs: Callable[["ExportTarget", BenchRun], dict[str, tuple[Path, dict]]] = one_program
    cpp_program: Optional[str] = None  # the `make cpp` program that loads its file

    def own(self, options: dict) -> dict:
        """The target's own options popped from the export API's keywords ``options``."""
        return {o.name: options.pop(o.name) for o in self.options if o.name in options}

    def refuse_lossy(self, step: str, spec: Any, unbuilt: str) -> None:
        """A lossy step asked of this target that it cannot write: its one-line refusal, the
        record's check of the spec or (a step it does not build) the step's ``unbuilt``."""
        why = self.builds[step](spec) if step in self.builds else unbuilt.format(title=self.title)
        if why:
            raise UsageError(why)
