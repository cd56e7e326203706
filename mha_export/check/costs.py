"""What each lossy step of an artifact cost, measured apart from the runners' kernel parity:
each compares two eager layers in fp64 on the check's own inputs, and fails only against a
budget the user sets (a NaN or empty measurement never passes).

- ``QuantizationCost``: quantized projections — the dequantized layer vs the unquantized one
  (both with a float cache), over the sweep's single calls.
- ``KVCacheCost``: an int8 cache — the layer quantizing on write / dequantizing on read vs the
  same layer with a float cache, over the generate and ragged scenarios; and how often the
  written keys and values were clipped (beyond the calibrated scales), over the whole sweep.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import numpy as np
import torch

from ..artifact import Artifact
from ..errors import UsageError
from ..signature import INT8, STATIC, make_signature
from .comparator import Deviation, deviation, worst
from .runners import Feeds
from .runners.pytorch import EagerRunner
from .sweep import Case, positions

CACHE_OUTPUTS = {"present_key": "key", "present_value": "value"}


def within(value: float, budget: Optional[float]) -> bool:
    """A measured figure passes: finite (a NaN or empty measurement never does), and within
    the budget where one is set."""
    return bool(np.isfinite(value) and (budget is None or value <= budget))


def _budget(name: str, value: Optional[float], applies: bool, why_not: str) -> None:
    """A budget must be a finite number >= 0, and given only where it measures something."""
    if value is None:
        return
    if not (value >= 0 and np.isfinite(value)):
        raise UsageError(f"{name} must be a finite number >= 0, got {value}")
    if not applies:
        raise UsageError(f"{name}: {why_not}")


def float_cache_feeds(artifact: Artifact, feeds: Feeds) -> Feeds:
    """An int8 cache's inputs for the same layer with a float cache: its codes dequantized."""
    spec = artifact.kv_cache
    if spec is None:
        return feeds
    return {**feeds, "past_key": spec.key.dequantize(feeds["past_key"]),
            "past_value": spec.value.dequantize(feeds["past_value"])}


def _float_cache_layer(artifact: Artifact, module) -> EagerRunner:
    """``module`` (a float cache) run in fp64 by the static signature with float buffers."""
    sig = make_signature(artifact.config, STATIC) if artifact.kv_cache else artifact.signature
    return EagerRunner(sig, module, torch.float64)


@dataclass
class QuantizationError:
    """What quantizing the projections cost, for one output: the dequantized layer (the
    function the file holds) against the unquantized source layer, both in fp64, worst over the
    sweep's cases. A kernel question (does the runtime compute what the file holds) is the
    runners' rows; this is the other question, judged only against a budget the user sets."""

    output: str
    spec: str  # e.g. "int4 block 32 symmetric, fp32 compute (accuracy level 1)"
    deviation: Deviation
    budget: Optional[float]  # the largest rel allowed (--max-quant-error); None: reported only
    passed: bool


class QuantizationCost:
    """Collects, case by case, how far the dequantized layer (the check's fp64 reference) is
    from the unquantized source layer run in fp64 on the same inputs; a failure only over the
    budget (``max_quant_error``: max|d| / max|y| per output)."""

    def __init__(self, artifact: Artifact, budget: Optional[float]):
        self.artifact, self.spec, self.budget = artifact, artifact.quantization, budget
        self.source = _float_cache_layer(artifact, artifact.load_unquantized_module())
        # an int8 cache: the dequantized layer with a float cache, fed the codes dequantized
        # (what the cache costs is KVCacheCost's, apart)
        self.lossy = _float_cache_layer(artifact, artifact.load_source_module(
            float_cache=True)) if artifact.kv_cache else None
        self.deviations: dict[str, list[Deviation]] = {
            n: [] for n in artifact.signature.output_names}

    @classmethod
    def of(cls, artifact: Artifact, budget: Optional[float]) -> Optional["QuantizationCost"]:
        """None for an unquantized artifact (where a budget is bad input)."""
        _budget("--max-quant-error", budget, artifact.quantization is not None,
                f"{artifact.path} has no quantized projections (export with --quantize "
                "int4|int8)")
        return None if artifact.quantization is None else cls(artifact, budget)

    def add(self, feeds: Feeds, dequantized: Feeds, valid: dict) -> None:
        """``dequantized``: the check's fp64 reference on ``feeds`` (re-run here with a float
        cache when the artifact's cache is int8)."""
        if self.lossy is not None:
            feeds = float_cache_feeds(self.artifact, feeds)
            dequantized = self.lossy.run(feeds)
        unquantized = self.source.run(feeds)
        for n, found in self.deviations.items():
            found.append(deviation(dequantized[n], unquantized[n], valid.get(n)))

    def results(self) -> list[QuantizationError]:
        out = []
        for n, found in self.deviations.items():
            d = worst(found)
            out.append(QuantizationError(n, self.spec.label(), d, self.budget,
                                         within(d.rel, self.budget)))
        return out


