"""Invariants of bounds() over the whole registry, and values against a 60-digit reference."""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fbands
from fbands import _refine, _solver
from fbands._dispatch import PATHS, plan
from fbands._inputs import NumpyInputs, Request

from .. import _user as user
from .. import reference as ref
from .._speed import registry

DIVS = list(ref.TABLE)
CLOSED = [d for d in DIVS if user.get(d).derivation.upper is not None]
# The registry tests also cover a user-registered generator (tests/_user.py).
pytestmark = pytest.mark.usefixtures("user_divergence")
BUILTIN = list(ref.GENERATORS)

log_p = st.floats(math.log(1e-12), math.log1p(-1e-9))
log_delta = st.floats(math.log(1e-4), 0.0)


def band(p, delta, div, **kw):
    return fbands.bounds(np.float64(p), delta, div, backend="numpy", **kw)


def g(div, p, r):
    with mp.workdps(ref.DPS):
        return ref.g(ref.TABLE[div], mp.mpf(p), mp.mpf(r))


@pytest.mark.parametrize("div", registry(DIVS))
@given(lp=log_p, ld=log_delta)
def test_band_contains_one_and_respects_the_simplex(div, lp, ld):
    p, delta = math.exp(lp), math.exp(ld)
    lo, hi = band(p, delta, div)
    assert 0.0 <= lo <= 1.0 <= hi
    assert hi <= (1 / p) * (1 + 1e-15)


@pytest.mark.parametrize("div", registry(DIVS))
@given(lp=log_p, ld=log_delta)
def test_edges_solve_the_band_equation(div, lp, ld):
    """g crosses delta at each unsaturated edge (checked in 60-digit arithmetic)."""
    p, delta = math.exp(lp), math.exp(ld)
    lo, hi = band(p, delta, div)
    eps = 1e-10
    assert g(div, p, hi * (1 - eps)) <= delta  # just inside the band: allowed
    if hi < (1 / p) * (1 - 1e-9):
        assert g(div, p, hi * (1 + eps)) >= delta  # just outside: not allowed
    if lo > 1e-300:
        assert g(div, p, lo * (1 + eps)) <= delta <= g(div, p, lo * (1 - eps))
    else:  # saturated at 0, or an edge below the smallest float
        assert g(div, p, mp.mpf("1e-300")) <= delta * (1 + 1e-9)


@pytest.mark.parametrize("div", registry(DIVS))
@given(lp=log_p, ld=log_delta, factor=st.floats(1.01, 10.0))
def test_bands_are_nested_in_delta(div, lp, ld, factor):
    p, delta = math.exp(lp), math.exp(ld)
    lo1, hi1 = band(p, delta, div)
    lo2, hi2 = band(p, delta * factor, div)
    assert lo2 <= lo1 and hi1 <= hi2


@pytest.mark.parametrize("div", CLOSED)
def test_closed_form_equals_generic_solver(div):
    """The closed-form edges agree with the root finder run on the same divergence."""
    rng = np.random.default_rng(7)
    p = np.exp(rng.uniform(math.log(1e-12), math.log1p(-1e-9), 300))
    delta = np.exp(rng.uniform(math.log(1e-4), 0, 300))
    d = fbands.get(div)
    x = NumpyInputs(p, delta, Request())
    inputs = _solver.Inputs(x.lp, x.lq, x.p, x.q, x.delta)
    with np.errstate(all="ignore"):
        closed = _solver.solve(d, _solver.NUMPY, inputs)
        generic = _solver.solve(d, _solver.NUMPY, inputs, closed_forms=False)
    for c, n in zip(closed, generic, strict=True):
        c, n = np.exp(c), np.exp(n)
        np.testing.assert_allclose(c, n, rtol=1e-12, atol=1e-300)


# ----------------------------------------------------------------------------- 60-digit values

GRID_P = [1e-12, 3e-9, 1e-6, 1e-3, 0.02, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99, 1 - 1e-6, 1 - 1e-9]
GRID_DELTA = [1e-4, 3e-3, 0.05, 0.3, 1.0]


