"""Compare one output against an expected one: a small result object, elementwise tolerances.

An element passes when |actual - expected| <= atol + rtol * |expected| (numpy.allclose's rule).
Any NaN or Inf in the output is a failure, never a pass. ``rel`` is the error relative to the
output's scale: max |actual - expected| / max |expected| (an element-by-element ratio explodes
where expected is near zero, and says nothing a person can act on).

An int64 output is a selection (a DSA layer's topk_indices (B, T, K): key positions; an int8
cache's codes are values, compared elementwise) and is compared as what it means: each row's set
of positions, in any order (ONNX TopK and torch.sort order equal scores differently; the
positions, not their order, decide what attention sees). Equal scores pick the same positions
in every runtime (the earlier key: ONNX TopK's rule and the eager stable sort), so the sets must
match, but for near-equal scores that float rounding orders differently: at most ``SWAPS`` rows
(or ``changed`` of the rows) may differ, each by one position at its k-th pick. A position
shifted, a wrong k-th pick in every row, a row missing a key: all fail. The figures count
positions: ``max_abs`` the most one row differs by.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    # + scaled * max|expected|: for arithmetic whose error follows the output's scale, not each
    # element's (int8 activations, quantized per block of their largest value)
    scaled: float = 0.0
    # the largest fraction of compared elements that may differ at all (None: no limit): int8
    # codes, where a value on a rounding tie may flip by one code, but rarely
    changed: Optional[float] = None

    def __post_init__(self) -> None:
        for name, v in (("atol", self.atol), ("rtol", self.rtol), ("scaled", self.scaled),
                        ("changed", 0.0 if self.changed is None else self.changed)):
            if not (v >= 0 and np.isfinite(v)):
                from ..errors import UsageError
                raise UsageError(f"{name} must be a finite number >= 0, got {v}")

    def __str__(self) -> str:
        scaled = f" + {self.scaled:g} max|y|" if self.scaled else ""
        changed = "" if self.changed is None else f", <= {self.changed:.2%} changed (or {TIES})"
        return f"atol {self.atol:g}{scaled}, rtol {self.rtol:g}{changed}"


# Default tolerances (applied to both comparisons: vs eager fp32 and vs the fp64 reference).
# fp32: elementwise atol 1e-5 / rtol 1e-4, plus 6e-5 of the output's scale (max|y|). fp32
# rounding follows the output's scale, not each element's: on SmolLM2-135M's 30 trained layers
# (N(0, 1) inputs, max|y| up to ~250) eager fp32 itself is 3.5e-6 to 2.0e-5 of max|y| from
# fp64, and ONNX Runtime's fp32 CPU run 3.2e-6 to 1.8e-5 (measured 2026-11-25, AMD EPYC:
# benchmarks/real_layers.py); 6e-5 is a 3x margin over that worst. A real defect is 1e-3 and
# more (a 1% change of one kv head's value rows: 7.3e-3 of max|y| on a real layer).
FP32 = Tolerance(atol=1e-5, rtol=1e-4, scaled=6e-5)
# CUDA may run fp32 MatMuls in TF32 (10-bit mantissa).
FP32_TF32 = Tolerance(atol=2e-3, rtol=1e-2)
# fp16 and bf16: the check's truth holds the file's rounded weights and inputs (lossy/
# half_weights: what rounding them cost is reported apart), so this is the half-precision
# arithmetic alone, whose error follows the output's scale. fp16: <= 7e-4 at 12 x 768 (CPU); on
# SmolLM2-135M's layer 5 (max|y| ~100) ORT CPU's y 1.2e-2 and keys 1.0e-3 of max|y| (full,
# kv-cache, static; measured 2026-11-27, AMD EPYC Zen 3): atol and rtol as before, plus 3e-2 of
# max|y| (a 2.6x margin).
FLOAT16 = Tolerance(atol=2e-3, rtol=2e-2, scaled=3e-2)
# bf16 (8-bit mantissa: eps 2^-8, 8x fp16's), a bfloat16 model or OpenVINO's bf16 arithmetic on
# AVX512_BF16 CPUs: y <= 8.6e-3 at 12 x 768 (OpenVINO, full / kv / static; the caches within one
# bf16 step of their values); on SmolLM2's layer 5, OpenVINO's y 5.4e-3 (full) and 1.9e-2
# (kv-cache, a 1030-token generation) of max|y|, keys 7.4e-3: plus 5e-2 of max|y| (2.7x).
BFLOAT16 = Tolerance(atol=3e-2, rtol=5e-2, scaled=5e-2)
# ONNX Runtime's MatMulNBits at accuracy level 4: activations quantized to int8 per block, an
# error that follows the output's scale. Measured against the same dequantized weights in fp64
# (int4 and int8, blocks 16-128, check inputs): max|d| / max|y| 1.1e-2 on y of 12 x 768 and a
# Qwen3-0.6B-shaped layer, 7.5e-3 on keys after q/k norm (where an elementwise rule fails on
# small entries), 4.5e-2 on a tiny phi3 checkpoint layer with 10x init weights (sharp attention
# amplifies the rounding). 0.1 x max|y| is a ~2.2x margin over that worst; the file's weights
# are proven at fp32 compute (ort-cpu-fp32-compute), tightly.
INT8_ACTIVATIONS = Tolerance(atol=1e-5, rtol=1e-4, scaled=0.1)
TIES = 4  # a tolerance with ``changed`` always allows this many (a small case's one flip)
# the tolerance of arithmetic in a half-precision model dtype, on any runtime
HALF_TOLERANCES = {"float16": FLOAT16, "bfloat16": BFLOAT16}
# a runner's tolerance_dtype when quantized projections really computed with int8 activations
INT8_ACTIVATION_DTYPE = "int8-activations"


def native_tolerance(dtype: str, options: object = None) -> Tolerance:
    """A CPU runtime's (ONNX Runtime's, ExecuTorch's): ``dtype`` the model's, or the runner's
    ``tolerance_dtype`` "int8-activations" when its quantized projections really computed
    with int8 activations (accuracy level 4)."""
    return {**HALF_TOLERANCES, INT8_ACTIVATION_DTYPE: INT8_ACTIVATIONS}.get(dtype, FP32)


def loosest(tolerances: list[Tolerance]) -> Tolerance:
    """Each bound at its loosest over ``tolerances``: arithmetic that had several lossy steps
    (bf16 and int8 activations) is held to the widest of them, never to the tightest."""
    changed = [t.changed for t in tolerances if t.changed is not None]
    return Tolerance(max(t.atol for t in tolerances), max(t.rtol for t in tolerances),
                     max(t.scaled for t in tolerances), max(changed) if changed else None)


@dataclass(frozen=True)
class Comparison:
    """One output against one truth: the verdict, the error figures (max, mean, p99, ``rel``
    = max / max|expected|), NaN/Inf count, the worst element's index and why it failed."""

    passed: bool
    max_abs: float
    mean_abs: float
    p99_abs: float
    rel: float  # max_abs / max |expected|: the error relative to the output's scale
    nonfinite: int  # NaN/Inf count in the output
    worst_index: tuple  # index of the element furthest outside tolerance
    reason: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def _failed(reason: str, nonfinite: int = 0) -> Comparison:
    nan = float("nan")
    return Comparison(False, nan, nan, nan, nan, nonfinite, (), reason)


