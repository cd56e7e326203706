"""What an export target is (``ExportTarget``) and what its ``prepare`` returns (``Prepared``)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable


@dataclass(frozen=True)
class Prepared:
    """A model built in memory, before anything is written: its config.json "export" entry
    and the function that writes its file into the staging folder."""

    export: dict[str, Any]
    write: Callable[[Path], None]


# (module, config, signature, target options) -> Prepared; bad options raise UsageError here
Prepare = Callable[..., Prepared]


@dataclass(frozen=True)
class ExportTarget:
    name: str  # config.json "format" and the default folder's suffix: models/<slug>-<name>
    model_file: str  # the file it writes into the artifact folder
    prepare: Prepare  # takes ``specs``: the lossy steps' (a step says which targets refuse it)
