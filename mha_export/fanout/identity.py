"""What a layer was made from, as one short fingerprint: the target, the weights' and every
file option's identity (path, size, mtime), the export options and the check's options. It is
kept in the layer's row of layers.json: ``--resume`` skips a passing layer whose fingerprint
is the same, ``eval --exports`` reuses one (``checked_layer``)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Optional

from ..lossy import registry as lossy
from ..weights.source import weights_version
from .records import PASS, read_summary

EXPORT, CHECK = "export", "check"


def fingerprint(*parts: Any) -> str:
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def export_stamp(target: str, weights: str | Path, options: dict,
                 check_options: Optional[dict], layer: int) -> str:
    files = {k: weights_version(f) for k, f in lossy.files(options).items()}
    return fingerprint(EXPORT, target, weights_version(weights), files, lossy.as_json(options),
                       check_options, layer)


def checked_layer(root: str | Path, target: str, weights: str | Path, options: dict,
                  layer: int) -> Optional[Path]:
    """DIR/layer-{L} where DIR's layers.json says it passed, made by ``target`` from these
    weights and export options: what ``eval --exports DIR`` reuses; else None."""
    summary = read_summary(root, strict=False)
    row = next((r for r in summary.records if r.layer == layer and r.status == PASS),
               None) if summary else None
    if row is None or row.fingerprint != export_stamp(target, weights, options,
                                                      summary.check_options, layer):
        return None
    folder = Path(root) / row.folder
    return folder if folder.is_dir() else None
