"""The two-point reduction, proved numerically: the convex program over the whole simplex
(cvxpy) has the same optimum as the two-point band, for any vocabulary size."""

from __future__ import annotations

import numpy as np
import pytest

import fbands

DIVS = ["kl", "reverse_kl", "tv", "chi2", "neyman_chi2", "hellinger", "js", "alpha(a=1/2)",
        "alpha(a=2)", "alpha(a=-1/2)"]


@pytest.mark.parametrize("div", DIVS)
@pytest.mark.parametrize("n", [2, 5, 50])
def test_simplex_optimum_equals_the_two_point_band(div, n):
    rng = np.random.default_rng(n)
    for trial in range(2):
        old = rng.dirichlet(np.full(n, 0.7))
        index = int(rng.integers(n)) if trial else int(np.argmin(old))
        delta = [0.02, 0.2][trial]
        ref_lo, ref_hi = fbands.reference_band(old, index, delta, div)
        lo, hi = fbands.bounds(old[index], delta, div, backend="numpy")
        # Interior-point accuracy: compare the probabilities pi(a) = r p.
        p = old[index]
        assert abs(ref_lo - lo) * p <= 2e-6 + 1e-5 * lo * p
        assert abs(ref_hi - hi) * p <= 2e-6 + 1e-5 * hi * p


def test_cvxpy_backend_of_bounds():
    p = np.array([0.05, 0.4, 0.9])
    lo, hi = fbands.bounds(p, 0.05, "chi2", backend="cvxpy")
    e_lo, e_hi = fbands.bounds(p, 0.05, "chi2", backend="numpy")
    np.testing.assert_allclose(lo, e_lo, atol=1e-6)
    np.testing.assert_allclose(hi, e_hi, rtol=1e-6)
    lo, hi = fbands.bounds(np.array([1.0]), 0.1, "kl", backend="cvxpy")
    assert hi[0] == pytest.approx(1.0, abs=1e-6) and lo[0] == pytest.approx(np.exp(-0.1), 1e-5)


def test_cvxpy_rejects_what_it_cannot_express():
    fbands.register("test_cvx_user", "(u - 1)**4 + (u - 1)**2", overwrite=True)
    with pytest.raises(fbands.DivergenceError, match="no DCP form"):
        fbands.reference_band([0.5, 0.5], 0, 0.1, "test_cvx_user")
    with pytest.raises(ValueError, match="summing to 1"):
        fbands.reference_band([0.5, 0.6], 0, 0.1, "kl")
