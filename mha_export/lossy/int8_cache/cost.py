"""What an int8 cache cost (lossy/base.py's ``Cost``): the layer quantizing on write /
dequantizing on read vs the same layer with a float cache, over the generate and ragged
scenarios; and how often the written keys and values were clipped (beyond the calibrated
scales), over the whole sweep. Also how the check reads an int8 artifact: y judged over each
runtime's own codes (given_codes.py), the codes compared as codes."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

import numpy as np
import torch

from ...comparison.comparator import FP32, Deviation, Tolerance, deviation, worst
from ...comparison.runner import Feeds, positions
from ...comparison.torch_runners import EagerRunner
from ...signature import INT8, STATIC, make_signature
from ..base import CheckedArtifact, Cost, check_budget, verdict, within
from .given_codes import GivenCodes
from .step import STEP

CACHE_OUTPUTS = {"present_key": "key", "present_value": "value"}
# The codes (present_key / present_value): the runtime's keys differ from eager's in the last
# bits, so an entry on a rounding tie may land one code away; more than one code, or more than
# 0.1% of entries changed, is a wrong write (floor instead of round: ~50% changed).
INT8_CODES = Tolerance(atol=1.0, rtol=0.0, changed=1e-3)


def float_cache_feeds(artifact: CheckedArtifact, feeds: Feeds) -> Feeds:
    """An int8 cache's inputs for the same layer with a float cache: its codes dequantized."""
    spec = artifact.spec(STEP.name)
    if spec is None:
        return feeds
    return {**feeds, "past_key": spec.key.dequantize(feeds["past_key"]),
            "past_value": spec.value.dequantize(feeds["past_value"])}


def float_cache_layer(artifact: CheckedArtifact, module) -> EagerRunner:
    """``module`` (a float cache) run in fp64 by the static signature with float buffers."""
    cached = artifact.spec(STEP.name) is not None
    sig = make_signature(artifact.config, STATIC) if cached else artifact.signature
    return EagerRunner(sig, module, torch.float64)


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


class KVCacheCost(Cost):
    """Collects an int8 cache's error (``add_scenario``) and clip counts (every call)."""

    field, empty, title = "kv_cache", None, "int8 KV cache"
    over = "the generate and ragged scenarios"
    budgets = {"max_kv_error": "int8-cache artifacts: fail (exit 1) when the int8 cache cost "
                               "more than this max|d| / max|y| on y over the generate and "
                               "ragged scenarios (vs the same layer with a float cache) "
                               "[default: reported only].",
               "max_clip_rate": "int8-cache artifacts: fail (exit 1) when more than this "
                                "fraction of the keys or values written in the sweep fell "
                                "beyond the calibrated scales (clipped) [default: reported "
                                "only]."}

    def __init__(self, artifact: CheckedArtifact, budget: Optional[float],
                 clip_budget: Optional[float]):
        self.spec, self.budget, self.clip_budget = artifact.spec(STEP.name), budget, clip_budget
        self.float_layer = float_cache_layer(artifact, artifact.load_source_module(
            without=(STEP.name,)))
        self.deviations: list[Deviation] = []
        self.clipped = {n: [0, 0] for n in CACHE_OUTPUTS}  # output -> [clipped, written]

    @classmethod
    def of(cls, artifact: CheckedArtifact, budgets: dict) -> Optional["KVCacheCost"]:
        cached = artifact.spec(STEP.name) is not None
        why = f"{artifact.path} has no int8 cache (export with --kv-cache-dtype int8)"
        check_budget("--max-kv-error", budgets.get("max_kv_error"), cached, why)
        check_budget("--max-clip-rate", budgets.get("max_clip_rate"), cached, why)
        if artifact.signature.cache_dtype != INT8:
            return None
        return cls(artifact, budgets.get("max_kv_error"), budgets.get("max_clip_rate"))

    @classmethod
    def given(cls, artifact: CheckedArtifact, baseline, reference: EagerRunner
              ) -> Optional[GivenCodes]:
        """y judged over each runtime's own codes (given_codes.py)."""
        return GivenCodes(baseline, reference) if artifact.signature.cache_dtype == INT8 \
            else None

    @classmethod
    def tolerance(cls, artifact: CheckedArtifact, output: str, default: Tolerance
                  ) -> Optional[Tolerance]:
        """The codes compared as codes: INT8_CODES (one code, rarely); for a runner whose
        arithmetic errs with the output's scale (quantized projections at int8 activations:
        keys off by ~1e-2 of their range, ~1 code, often), that error in codes — scaled x
        max|code| — with no count of changed entries: its fp32-compute twin holds the same
        file's codes to INT8_CODES. Never overridden by --atol / --rtol."""
        if artifact.signature.cache_dtype != INT8 or output not in CACHE_OUTPUTS:
            return None
        if default.scaled > FP32.scaled:  # lossy arithmetic, beyond fp32's rounding
            return Tolerance(INT8_CODES.atol, 0.0, scaled=default.scaled)
        return INT8_CODES

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

    def add_case(self, feeds: Feeds, reference: dict, valid: dict, case: Any) -> None:
        """A single call of the sweep: row b's tokens at past_lengths[b] + i (or its
        position_ids)."""
        pos = feeds.get("position_ids")
        if pos is None:
            pos = feeds["past_lengths"][:, None] + np.arange(case.seq)
        self.add_call(feeds["x"], pos)

    def add_scenario(self, x: np.ndarray, mask: np.ndarray, reference_y: np.ndarray,
                     truth: Callable[[EagerRunner], Feeds]) -> None:
        """A multi-call scenario: ``reference_y``, the int8-cache reference's y; ``truth`` runs
        a layer through it as the check's truth does."""
        float_y = truth(self.float_layer)["y"]
        self.deviations.append(deviation(reference_y, float_y, (mask == 1)[:, :, None]))
        self.add_call(x, positions(mask), mask == 1)

    def result(self) -> KVCacheError:
        rates = {n: (c / total if total else float("nan")) for n, (c, total)
                 in self.clipped.items()}
        return KVCacheError(self.spec.label(), self.spec.synthetic, worst(self.deviations),
                            self.budget, rates, self.clip_budget)

    @staticmethod
    def lines(result: Optional[KVCacheError], over: str) -> list[str]:
        """What the int8 cache cost, apart from the runners' parity (which judges the runtime
        against the int8 function the file holds)."""
        if result is None:
            return []
        d = result.deviation
        lines = [f"int8 KV cache cost ({result.spec}): the int8-cache layer vs the float-cache "
                 f"layer, fp64, worst over {over}"]
        if result.synthetic:
            lines.append("  (scales calibrated on random inputs, not the model's hidden "
                         "states: export with --calibration FILE for real ones)")
        lines.append(f"  {'y':13s} max|d| {d.max_abs:.2e}  {d.rel:.2e} of max|y|  cosine "
                     f"{d.cosine:.6f}  "
                     f"{verdict(result.error_passed, result.budget, '--max-kv-error')}")
        for name, rate in result.clip_rates.items():
            judged = verdict(result.clip_passed(name), result.clip_budget, "--max-clip-rate",
                             percent=True)
            lines.append(f"  {name:13s} clipped {rate:.3%} of the entries written in the "
                         f"sweep  {judged}")
        return lines
