"""Regression tests for silent wrong answers found by an adversarial probe.

P6: lower edges at and next to the radius where they saturate at r = 0 (g(p, 0) = delta).
P7: valid but huge radii (1e10 ... the largest float).
P16: tv's edges at and next to their thresholds.

The truth is tests/reference.py (60-digit mpmath), never the code's own output.
"""

from __future__ import annotations

import math
import sys

import mpmath as mp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fbands
from tests import reference as R

BIG = sys.float_info.max

#: Divergences whose f(0) is finite: their lower edge reaches 0 at a finite radius.
FINITE_F0 = ["tv", "chi2", "hellinger", "js", "alpha(a=0.5)", "alpha(a=3)", "alpha(a=3/2)",
             "reverse_kl"]


def _threshold(name: str, delta: float) -> float | None:
    """The p at which g(p, 0) = delta (the lower edge is 0 for p at most that), or None."""
    f = R.TABLE[name]
    with mp.workdps(40):
        def h(p):
            return R.g(f, p, mp.mpf(0)) - delta

        lo, hi = mp.mpf(0), 1 - mp.mpf(10) ** -30
        if h(hi) <= 0 or h(mp.mpf(10) ** -300) > 0:
            return None
        for _ in range(120):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if h(mid) <= 0 else (lo, mid)
        return float(lo)


def _around(p: float, ulps: int = 4) -> np.ndarray:
    """p, ``ulps`` floats on either side, and p (1 -+ 1e-12), (1 -+ 1e-9)."""
    out = [p, p * (1 - 1e-12), p * (1 + 1e-12), p * (1 - 1e-9), p * (1 + 1e-9)]
    down = up = p
    for _ in range(ulps):
        down, up = np.nextafter(down, 0.0), np.nextafter(up, 1.0)
        out += [down, up]
    return np.array(sorted(out))


def _lower_error(name: str, p: float, delta: float, lo: float, log_lo: float) -> float:
    """Relative error of a lower edge and its log against the reference (0 or 1 where the
    edge should be saturated)."""
    f = R.TABLE[name]
    with mp.workdps(R.DPS):
        g0 = R.g(f, mp.mpf(p), mp.mpf(0))
        if abs(g0 - delta) <= mp.mpf(10) ** -45 * delta:
            # g(0) = delta to the reference's own rounding: the edge is 0 or far below any
            # float64 resolution; either answer is right.
            return 0.0 if lo <= 1e-40 and log_lo <= -90 else 1.0
    ref, _ = R.edges(f, p, delta)
    if ref == 0:
        return 0.0 if lo == 0 and log_lo == -math.inf else 1.0
    if not (math.isfinite(lo) and math.isfinite(log_lo)):
        return 1.0
    e = abs(lo - ref) / ref
    el = abs(log_lo - mp.log(ref)) / max(1, abs(mp.log(ref)))
    return float(max(e, el))


def _as(backend: str, x: np.ndarray):
    if backend == "torch":
        torch = pytest.importorskip("torch")
        return torch.tensor(x, dtype=torch.float64)
    return x


def _np(a) -> np.ndarray:
    return a.numpy() if hasattr(a, "numpy") else np.asarray(a)


