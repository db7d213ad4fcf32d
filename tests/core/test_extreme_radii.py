"""Bands at extreme radii (issue 27, F4 to F6), against an independent reference.

A radius far below float64's resolution of the closed forms (delta = 1e-18 puts the edges
1e-9 from 1, where a root of a polynomial in r keeps half its digits), down to the smallest
subnormal (where g itself underflows), and a radius so large at a tiny p that the mass left
to the other tokens underflows. Below float64's resolution of ``1 - r`` the ratio is what is
promised (a few ulps of 1), with the edges strictly on their sides of 1; where the small-
radius band ``1 -+ sqrt(2 delta q / (f''(1) p))`` is exact to float64 (radii below about
1e-34), the log-edges are also right relatively. The reference bisects in 400-digit
arithmetic on the distance of the edge from 1, relatively, from THEORY's definition of g
alone (the generators of tests/reference.py).
"""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fbands
from fbands._refine import extended_has_range

from .. import reference as ref

SMALL = [1e-18, 1e-40, 1e-120, 1e-300, 5e-324]
PS = [0.5, 0.1, 0.9, 1e-5, 1 - 1e-5]
#: Divergences of tests/reference.py, the user-registered one included.
DIVS = sorted(ref.TABLE)


def _log_edges_near_one(f, p: float, delta: float):
    """``(log lower, log upper)`` at a radius so small that both edges lie next to 1: each
    by bisection on ``log t`` for the edge ``1 -+ t`` (g grows with t on both sides)."""
    with mp.workdps(400):
        p, delta = mp.mpf(p), mp.mpf(delta)
        out = []
        for sign in (-1, 1):
            def g(log_t, sign=sign):
                return ref.g(f, p, 1 + sign * mp.exp(log_t))

            hi = mp.log(mp.sqrt(delta)) + 10
            while g(hi) <= delta:
                hi += 10
            lo = hi - 20
            while g(lo) > delta:
                lo -= 20
            for _ in range(120):  # 2^-120 of 20 in log t: far below float64
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if g(mid) <= delta else (lo, mid)
            out.append(mp.log1p(sign * mp.exp((lo + hi) / 2)))
        return out


def _close(got: float, want) -> bool:
    """The ratio's accuracy (docs/theory/numerics.md): ``r = exp(s)`` within 1e-12 of
    ``|s|`` and a few ulps of 1, and never on the wrong side of 1 (nor on it)."""
    want = float(want)
    return (abs(got - want) <= 1e-12 * abs(want) + 4 * 2.0**-53
            and math.copysign(1.0, got) == math.copysign(1.0, want) and got != 0)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("div", DIVS)
def test_radii_below_float64_resolution(div, backend, user_divergence):
    if backend == "numba":
        pytest.importorskip("numba")
    f = ref.TABLE[div]
    ps = np.array(PS)
    for delta in SMALL:
        lo, hi = fbands.log_bounds(ps, np.full(ps.shape, delta), div, backend=backend)
        for i, p in enumerate(PS):
            w_lo, w_hi = _log_edges_near_one(f, p, delta)
            assert _close(lo[i], w_lo), (div, p, delta, lo[i], float(w_lo))
            assert _close(hi[i], w_hi), (div, p, delta, hi[i], float(w_hi))


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_a_large_radius_at_a_tiny_p_reaches_one_over_p(backend):
    """KL at p = 1e-200 and delta = 1000: the upper edge's other mass, 1 - p r, is
    e^-1000 of 1, below the smallest float, so the edge is 1/p to working precision."""
    if backend == "numba":
        pytest.importorskip("numba")
    for p in (1e-150, 1e-200, 1e-300):
        for delta in (1e3, 1e4):
            lo, hi = fbands.log_bounds(np.array([p]), np.array([delta]), "kl",
                                       backend=backend)
            assert hi[0] == pytest.approx(-math.log(p), rel=1e-15)
            assert lo[0] == pytest.approx(-delta / p, rel=1e-12)  # KL: p f(r) ~ -p log r
    assert fbands.bounds(1e-200, 1000.0, "kl") == (0.0, pytest.approx(1e200, rel=1e-14))


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_the_smallest_radii_give_log_edges_right_relatively(backend):
    if backend == "numba":
        pytest.importorskip("numba")
    for div in ("kl", "chi2", "hellinger", "js"):
        for delta in (1e-120, 5e-324):
            lo, hi = fbands.log_bounds(np.array(PS), np.full(len(PS), delta), div,
                                       backend=backend)
            for i, p in enumerate(PS):
                w_lo, w_hi = _log_edges_near_one(ref.TABLE[div], p, delta)
                assert lo[i] == pytest.approx(float(w_lo), rel=1e-12), (div, p, delta)
                assert hi[i] == pytest.approx(float(w_hi), rel=1e-12), (div, p, delta)


