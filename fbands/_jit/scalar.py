"""The scalar form of the band solver: the method of :func:`fbands._solver.solve`, one
element at a time, for numba.

Each function mirrors the array function named in its docstring, step for step: both forms
take the same branches and iterate the same number of times on the same element
(``tests/jit/test_solver_forms.py`` checks it through :func:`trace_arrays`).  The divergence
enters through its leaves (:mod:`fbands._jit.codegen`): ``F_near``, ``F_far``, ``dF``, the
closed-form coefficients ``upper_a2 ... lower_a0`` and the constants imported below, which
numba reads as compile-time constants.  The relative import of ``.leaves`` resolves in the
package that :mod:`fbands._jit.loader` makes for each divergence; this file is never
imported as ``fbands._jit.scalar``.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from fbands._jit import disk_cache
from fbands._jit.prims import INLINE, OPTS, fmax, fmin
from fbands._solver import (
    AT_ONE,
    BRACKET_TOL,
    CLOSED,
    FAR_ABOVE,
    GEOMETRIC_SPLIT,
    JUST_BELOW,
    LN2,
    LOG_NORMAL,
    LP_CLOSED,
    LP_TINY,
    MAX_ITER,
    NEAR_DOUBLE,
    NEGATIVE_DISC,
    NEWTON,
    POLISHED,
    RESOLVED_W,
    S_FLOOR,
    SATURATED,
    SMALL_BAND_EXACT,
    SQUARED_NEAR_ONE,
    STEEP_FROM,
    STEP_TOL,
    TAIL_EXACT,
    TAIL_SWITCH,
    TINY,
    TOP_SLACK,
    W_ULP,
    WIDTH_FLOOR,
    Y_RESOLUTION,
)

from .leaves import (
    CURVATURE,
    F0,
    FPRIME_INF,
    HAS_LOWER,
    HAS_TAIL_INF,
    HAS_UPPER,
    LOWER_UNSQUARED,
    LOWER_Y_ZERO,
    LOWER_ZERO,
    NEAR,
    NEAR_DIFFERS,
    SMOOTH,
    STEEP_TAIL,
    TAIL0_A,
    TAIL0_K,
    TAIL0_KIND,
    TAIL_INF_A,
    TAIL_INF_B,
    TAIL_INF_K,
    TAIL_INF_M,
    UPPER_UNSQUARED,
    UPPER_ZERO,
    F_far,
    F_near,
    dF,
    lower_a0,
    lower_a1,
    lower_a2,
    lower_y_a0,
    lower_y_a1,
    lower_y_a2,
    upper_a0,
    upper_a1,
    upper_a2,
)

# The band function g, for the three equations (BandFunction, TinyUpper, AtOne).
BAND, TINY_UPPER, LIMIT_AT_ONE = 0, 1, 2


@numba.njit(**OPTS)
def F(s):
    """``F(s) = f(e^s)`` (``Divergence.kernels``: the near form for ``|s| < NEAR``)."""
    if NEAR_DIFFERS and abs(s) < NEAR:
        return F_near(s)
    return F_far(s)


@numba.njit(**OPTS)
def log1mexp_one(z):
    """:func:`log1mexp` of one float."""
    if z > -LN2:
        return math.log(-math.expm1(z))
    return math.log1p(-math.exp(z))


@numba.njit(**OPTS)
def s_c_one(s, lp, lq, poq):
    """``BandFunction.s_c``."""
    xc = -poq * math.expm1(s)
    if xc > -0.5:
        return math.log1p(xc)
    return log1mexp_one(fmin(lp + s, 0.0)) - lq


@numba.njit(**OPTS)
def times_one(w, c):
    """``BandFunction._times``: ``w * c`` with ``0 * inf = 0``."""
    if math.isfinite(c):
        return w * c
    return math.inf if w > 0 else 0.0


@numba.njit(**OPTS)
def tiny_terms(w, lp):
    """``TinyUpper._T``: ``(T(w), T'(w))``."""
    scale = math.exp(TAIL_INF_K * w + (1.0 - TAIL_INF_K) * lp)
    if TAIL_INF_M == 0:
        T = TAIL_INF_A * scale
        return T, TAIL_INF_K * T
    T = scale * (TAIL_INF_A * (w - lp) + TAIL_INF_B)
    return T, TAIL_INF_K * T + TAIL_INF_A * scale


@numba.njit(**OPTS)
def value_and_slope_one(kind, s, lp, lq, p, q, poq):
    """``value_and_slope`` of BandFunction (``kind`` BAND), TinyUpper or AtOne."""
    if kind == LIMIT_AT_ONE:
        return F(s) - math.expm1(s) * FPRIME_INF, dF(s) - math.exp(s) * FPRIME_INF
    if kind == TINY_UPPER:
        sc = log1mexp_one(fmin(s, 0.0))
        T, dT = tiny_terms(s, lp)
        if sc == -math.inf:
            return T + F0, math.inf
        return T + F(sc), dT - math.exp(s - sc) * dF(sc)
    sc = s_c_one(s, lp, lq, poq)
    if sc == -math.inf:
        return p * F(s) + q * F0, math.inf
    return p * F(s) + q * F(sc), p * (dF(s) - math.exp(s - sc) * dF(sc))


@numba.njit(**OPTS)
def complement_one(kind, s, lp, lq, poq):
    """``complement`` of BandFunction (``kind`` BAND) or TinyUpper: ``(s_c, ds/ds_c)``."""
    if kind == TINY_UPPER:
        sc = log1mexp_one(fmin(s, 0.0))
        return sc, -math.exp(sc - s)
    sc = s_c_one(s, lp, lq, poq)
    return sc, -math.exp(sc - s) / poq


@numba.njit(**OPTS)
def from_complement_one(kind, sc, lp, lq):
    """``from_complement`` of BandFunction or TinyUpper."""
    if kind == TINY_UPPER:
        return log1mexp_one(fmin(sc, -1e-300)) if sc < 0 else math.nan
    return math.log1p(-math.exp(sc + lq)) - lp


@numba.njit(**OPTS)
def newton_one(kind, upper, s, lo, hi, lp, lq, p, q, poq, delta):
    """:func:`newton_edge` for one element: ``(root, iterations)``."""
    sign = 1.0 if upper else -1.0
    for it in range(1, MAX_ITER + 1):
        g, slope = value_and_slope_one(kind, s, lp, lq, p, q, poq)
        r = g - delta
        if not (sign * r <= 0):
            hi = s
        else:
            lo = s
        num = math.log(g / delta) * g if g / delta > FAR_ABOVE else r
        step = num / slope
        cand = s - step
        small = abs(step) <= STEP_TOL * abs(s)
        if upper and kind != LIMIT_AT_ONE:
            sc, ds_dsc = complement_one(kind, s, lp, lq, poq)
            if sc < -LN2:
                step_c = num / (slope * ds_dsc)
                cand = fmin(from_complement_one(kind, sc - step_c, lp, lq), hi * JUST_BELOW)
                if g < delta / FAR_ABOVE and not (cand > lo and cand < hi):  # (see newton_edge)
                    step_c = math.log(g / delta) * g / (slope * ds_dsc)
                    cand = fmin(from_complement_one(kind, sc - step_c, lp, lq),
                                hi * JUST_BELOW)
                small = (abs(step_c) <= STEP_TOL * abs(sc)
                         or abs(cand - s) <= STEP_TOL * abs(s))
        inside = math.isfinite(slope) and slope != 0 and cand > lo and cand < hi
        alo, ahi = fmax(abs(lo), 1.0), fmax(abs(hi), 1.0)
        far = lo * hi >= 0 and (alo > GEOMETRIC_SPLIT * ahi or ahi > GEOMETRIC_SPLIT * alo)
        if not math.isfinite(lo):
            mid = hi - fmax(abs(hi), 1.0)
        elif far:
            mid = math.copysign(1.0, lo + hi) * math.sqrt(alo * ahi)
        else:
            mid = 0.5 * (lo + hi)
        converged = r == 0 or (small and math.isfinite(r) and math.isfinite(slope)
                               and slope != 0)
        converged = converged or hi - lo <= BRACKET_TOL * fmax(abs(hi), WIDTH_FLOOR)
        s = fmin(fmax(cand, lo), hi) if (converged or inside) else mid
        if converged:
            return s, it
    return math.nan, MAX_ITER


@numba.njit(**OPTS)
def lower_tail_one(lp, delta):
    """:func:`_lower_tail` (nan where f has no usable tail at 0)."""
    if TAIL0_KIND == 1:
        return (math.log(delta) - math.log(TAIL0_A) - lp) / TAIL0_K
    if TAIL0_KIND == 2:
        return -math.exp(math.log(delta) - math.log(-TAIL0_A) - lp)
    return math.nan


@numba.njit(**OPTS)
def initial_guess_one(upper, lp, lq, poq, delta):
    """:func:`_initial_guess`."""
    w = math.sqrt(2.0 * delta) / math.sqrt(CURVATURE * poq)  # (see _initial_guess)
    if upper:
        return fmin(math.log1p(w), -0.5 * lp)
    if STEEP_TAIL and w * poq > STEEP_FROM:  # (see _steep_tail)
        c = math.exp((math.log(delta) - math.log(TAIL_INF_A) - lq) / TAIL_INF_K)
        w = fmin(w, c / poq)
    if w < TAIL_SWITCH:
        return fmax(math.log1p(-w), S_FLOOR)
    if TAIL0_KIND == 0:
        return fmax(-w, S_FLOOR)
    return fmax(fmin(lower_tail_one(lp, delta), -1.0), S_FLOOR)


@numba.njit(**INLINE)
def real_roots_one(a2, a1, a0, zero):
    """:func:`real_roots`."""
    if zero[0]:
        v = -a0 * (1.0 / a1)
        return v, v, False
    if zero[1]:
        v = math.sqrt(-a0 * (1.0 / a2))
        return v, -v, False
    big = not math.isfinite(a1 * a1 - 4.0 * a2 * a0)  # (see real_roots)
    scale = 1.0 / (abs(a2) + abs(a1) + abs(a0)) if big else 1.0
    a2, a1, a0 = a2 * scale, a1 * scale, a0 * scale
    disc = a1 * a1 - 4.0 * a2 * a0
    root = math.sqrt(fmax(disc, 0.0) if disc >= -NEGATIVE_DISC * a1 * a1 else math.nan)
    t = -0.5 * (a1 + (root if a1 >= 0 else -root))
    return t * (1.0 / a2), a0 / t, disc < NEAR_DOUBLE * a1 * a1


@numba.njit(**INLINE)
def newton_step_one(a2, a1, a0, v, zero):
    """:func:`newton_step`."""
    if zero[0]:
        return (a1 * v + a0) * (1.0 / a1)
    return ((a2 * v + a1) * v + a0) / (2.0 * a2 * v + a1)


@numba.njit(**INLINE)
def smallest_positive_one(v1, v2):
    """:func:`smallest_positive`."""
    return min(v1 if v1 > 0.0 else math.inf, v2 if v2 > 0.0 else math.inf)


@numba.njit(**INLINE)
def upper_root_one(p, q, delta):
    """:func:`upper_root`.  (Inlined, like the two below, into the closed-form pass, whose
    loop must vectorise: every choice is a select.)"""
    y1, y2, ill = real_roots_one(np.float64(upper_a2(p, q, delta)),
                                 np.float64(upper_a1(p, q, delta)),
                                 np.float64(upper_a0(p, q, delta)), UPPER_ZERO)
    return smallest_positive_one(y1, y2), ill


@numba.njit(**INLINE)
def lower_root_one(p, q, delta, polish):
    """:func:`lower_root`.  (Bitwise operators, not ``and``: see :func:`upper_root_one`.)"""
    y1, y2, ill = real_roots_one(np.float64(lower_y_a2(p, q, delta)),
                                 np.float64(lower_y_a1(p, q, delta)),
                                 np.float64(lower_y_a0(p, q, delta)), LOWER_Y_ZERO)
    y = smallest_positive_one(y1, y2)
    r = 1.0 - y
    if polish:  # (a constant at each call site)
        a2 = np.float64(lower_a2(p, q, delta))
        a1 = np.float64(lower_a1(p, q, delta))
        a0 = np.float64(lower_a0(p, q, delta))
        below_half = r < 0.5
        unresolved = abs(r) <= Y_RESOLUTION
        start = 0.0 if unresolved else r
        step = below_half & ((r > 0.0) | unresolved)
        ill = ill | (below_half & real_roots_one(a2, a1, a0, LOWER_ZERO)[2])
        r = start - newton_step_one(a2, a1, a0, start, LOWER_ZERO) if step else r
    return r, y, ill


@numba.njit(**INLINE)
def _squared_pick(ok, s, best, best_e, have, lp, lq, p, q, poq, delta):
    """One candidate of :func:`squared_edge_one`: ``(best, its |g - delta|, any taken)``."""
    e = abs(value_and_slope_one(BAND, s if ok else 0.0, lp, lq, p, q, poq)[0] - delta)
    e = e if e == e else math.inf
    if ok and ((not have) or e < best_e):
        return s, e, True
    return best, best_e, have or ok


@numba.njit(**OPTS)
def squared_edge_one(upper, lp, lq, p, q, poq, delta):
    """:func:`fbands._roots.squared_edge` (a form the divergence lacks has nan
    coefficients: no root of it is ever taken)."""
    best, best_e, have = math.nan, math.inf, False
    if upper:
        v1, v2, _ = real_roots_one(upper_a2(p, q, delta) + 0.0, upper_a1(p, q, delta) + 0.0,
                                   upper_a0(p, q, delta) + 0.0, UPPER_ZERO)
        for v in (v1, v2):
            s = math.log1p(v) if v > -1 else math.nan
            best, best_e, have = _squared_pick(v > 0 and v * poq <= TOP_SLACK, s, best,
                                               best_e, have, lp, lq, p, q, poq, delta)
        return best
    v1, v2, _ = real_roots_one(lower_a2(p, q, delta) + 0.0, lower_a1(p, q, delta) + 0.0,
                               lower_a0(p, q, delta) + 0.0, LOWER_ZERO)
    for v in (v1, v2):
        s = math.log(v) if v > 0 else (-math.inf if v == 0 else math.nan)
        best, best_e, have = _squared_pick(v >= 0 and v <= 1, s, best, best_e, have,
                                           lp, lq, p, q, poq, delta)
    v1, v2, _ = real_roots_one(lower_y_a2(p, q, delta) + 0.0, lower_y_a1(p, q, delta) + 0.0,
                               lower_y_a0(p, q, delta) + 0.0, LOWER_Y_ZERO)
    for v in (v1, v2):
        s = math.log1p(-v) if v < 1 else (-math.inf if v == 1 else math.nan)
        best, best_e, have = _squared_pick(v >= 0 and v <= 1, s, best, best_e, have,
                                           lp, lq, p, q, poq, delta)
    return best


@numba.njit(**OPTS)
def closed_edge_one(upper, lp, lq, p, q, poq, delta):
    """:func:`fbands._roots.closed_edge`: ``(log-edge, needs a polish)``."""
    if not (UPPER_UNSQUARED if upper else LOWER_UNSQUARED):
        return squared_edge_one(upper, lp, lq, p, q, poq, delta), True
    if upper:
        y, ill = upper_root_one(p, q, delta)
        return (math.log1p(y) if y > -1 else math.nan), ill
    r, y, ill = lower_root_one(p, q, delta, True)
    if r >= 0.5:
        return math.log1p(-y), ill
    return (math.log(r) if r > 0 else (-math.inf if r <= 0 else math.nan)), ill


@numba.njit(**OPTS)
def polish_one(s, lo, hi, lp, lq, p, q, poq, delta):
    """:func:`polish`."""
    g, slope = value_and_slope_one(BAND, s, lp, lq, p, q, poq)
    cand = s - (g - delta) / slope
    if cand >= lo and cand <= hi and math.isfinite(s):
        return cand
    return s


@numba.njit(**OPTS)
def edge_one(upper, lo, hi, lp, lq, p, q, poq, delta):
    """:func:`_edge`: ``(log-edge before saturation, how, iterations)``."""
    has_closed = HAS_UPPER if upper else HAS_LOWER
    small_band = initial_guess_one(upper, lp, lq, poq, delta)
    near_one = abs(small_band) * fmax(1.0, poq)  # (see _edge)
    exact_band = SMOOTH and near_one < SMALL_BAND_EXACT
    if not has_closed or lp < LP_CLOSED:
        s, n = newton_one(BAND, upper, small_band, lo, hi, lp, lq, p, q, poq, delta)
        return (small_band if exact_band else s), NEWTON, n
    s, close = closed_edge_one(upper, lp, lq, p, q, poq, delta)
    if SMOOTH and not (UPPER_UNSQUARED if upper else LOWER_UNSQUARED) \
            and near_one < SQUARED_NEAR_ONE:
        s = polish_one(small_band, lo, hi, lp, lq, p, q, poq, delta)
    how = CLOSED
    if close:
        s, how = polish_one(s, lo, hi, lp, lq, p, q, poq, delta), POLISHED
    return (small_band if exact_band else s), how, 0


@numba.njit(**OPTS)
def tiny_one(lp, delta):
    """:func:`_solve_tiny`: ``(log lower, log upper, upper's iterations)``."""
    s_hi, n = math.nan, 0
    if HAS_TAIL_INF:
        m_term = math.log(-lp) if TAIL_INF_M != 0 else 0.0
        w0 = (math.log(delta / TAIL_INF_A) - (1.0 - TAIL_INF_K) * lp - m_term) / TAIL_INF_K
        w0 = fmin(w0, -LN2)
        w, n = newton_one(TINY_UPPER, True, w0, -math.inf, 0.0, lp, 0.0, 0.0, 1.0, 0.0, delta)
        if tiny_terms(0.0, lp)[0] + F0 <= delta:
            w = 0.0
        w_res = fmin(-W_ULP, lp * RESOLVED_W)
        if value_and_slope_one(TINY_UPPER, w_res, lp, 0.0, 0.0, 1.0, 0.0)[0] < delta:
            w = 0.0  # the root within a float of 0 (see _solve_tiny)
        s_hi = w - lp
    if math.isfinite(F0):
        return -math.inf, s_hi, n
    return lower_tail_one(lp, delta), s_hi, n


@numba.njit(**OPTS)
def at_one_one(delta):
    """:func:`_solve_at_one`: ``(log lower edge at p = 1, iterations)``."""
    if math.isinf(FPRIME_INF):
        return 0.0, 0
    if F0 + FPRIME_INF <= 0:  # pragma: no cover - excluded by convexity
        return -math.inf, 0
    s, n = newton_one(LIMIT_AT_ONE, False, -0.1, -math.inf, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0,
                      delta)
    if F0 + FPRIME_INF <= delta:
        return -math.inf, n
    return fmin(s, 0.0), n


@numba.njit(**OPTS)
def solve_one(lp, lq, p, q, delta):
    """:func:`solve` for one element: ``(log lower, log upper, how lower, how upper,
    iterations lower, iterations upper)``."""
    if lp == 0:
        s_lo, n_lo = at_one_one(delta)
        return s_lo, 0.0, AT_ONE, AT_ONE, n_lo, 0
    if lp < LP_TINY:
        s_lo, s_hi, n_hi = tiny_one(lp, delta)
        return s_lo, s_hi, TINY, TINY, 0, n_hi
    poq = math.exp(lp - lq)
    top = -lp
    if p * F(-lp) + times_one(q, F0) <= delta:
        s_hi, how_hi, n_hi = top, SATURATED, 0
    else:
        s_hi, how_hi, n_hi = edge_one(True, 0.0, top, lp, lq, p, q, poq, delta)
        s_hi = fmin(fmax(s_hi, 0.0), top)
    sat_lo = times_one(p, F0) + q * F(-lq) <= delta
    if not math.isfinite(F0):  # (see solve)
        sat_lo = sat_lo or value_and_slope_one(BAND, S_FLOOR, lp, lq, p, q, poq)[0] <= delta
    if sat_lo:
        s_lo, how_lo, n_lo = -math.inf, SATURATED, 0
    else:
        s_lo, how_lo, n_lo = edge_one(False, -math.inf, 0.0, lp, lq, p, q, poq, delta)
        s_lo = power_tail_one(fmin(s_lo, 0.0), lp, delta)
    return s_lo, s_hi, how_lo, how_hi, n_lo, n_hi


@numba.njit(**OPTS)
def power_tail_one(s_lo, lp, delta):
    """:func:`fbands._solver._power_tail` of an unsaturated lower edge."""
    if TAIL0_KIND != 1 or math.isfinite(F0) or not TAIL0_K < 0:
        return s_lo
    t = lower_tail_one(lp, delta)
    if not (s_lo >= LOG_NORMAL) and TAIL0_K * t >= TAIL_EXACT:
        return t
    return s_lo



# ----------------------------------------------------------------------------- drivers


@numba.njit(parallel=True, **OPTS)
def solve_arrays(lp, lq, p, q, delta, out_lo, out_hi):
    """:func:`solve_one` over flat float64 arrays (the inputs of
    :class:`fbands._inputs.NumpyInputs`), in parallel."""
    for i in numba.prange(lp.size):
        out_lo[i], out_hi[i] = solve_one(lp[i], lq[i], p[i], q[i], delta[i])[:2]


@numba.njit(parallel=True, **OPTS)
def trace_arrays(lp, lq, p, q, delta, out_lo, out_hi, how, iters):
    """:func:`solve_arrays` that also stores how each edge was found and Newton's
    iterations (columns lower, upper): what the tests compare with the array form."""
    for i in numba.prange(lp.size):
        lo, hi, how_lo, how_hi, n_lo, n_hi = solve_one(lp[i], lq[i], p[i], q[i], delta[i])
        out_lo[i], out_hi[i] = lo, hi
        how[i, 0], how[i, 1], iters[i, 0], iters[i, 1] = how_lo, how_hi, n_lo, n_hi


disk_cache.tolerate(globals())  # (a damaged cache file costs a compile, not a call)