def compare(actual: np.ndarray, expected: np.ndarray, tol: Tolerance,
            valid: Optional[np.ndarray] = None, written: Optional[np.ndarray] = None
            ) -> Comparison:
    """``valid``: a boolean mask broadcastable to the output; only those elements are compared
    (e.g. the real tokens of a padded batch). Every element must be finite regardless.
    ``written`` (with a tolerance's ``changed``): the only elements that may change at all
    (those the call wrote; the rest must be exact), the allowance counted over them. The
    compared elements are gathered once and every figure made from them (the check compares
    every output of every case twice)."""
    a, e = np.asarray(actual), np.asarray(expected)
    if a.shape != e.shape:
        return _failed(f"shape {list(a.shape)} != expected {list(e.shape)}")
    if e.dtype == np.int64:  # positions (an int8 cache's codes are values: elementwise)
        return compare_selection(a, e, tol, valid)
    nonfinite = _nonfinite(a)
    if nonfinite or _nonfinite(e):
        where = "output" if nonfinite else "expected output"
        return _failed(f"non-finite values (NaN/Inf) in the {where}", nonfinite)
    keep = None if valid is None else np.broadcast_to(valid, a.shape)
    if a.size == 0 or keep is not None and not keep.any():  # (a cache's empty state: equal)
        return Comparison(True, 0.0, 0.0, 0.0, 0.0, 0, ())
    kept_a, kept_e = (a.ravel(), e.ravel()) if keep is None else (a[keep], e[keep])
    err = np.abs(kept_a.astype(np.float64) - kept_e)  # (K,): the compared elements
    magnitude = np.abs(kept_e, dtype=np.float64)
    scale = float(magnitude.max())
    excess = err - (tol.atol + tol.scaled * scale + tol.rtol * magnitude)
    at = int(np.argmax(excess))
    worst = _index_of(at, keep, a.shape)
    outside = int(np.count_nonzero(excess > 0))
    passed = outside == 0
    reason = "" if passed else (f"{outside} of {err.size} elements outside {tol}; worst at "
                                f"{worst}")
    if passed and tol.changed is not None:
        passed, reason = _few_changed(err, keep, tol, written, a.shape)
    top = float(err.max())
    return Comparison(passed, top, float(err.mean()), _p99(err), top / max(scale, 1e-30), 0,
                      worst, reason)


SWAPS = TIES  # rows of a selection that may differ by one near-tied pick (``changed``: more)