def _log_reference(f, logp: float, delta: float):
    """``(log lower, log upper)`` at 60 digits for ``p = exp(logp)`` (tests/reference.py)."""
    with mp.workdps(ref.DPS):
        lower, upper = ref.edges(f, mp.exp(mp.mpf(logp)), delta)
        return (-mp.inf if lower == 0 else mp.log(lower)), mp.log(upper)


def _close_log(got: float, want) -> bool:
    """``log r`` to 1e-12 relatively, or ``r`` to a few ulps of 1 (docs/theory/numerics.md:
    where the near form of F still cancels at O(s), as js's does, the edge next to 1 is
    accurate to about eps / |r - 1| relatively; js reaches 2.5 ulps)."""
    if float(want) == -math.inf:  # (a log below -1.8e308 is -inf as a float)
        return got == -math.inf
    return abs(got - float(want)) <= 1e-12 * abs(float(want)) + 4 * 2.0**-52


@pytest.mark.slow
@pytest.mark.usefixtures("user_divergence")
@pytest.mark.parametrize("div", DIVS)
@given(logp=st.floats(-690.0, math.log1p(-1e-15)), log10_delta=st.floats(-30.0, 3.0))
def test_extreme_inputs_in_log_space_against_the_reference(div, logp, log10_delta):
    """Hypothesis over p from 1e-300 to 1 - 1e-15 (as log p) and delta from 1e-30 to 1000,
    every divergence of tests/reference.py, both CPU backends, logp input and log output."""
    delta = 10.0**log10_delta
    want = _log_reference(ref.TABLE[div], logp, delta)
    for backend in ("numpy", "numba"):
        lo, hi = fbands.log_bounds(np.array([logp]), delta, div, backend=backend, logp=True)
        assert _close_log(lo[0], want[0]), (backend, lo[0], float(want[0]))
        assert _close_log(hi[0], want[1]), (backend, hi[0], float(want[1]))


#: Radii at which the terms of g overflow float64 on the way to the root (issue 42, P7):
#: solved in extended precision, so every path gives the edge, not where the overflow stopped.
HUGE = [1e61, 1e100, 1e200, 1e300, 1.7976931348623157e308]
HUGE_PS = [5e-321, 1e-300, 1e-200, 1e-130, 1e-100, 1e-50, 1e-10, 0.3, 0.9]


@pytest.mark.slow
@pytest.mark.usefixtures("user_divergence")
@pytest.mark.parametrize("div", DIVS)
def test_a_huge_radius_gives_the_edges_of_the_reference(div):
    """Every divergence of tests/reference.py at radii from 1e61 to the largest float, p
    from the smallest subnormals to 0.9, on the numpy and numba backends and a CPU tensor;
    before, alpha(3) gave nan or an edge where F overflowed (p = 1e-200: 2.6e169 against
    4.8e169), alpha(10) at delta 1e300 stopped at log r = 709.78 / 10."""
    if not extended_has_range():
        pytest.skip("this platform's long double has float64's range")
    torch = pytest.importorskip("torch")
    f = ref.TABLE[div]
    ps = np.array(HUGE_PS)
    for delta in HUGE:
        with mp.workdps(ref.DPS):
            want = [_logs(ref.edges(f, mp.mpf(p), delta)) for p in HUGE_PS]
        got = {b: fbands.log_bounds(ps, delta, div, backend=b) for b in ("numpy", "numba")}
        got["torch"] = tuple(t.numpy() for t in fbands.log_bounds(torch.tensor(ps), delta, div))
        for backend, (lo, hi) in got.items():
            for i, p in enumerate(HUGE_PS):
                assert _close_log(lo[i], want[i][0]), (backend, p, delta, lo[i], want[i][0])
                assert _close_log(hi[i], want[i][1]), (backend, p, delta, hi[i], want[i][1])


def _logs(edges):
    lower, upper = edges
    return (-mp.inf if lower == 0 else mp.log(lower)), mp.log(upper)