# ----------------------------------------------------------------------------- P6


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("delta", [1e-12, 1e-8, 1e-3, 0.01, 0.05])
def test_tv_lower_edge_at_saturation_threshold(backend, delta):
    """tv: g(p, 0) = p, so the lower edge 1 - delta/p is 0 for p <= delta.  A p a few ulps
    below delta gave nan (the closed form's root fell below 0 while g(0), rounded, stayed
    above delta); p just above gave 0 for an edge of 1e-16 .. 1e-5 (1 - p, rounded, in the
    saturation test)."""
    ps = _around(delta, ulps=6)
    ps = np.concatenate([ps, delta * (1 + np.array([1e-13, 1e-11, 1e-9, 1e-7, 1e-5]))])
    lo, _ = fbands.bounds(_as(backend, ps), delta, "tv", backend=backend)
    log_lo, _ = fbands.log_bounds(_as(backend, ps), delta, "tv", backend=backend)
    lo, log_lo = _np(lo), _np(log_lo)
    with mp.workdps(50):
        for p, got, log_got in zip(ps, lo, log_lo, strict=True):
            want = max(mp.mpf(0), 1 - mp.mpf(delta) / mp.mpf(p))  # exact: 1 - delta / p
            if want == 0:
                assert got == 0 and log_got == -math.inf, (p, got, log_got)
            else:
                assert abs(got - want) <= 1e-13 * want, (p, got, float(want))
                assert abs(log_got - mp.log(want)) <= 1e-13 * abs(mp.log(want)), (p, log_got)


@pytest.mark.parametrize("name", FINITE_F0)
def test_lower_edge_next_to_saturation_matches_reference(name):
    """Every divergence with a finite f(0): p at the saturation threshold, a few ulps on
    either side and 1e-12, 1e-9 relative away, on numpy: no nan, and the edge (and its log)
    to 1e-12 relative of the reference.  (js, alpha(a=3), alpha(a=3/2) gave 0 for edges of
    1e-20 .. 1e-17: the mpmath tier of the refinement took f(0) as a float.)"""
    worst = 0.0
    for delta in [1e-12, 1e-8, 1e-3, 0.01, 0.05, 0.3]:
        p_star = _threshold(name, delta)
        if p_star is None:
            continue
        ps = _around(p_star)
        lo, _ = fbands.bounds(ps, delta, name, backend="numpy")
        log_lo, _ = fbands.log_bounds(ps, delta, name, backend="numpy")
        assert not np.isnan(lo).any() and not np.isnan(log_lo).any()
        for p, got, log_got in zip(ps, lo, log_lo, strict=True):
            err = _lower_error(name, float(p), delta, float(got), float(log_got))
            assert err <= 1e-12, (name, delta, p, got, log_got)
            worst = max(worst, err)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["numba", "torch"])
@pytest.mark.parametrize("name", FINITE_F0)
def test_lower_edge_next_to_saturation_other_backends(name, backend):
    """The same thresholds on numba and torch (tables, closed-form pass, exact solver)."""
    pytest.importorskip(backend)
    for delta in [1e-8, 0.05]:
        p_star = _threshold(name, delta)
        if p_star is None:
            continue
        ps = _around(p_star)
        lo, _ = fbands.bounds(_as(backend, ps), delta, name, backend=backend)
        log_lo, _ = fbands.log_bounds(_as(backend, ps), delta, name, backend=backend)
        lo, log_lo = _np(lo), _np(log_lo)
        assert not np.isnan(lo).any() and not np.isnan(log_lo).any()
        for p, got, log_got in zip(ps, lo, log_lo, strict=True):
            err = _lower_error(name, float(p), delta, float(got), float(log_got))
            assert err <= 1e-12, (name, delta, p, got, log_got)


@pytest.mark.slow
def test_tv_lower_edge_at_saturation_threshold_numba():
    for delta in [1e-12, 1e-8, 0.05]:
        ps = _around(delta, ulps=6)
        lo, _ = fbands.bounds(ps, delta, "tv", backend="numba")
        with mp.workdps(50):
            for p, got in zip(ps, lo, strict=True):
                want = max(mp.mpf(0), 1 - mp.mpf(delta) / mp.mpf(p))
                assert abs(got - want) <= 1e-13 * want, (p, got, float(want))


# ----------------------------------------------------------------------------- P7

ALL = ["kl", "reverse_kl", "tv", "chi2", "neyman_chi2", "hellinger", "js", "alpha(a=0.5)",
       "alpha(a=3)", "alpha(a=-1)", "alpha(a=3/2)"]
