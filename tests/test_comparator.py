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