def test_the_device_solver_gives_nan_not_a_wrong_edge_at_a_huge_radius():
    """Without an extended type on the device, the fixed-count solver cannot reach the root
    of a huge radius: nan, never the edge where float64 overflowed."""
    torch = pytest.importorskip("torch")
    from fbands._dispatch import compute

    p = torch.tensor([1e-200, 0.5], dtype=torch.float64)
    for delta, finite in ((1e300, False), (1.0, True)):
        lo, hi = compute("log_edges", "alpha(a=3)", p, torch.full_like(p, delta), "torch",
                         invalid="nan", path="device-solver")
        assert bool(torch.isfinite(hi).all()) == finite
        assert bool(torch.isnan(lo).any()) != finite


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_a_tie_at_saturation_next_to_p_1_is_decided_not_a_crash(backend):
    """tv at delta = 1 saturates its lower edge where g(p, 0) = p <= 1; for log p = -1e-60
    the tie goes to the mpmath tier, which took p = exp(log p) as 1 at its working digits
    and divided by q = 0 (a ZeroDivisionError): q now comes from expm1."""
    lps = np.array([-1e-60, -1e-80, -1e-160, -1e-220])
    lo, hi = fbands.log_bounds(lps, 1.0, "tv", backend=backend, logp=True)
    assert (lo == -np.inf).all()  # g(p, 0) = p < 1 = delta: the ball reaches r = 0
    np.testing.assert_allclose(hi, -lps, rtol=1e-15)  # saturated at 1 / p


def _lower_next_to_one(f, logp: float, delta: float):
    """``log`` of the lower edge for ``p = exp(logp)`` next to 1, by bisection on
    ``log(1 - r)`` at 700 digits, with ``q = -expm1(logp)`` exact (``1 - p`` would need the
    digits down to q)."""
    with mp.workdps(700):
        lp = mp.mpf(logp)
        p, q, delta = mp.exp(lp), -mp.expm1(lp), mp.mpf(delta)

        def g(t):  # r = 1 - t, so the other token's ratio is c = 1 + p t / q
            return p * f(1 - t) + q * f(1 + p * t / q)

        if g(mp.mpf(1)) <= delta:
            return -mp.inf
        lo, hi = mp.mpf(-4000), mp.mpf(0)  # log t
        for _ in range(300):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if g(mp.exp(mid)) <= delta else (lo, mid)
        return mp.log1p(-mp.exp((lo + hi) / 2))


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("a", [3, 10])
def test_a_steep_generator_next_to_p_1_gives_the_lower_edge(a, backend):
    """alpha(10) with log p at or below -1e-160 gave a nan lower edge at every radius, and
    alpha(3) at log p = -1e-300 from delta 1e8 on: g overflows far from the edge, where the
    small-delta band put Newton's first guess (the guess now comes from f's tail at infinity),
    and ``delta / q`` itself overflows at the larger radii (solved in extended precision)."""
    f = ref.alpha(a)
    lps = [-1e-300, -1e-200, -1e-150, -1e-100, -1e-40, -1e-20]
    for delta in (1e-3, 0.05, 10.0, 1e8, 1e11):
        lo, _ = fbands.log_bounds(np.array(lps), delta, f"alpha(a={a})", backend=backend,
                                  logp=True)
        for i, lp in enumerate(lps):
            want = _lower_next_to_one(f, lp, delta)
            assert lo[i] == pytest.approx(float(want), rel=1e-12), (delta, lp, lo[i])


@pytest.mark.skipif(not extended_has_range(), reason="no extended exponent range here")
@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_chi2_saturation_ties_at_huge_radii(backend):
    """chi2 at log p = -q (p within 1e-61 .. 1e-300 of 1): g(p, r) = (1 - r)^2 p / q, so the
    lower edge is 1 - sqrt(delta q / p) and saturates at delta = p / q, a radius above 1e60.
    Within a few ulps of that tie the edge is about 1e-17 and its log is decided by digits
    beyond the extended type's (they were off by up to 0.5): every log-edge is within 1e-12
    of the 80-digit value, and -inf exactly where the edge is 0."""
    checked = 0
    for k in (61, 150, 300):
        lp = -(10.0 ** -k)
        with mp.workdps(80):
            p, q = mp.exp(mp.mpf(lp)), -mp.expm1(mp.mpf(lp))
            tie = float(p / q)
            radii = [tie]
            for direction in (math.inf, 0.0):
                d = tie
                for _ in range(3):
                    d = float(np.nextafter(d, direction))
                    radii.append(d)
            for delta in radii:
                want = 1 - mp.sqrt(mp.mpf(delta) * q / p)
                lo, _ = fbands.log_bounds(np.full(3, lp), delta, "chi2", logp=True,
                                          backend=backend)
                if want <= 0:
                    assert lo[0] == -math.inf, (k, delta)
                else:
                    assert abs(mp.mpf(float(lo[0])) - mp.log(want)) <= 1e-12 * abs(
                        mp.log(want)), (k, delta, lo[0])
                checked += 1
    assert checked == 21