@dataclass
class KVCacheError:
    """What an int8 cache cost: y of the int8-cache layer vs the float-cache layer (same
    weights, fp64, worst over the multi-call scenarios), and the fraction of written keys and
    values that fell beyond the calibrated scales (clipped), over every call of the sweep."""

    spec: str  # e.g. "int8 cache, keys per channel, values per tensor, scales from ..."
    synthetic: bool  # scales calibrated on random inputs, not the model's hidden states
    deviation: Deviation
    budget: Optional[float]  # --max-kv-error: the largest rel allowed; None: reported only
    clip_rates: dict = field(default_factory=dict)  # {"present_key": fraction, ...}
    clip_budget: Optional[float] = None  # --max-clip-rate

    @property
    def error_passed(self) -> bool:
        return within(self.deviation.rel, self.budget)

    def clip_passed(self, output: str) -> bool:
        return within(self.clip_rates[output], self.clip_budget)

    @property
    def passed(self) -> bool:
        return self.error_passed and all(self.clip_passed(n) for n in self.clip_rates)

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


class KVCacheCost:
    """Collects an int8 cache's error (``add_scenario``) and clip counts (``add_call``)."""

    def __init__(self, artifact: Artifact, budget: Optional[float],
                 clip_budget: Optional[float]):
        self.spec, self.budget, self.clip_budget = artifact.kv_cache, budget, clip_budget
        self.float_layer = _float_cache_layer(artifact, artifact.load_source_module(
            float_cache=True))
        self.deviations: list[Deviation] = []
        self.clipped = {n: [0, 0] for n in CACHE_OUTPUTS}  # output -> [clipped, written]

    @classmethod
    def of(cls, artifact: Artifact, budget: Optional[float],
           clip_budget: Optional[float]) -> Optional["KVCacheCost"]:
        """None for a float cache (where either budget is bad input)."""
        why = f"{artifact.path} has no int8 cache (export with --kv-cache-dtype int8)"
        _budget("--max-kv-error", budget, artifact.kv_cache is not None, why)
        _budget("--max-clip-rate", clip_budget, artifact.kv_cache is not None, why)
        if artifact.signature.cache_dtype != INT8:
            return None
        return cls(artifact, budget, clip_budget)

    def add_call(self, x: np.ndarray, position_ids: np.ndarray,
                 real: Optional[np.ndarray] = None) -> None:
        """Count the clipped entries among the keys and values a call of x (B, T, d_in) at
        position_ids (B, T) writes; ``real`` (B, T): only those tokens (the rest is padding)."""
        layer = self.float_layer.source
        with torch.inference_mode():
            k, v = layer.keys_values(torch.from_numpy(x).to(torch.float64),
                                     torch.from_numpy(position_ids))  # (B, K, T, H) each
        for name, entries, scale in (("present_key", k, self.spec.key),
                                     ("present_value", v, self.spec.value)):
            kept = entries.numpy().transpose(0, 2, 1, 3)  # (B, T, K, H)
            kept = kept if real is None else kept[real.astype(bool)]
            kept = kept.reshape(1, -1, *kept.shape[-2:]).transpose(0, 2, 1, 3)  # (1, K, n, H)
            self.clipped[name][0] += scale.clipped_count(kept)
            self.clipped[name][1] += kept.size

    def add_case(self, feeds: Feeds, case: Case) -> None:
        """A single call of the sweep: row b's tokens at past_lengths[b] + i (or its
        position_ids)."""
        pos = feeds.get("position_ids")
        if pos is None:
            pos = feeds["past_lengths"][:, None] + np.arange(case.seq)
        self.add_call(feeds["x"], pos)

    def add_scenario(self, x: np.ndarray, mask: np.ndarray, int8_y: np.ndarray,
                     truth: Callable[[EagerRunner], Feeds]) -> None:
        """A multi-call scenario: ``int8_y``, the int8-cache reference's y; ``truth`` runs a
        layer through it as the check's truth does."""
        float_y = truth(self.float_layer)["y"]
        self.deviations.append(deviation(int8_y, float_y, (mask == 1)[:, :, None]))
        self.add_call(x, positions(mask), mask == 1)

    def result(self) -> KVCacheError:
        rates = {n: (c / total if total else float("nan")) for n, (c, total)
                 in self.clipped.items()}
        return KVCacheError(self.spec.label(), self.spec.synthetic, worst(self.deviations),
                            self.budget, rates, self.clip_budget)

