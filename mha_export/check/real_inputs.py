"""Real layer inputs as check cases (``check --inputs FILE``): the file ``mha-export capture``
writes, ``layers.{L}.x`` float32 (S, N, d_in) — layer L's attention input (the hidden states
after its input norm) on S sequences of N tokens of a real text.

Each artifact call kind gets the real sequences the way it is used:

    every kind       one call over all S x N tokens (no padding; an empty cache)
    growing cache    and: prefill N - 4 tokens, then 4 single-token steps, carrying the cache
    static cache     and: the same into one app-owned buffer, written in place

and every case is labelled ``real inputs`` in the report and the JSON (``inputs: "real"``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from ..address import Address, address_key, parse_address
from ..artifact import Artifact
from ..errors import UsageError
from .sweep import Case

STEPS = 4  # single-token decode steps after the real prefill


@dataclass(frozen=True)
class RealInputs:
    path: str
    layer: Address
    x: np.ndarray  # (S, N, d_in) float32

    def cases(self, has_cache: bool, static: bool) -> list[tuple[Case, Optional[list[int]]]]:
        """(case, call lengths) — None: one call (where the lossy steps' costs are measured)."""
        s, n = self.x.shape[:2]
        one_call = [(Case(s, n, inputs="real"), None)]
        if not has_cache:
            return one_call
        split = [n - STEPS] + [1] * STEPS
        name = ("static generate " if static else "generate ") + "+".join(map(str, split))
        return one_call + [(Case(s, n, 0, "none", name, inputs="real"), split)]


def read_real_inputs(path: str | Path, artifact: Artifact) -> RealInputs:
    """The captured input of the artifact's own layer (weights.source.layer), or the file's
    only layer for an artifact without one; bad input is one UsageError line."""
    from safetensors import SafetensorError, safe_open
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"--inputs: {path} not found")
    try:
        with safe_open(str(path), "np") as f:
            arrays = {k: f.get_tensor(k) for k in f.keys() if _layer_of(k) is not None}
    except (SafetensorError, OSError, ValueError) as e:
        raise UsageError(f"--inputs: {path} is not a readable safetensors file "
                         f"({str(e).splitlines()[0][:200]})") from None
    layers = {_layer_of(k): v for k, v in arrays.items()}
    if not layers:
        raise UsageError(f"--inputs: {path} holds no layers.{{L}}.x tensors "
                         "(write one with mha-export capture)")
    layer = _wanted_layer(artifact, layers, path)
    x = layers[layer]
    d_in = artifact.config.d_in
    if x.ndim != 3 or x.shape[-1] != d_in or x.shape[1] <= STEPS:
        raise UsageError(f"--inputs: layers.{layer}.x is {list(x.shape)}; this layer takes "
                         f"[sequences, tokens > {STEPS}, {d_in}]")
    if not np.isfinite(x).all():
        raise UsageError(f"--inputs: layers.{layer}.x holds NaN or Inf")
    return RealInputs(str(path), layer, np.ascontiguousarray(x, dtype=np.float32))


def _layer_of(key: str) -> Optional[Address]:
    """The layer address of a captured tensor's key: layers.5.x -> 5, layers.3.1.x -> "3.1"."""
    parts = key.split(".")
    if len(parts) not in (3, 4) or parts[0] != "layers" or parts[-1] != "x":
        return None
    try:
        return parse_address(".".join(parts[1:-1]))
    except ValueError:
        return None


def _listed(layers: dict) -> list[Address]:
    return sorted(layers, key=address_key)


def _wanted_layer(artifact: Artifact, layers: dict, path: Path) -> Address:
    source = artifact.meta.get("weights", {}).get("source", {})
    layer = source.get("layer") if isinstance(source, dict) else None
    if layer is None:
        if len(layers) == 1:
            return next(iter(layers))
        raise UsageError(f"--inputs: {path} holds layers {_listed(layers)}; this artifact "
                         "records no source layer to pick one")
    if layer not in layers:
        raise UsageError(f"--inputs: {path} holds layers {_listed(layers)}, not this "
                         f"artifact's layer {layer}")
    return layer
