"""What an export was made from, as one short fingerprint: the target, the weights' and every
file option's identity (path, size, mtime), the export options and the check's options. A
fan-out keeps it in each layer's row of DIR/layers.json (fanout/records.py): ``--resume`` skips
a passing layer whose fingerprint is the same, ``eval --exports DIR`` reuses one
(``checked_layer``); eval stamps the layers it exports itself with it (``export_stamp``)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Optional

from ..address import Address
from ..artifact import SUMMARY_FILE
from ..lossy import registry as lossy
from ..weights.source import weights_version

STAMPED = "export"  # the stamp's first part, as every layers.json so far holds it
PASSED = "pass"  # a layers.json row's status when its layer passed (fanout/records.py's PASS)


def fingerprint(*parts: Any) -> str:
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def export_stamp(target: str, weights: str | Path, options: dict,
                 check_options: Optional[dict], layer: Address) -> str:
    files = {k: weights_version(f) for k, f in lossy.files(options).items()}
    return fingerprint(STAMPED, target, weights_version(weights), files, lossy.as_json(options),
                       check_options, layer)


def checked_layer(root: str | Path, target: str, weights: str | Path, options: dict,
                  layer: Address) -> Optional[Path]:
    """DIR/layer-{L} where DIR's layers.json says it passed, made by ``target`` from these
    weights and export options: what ``eval --exports DIR`` reuses; else None (a damaged
    layers.json too)."""
    summary = layers_summary(root)
    row = next((r for r in summary.get("layers", []) if isinstance(r, dict)
                and r.get("layer") == layer and r.get("status") == PASSED), None)
    if row is None or row.get("fingerprint") != export_stamp(
            target, weights, options, summary.get("check_options"), layer):
        return None
    folder = Path(root) / str(row.get("folder") or "")
    return folder if row.get("folder") and folder.is_dir() else None


def layers_summary(root: str | Path) -> dict:
    """DIR/layers.json as written (``{}`` where there is none, or none readable)."""
    try:
        data = json.loads((Path(root) / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and isinstance(data.get("layers"), list) else {}
