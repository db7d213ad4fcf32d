"""Adversarial probe, issue 27: each test is built from the probe's reproducer; the
reference values come from mpmath (tests/reference.py), never from fbands."""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest

import fbands
from fbands.errors import SolverError
from tests import reference

DELTA = 0.05


def _one_sided_fd(name, h):
    """``(r_lo(1) - r_lo(1 - h)) / h`` at 60 digits."""
    with mp.workdps(reference.DPS):
        at_one = reference.lower_at_one(name, DELTA)
        below, _ = reference.edges(reference.TABLE[name], 1 - mp.mpf(h), DELTA)
        return (at_one - below) / mp.mpf(h)


@pytest.mark.parametrize("name", ["tv", "alpha(a=-1)"])
def test_f9_lower_edge_gradient_at_p_one_is_the_one_sided_limit(name):
    torch = pytest.importorskip("torch")
    p = torch.tensor([1.0], dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(fbands.bounds(p, DELTA, name)[0].sum(), p)
    want = float(_one_sided_fd(name, mp.mpf(10) ** -30))
    assert grad.item() == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("name", ["kl", "hellinger"])
def test_f9_lower_edge_gradient_at_p_one_is_infinite_where_the_limit_is(name):
    torch = pytest.importorskip("torch")
    # the one-sided difference quotient grows without bound (like log(1/h) or 1/sqrt(h))
    assert _one_sided_fd(name, 1e-24) > _one_sided_fd(name, 1e-12) + 5
    p = torch.tensor([1.0], dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(fbands.bounds(p, DELTA, name)[0].sum(), p)
    assert grad.item() == math.inf
    # the upper edge alone: its gradient stays finite (0 * inf adds nothing)
    p = torch.tensor([1.0], dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(fbands.bounds(p, DELTA, name)[1].sum(), p)
    assert grad.item() == -1.0


def test_f9_log_bounds_gradient_at_logp_zero():
    torch = pytest.importorskip("torch")
    lp = torch.tensor([0.0], dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(fbands.log_bounds(lp, DELTA, "tv", logp=True)[0].sum(), lp)
    with mp.workdps(reference.DPS):
        want = _one_sided_fd("tv", mp.mpf(10) ** -30) / reference.lower_at_one("tv", DELTA)
    assert grad.item() == pytest.approx(float(want), rel=1e-9)


# -- raw tracebacks -> library errors or right answers -------------------------------------


def test_long_literal_generator_compiles_and_is_right():
    from fbands.divergences import register

    register("adv_long_literal", "0.1234567890123456789*(u-1)**2")
    lo, hi = fbands.bounds(0.1, DELTA, "adv_long_literal")
    c = mp.mpf("0.1234567890123456789")
    want = reference.edges(lambda u: c * (u - 1) ** 2, 0.1, DELTA)
    assert (lo, hi) == pytest.approx((float(want[0]), float(want[1])), rel=1e-12, abs=1e-300)


def test_reference_band_float_index_is_a_band_error():
    pytest.importorskip("cvxpy")
    with pytest.raises(fbands.BandError, match="index must be an integer"):
        fbands.reference_band([0.5, 0.5], 0.5, 0.05)


@pytest.mark.parametrize("div", ["chi2", "alpha(a=3)", "kl"])
@pytest.mark.parametrize("p", [1e-12, 1e-300])
def test_f10_cvxpy_unresolvable_tiny_p_is_nan_not_a_wrong_band(div, p):
    # Each edge is certified apart (probe P10): the one the solver cannot resolve is nan, the
    # other, where certified, is the band's (saturated at 0, or within 1e-5).
    pytest.importorskip("cvxpy")
    with pytest.warns(RuntimeWarning, match="cvxpy reference left"):
        lo, hi = fbands.bounds(np.array([p]), DELTA, div, backend="cvxpy")
    assert np.isnan(lo[0]) or np.isnan(hi[0])
    want = reference.edges(reference.TABLE[div], p, DELTA, iterations=200)
    for got, true in zip((lo[0], hi[0]), want, strict=True):
        assert np.isnan(got) or got == pytest.approx(float(true), rel=1.01e-5, abs=0)
    with pytest.raises(SolverError):
        fbands.reference_band([p, 1 - p], 0, DELTA, div)


def test_f10_cvxpy_edges_bracket_one_near_p_one():
    pytest.importorskip("cvxpy")
    lo, hi = fbands.bounds(1 - 1e-12, DELTA, "kl", backend="cvxpy")
    want = reference.lower_at_one("kl", DELTA)
    assert lo == pytest.approx(float(want), rel=1e-6)
    assert hi >= 1.0


@pytest.mark.parametrize("div", ["chi2", "hellinger"])
@pytest.mark.parametrize("p", [1.0, 1 - 1e-12])
def test_f10_cvxpy_near_p_one_is_nan_where_the_band_has_no_resolved_limit(div, p):
    # The lower edge opens like sqrt(1 - p): the band at the solver's smallest mass of the
    # second token is not the band at p (it used to be returned, 7e-6 off for chi2).
    # (the upper edge, certified apart since probe P10, is 1 to 1e-12: it may be given)
    pytest.importorskip("cvxpy")
    lo, hi = fbands.bounds(np.array([p]), DELTA, div, backend="cvxpy")
    assert np.isnan(lo).all() and (np.isnan(hi[0]) or 1.0 <= hi[0] <= 1.0 / p)


@pytest.mark.parametrize("div", ["kl", "tv"])
def test_f10_cvxpy_near_p_one_is_the_limit_where_it_converges(div):
    pytest.importorskip("cvxpy")
    p = 1 - 1e-12
    lo, hi = fbands.bounds(np.array([p]), DELTA, div, backend="cvxpy")
    want = reference.edges(reference.TABLE[div], p, DELTA)
    assert lo[0] == pytest.approx(float(want[0]), rel=1e-6)
    assert 1.0 <= hi[0] <= 1.0 / p


@pytest.mark.parametrize("div", ["chi2", "kl", "alpha(a=2)"])
@pytest.mark.parametrize("p", [0.3, 1 - 1e-6, 1 - 1e-8])
def test_f10_cvxpy_upper_edge_never_gives_more_than_all_the_mass(div, p):
    pytest.importorskip("cvxpy")
    _, hi = fbands.bounds(np.array([p]), DELTA, div, backend="cvxpy")
    assert np.isnan(hi[0]) or hi[0] * p <= 1.0


@pytest.mark.parametrize("scale", ["1e16", "1e300"])
def test_f8_huge_coefficient_is_resolved_on_numpy_and_numba(scale):
    # c (u - 1)**2 is chi2 scaled by c: log r = log1p(+-sqrt(delta q / (p c))) exactly.
    fbands.register(f"adv_scaled_{scale}", f"{scale}*(u-1)**2", overwrite=True)
    p = 0.1
    with mp.workdps(reference.DPS):
        w = mp.sqrt(mp.mpf(DELTA) * (1 - mp.mpf(p)) / (mp.mpf(p) * mp.mpf(scale)))
        want = (float(mp.log(1 - w)), float(mp.log(1 + w)))
    for backend in ("numpy", "numba"):
        got = fbands.log_bounds(np.log(np.array([p])), DELTA, f"adv_scaled_{scale}",
                                backend=backend, logp=True)
        assert (got[0][0], got[1][0]) == pytest.approx(want, rel=1e-12), backend
        lo, hi = fbands.bounds(np.array([p]), DELTA, f"adv_scaled_{scale}", backend=backend)
        assert (lo[0], hi[0]) == pytest.approx((1 - float(w), 1 + float(w)), rel=1e-15)


@pytest.mark.parametrize("a", ["-1/2", "3/2", "-3/2", "5/2", "-7/2"])
def test_f14_radicals_that_cannot_square_into_a_quadratic_skip_unrad(a):
    # The filter that spares sympy's unrad (a minute for alpha(a=-7/2)) ...
    import sympy as sp

    from fbands import symbolic

    A = sp.Rational(a)
    f = (symbolic.U**A - 1 - A * (symbolic.U - 1)) / (A * (A - 1))
    assert not symbolic._may_have_closed_form(f)


@pytest.mark.slow
@pytest.mark.parametrize("a", ["-1/2", "3/2", "5/2"])
def test_f14_the_radical_filter_loses_no_closed_form(a, monkeypatch):
    # ... rejects only what unrad itself finds to have no quadratic form.
    import sympy as sp

    from fbands import symbolic

    A = sp.Rational(a)
    f = (symbolic.U**A - 1 - A * (symbolic.U - 1)) / (A * (A - 1))
    monkeypatch.setattr(symbolic, "_may_have_closed_form", lambda f: True)
    assert symbolic._closed_form(f, "upper") is None
    assert symbolic._closed_form(f, "lower") is None


def test_f14_hellinger_keeps_its_closed_form():
    from fbands import symbolic

    f = (symbolic.sp.sqrt(symbolic.U) - 1) ** 2
    assert symbolic._may_have_closed_form(f)
    assert symbolic._closed_form(f, "upper") is not None


@pytest.mark.parametrize("name", ["kl", "tv", "js", "hellinger", "alpha(a=-1)"])
@pytest.mark.parametrize("q", [1e-9, 1e-12, 1e-15])
def test_lower_edge_gradient_just_below_p_one(name, q):
    # g_p = f(r) - f(c) + f'(c) (c - r) cancels for c ~ 1/q: taken from the intercept
    # T(c) = f(c) - c f'(c) there (was eps / q off: 48% for tv at q = 1e-15)
    torch = pytest.importorskip("torch")
    p = torch.tensor([1.0 - q], dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(fbands.bounds(p, DELTA, name)[0].sum(), p)
    with mp.workdps(reference.DPS):
        P = mp.mpf(float(p))
        h = (1 - P) * mp.mpf(10) ** -15
        f = reference.TABLE[name]
        want = (reference.edges(f, P + h, DELTA)[0] - reference.edges(f, P - h, DELTA)[0]) / (2 * h)
    assert grad.item() == pytest.approx(float(want), rel=1e-10)
