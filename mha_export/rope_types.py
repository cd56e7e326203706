"""Rope scaling types: Hugging Face's ``rope_scaling`` / ``rope_parameters`` dict checked and
completed without torch (an ONNX Runtime benchmark worker reads configs and never imports it),
and the scalar parts of their math — attention factors, YaRN's ramp bounds — exactly as
transformers 5.23 computes them (``modeling_rope_utils``); ``layer/rotary.py`` builds the tables.

The dict a config stores is self-contained: nothing is read from config.json later. Where
transformers derives a value from ``max_position_embeddings``, the caller writes it in:

* yarn ``factor`` (required): transformers takes ``max_position_embeddings /
  original_max_position_embeddings`` when config.json's factor is null;
* longrope ``factor`` (or ``attention_factor``): the same ratio when config.json omits factor
  (Phi-3: 131072 / 4096); it only sets the attention factor.

``original_max_position_embeddings`` is required for yarn and longrope: transformers falls back
to ``max_position_embeddings`` when it is missing, and Phi-3 reads it from the config's top
level in preference to the dict's — the caller resolves both.
"""
from __future__ import annotations

import math
from typing import Any, Optional

from .errors import UsageError

SCALINGS = ("default", "linear", "llama3", "yarn", "longrope", "proportional")
# Required fields: numbers > 0 (yarn's and longrope's original_max_position_embeddings: integers;
# longrope also needs short_factor and long_factor: lists of rotary_dim / 2 numbers > 0).
SCALING_FIELDS = {
    "default": (), "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings"),
    "longrope": ("original_max_position_embeddings",),
    # Gemma 4: the first partial_rotary_factor of the head's frequencies (over the whole head
    # width), the rest 0 (those features pass unrotated), all divided by factor
    "proportional": (),
}
# Optional fields with transformers' defaults (None: absent, the field is then left out).
OPTIONAL_FIELDS: dict[str, dict[str, Any]] = {
    "yarn": {"beta_fast": 32.0, "beta_slow": 1.0, "mscale": None, "mscale_all_dim": None,
             "attention_factor": None, "truncate": True},
    # short_mscale / long_mscale (Phi-MoE): the attention factor of each table
    "longrope": {"factor": None, "attention_factor": None, "short_mscale": None,
                 "long_mscale": None},
    "proportional": {"partial_rotary_factor": 1.0, "factor": 1.0},
}
FACTOR_LISTS = ("short_factor", "long_factor")  # longrope


def normalized_scaling(scaling: Optional[dict], rotary_dim: Optional[int] = None
                       ) -> Optional[dict]:
    """Hugging Face's rope_scaling dict checked: the type under "rope_type" (4.x wrote "type"),
    one of SCALINGS, its required fields present, finite and > 0, optional ones valid and
    defaulted as transformers does, longrope's factor lists of rotary_dim / 2 entries (when
    rotary_dim is given). None for no scaling. Idempotent."""
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise UsageError(f"rope_scaling must be a JSON object, got {scaling!r}")
    scaling = dict(scaling)
    kind = scaling.pop("rope_type", None) or scaling.pop("type", None)
    scaling.pop("type", None)
    if kind is None:
        raise UsageError(f"rope_scaling needs a rope_type ({', '.join(SCALINGS)}), got {scaling}")
    if kind not in SCALINGS:
        raise UsageError(f"unsupported rope scaling type {kind!r} (supported: "
                         f"{', '.join(SCALINGS)})")
    for name in SCALING_FIELDS[kind]:
        _check_number(kind, name, scaling.get(name))
    if kind == "llama3" and scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
        raise UsageError("rope scaling 'llama3' needs high_freq_factor > low_freq_factor")
    if kind in ("yarn", "longrope"):
        scaling["original_max_position_embeddings"] = _integer(
            kind, "original_max_position_embeddings", scaling["original_max_position_embeddings"])
    if kind in OPTIONAL_FIELDS:
        _optional_fields(kind, scaling)
    if kind == "longrope":
        _longrope_fields(scaling, rotary_dim)
    return None if kind == "default" else {"rope_type": kind, **scaling}


def _check_number(kind: str, name: str, value: Any, minimum: float = 0.0,
                  strict: bool = True) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and (value > minimum if strict else value >= minimum)):
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise UsageError(f"rope scaling {kind!r} needs {name} {bound}, got {value!r}")