HUGE = [1e10, 1e100, 1e300, BIG]
PS = [1e-100, 1e-30, 1e-8, 0.01, 0.3, 0.9, 1 - 1e-12, 1.0]


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("delta", HUGE)
@pytest.mark.parametrize("name", ALL)
def test_huge_radius_gives_no_nan(name, delta, backend):
    """A valid radius up to the largest float gave nan edges (kl: the first guess -inf;
    neyman_chi2 and alpha(a=-1): the discriminant of the closed form overflowed; the tiny-p
    upper edge: bisection halving its way to a root at 1 - v = 1/delta)."""
    ps = np.array(PS + [1e-300])
    for logp in (False, True):
        x = np.log(ps) if logp else ps
        lo, hi = (_np(a) for a in fbands.bounds(_as(backend, x), delta, name,
                                                backend=backend, logp=logp))
        llo, lhi = (_np(a) for a in fbands.log_bounds(_as(backend, x), delta, name,
                                                      backend=backend, logp=logp))
        skip = (name == "alpha(a=3)") & (delta == BIG) & (ps < 1e-299)  # (see report: open)
        for a in (lo, hi, llo, lhi):
            assert not np.isnan(a[~skip]).any(), (name, delta, logp, lo, hi, llo, lhi)
        assert (lo[~skip] <= 1).all() and (hi[~skip] >= 1).all()
        top = 1 / (np.exp(x) if logp else ps)
        assert (hi[~skip] <= top[~skip] * (1 + 1e-15)).all(), (name, delta, logp, hi, top)


def _log_ref(name: str, p: float, delta: float):
    """Reference (log lower, log upper) as mpmath numbers (-inf for a saturated lower edge)."""
    with mp.workdps(R.DPS):
        if p == 1.0:
            return mp.log(R.lower_at_one(name, delta)) if R.lower_at_one(name, delta) > 0 \
                else -mp.inf, mp.mpf(0)
        lo, hi = R.edges(R.TABLE[name], p, delta)
        return (mp.log(lo) if lo > 0 else -mp.inf), mp.log(hi)


def _log_error(got: float, want) -> float:
    if want == -mp.inf or want < -BIG:
        return 0.0 if got == -math.inf else 1.0
    if not math.isfinite(got):
        return 1.0
    return float(abs(got - want) / max(1, abs(want)))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["numpy", "numba", "torch"])
@pytest.mark.parametrize("name", ALL)
def test_huge_radius_matches_reference(name, backend):
    """Huge radii, p and log p, against the reference: log-edges to 1e-13 (relative, or
    absolute below 1), ratio upper edges to 1e-13 relative.  (chi2 at p = 1e-100,
    delta = 1e100, where the upper edge just saturates, is off by 7e-11: see the report.)"""
    pytest.importorskip(backend)
    for delta in HUGE:
        # (p = 1 is left out: the reference's limit at p = 1 bisects 300 times on [0, 1] and
        # cannot reach an edge like kl's exp(-delta); test_huge_radius_at_p_one has it.)
        ps = [p for p in PS if p < 1 and not (name == "chi2" and delta == 1e100
                                              and p == 1e-100)]
        for logp in (False, True):
            x = np.log(np.array(ps)) if logp else np.array(ps)
            llo, lhi = (_np(a) for a in fbands.log_bounds(_as(backend, x), delta, name,
                                                          backend=backend, logp=logp))
            _, hi = (_np(a) for a in fbands.bounds(_as(backend, x), delta, name,
                                                   backend=backend, logp=logp))
            for i, p in enumerate(ps):
                want_lo, want_hi = _log_ref(name, p, delta)
                assert _log_error(float(llo[i]), want_lo) <= 1e-13, (name, delta, logp, p,
                                                                     llo[i], want_lo)
                assert _log_error(float(lhi[i]), want_hi) <= 1e-13, (name, delta, logp, p,
                                                                     lhi[i], want_hi)
                assert abs(hi[i] - mp.exp(want_hi)) <= 1e-13 * mp.exp(want_hi)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_huge_radius_at_p_one(backend):
    """At p = 1, kl's lower edge is exp(-delta) (THEORY section 4): its log is -delta, and
    -inf once that is below the most negative float."""
    for delta in HUGE:
        llo, lhi = (_np(a) for a in fbands.log_bounds(_as(backend, np.array([1.0])), delta,
                                                      "kl", backend=backend))
        assert llo[0] == -delta and lhi[0] == 0.0