def compare_selection(actual: np.ndarray, expected: np.ndarray, tol: Tolerance,
                      valid: Optional[np.ndarray] = None) -> Comparison:
    """Integer selections (.., K) as sets of positions per row (the module docstring's rule);
    ``valid`` (broadcastable to the output): the rows compared (a row is when all its K are)."""
    k = actual.shape[-1]
    keep = np.ones(actual.shape[:-1], bool) if valid is None else np.broadcast_to(
        valid, actual.shape).all(axis=-1)  # (..): the rows compared
    if not keep.any() or k == 0:
        return Comparison(True, 0.0, 0.0, 0.0, 0.0, 0, ())
    a, e = actual[keep], expected[keep]  # (rows, K)
    if min(a.min(), e.min()) < 0:
        return _failed("negative positions in a selection")
    width = int(max(a.max(), e.max())) + 1
    rows = np.arange(a.shape[0])[:, None]  # (rows, 1)
    kept_a, kept_e = (np.zeros((a.shape[0], width), bool) for _ in range(2))  # (rows, S)
    kept_a[rows, a], kept_e[rows, e] = True, True
    missing = (kept_e & ~kept_a).sum(axis=-1).astype(np.float64)  # (rows,) picks not made
    missing += k - kept_a.sum(axis=-1)  # a position picked twice: one pick short
    at = int(np.argmax(missing))
    worst = tuple(int(i) for i in np.argwhere(keep)[at]) + (0,)
    differ = int(np.count_nonzero(missing))
    allowed = max(SWAPS, (tol.changed or 0.0) * a.shape[0])
    reason = ""
    if missing.max() > 1:
        reason = f"a row keeps {int(missing.max())} of {k} positions elsewhere; worst at {worst}"
    elif differ > allowed:
        reason = f"{differ} of {a.shape[0]} rows keep another position (at most {allowed:g})"
    top = float(missing.max())
    return Comparison(not reason, top, float(missing.mean()), _p99(missing), top / k, 0,
                      worst, reason)


def _nonfinite(values: np.ndarray) -> int:
    """NaN/Inf count (integer arrays have none)."""
    if not np.issubdtype(values.dtype, np.inexact):
        return 0
    return int(values.size - np.count_nonzero(np.isfinite(values)))


def _index_of(at: int, keep: Optional[np.ndarray], shape: tuple) -> tuple:
    """The output index of the ``at``-th compared element."""
    flat = at if keep is None else int(np.flatnonzero(keep)[at])
    return tuple(int(i) for i in np.unravel_index(flat, shape))


def _p99(values: np.ndarray) -> float:
    """np.quantile(values, 0.99) (linear), from one partial sort."""
    q = 0.99 * (values.size - 1)
    lo = int(q)
    hi = min(lo + 1, values.size - 1)
    part = np.partition(values, [lo, hi])
    return float(part[lo] + (part[hi] - part[lo]) * (q - lo))


def _few_changed(err: np.ndarray, keep: Optional[np.ndarray], tol: Tolerance,
                 written: Optional[np.ndarray], shape: tuple) -> tuple[bool, str]:
    """At most ``tol.changed`` of the written elements (or TIES) differ, none of the rest
    (``err``: of the compared elements, ``keep`` of the output; None: all)."""
    changed = err > 0
    if written is None:
        may = np.ones(err.shape, bool)
    else:
        whole = np.broadcast_to(written, shape)
        may = whole.ravel() if keep is None else whole[keep]
    if (changed & ~may).any():
        return False, f"{int((changed & ~may).sum())} elements this call did not write changed"
    n, total = int((changed & may).sum()), int(may.sum())
    if n > max(tol.changed * total, TIES):
        return False, f"{n} of {total} written elements changed ({tol})"
    return True, ""


@dataclass(frozen=True)
class Deviation:
    """How far one function's output is from another's, without a verdict: what quantizing the
    weights cost (the dequantized layer vs the unquantized one)."""

    max_abs: float
    rel: float  # max_abs / max |expected|
    cosine: float  # of the flattened outputs: 1 = same direction

    def to_dict(self) -> dict:
        return asdict(self)


def deviation(actual: np.ndarray, expected: np.ndarray,
              valid: Optional[np.ndarray] = None) -> Deviation:
    """Over the elements ``valid`` names (all when None); a non-finite value is NaN here, which
    no budget accepts."""
    a, e = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    keep = np.ones(a.shape, bool) if valid is None else np.broadcast_to(valid, a.shape)
    a, e = a[keep], e[keep]
    if not (np.isfinite(a).all() and np.isfinite(e).all()):
        return Deviation(float("nan"), float("nan"), float("nan"))
    if not a.size:
        return Deviation(0.0, 0.0, 1.0)
    err = float(np.abs(a - e).max())
    norms = float(np.linalg.norm(a) * np.linalg.norm(e))
    cosine = float(a @ e) / norms if norms > 0 else float(np.array_equal(a, e))
    return Deviation(err, err / max(float(np.abs(e).max()), 1e-30), cosine)


def worst(deviations: list[Deviation]) -> Deviation:
    """The worst of each figure over several cases (NaN wins; no case: NaN, never a pass)."""
    def pick(values, fn):
        return float("nan") if not values or any(np.isnan(values)) else fn(values)
    return Deviation(pick([d.max_abs for d in deviations], max),
                     pick([d.rel for d in deviations], max),
                     pick([d.cosine for d in deviations], min))
