"""An int8 cache's static scales, calibrated once at export from the layer's own keys (after q/k
norm and rotary) and values over hidden states: a file of real ones (``--calibration``:
[n, T, d_in] as .npy or .safetensors, e.g. captured from the model's previous layer), or, without
one, synthetic standard-normal inputs — which the artifact and the check's report then say,
because a real model's hidden states have outlier channels that random ones do not.

Keys are scaled per channel (q/k norm and the projections give channels very different ranges),
each rotary pair by its norm (a rotated channel's range depends on the position); values per
tensor (measured: docs/kv-cache.md) or per channel (``value``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ...config import MHAConfig
from ...errors import UsageError
from ...layer.base import AttentionBase
from .codes import (GRANULARITIES, KEY_GRANULARITY, VALUE_SCALE, KVCacheSpec, channel_max,
                       scale_from_max)

SYNTHETIC_ROWS, SYNTHETIC_TOKENS = 4, 256
SYNTHETIC = f"synthetic: {SYNTHETIC_ROWS} x {SYNTHETIC_TOKENS} standard-normal tokens"
ROWS_PER_CALL = 8  # calibration rows run at once (bounded memory for a long file)


def read_hidden_states(path: str | Path, d_in: int, layer: Optional[int] = None) -> np.ndarray:
    """[n, T, d_in] float hidden states from a .npy file or a .safetensors file holding one
    tensor (or one named hidden_states, or — a file of ``mha-export capture`` — the layer's own
    ``layers.{layer}.x``); anything else is bad input."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"--calibration: no such file {path}")
    if path.suffix not in (".npy", ".safetensors"):
        raise UsageError(f"--calibration: expected a .npy or .safetensors file, got {path.name}")
    try:
        x = _load_hidden_states(path, layer)
    except UsageError:
        raise
    except Exception as e:  # an empty, corrupt or foreign file: numpy's and safetensors' errors
        raise UsageError(f"--calibration: cannot read {path}: {type(e).__name__}: "
                         f"{str(e).strip()[:200]}") from None
    if not isinstance(x, np.ndarray) or x.ndim != 3 or x.shape[2] != d_in or not x.size:
        shape = list(x.shape) if isinstance(x, np.ndarray) else type(x).__name__
        raise UsageError(f"--calibration: hidden states must be [n, T, d_in={d_in}], got {shape}")
    if x.dtype.kind != "f" or not np.isfinite(x).all():
        raise UsageError("--calibration: hidden states must be finite floats")
    return x.astype(np.float32)


def _load_hidden_states(path: Path, layer: Optional[int]):
    if path.suffix == ".npy":
        return np.load(path, allow_pickle=False)
    from safetensors.numpy import load_file
    tensors = load_file(str(path))
    captured = {k: v for k, v in tensors.items() if k.startswith("layers.") and k.endswith(".x")}
    if captured:  # mha-export capture's file: this layer's input (or its only layer's)
        key = f"layers.{layer}.x" if layer is not None else (
            next(iter(captured)) if len(captured) == 1 else None)
        if key not in captured:
            wanted = f"layers.{layer}.x" if layer is not None else "one layer's input"
            raise UsageError(f"--calibration: {path.name} holds {', '.join(sorted(captured))}, "
                             f"not {wanted}")
        return captured[key]
    if "hidden_states" not in tensors and len(tensors) != 1:
        raise UsageError(f"--calibration: {path} holds {len(tensors)} tensors; name the one to "
                         "use hidden_states")
    return tensors.get("hidden_states", next(iter(tensors.values()), None))


def synthetic_hidden_states(d_in: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng([seed, 24])
    return rng.standard_normal((SYNTHETIC_ROWS, SYNTHETIC_TOKENS, d_in)).astype(np.float32)


def cache_entries(module: AttentionBase, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The keys (after q/k norm and rotary, at positions 0 .. T-1) and values the layer writes
    for hidden states [n, T, d_in]: (n, K, T, H) each, in float32."""
    x = torch.from_numpy(hidden)  # (n, T, d_in)
    positions = torch.arange(x.size(1)).expand(x.size(0), x.size(1))  # (n, T)
    with torch.inference_mode():
        k, v = module.keys_values(x.to(next(module.parameters()).dtype), positions)
    return k.float().numpy(), v.float().numpy()


def calibrate_cache(module: AttentionBase, calibration: Optional[str | Path] = None,
                    value: str = VALUE_SCALE, seed: int = 0,
                    layer: Optional[int] = None) -> KVCacheSpec:
    """The int8 cache's scales for this layer: keys per channel (rotary pairs by their norm),
    values per ``value``, each mapping the largest |entry| seen to 127. A file is read in
    chunks of rows: only each channel's running maximum is kept."""
    if value not in GRANULARITIES:
        raise UsageError(f"unknown value scale {value!r}: choose one of "
                         f"{', '.join(GRANULARITIES)}")
    d_in = module.config.d_in
    if calibration is None:
        hidden, source, synthetic = synthetic_hidden_states(d_in, seed), SYNTHETIC, True
    else:
        hidden = read_hidden_states(calibration, d_in, layer)
        source = f"file: {Path(calibration).name} ({hidden.shape[0]} x {hidden.shape[1]} tokens)"
        synthetic = False
    partners = rotary_partners(module.config)
    keys = values = None
    for start in range(0, hidden.shape[0], ROWS_PER_CALL):
        k, v = cache_entries(module, hidden[start:start + ROWS_PER_CALL])
        keys = _maximum(keys, channel_max(k, partners))  # (1, K, 1, H)
        values = _maximum(values, channel_max(v))
    return KVCacheSpec(scale_from_max(keys, KEY_GRANULARITY), scale_from_max(values, value),
                       source, synthetic)


def _maximum(a: Optional[np.ndarray], b: np.ndarray) -> np.ndarray:
    return b if a is None else np.maximum(a, b)


def rotary_partners(c: MHAConfig) -> np.ndarray | None:
    """(H,) the channel each key channel rotates with (-1: not rotated), or None without
    rotary: half (GPT-NeoX: i <-> i + rd/2) or interleaved (GPT-J: 2i <-> 2i + 1) over the
    first rotary_dim channels."""
    if c.rotary == "none":
        return None
    partners = np.full(c.head_dim, -1)
    i = np.arange(c.rotary_dim)
    partners[:c.rotary_dim] = (i ^ 1 if c.rotary == "interleaved"
                               else (i + c.rotary_dim // 2) % c.rotary_dim)
    return partners