def _rel_err(x, r):
    return float(abs(mp.mpf(float(x)) - r) / max(abs(r), mp.mpf("1e-6")))


@pytest.mark.parametrize("div", registry(BUILTIN + ["alpha(a=0.5)", "alpha(a=3)", "triangular"]))
def test_float64_accuracy_against_60_digit_bisection(div):
    p = np.repeat(GRID_P, len(GRID_DELTA))
    delta = np.tile(GRID_DELTA, len(GRID_P))
    lo, hi = fbands.bounds(p, delta, div, backend="numpy")
    worst = 0.0
    for i in range(p.size):
        r_lo, r_hi = ref.edges(ref.TABLE[div], p[i], delta[i])
        worst = max(worst, _rel_err(lo[i], r_lo), _rel_err(hi[i], r_hi))
    assert worst <= 1e-12


@pytest.mark.parametrize("div", registry(BUILTIN))
@given(lp=log_p, ld=log_delta)
def test_random_points_against_60_digit_bisection(div, lp, ld):
    p, delta = math.exp(lp), math.exp(ld)
    lo, hi = band(p, delta, div)
    r_lo, r_hi = ref.edges(ref.TABLE[div], p, delta)
    assert _rel_err(lo, r_lo) <= 1e-12 and _rel_err(hi, r_hi) <= 1e-12


def _near_saturation():
    """Points where the lower edge is about to reach 0: g(p, 0) just above delta."""
    for delta in (1e-4, 0.01, 0.3):
        for gap in (3e-6, 1e-4, 3e-3):
            yield "chi2", delta / (1 + delta) * (1 + gap), delta  # g(p, 0) = p / q
            yield "hellinger", delta * (1 - delta / 4) * (1 + gap), delta  # 2 - 2 sqrt(q)
            yield "reverse_kl", -math.expm1(-delta) * (1 + gap), delta  # -log q
            yield "tv", delta * (1 + gap), delta  # p


@pytest.mark.parametrize("div, p, delta", list(_near_saturation()))
def test_lower_edges_next_to_saturation_are_exact(div, p, delta):
    """Ill-conditioned in float64 (a rounding of g moves the edge by eps delta / |g'|): the
    numpy backend redoes these few elements in 40-digit arithmetic."""
    lo, _ = band(p, delta, div)
    r_lo, _ = ref.edges(ref.TABLE[div], p, delta)
    assert _rel_err(lo, r_lo) <= 1e-13


HAS_EXTENDED = np.finfo(np.longdouble).eps < np.finfo(np.float64).eps / 8
SATURATING = [d for d in DIVS
              if math.isfinite(user.get(d).f0)]


def _saturation_threshold(div, delta):
    """The p at which the lower edge reaches 0, g(p, 0) = delta, by 60-digit bisection."""
    f = ref.TABLE[div]
    with mp.workdps(ref.DPS):
        lo, hi = mp.mpf("1e-9"), 1 - mp.mpf("1e-9")
        for _ in range(120):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if ref.g(f, mid, mp.mpf(0)) <= delta else (lo, mid)
        return float((lo + hi) / 2)