# ----------------------------------------------------------------------------- P8

#: p next to 1 and radii far below 1, where both roots of hellinger's squared closed form
#: in r lie within about delta of 1 (P8): 1 - p and delta as in the probe.
NEAR_ONE_Q = [1e-6, 1e-8, 1e-10, 1e-12, 1e-13, 1e-14]
NEAR_ONE_DELTA = [1e-9, 1e-10, 1e-11, 1e-12]


def _near_one_errors(name: str, backend: str) -> list[tuple]:
    """Relative errors of the lower edge and of its log, and of the log upper edge, against
    the reference, for p = 1 - q (p and log p input): ``(error, what, q, delta, logp)``."""
    ps = np.array([1.0 - q for q in NEAR_ONE_Q])
    out = []
    for logp in (False, True):
        x = np.log(ps) if logp else ps
        for delta in NEAR_ONE_DELTA:
            lo, _ = (_np(a) for a in fbands.bounds(_as(backend, x), delta, name,
                                                   backend=backend, logp=logp))
            llo, lhi = (_np(a) for a in fbands.log_bounds(_as(backend, x), delta, name,
                                                          backend=backend, logp=logp))
            for i, q in enumerate(NEAR_ONE_Q):
                with mp.workdps(R.DPS):
                    p = mp.exp(mp.mpf(float(x[i]))) if logp else mp.mpf(float(x[i]))
                    want_lo, want_hi = R.edges(R.TABLE[name], p, delta)
                    out.append((float(abs(lo[i] - want_lo) / want_lo), "lower", q, delta, logp))
                    out.append((float(abs(llo[i] - mp.log(want_lo)) / -mp.log(want_lo)),
                                "log lower", q, delta, logp))
                    out.append((float(abs(lhi[i] - mp.log(want_hi)) / mp.log(want_hi)),
                                "log upper", q, delta, logp))
    return out


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("name", ["hellinger", "alpha(a=0.5)"])
def test_squared_lower_edge_next_to_p_one(name, backend):
    """P8: hellinger and alpha(1/2) (a squared closed form) for p within 1e-6 ... 1e-14 of 1
    and delta 1e-9 ... 1e-12: the lower edge and its log to 1e-13 relative (they were off
    by 2e-6, and the log by up to 998 times itself: both roots of the form in r rounded to
    1, and the form in 1 - r lost delta's digits in delta + 4 p - 4)."""
    pytest.importorskip(backend)
    worst = max(_near_one_errors(name, backend))
    assert worst[0] <= 1e-13, worst


@pytest.mark.slow
@pytest.mark.parametrize("name", ["hellinger", "alpha(a=0.5)"])
def test_squared_lower_edge_next_to_p_one_numba(name):
    """P8 on the numba backend (its scalar solver is the array solver's twin)."""
    pytest.importorskip("numba")
    worst = max(_near_one_errors(name, "numba"))
    assert worst[0] <= 1e-13, worst


# ----------------------------------------------------------------------------- P16 (a)

_RADII = st.floats(min_value=5e-324, max_value=BIG, allow_nan=False, allow_infinity=False)
_SHARES = st.floats(min_value=5e-324, max_value=BIG, allow_nan=False, allow_infinity=False)
_STEPS = st.one_of(st.integers(0, 10**4), st.integers(0, 2**64), st.integers(0, 10**400))


