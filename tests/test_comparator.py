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