@pytest.mark.skipif(not HAS_EXTENDED, reason="long double is float64 on this platform")
@pytest.mark.parametrize("div", SATURATING)
def test_extended_precision_settles_the_refinements(div, monkeypatch):
    """Newton steps in long double, vectorised over the elements float64 cannot resolve,
    agree with the 40-digit path.  They leave it the edges that need more than long
    double's 19 digits (r below about 1e-9): a few of evenly spread p (as in data), more of
    p crowding the threshold.  Some points are checked against the 60-digit reference."""
    assert {"js", "tv", "chi2", "hellinger"} <= set(SATURATING)
    delta = 0.05
    t = np.concatenate((np.linspace(2e-3, 2e-5, 40), np.geomspace(1e-5, 1e-10, 20)))
    even = np.concatenate((np.arange(t.size) < 40,) * 2)
    p = _saturation_threshold(div, delta) * np.concatenate((1 - t, 1 + t))
    for logp in (False, True):
        x = NumpyInputs(np.log(p) if logp else p, delta, Request(logp=logp))
        inputs = _solver.Inputs(x.lp, x.lq, x.p, x.q, x.delta)
        with np.errstate(all="ignore"):
            s_lo, _ = _solver.solve(fbands.get(div), _solver.NUMPY, inputs)
        suspect = _refine.near_saturation(fbands.get(div), inputs, s_lo)
        assert suspect.sum() >= 20
        got, left = _refine._refine_extended(
            fbands.get(div), inputs, s_lo, suspect, from_logp=logp,
            above=_refine.REFINE_ABOVE)
        assert left[even].sum() <= suspect[even].sum() // 10, (div, logp)
        with monkeypatch.context() as m:
            m.setattr(_refine, "_refine_extended", lambda d, x, s, sus, **k: (s, sus))
            slow = _refine.refine_near_saturation(fbands.get(div), inputs, s_lo,
                                                        from_logp=logp)
        done = suspect & ~left
        assert np.array_equal(np.isinf(got[done]), np.isinf(slow[done]))
        finite = done & np.isfinite(slow)
        assert np.max(np.abs(np.expm1(got[finite] - slow[finite])), initial=0.0) <= 1e-14
    lo, _ = band(p[::12], delta, div)
    for pi, li in zip(p[::12], lo, strict=True):
        assert _rel_err(li, ref.edges(ref.TABLE[div], pi, delta)[0]) <= 1e-13, (div, pi)


@pytest.mark.skipif(not HAS_EXTENDED, reason="long double is float64 on this platform")
def test_extended_kernels_carry_their_constants_to_full_precision():
    """js's F holds log 2: in long double it must come to 30 digits, not as a float64."""
    div = fbands.get("js")
    F = div.kernels(_refine.xp_extended)[0]
    s = np.array([-30.0, -3.0, -0.5, 0.25, 4.0], dtype=np.longdouble)
    got = F(s)
    assert got.dtype == np.longdouble
    with mp.workdps(40):
        for si, gi in zip(s, got, strict=True):
            want = div.mpmath_f(mp.exp(mp.mpf(float(si))))
            assert abs(mp.mpf(str(gi)) - want) <= 64 * np.finfo(np.longdouble).eps * abs(want)


# ----------------------------------------------------------------------------- limits


@pytest.mark.parametrize("div", DIVS)
@pytest.mark.parametrize("delta", [1e-3, 0.05, 0.5, 1.5])
def test_p_equal_one_gives_r_star(div, delta):
    lo, hi = band(1.0, delta, div)
    assert hi == 1.0
    expected = float(ref.lower_at_one(div, delta))
    assert lo == pytest.approx(expected, rel=1e-12, abs=1e-15)
    near = [band(1 - q, delta, div)[0] for q in (1e-6, 1e-9, 1e-12)]
    if math.isfinite(fbands.get(div).fprime_inf):  # continuous at p = 1
        assert near[-1] == pytest.approx(expected, rel=1e-4, abs=1e-6)
    else:  # f'(inf) = inf: the edge creeps up to 1, like 1 - delta / log(1 / q) for reverse KL
        assert near[0] <= near[1] <= near[2] < 1.0


def test_known_values_of_r_star():
    delta = 0.2
    assert band(1.0, delta, "kl")[0] == pytest.approx(math.exp(-delta), rel=1e-14)
    assert band(1.0, delta, "tv")[0] == pytest.approx(1 - delta, rel=1e-14)
    assert band(1.0, delta, "hellinger")[0] == pytest.approx((1 - delta / 2) ** 2, rel=1e-14)
    assert band(1.0, delta, "chi2")[0] == 1.0
    assert band(1.0, delta, "reverse_kl")[0] == 1.0


