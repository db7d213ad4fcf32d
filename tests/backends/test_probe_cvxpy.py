"""Probe P10: the cvxpy reference gives each edge to its stated tolerance
(``EDGE_TOLERANCE`` relative, or exactly 0 and 1/p when saturated), or nan with a warning;
never a finite edge orders of magnitude off.  The truth is the 60-digit mpmath reference."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import fbands

from .. import reference as ref

pytest.importorskip("cvxpy")
from fbands.backends import cvxpy_backend  # noqa: E402
from fbands.errors import SolverError  # noqa: E402

#: The true edge lies within EDGE_TOLERANCE of the certified one; a little slack for the
#: rounding of the certificate's own evaluations.
RTOL = 1.01 * cvxpy_backend.EDGE_TOLERANCE
REF_NAME = {"alpha(a=1/2)": "alpha(a=0.5)"}


def _check(name, ps, deltas):
    """Every finite edge right to RTOL; a nan edge comes with a warning."""
    f = ref.TABLE[REF_NAME.get(name, name)]
    p = np.array(ps, dtype=np.float64)
    d = np.array(deltas, dtype=np.float64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lo, hi = fbands.bounds(p, d, name, backend="cvxpy")
    if np.isnan(lo).any() or np.isnan(hi).any():
        assert any("cvxpy reference left" in str(w.message) for w in caught)
    for i in range(p.size):
        want = [float(e) for e in ref.edges(f, p[i], d[i], iterations=200)]
        for got, true in zip((lo[i], hi[i]), want, strict=True):
            if math.isnan(got):
                continue
            if true == 0 or got == 0:
                assert got == true, (name, p[i], d[i], got, true)
            else:
                assert abs(got - true) <= RTOL * true, (name, p[i], d[i], got, true)
    return lo, hi


#: (divergence, p, delta) where the backend returned finite lower edges 100 to 1e80 times
#: too large (an interior-point minimum of pi(a) below the solver's absolute tolerance)
WRONG_BEFORE = [
    ("kl", 0.05, 1.0),            # 1.85e-7 for 7.78e-10
    ("kl", 0.05, 10.0),           # 1.0e-7 for 5.2e-88
    ("alpha(a=-1)", 0.001, 1.0),  # 0.19 for 5.0e-4
    ("neyman_chi2", 1e-5, 0.1),   # 3.7e-4 for 1.0e-4
    ("hellinger", 0.001, 1e-3),   # 1.6e-5 for 1.6e-8
    ("js", 1e-8, 1.0),            # 0.17 for 0 (saturated)
]


@pytest.mark.parametrize(("name", "p", "delta"), WRONG_BEFORE)
def test_lower_edges_are_right_or_nan(name, p, delta):
    _check(name, [p], [delta])


def test_saturated_edges_are_exact():
    lo, hi = _check("tv", [1e-8, 1e-8], [1.0, 10.0])
    assert lo.tolist() == [0.0, 0.0] and hi.tolist() == [1e8, 1e8]


def test_an_unresolvable_edge_is_nan_with_a_warning():
    # kl's lower edge at p = 1e-3, delta = 0.1 is 1.4e-44: far below the solver's reach
    with pytest.warns(RuntimeWarning, match="cvxpy reference left 1 band edge"):
        lo, hi = fbands.bounds(np.array([1e-3]), 0.1, "kl", backend="cvxpy")
    assert math.isnan(lo[0])
    assert hi[0] == pytest.approx(float(ref.edges(ref.TABLE["kl"], 1e-3, 0.1)[1]), rel=RTOL)


def test_reference_band_two_tokens_raises_rather_than_guess():
    with pytest.raises(SolverError, match="lower edge"):
        fbands.reference_band([1e-3, 1 - 1e-3], 0, 0.1, "kl")


SWEEP_P = [1e-12, 1e-8, 1e-5, 1e-3, 0.05, 0.5, 0.9, 0.999, 1 - 1e-6, 1 - 1e-9]
SWEEP_D = [1e-6, 1e-3, 0.1, 1.0, 10.0]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["kl", "reverse_kl", "tv", "chi2", "neyman_chi2", "hellinger",
                                  "js", "alpha(a=1/2)", "alpha(a=3)", "alpha(a=-1)"])
def test_sweep_every_finite_edge_is_within_the_tolerance(name):
    ps = [p for p in SWEEP_P for _ in SWEEP_D]
    ds = [d for _ in SWEEP_P for d in SWEEP_D]
    _check(name, ps, ds)
