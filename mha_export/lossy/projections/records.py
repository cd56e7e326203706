"""The projections' quantizers, by the name an artifact's quantize record gives
(``"quantizer"``): round to nearest (rtn.py) and a GGUF's kept blocks (source.py).
A new quantizer is a module with its spec class (``forms``, ``requantizes``, ``label``,
``to_dict`` / ``from_dict``) and one entry here."""
from __future__ import annotations

from typing import Any

from ...errors import UsageError
from .rtn import QuantSpec
from .source import SOURCE, SourceQuantSpec

QUANTIZERS = {"rtn": QuantSpec, SOURCE: SourceQuantSpec}
RECORD_ONLY = ("format", "projections", "arithmetic")  # written beside an RTN spec, not part of it


def quant_spec_from_record(record: dict) -> Any:
    """The spec an artifact (or a bench run) recorded."""
    name = record.get("quantizer", "rtn")
    if name not in QUANTIZERS:
        raise UsageError(f"unknown quantizer {name!r} (known: {', '.join(QUANTIZERS)})")
    if name == "rtn":
        record = {k: v for k, v in record.items() if k not in RECORD_ONLY}
    return QUANTIZERS[name].from_dict(record)