def _integer(kind: str, name: str, value: Any) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UsageError(f"rope scaling {kind!r} needs {name}: a positive integer, got {value!r}")
    return value


def _optional_fields(kind: str, scaling: dict) -> None:
    """In place: absent or null optional fields take transformers' default (or are left out)."""
    for name, default in OPTIONAL_FIELDS[kind].items():
        value = scaling.get(name)
        if name == "truncate":  # transformers: rope_parameters.get("truncate", True), then `if`
            if name in scaling and value is not None and not isinstance(value, bool):
                raise UsageError(f"rope scaling {kind!r} needs truncate: true or false, "
                                 f"got {value!r}")
            scaling[name] = bool(value) if name in scaling else default
        elif value is None or (name.startswith("beta") and value == 0):  # `get(...) or 32`
            scaling.pop(name, None)
            if default is not None:
                scaling[name] = default
        else:  # mscale / mscale_all_dim 0 count as absent in transformers (`if mscale and ...`)
            _check_number(kind, name, value, strict=not name.startswith("mscale"))


def _longrope_fields(scaling: dict, rotary_dim: Optional[int]) -> None:
    """In place: short_factor / long_factor as lists of floats; factor or attention_factor."""
    want = None if rotary_dim is None else rotary_dim // 2
    for name in FACTOR_LISTS:
        value = scaling.get(name)
        if not isinstance(value, (list, tuple)) or not value or any(
                isinstance(v, bool) or not isinstance(v, (int, float))
                or not (math.isfinite(v) and v > 0) for v in value):
            raise UsageError(f"rope scaling 'longrope' needs {name}: a list of numbers > 0, "
                             f"got {_short(value)}")
        if want is not None and len(value) != want:
            raise UsageError(f"rope scaling 'longrope' needs {name} of rotary_dim / 2 = {want} "
                             f"numbers, got {len(value)}")
        scaling[name] = [float(v) for v in value]
    if "factor" not in scaling and "attention_factor" not in scaling:
        raise UsageError("rope scaling 'longrope' needs factor (max_position_embeddings / "
                         "original_max_position_embeddings) or attention_factor")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# --- scalar math, as transformers' _compute_{yarn,longrope}_parameters ------------------------

def attention_factor(scaling: Optional[dict]) -> float:
    """The factor that multiplies cos and sin (transformers' attention_scaling): 1.0 unless
    yarn or longrope. ``scaling`` as normalized_scaling returns it."""
    kind = (scaling or {}).get("rope_type", "default")
    if kind not in ("yarn", "longrope"):
        return 1.0
    given = scaling.get("attention_factor")
    if kind == "longrope" and scaling.get("short_mscale") is not None:
        given = scaling["short_mscale"]  # Phi-MoE: the short table's factor
    if given is not None:
        return float(given)
    factor = scaling.get("factor")
    if kind == "longrope":
        if factor <= 1.0:
            return 1.0
        original = scaling["original_max_position_embeddings"]
        return math.sqrt(1 + math.log(factor) / math.log(original))
    mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return float(_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim))
    return _yarn_mscale(factor)


def long_attention_factor(scaling: Optional[dict]) -> float:
    """longrope: the factor while the long table is in use (long_mscale where given)."""
    given = (scaling or {}).get("long_mscale")
    return attention_factor(scaling) if given is None else float(given)


def _yarn_mscale(scale: float, mscale: float = 1) -> float:
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def yarn_ramp_bounds(rotary_dim: int, theta: float, scaling: dict) -> tuple[float, float]:
    """YaRN's correction range (low, high) in frequency indices: below low the frequencies are
    kept (extrapolation), above high divided by factor (interpolation), linear in between."""
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1
    original = scaling["original_max_position_embeddings"]
    low = _correction_dim(beta_fast, rotary_dim, theta, original)
    high = _correction_dim(beta_slow, rotary_dim, theta, original)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, rotary_dim - 1)


def _correction_dim(rotations: float, dim: int, base: float, original: int) -> float:
    """The dimension whose wavelength fits ``rotations`` turns in ``original`` positions."""
    return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))


def switch_length(scaling: Optional[dict]) -> int:
    """The call length where longrope changes tables (max(position_ids) + 1 beyond it: long
    factors); 0 for every other type."""
    if scaling and scaling.get("rope_type") == "longrope":
        return int(scaling["original_max_position_embeddings"])
    return 0
