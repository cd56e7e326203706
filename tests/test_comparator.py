import numpy as np
import pytest

from mha_export import Tolerance, compare

TOL = Tolerance(atol=1e-5, rtol=1e-4)


def test_within_and_outside_tolerance():
    ref = np.linspace(-1, 1, 100).reshape(4, 25)
    assert compare(ref + 5e-6, ref, TOL).passed
    out = ref.copy()
    out[2, 3] += 1e-3
    c = compare(out, ref, TOL)
    assert not c.passed and c.worst_index == (2, 3) and c.max_abs == pytest.approx(1e-3)
    assert "1 of 100 elements" in c.reason


def test_rtol_scales_with_magnitude():
    ref = np.array([1000.0, 0.0])
    assert compare(ref + [0.05, 0.0], ref, TOL).passed      # 0.05 <= 1e-5 + 1e-4*1000
    assert not compare(ref + [0.0, 0.05], ref, TOL).passed  # near zero only atol counts


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_is_never_a_pass(bad):
    ref = np.zeros((2, 3))
    out = ref.copy()
    out[1, 1] = bad
    c = compare(out, ref, Tolerance(atol=1e9, rtol=1e9))
    assert not c.passed and c.nonfinite == 1 and "non-finite" in c.reason
    assert not compare(ref, out, Tolerance(atol=1e9, rtol=1e9)).passed  # NaN in the reference too


def test_shape_mismatch_fails():
    c = compare(np.zeros((1, 4, 8)), np.zeros((1, 5, 8)), TOL)
    assert not c.passed and "shape" in c.reason


def test_int8_codes_may_change_only_where_the_call_wrote_and_rarely():
    """INT8_CODES: one code off is a rounding tie flipped by the kernel's last bit, allowed on at
    most 0.1% (or 4) of the entries the call wrote; any change elsewhere fails, and so does a
    whole written row off by one, however long the untouched past around it."""
    from mha_export.lossy.int8_cache.cost import INT8_CODES
    expected = np.zeros((1, 2, 1024, 64))
    valid = np.ones((1, 1, 1024, 1), bool)
    written = np.zeros((1, 1, 1024, 1), bool)
    written[:, :, 1023] = True  # a step at past 1023: 128 of 131072 entries are its own
    tie = expected.copy()
    tie[0, 0, 1023, :3] = 1
    assert compare(tie, expected, INT8_CODES, valid, written).passed
    row = expected.copy()
    row[:, :, 1023] = 1  # every entry the call wrote one code off
    result = compare(row, expected, INT8_CODES, valid, written)
    assert not result.passed and "128 of 128 written elements changed" in result.reason
    past = expected.copy()
    past[0, 1, 5, 7] = 1  # an entry of the past, which the call must not touch
    result = compare(past, expected, INT8_CODES, valid, written)
    assert not result.passed and "did not write" in result.reason
    far = tie.copy()
    far[0, 0, 1023, 9] = 3  # more than one code
    assert not compare(far, expected, INT8_CODES, valid, written).passed


def _selection(rows: int = 9, k: int = 4, keys: int = 20) -> np.ndarray:
    """(2, rows, k) int64: distinct key positions per row."""
    rng = np.random.default_rng(0)
    return np.stack([np.stack([rng.permutation(keys)[:k] for _ in range(rows)])
                     for _ in range(2)]).astype(np.int64)


def _outside(picks: np.ndarray, keys: int = 20) -> np.ndarray:
    """Each row's k-th pick replaced by a position the row does not keep."""
    out = picks.copy()
    for i, j in np.ndindex(picks.shape[:2]):
        out[i, j, -1] = next(p for p in range(keys) if p not in picks[i, j])
    return out


def test_a_selection_is_compared_as_sets_of_positions():
    """int64 outputs (a DSA layer's topk_indices): each row's positions in any order; one
    near-tied swap in at most 4 rows; a shift, a k-th pick wrong in every row, a repeated
    position, fail; rows outside ``valid`` are not compared."""
    want = _selection()
    assert compare(want[..., ::-1].copy(), want, TOL).passed
    shifted = compare(want + 1, want, TOL)
    assert not shifted.passed and "keeps 4 of 4 positions elsewhere" in shifted.reason
    wrong = compare(_outside(want), want, TOL)
    assert not wrong.passed and "18 of 18 rows keep another position" in wrong.reason
    one = want.copy()
    one[0, :4] = _outside(want)[0, :4]  # 4 rows: near ties flipped
    assert compare(one, want, TOL).passed
    one[0, 4] = _outside(want)[0, 4]
    assert not compare(one, want, TOL).passed
    twice = want.copy()
    twice[0, 0, 2] = twice[0, 0, 3]
    assert not compare(twice, want, TOL).passed
    real = np.ones((2, 9, 1), bool)
    real[1] = False
    moved = want.copy()
    moved[1] += 1
    assert compare(moved, want, TOL, real).passed