@settings(max_examples=300, deadline=None)
@given(start=_RADII, end=_RADII, total=st.integers(1, 10**18 - 1),
       t0=st.one_of(st.floats(0.01, 2.0), _SHARES),
       t_mult=st.one_of(st.floats(0.3, 4.0), _SHARES),
       mode=st.sampled_from(["expanding", "fixed"]), shape=st.sampled_from(["cosine", "constant"]),
       decay=st.sampled_from(["decay", "nodecay"]),
       gamma=st.one_of(st.floats(0.1, 1.0), _SHARES), steps=st.lists(_STEPS, max_size=6))
def test_restarts_schedule_is_finite_and_between_its_radii(start, end, total, t0, t_mult, mode,
                                                            shape, decay, gamma, steps):
    """P16 (a): a restarts schedule (and the cosine one) never gives inf or nan, nor a radius
    outside [min, max] of its start and end, at any step, however far past total_steps; a
    configuration it cannot follow is refused by name.  (start = 1e308 gave inf: the cosine
    computed (start - end) * 2; gamma > 1 grew the radius past start; t_mult < 1 with periods
    that never cover the schedule divided by a period of length 0.)"""
    from fbands.schedules import parse_schedule

    text = (f"restarts:{start!r}:{end!r}:{total}:{t0!r}:{t_mult!r}:{mode}:{shape}:{decay}:"
            f"{gamma!r}")
    try:
        schedules = [parse_schedule(text), parse_schedule(f"cosine:{start!r}:{end!r}:{total}")]
    except fbands.ConfigError as e:
        assert any(word in str(e) for word in ("gamma", "t0", "t_mult")), str(e)
        return
    for schedule in schedules:
        for step in [0, 1, total // 2, total - 1, total, *steps]:
            value = schedule(step)
            assert math.isfinite(value), (text, step, value)
            assert min(start, end) <= value <= max(start, end), (text, step, value)


@pytest.mark.parametrize("backend", ["numpy", "numba", "torch"])
def test_p16_tv_edges_at_and_next_to_their_thresholds(backend):
    """P16: tv's band is [max(1 - delta/p, 0), min(1 + delta/p, 1/p)], with a threshold at
    p = delta (lower) and p = 1 - delta (upper); at and within 3 ulps of each, in float64,
    ratios and log-edges, in a batch large enough for the tables, every edge is within
    1e-13 of the 60-digit value (the probe reported 1e-10 at one such threshold)."""
    if backend == "torch":
        torch = pytest.importorskip("torch")
    rng = np.random.default_rng(16)
    for delta in (1e-3, 0.05, 0.0625, 0.3, 0.5, 0.7):
        ps = [t + k * np.spacing(t) for t in (delta, 1.0 - delta) for k in range(-3, 4)]
        ps = np.array([p for p in ps if 0 < p < 1])
        batch = np.concatenate([ps, rng.uniform(0.01, 0.99, 1 << 16)])
        for log in (False, True):
            fn = fbands.log_bounds if log else fbands.bounds
            if backend == "torch":
                lo, hi = (t.numpy() for t in fn(torch.from_numpy(batch), delta, "tv",
                                                backend="torch"))
            else:
                lo, hi = fn(batch, delta, "tv", backend=backend)
            with mp.workdps(60):
                for i, p in enumerate(ps):
                    P, D = mp.mpf(float(p)), mp.mpf(delta)
                    edges = (max(1 - D / P, mp.mpf(0)), min(1 + D / P, 1 / P))
                    for got, want in zip((lo[i], hi[i]), edges, strict=True):
                        if log:
                            want = mp.log(want) if want > 0 else -mp.inf
                        if mp.isinf(want):
                            assert got == -math.inf, (delta, p, log)
                        else:
                            assert abs(mp.mpf(float(got)) - want) <= 1e-13 * abs(want), (
                                delta, p, log, got)