@pytest.mark.parametrize("logp", [-1e4, -2000.0, -700.0, -300.0, -60.0])
@pytest.mark.parametrize("delta", [1e-3, 0.05, 0.7])
def test_kl_upper_edge_as_p_vanishes(logp, delta):
    """p -> 0: v = p r solves v + f(1 - v) = delta, i.e. v = 1 - exp(-delta) for KL."""
    _, log_hi = fbands.log_bounds(logp, delta, "kl", backend="numpy", logp=True)
    assert log_hi + logp == pytest.approx(math.log(-math.expm1(-delta)), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("logp", [-1e4, -800.0, -300.0, -40.0])
def test_lower_edges_as_p_vanishes(logp):
    delta = 0.05
    lo, _ = fbands.log_bounds(logp, delta, "kl", backend="numpy", logp=True)
    expected = -delta * math.exp(-logp) if logp > -700 else -math.inf  # about -delta / p
    if math.isfinite(expected):
        assert lo == pytest.approx(expected, rel=1e-6)
    else:
        assert lo == -math.inf
    lo, _ = fbands.log_bounds(logp, delta, "neyman_chi2", backend="numpy", logp=True)
    assert lo == pytest.approx(logp - math.log(delta), rel=1e-9)  # r ~ p / delta
    for div in ("tv", "chi2", "reverse_kl", "hellinger", "js"):  # f(0) finite: saturated
        lo, _ = fbands.log_bounds(logp, delta, div, backend="numpy", logp=True)
        assert lo == -math.inf


@pytest.mark.parametrize("div", DIVS)
def test_log_edges_are_continuous_across_the_tiny_p_switch(div):
    logp = np.array([_solver.LP_TINY - 1e-9, _solver.LP_TINY + 1e-9])
    lo, hi = fbands.log_bounds(logp, 0.05, div, backend="numpy", logp=True)
    assert hi[0] - hi[1] == pytest.approx(2e-9, abs=1e-8)
    if np.isfinite(lo).all():
        assert lo[0] == pytest.approx(lo[1], rel=1e-8)


@pytest.mark.parametrize("div", DIVS)
def test_logp_minus_inf_is_the_p_to_zero_limit(div):
    lo, hi = fbands.bounds(np.array([-np.inf]), 0.1, div, backend="numpy", logp=True)
    assert lo[0] == 0.0 and hi[0] == np.inf


@pytest.mark.parametrize("div", DIVS)
def test_logp_and_p_inputs_agree(div):
    p = np.array([1e-9, 0.01, 0.3, 0.9])
    a = fbands.log_bounds(p, 0.05, div, backend="numpy")
    b = fbands.log_bounds(np.log(p), 0.05, div, backend="numpy", logp=True)
    np.testing.assert_allclose(a, b, rtol=1e-12)


# ----------------------------------------------------------------------------- input handling


def test_types_shapes_and_dtypes_are_kept():
    lo, hi = fbands.bounds(0.2, 0.05, backend="numpy")
    assert type(lo) is float and type(hi) is float
    p32 = np.full((3, 4), 0.2, dtype=np.float32)
    lo, hi = fbands.bounds(p32, 0.05, backend="numpy")
    assert lo.dtype == np.float32 and lo.shape == (3, 4)
    exact = fbands.bounds(np.float64(np.float32(0.2)), 0.05, backend="numpy")
    assert lo[0, 0] == np.float32(exact[0]) and hi[0, 0] == np.float32(exact[1])
    lo, hi = fbands.bounds(np.full((3, 1), 0.2), np.array([0.01, 0.05, 0.1, 0.2]))
    assert lo.shape == (3, 4) and np.all(np.diff(hi, axis=1) > 0)


@pytest.mark.parametrize(
    "p, delta, logp, message",
    [
        (np.array([0.1, np.nan]), 0.05, False, "p must lie in"),
        (np.array([0.1, np.inf]), 0.05, False, "p must lie in"),
        (np.array([0.1, 0.0]), 0.05, False, "p must lie in"),
        (np.array([0.1, -0.3]), 0.05, False, "p must lie in"),
        (np.array([0.1, 1.5]), 0.05, False, "p must lie in"),
        (np.array([-0.1, 0.5]), 0.05, True, "log p must lie in"),
        (np.array([-0.1, np.nan]), 0.05, True, "log p must lie in"),
        (0.1, 0.0, False, "delta must lie in"),
        (0.1, -1.0, False, "delta must lie in"),
        (0.1, np.nan, False, "delta must lie in"),
        (0.1, np.inf, False, "delta must lie in"),
    ],
)
def test_bad_input_raises_a_clear_error(p, delta, logp, message):
    with pytest.raises(fbands.BandError, match=message):
        fbands.bounds(p, delta, "kl", backend="numpy", logp=logp)
    assert issubclass(fbands.BandError, ValueError)


def test_bad_elements_give_nan_in_place_on_request():
    p = np.array([0.1, np.nan, 2.0, 0.5])
    delta = np.array([0.05, 0.05, 0.05, -1.0])
    lo, hi = fbands.bounds(p, delta, "kl", backend="numpy", invalid="nan")
    assert np.isnan(lo[1:]).all() and np.isnan(hi[1:]).all()
    assert (lo[0], hi[0]) == band(0.1, 0.05, "kl")


def test_the_error_names_the_index_and_value():
    with pytest.raises(fbands.BandError, match=r"got 1\.5 at index \(1, 0\)"):
        fbands.bounds(np.array([[0.2], [1.5]]), 0.05, backend="numpy")


def test_unknown_names_list_the_alternatives():
    with pytest.raises(fbands.DivergenceError, match="available: kl, reverse_kl"):
        fbands.bounds(0.1, 0.05, "kullback")
    with pytest.raises(fbands.BandError, match="unknown backend"):
        fbands.bounds(0.1, 0.05, "kl", backend="jax")
    with pytest.raises(fbands.BandError, match="invalid must be"):
        fbands.bounds(0.1, 0.05, "kl", invalid="ignore")


# ----------------------------------------------------------------------------- choose_path


def choose_path(backend, div, p, delta, *, logp, log, path=None):
    """The path that :func:`fbands._dispatch.plan` chooses."""
    return plan(div, p, delta, backend=backend, logp=logp, log=log, path=path).path


F64 = np.linspace(0.1, 0.9, 5)


def _tensor(x, **kw):
    torch = pytest.importorskip("torch")
    return torch.tensor(x, **kw)


#: The decision table of choose_path (and of docs/theory/implementation.md),
#: row by row: (backend, divergence, p, delta, logp, log) -> path.
PATH_TABLE = [
    ("numpy", "kl", lambda: F64, 0.05, False, False, "exact"),
    ("numba", "tv", lambda: F64, 0.05, False, False, "closed-pass"),
    ("numba", "tv", lambda: F64, 0.05, True, False, "table"),  # log p: no closed pass
    ("numba", "tv", lambda: F64, 0.05, False, True, "table"),  # log-edges: no closed pass
    ("numba", "kl", lambda: F64.astype(np.float32), np.float32(0.05), False, False, "table"),
    ("numba", "kl", lambda: F64, np.full(5, 0.05), False, False, "exact"),  # per element
    ("numba", "kl", lambda: F64, 1e-7, False, False, "exact"),  # below the tables' radii
    ("numba", "tv", lambda: F64, 1e-7, False, False, "closed-pass"),  # (no table needed)
    ("numba", "kl", lambda: F64, -1.0, False, False, "exact"),  # invalid radius: raises there
    ("numba", "kl", lambda: 0.3, 0.05, False, False, "exact"),  # a scalar p
    ("numba", "kl", lambda: F64.astype(np.float16), 0.05, False, False, "exact"),
    ("torch", "kl", lambda: _tensor(F64), 0.05, False, False, "device-table"),  # a CPU tensor
    ("torch", "tv", lambda: _tensor(F64), 0.05, False, False, "device-closed"),  # closed forms
    ("torch", "tv", lambda: _tensor(F64, device="meta"), 0.05, False, False, "device-closed"),
    ("torch", "tv", lambda: _tensor(F64), 0.05, True, False, "device-table"),  # log p
    ("torch", "neyman_chi2", lambda: _tensor(F64), 0.05, False, False, "device-table"),
    ("torch", "kl", lambda: _tensor(F64), _tensor([0.05] * 5), False, False, "host"),
    ("torch", "kl", lambda: _tensor(F64), 1e-7, False, False, "host"),  # below the tables'
    ("torch", "kl", lambda: _tensor(F64, device="meta"), 0.05, False, False, "device-solver"),
    ("torch", "kl", lambda: F64, 0.05, False, False, "device-solver"),  # not a tensor
    ("torch", "kl", lambda: _tensor([1, 2]), 0.05, False, False, "device-solver"),  # integers
]


@pytest.mark.parametrize("backend, div, p, delta, logp, log, path", PATH_TABLE)
def test_choose_path_follows_the_decision_table(backend, div, p, delta, logp, log, path):
    got = choose_path(backend, fbands.get(div), p(), delta, logp=logp, log=log)
    assert got == path
    assert got in PATHS[backend]


def test_auto_hands_numba_only_large_arrays_whose_kernels_are_ready(monkeypatch):
    from fbands._dispatch import NUMBA_FROM, Plan, plan
    from fbands._jit import backend

    kl = fbands.get("kl")
    asked = []
    monkeypatch.setattr(backend, "is_ready", lambda div, dtype: asked.append(dtype) or True)
    for small in (F64, 0.3, [0.1, 0.2], np.full(NUMBA_FROM - 1, 0.3)):
        assert plan(kl, small, 0.05, logp=False, log=False) == Plan("numpy", "exact")
    assert asked == []
    big = np.full(NUMBA_FROM, 0.3)
    assert plan(kl, big, 0.05, logp=False, log=False) == Plan("numba", "table")
    assert plan(kl, big.astype(np.float32), 0.05, logp=True, log=False).backend == "numba"
    assert asked == ["float64", "float32"]
    monkeypatch.setattr(backend, "is_ready", lambda div, dtype: False)  # not compiled ahead
    assert plan(kl, big, 0.05, logp=False, log=False) == Plan("numpy", "exact")
    assert plan(kl, big, 0.05, logp=False, log=False, backend="numpy").backend == "numpy"
    assert plan(kl, F64, 0.05, logp=False, log=False, backend="numba").backend == "numba"


def test_choose_path_forces_torch_paths_only_where_they_apply():
    kl = fbands.get("kl")
    p = _tensor(F64)
    choose = choose_path
    assert choose("torch", kl, p, 0.05, logp=False, log=False, path="device-table") \
        == "device-table"
    assert choose("torch", kl, p, p, logp=False, log=False, path="device-solver") \
        == "device-solver"
    with pytest.raises(fbands.BandError, match="does not apply: delta is not one valid number"):
        choose("torch", kl, p, p, logp=False, log=False, path="device-table")
    with pytest.raises(fbands.BandError, match="does not apply: p is not a floating-point CPU"):
        choose("torch", kl, F64, 0.05, logp=False, log=False, path="host")


def test_a_scalar_argument_s_error_names_no_index():
    """A scalar delta (or p) is broadcast against the other argument, but its error is about
    the one value given: no "at index (0,)" and no count (issue 42, first contact)."""
    cases = [((np.array([0.1, 0.2]), -1.0), "delta must lie in (0, inf); got -1.0"),
             ((1.5, np.array([0.05, 0.1])), "p must lie in (0, 1]; got 1.5"),
             ((np.array([0.1, 1.5]), 0.05), "p must lie in (0, 1]; got 1.5 at index (1,)")]
    for (p, delta), message in cases:
        with pytest.raises(fbands.BandError) as err:
            fbands.bounds(p, delta)
        assert str(err.value) == message
