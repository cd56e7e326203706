"""What an export target is (``ExportTarget``) and what its ``prepare`` returns (``Prepared``)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from ..errors import UsageError


@dataclass(frozen=True)
class Prepared:
    """A model built in memory, before anything is written: its config.json "export" entry
    and the function that writes its file into the staging folder."""

    export: dict[str, Any]
    write: Callable[[Path], None]


def require_no_lossy_steps(specs: Optional[dict], model_file: str) -> None:
    """A target that writes no lossy step must never get one (a step names the targets that
    refuse it: a new step that forgot this one would write a float file under its name)."""
    if specs:
        raise UsageError(f"{model_file} cannot hold {', '.join(specs)} (no lossy step is built "
                         "for this target)")


# (module, config, signature, target options) -> Prepared; bad options raise UsageError here
Prepare = Callable[..., Prepared]
# (config, signature, target options) -> None: what prepare would refuse, before anything is
# built (export/pipeline.py's request checks; prepare checks it again)
Check = Callable[..., Any]
# (config, signature, target options) -> the axis bounds of the file it would write (None:
# none), so that a check asked past them is refused before anything is built
Bounds = Callable[..., Optional[dict]]


def unbounded(*args: Any, **options: Any) -> None:
    """A target whose file takes any batch and length."""
    return None


def untagged(*args: Any, **options: Any) -> str:
    """A target whose options (none, or only how the file is built) leave its name alone."""
    return ""


def available() -> Optional[str]:
    """A target whose libraries are this package's own requirements."""
    return None


@dataclass(frozen=True)
class ExportTarget:
    name: str  # config.json "format" and the default folder's suffix: models/<slug>-<name>
    model_file: str  # the file it writes into the artifact folder
    prepare: Prepare  # takes ``specs``: the lossy steps' (a step says which targets refuse it)
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
