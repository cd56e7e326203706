"""Compare one output against an expected one: a small result object, elementwise tolerances.

An element passes when |actual - expected| <= atol + rtol * |expected| (numpy.allclose's rule).
Any NaN or Inf in the output is a failure, never a pass.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float

    def __str__(self) -> str:
        return f"atol {self.atol:g}, rtol {self.rtol:g}"


@dataclass(frozen=True)
class Comparison:
    passed: bool
    max_abs: float
    mean_abs: float
    p99_abs: float
    max_rel: float
    nonfinite: int  # NaN/Inf count in the output
    worst_index: tuple  # index of the element furthest outside tolerance
    reason: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def compare(actual: np.ndarray, expected: np.ndarray, tol: Tolerance) -> Comparison:
    actual = np.asarray(actual)
    expected = np.asarray(expected, dtype=np.float64)
    if actual.shape != expected.shape:
        return Comparison(False, float("inf"), float("inf"), float("inf"), float("inf"), 0, (),
                          f"shape {list(actual.shape)} != expected {list(expected.shape)}")
    a = actual.astype(np.float64)
    nonfinite = int(a.size - np.isfinite(a).sum())
    if nonfinite or not np.isfinite(expected).all():
        where = "output" if nonfinite else "expected output"
        return Comparison(False, float("nan"), float("nan"), float("nan"), float("nan"), nonfinite,
                          (), f"non-finite values (NaN/Inf) in the {where}")
    if a.size == 0:
        return Comparison(True, 0.0, 0.0, 0.0, 0.0, 0, ())
    err = np.abs(a - expected)
    excess = err - (tol.atol + tol.rtol * np.abs(expected))
    worst = np.unravel_index(int(np.argmax(excess)), err.shape)
    rel = err / np.maximum(np.abs(expected), np.finfo(np.float32).tiny)
    passed = bool(excess.max() <= 0)
    reason = "" if passed else (f"{int((excess > 0).sum())} of {err.size} elements outside "
                                f"{tol}; worst at {tuple(int(i) for i in worst)}")
    return Comparison(passed, float(err.max()), float(err.mean()),
                      float(np.quantile(err, 0.99)), float(rel.max()), 0,
                      tuple(int(i) for i in worst), reason)
