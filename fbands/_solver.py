"""The band solver, written once for every array library.

Everything here works on arrays of one array namespace ``xp`` (numpy, or torch through
:mod:`fbands.backends.torch_backend`), with the divergence's kernels bound to that namespace.
The unknown is ``s = log r``:

* the upper edge lies in ``[0, -log p]`` (``r`` in ``[1, 1/p]``);
* the lower edge lies in ``(-inf, 0]``; ``s = -inf`` is the saturated edge ``r = 0``.

The band function in ``s`` is

.. math::

    g(s) = p\\,F(s) + q\\,F(s_c), \\qquad
    s_c = \\log\\frac{1 - p e^s}{q},\\qquad F(s) = f(e^s),

with ``s_c`` computed as ``log1p(-(p/q) expm1(s))`` while ``c`` is near 1 and as
``log1mexp(log p + s) - log q`` once ``c`` is small, so that neither form cancels.  Its slope is

.. math::

    g'(s) = p\\,\\bigl(F'(s) - e^{s - s_c} F'(s_c)\\bigr).

Edges with a closed form (:class:`fbands.symbolic.ClosedForm`) come from the
cancellation-free quadratic formula (polished by one Newton step on ``g`` where the
polynomial is ill-conditioned); the others from a safeguarded Newton iteration that keeps
a bracket, falls back to bisection when a step leaves it, and stops once a Newton step is
below ``STEP_TOL |s|`` (the error left after it is of the order of that step squared).
Saturation is decided by ``g`` itself at ``r = 0`` and ``r = 1/p``.

The method is written here twice in form but once in substance: the array form
(:func:`solve`, for numpy and torch, every element at once) and the scalar form
(:mod:`fbands._jit.scalar`, one element at a time, compiled by numba against each
divergence's generated leaves).  Both take the same branches and iterate the same number
of times on the same element (``tests/jit/test_solver_forms.py`` checks it, through
:func:`solve`'s ``trace`` and the scalar form's counts).
"""

from __future__ import annotations

import math
import sys
from dataclasses import fields
from typing import TYPE_CHECKING

import numpy as np

from fbands._band_function import (  # noqa: F401  (LN2, LP_TINY ...: the method's names)
    LN2,
    LP_CLOSED,
    LP_TINY,
    AtOne,
    BandFunction,
    Inputs,
    TinyUpper,
    log1mexp,
    lower_tail,
    take_inputs,
)
from fbands._roots import (  # noqa: F401  (the closed forms' names, for both forms)
    NEAR_DOUBLE,
    NEGATIVE_DISC,
    TOP_SLACK,
    Y_RESOLUTION,
    closed_edge,
    lower_root,
    newton_step,
    real_roots,
    smallest_positive,
    squared_edge,
    unsquared,
    upper_root,
)

if TYPE_CHECKING:
    from fbands.divergences import Divergence

#: Where the small-radius band ``1 -+ sqrt(2 delta q / (f''(1) p))`` is an edge to float64: its
#: relative error is of the order of ``|r - 1|`` and ``|c - 1| = (p / q) |r - 1|``; below this,
#: Newton is not needed (and would meet ``g`` in subnormal numbers, delta below 1e-290).
SMALL_BAND_EXACT = 1e-17
#: Below this distance a root of a squared closed form is replaced by the small-radius band,
#: polished twice (each polish squares a relative error of at most 1e-4 away).
SQUARED_NEAR_ONE = 1e-4
#: The float next to 0 below it: the last point of the tiny upper edge's bracket.
W_ULP = 5e-324
#: ``w`` above ``log p`` times this is within a quarter ulp of ``-log p``: the upper edge
#: ``s = w - log p`` of a tiny ``p`` is ``-log p`` (saturated) to working precision.
RESOLVED_W = 2.0**-55
#: The other token's ratio beyond which the lower edge's first guess next to p = 1 comes
#: from f's tail at infinity for generators steeper than a square (:func:`_steep_tail`).
STEEP_FROM = 2.0**53
#: Smallest q used in the equations: p = 1 as p = 1 - 1e-300 gives the limit [r*, 1] exactly.
Q_FLOOR = 1e-300

# -- constants of the method (shared by both forms) ---------------------------------------

#: Newton has converged once its step is below this share of ``|s|`` (the error left is of
#: the order of the step squared) ...
STEP_TOL = 1e-12
#: ... or once the bracket holds about two floats (relative width) ...
BRACKET_TOL = 4e-16
#: ... relative to ``max(|hi|, WIDTH_FLOOR)``: a root at ``s = 0`` exactly has a bracket too.
WIDTH_FLOOR = 1e-300
#: Iterations before an element is declared unconverged (nan).  The safeguarded iteration
#: halves the bracket at worst, so 200 covers the whole float64 range of s many times over.
MAX_ITER = 200
#: Without a fixed count (numpy), once at most this share of the elements is left to
#: converge, the loop goes on with those alone (:meth:`BandFunction.take`): the same
#: values, without the work of the converged ones while a few stragglers finish.
COMPACT_AT = 0.25
#: Above ``FAR_ABOVE * delta`` a Newton step is taken on ``log g`` instead of ``g``.
FAR_ABOVE = 2.0
#: A positive float times this is the float just below it (or one further; see newton_edge).
JUST_BELOW = 1.0 - 2.0**-52
#: A bracket whose ends (floored at 1 in magnitude) differ by more than this factor is
#: bisected geometrically: its arithmetic midpoint would gain one bit per step.
GEOMETRIC_SPLIT = 4.0
#: The lower edge's first guess switches from ``log(1 - w)`` (small delta) to the tail of f at
#: 0 once the chi-square half-width ``w`` reaches this (log(1 - w) is far off, or undefined).
TAIL_SWITCH = 0.5
#: The most negative float: a lower edge whose log lies below it is ``-inf`` (saturated in
#: float64: ``g`` at ``s = S_FLOOR`` already within the radius), and the first guess of a
#: lower edge is never below it (Newton cannot start from ``-inf``).
S_FLOOR = -sys.float_info.max
#: ``log`` of the smallest normal float: a lower edge below it (a ratio that underflows, or
#: that has lost bits as a subnormal) is taken from the tail of ``f`` at 0 ...
LOG_NORMAL = math.log(sys.float_info.min)
#: ... where ``f ~ A r^k`` (``k < 0``) holds to ``r^|k| < 2^-60``, i.e. ``k log r`` above this.
TAIL_EXACT = 60 * math.log(2.0)

# -- how an edge was found (the ``trace`` of solve and the counts of solve_one) -----------

#: Saturated: ``r = 1/p`` (upper) or ``r = 0`` (lower), decided by g at that end.
SATURATED = 0
#: The closed form's root, as it is.
CLOSED = 1
#: The closed form's root, polished by one Newton step on g (nearly double roots).
POLISHED = 2
#: Safeguarded Newton on g.
NEWTON = 3
#: ``log p < LP_TINY``: from the tails of f (:class:`TinyUpper`, :func:`lower_tail`).
TINY = 4
#: ``p = 1``: the limit equation (:class:`AtOne`).
AT_ONE = 5


def _solve_where(mask, x: Inputs, fixed_iter, solve_part):
    """``solve_part(x)``, a tuple of arrays that the caller reads where ``mask`` holds: on
    numpy (no fixed count) ``solve_part`` runs on those elements alone and the arrays are 0
    elsewhere; otherwise on every element."""
    if fixed_iter is not None or not isinstance(mask, np.ndarray):
        return solve_part(x)
    shape = np.broadcast_shapes(*(np.shape(getattr(x, f.name)) for f in fields(Inputs)))
    index = np.nonzero(np.broadcast_to(mask, shape))
    found = solve_part(take_inputs(x, shape, index))
    out = []
    for part in found:
        full = np.zeros(shape)
        full[index] = part
        out.append(full)
    return tuple(out)


def _solve_at_one(div: Divergence, xp, x: Inputs, fixed_iter, kernels=None):
    """Log lower edge at ``p = 1`` and its Newton iterations."""
    zero = 0.0 * x.lp
    if math.isinf(div.fprime_inf):
        return zero, zero  # f'(inf) = inf: nothing may leave a token of probability 1
    if div.f0 + div.fprime_inf <= 0:  # pragma: no cover - excluded by convexity
        return zero - math.inf, zero
    fun = AtOne(div, xp, x, kernels)
    s, n = newton_edge(fun, "lower", zero - 0.1, zero - math.inf, zero, fixed_iter=fixed_iter)
    return xp.where(div.f0 + div.fprime_inf <= x.delta, -math.inf, xp.minimum(s, zero)), n


def _solve_tiny(div: Divergence, xp, x: Inputs, fixed_iter, kernels=None):
    """Log-edges for ``log p < LP_TINY`` (nan where the tails of f are unknown), and the
    upper edge's Newton iterations."""
    d = div.derivation
    zero = 0.0 * x.lp
    n = zero
    if d.tail_inf is None or not d.tail_inf[0] > 0:
        s_hi = zero + math.nan
    else:
        fun = TinyUpper(div, xp, x, kernels)
        w, n = newton_edge(fun, "upper", fun.guess(), zero - math.inf, zero,
                           fixed_iter=fixed_iter)
        T1, _ = fun._T(zero)
        w = xp.where(T1 + div.f0 <= x.delta, 0.0, w)
        # g still below delta a float below w = 0: the root is closer to 0 than that
        # (1 - v underflows, KL at delta 1000), and v = 1 to working precision; or within
        # a quarter ulp of log p below 0, where s = w - log p rounds to -log p (a huge
        # radius, where the iteration meets a slope that overflows).
        w = xp.where(fun.value(xp.minimum(zero - W_ULP, x.lp * RESOLVED_W)) < x.delta, 0.0, w)
        s_hi = w - x.lp
    if math.isfinite(d.f0):
        s_lo = zero - math.inf  # p f(0) -> 0: the ball reaches r = 0
    else:
        s_lo = lower_tail(div, xp, x)
        s_lo = zero + math.nan if s_lo is None else s_lo
    return s_lo, s_hi, n


def polish(fun: BandFunction, s, lo, hi):
    """One Newton step on ``g(s) = delta``, kept inside ``[lo, hi]``.

    A closed-form root can lose digits to the conditioning of its polynomial (two roots close
    together); ``g`` itself is evaluated without cancellation, so one step squares that error
    away.
    """
    xp = fun.xp
    g, slope = fun.value_and_slope(s)
    cand = s - (g - fun.x.delta) / slope
    ok = (cand >= lo) & (cand <= hi) & xp.isfinite(s)
    return xp.where(ok, cand, s)


def _initial_guess(fun: BandFunction, curvature: float, edge: str):
    """The small-delta (chi-square shaped) band, ``1 -+ sqrt(2 delta q / (f''(1) p))``."""
    xp, x = fun.xp, fun.x
    k = curvature if math.isfinite(curvature) and curvature > 0 else 1.0
    w = xp.sqrt(2.0 * x.delta) / xp.sqrt(k * fun.p_over_q)  # (2 delta q / p may underflow)
    if edge == "upper":
        return xp.minimum(xp.log1p(w), -0.5 * x.lp)
    w = _steep_tail(fun, w)
    # Far from 1, the leading behaviour of f at 0 (p f(r) = delta) is the better guess.
    tail = fun.tail_guess()
    return xp.maximum(xp.where(w < TAIL_SWITCH, xp.log1p(-xp.minimum(w, TAIL_SWITCH)),
                               -w if tail is None else tail), S_FLOOR)


def _steep_tail(fun: BandFunction, w):
    """The lower edge's ``w = 1 - r`` where the small-delta band puts the other token's ratio
    ``c = 1 + w p / q`` beyond :data:`STEEP_FROM`: for ``f ~ A c^k``, ``k > 2``, g overflows
    there, far from the root; ``q A c^k = delta`` (the tail at infinity) starts next to it."""
    tail = fun.div.derivation.tail_inf
    if tail is None or not (tail[0] > 0 and tail[1] > 2 and not tail[2]):
        return w
    xp, x = fun.xp, fun.x
    A, k = tail[0], tail[1]
    c = xp.exp((xp.log(x.delta) - math.log(A) - x.lq) / k)  # (delta / A may overflow)
    return xp.where(w * fun.p_over_q > STEEP_FROM, xp.minimum(w, c / fun.p_over_q), w)


def newton_edge(fun: BandFunction, edge: str, s0, lo, hi, *, max_iter: int = MAX_ITER,
                fixed_iter=None):
    """Safeguarded Newton on ``g(s) = delta`` inside the bracket ``[lo, hi]``; returns the
    root and how many times each element evaluated ``g`` (its iterations).

    ``g`` increases on the upper bracket and decreases on the lower one.  ``lo`` may be
    ``-inf`` (lower edge): a step that leaves the bracket then moves left by ``max(1, |s|)``.
    With ``fixed_iter`` the loop runs exactly that many times and never inspects the data
    (for devices where a host synchronisation is costly); otherwise it stops when every
    element has converged.
    """
    xp, x = fun.xp, fun.x
    sign = 1.0 if edge == "upper" else -1.0
    s = s0
    done = s != s  # all False, right shape and type
    iters = 0.0 * s
    n = fixed_iter if fixed_iter is not None else max_iter
    for k in range(n):
        iters = iters + xp.where(done, 0.0, 1.0)
        g, slope = fun.value_and_slope(s)
        r = g - x.delta
        above = ~(sign * r <= 0)  # the root is left of s (also where g is nan)
        hi = xp.where(above & ~done, s, hi)
        lo = xp.where(~above & ~done, s, lo)
        # Far above delta, Newton on log g: exact for an exponential g (a steep generator,
        # u**100), where plain Newton crawls by 1/k a step; its overshoot falls to bisection.
        far_above = g / x.delta > FAR_ABOVE  # (FAR_ABOVE * delta may overflow)
        num = xp.where(far_above, xp.log(xp.where(far_above, g, 1.0) / x.delta) * g, r)
        step = num / slope
        cand = s - step
        small = xp.abs(step) <= STEP_TOL * xp.abs(s)
        if edge == "upper" and fun.has_complement:
            # Next to r = 1/p, g climbs like -log(c) as the other token's ratio c -> 0: a
            # Newton step in s there is far shorter than the error (it crawls, and it can
            # stop short).  In s_c = log c, g is nearly linear: step in s_c instead.
            # That step is a faithful estimate of the error, so its image in s is too
            # (and it may fall below an ulp of s before it is small in s_c).  An edge
            # closer to the bracket's end than s can resolve is taken one float short of
            # that end (where the bracket then closes), not handed to bisection, which
            # would halve its way down to it.
            sc, ds_dsc = fun.complement(s)
            near_top = sc < -LN2
            step_c = num / (slope * ds_dsc)
            cand_c = xp.minimum(fun.from_complement(sc - step_c), hi * JUST_BELOW)
            # Far below delta, g blows up like a power of c (f(0) = inf): a linear step in
            # s_c overshoots past r = 1/p, and bisection would halve its way up to a huge
            # radius.  A step on log g (exact for a power of c) is taken instead.
            far_below = (g < x.delta / FAR_ABOVE) & ~((cand_c > lo) & (cand_c < hi))
            step_l = xp.log(xp.where(far_below, g, 1.0) / x.delta) * g / (slope * ds_dsc)
            step_c = xp.where(far_below, step_l, step_c)
            cand_c = xp.where(far_below, xp.minimum(fun.from_complement(sc - step_l),
                                                    hi * JUST_BELOW), cand_c)
            small_c = ((xp.abs(step_c) <= STEP_TOL * xp.abs(sc))
                       | (xp.abs(cand_c - s) <= STEP_TOL * xp.abs(s)))
            cand = xp.where(near_top, cand_c, cand)
            small = xp.where(near_top, small_c, small)
        # (a slope that overflowed or vanished gives no step: bisect, not crawl by ulps)
        inside = xp.isfinite(slope) & (slope != 0) & (cand > lo) & (cand < hi)
        # Bisection: arithmetic, geometric across orders of magnitude, doubling while the
        # bracket is open to the left.
        alo, ahi = xp.maximum(xp.abs(lo), 1.0), xp.maximum(xp.abs(hi), 1.0)
        far = (lo * hi >= 0) & ((alo > GEOMETRIC_SPLIT * ahi) | (ahi > GEOMETRIC_SPLIT * alo))
        mid = xp.where(far, xp.sign(lo + hi) * xp.sqrt(alo * ahi), 0.5 * (lo + hi))
        mid = xp.where(xp.isfinite(lo), mid, hi - xp.maximum(xp.abs(hi), 1.0))
        converged = (r == 0) | (small & xp.isfinite(r) & xp.isfinite(slope) & (slope != 0))
        converged = converged | (hi - lo <= BRACKET_TOL * xp.maximum(xp.abs(hi), WIDTH_FLOOR))
        new = xp.where(converged | inside, xp.minimum(xp.maximum(cand, lo), hi), mid)
        s = xp.where(done, s, new)
        done = done | converged
        if fixed_iter is None:
            left = ~done
            count = int(left.sum())
            if not count:
                break
            if isinstance(s, np.ndarray) and count <= COMPACT_AT * s.size and k + 1 < n:
                return _newton_on(fun, edge, s, lo, hi, np.nonzero(left), iters=iters,
                                  max_iter=n - k - 1)
    if fixed_iter is None:
        s = xp.where(done, s, math.nan)  # never an unconverged iterate as an edge
    return s, iters


def _newton_on(fun: BandFunction, edge: str, s, lo, hi, index, *, iters=None,
               max_iter: int = MAX_ITER):
    """numpy: :func:`newton_edge` on the elements ``index`` alone, from ``s``; returns ``s``
    with those elements solved and their iterations (added to ``iters``).  Each element's
    iteration depends on its own values only, so they are those of a solve of every
    element, to the bit."""
    sub = (np.broadcast_to(a, s.shape)[index] for a in (s, lo, hi))
    part, n = newton_edge(fun.take(index), edge, *sub, max_iter=max_iter)
    s = np.array(s, copy=True)
    s[index] = part
    iters = np.zeros(s.shape) if iters is None else np.array(iters, copy=True)
    iters[index] += n
    return s, iters


def _edge(fun: BandFunction, name: str, lo, hi, fixed_iter, tiny: bool, no_closed, need):
    """One edge before saturation: closed form where there is one (and log p is not below
    LP_CLOSED), Newton elsewhere; with how it was found and Newton's iterations.  ``need``:
    the elements whose edge is read (on numpy, Newton runs on those alone; the others keep
    the first guess, as the scalar form never solves them)."""
    xp = fun.xp
    zero = 0.0 * fun.x.lp
    k = fun.div.curvature
    smooth = math.isfinite(k) and k > 0  # (f smooth at 1: the small-radius band holds)
    small_band = _initial_guess(fun, k, name)
    # both masses' ratios next to 1: r - 1 = y and c - 1 = -(p / q) y
    near_one = xp.abs(small_band) * xp.maximum(1.0, fun.p_over_q)
    exact_band = near_one < SMALL_BAND_EXACT
    newton = None
    if (name not in fun.closed or tiny) and fixed_iter is None and isinstance(lo, np.ndarray):
        want = need if name not in fun.closed else need & no_closed
        index = np.nonzero(np.broadcast_to(want, small_band.shape))
        newton, iters = _newton_on(fun, name, small_band, lo, hi, index)
    elif name not in fun.closed or tiny:
        newton, iters = newton_edge(fun, name, small_band, lo, hi, fixed_iter=fixed_iter)
    if name not in fun.closed:
        s, how = newton, zero + NEWTON
    else:
        s, close = closed_edge(fun, name)
        if smooth and not unsquared(fun.closed, name):
            # A squared form's root next to r = 1 keeps few digits (two roots of its
            # polynomial in r nearly meet); the small-radius band is the better start.
            s = xp.where(near_one < SQUARED_NEAR_ONE, polish(fun, small_band, lo, hi), s)
        s = xp.where(close, polish(fun, s, lo, hi), s)
        how = xp.where(close, float(POLISHED), float(CLOSED)) + zero
        if newton is None:
            iters = zero
        else:
            s, how, iters = (xp.where(no_closed, newton, s),
                             xp.where(no_closed, float(NEWTON), how),
                             xp.where(no_closed, iters, 0.0))
    return (xp.where(exact_band, small_band, s) if smooth else s), how, iters


def _power_tail(div: Divergence, xp, x: Inputs, s_lo, sat_lo):
    """``s_lo``, with the lower edges below the normal floats (or nan) taken from the tail
    ``p A r^k = delta`` of a generator that grows like a power at 0, where it is exact to
    float64: the closed forms and ``g`` overflow there (``f(r) ~ 1/r`` at ``r = 1e-310``),
    and a subnormal ratio has lost bits."""
    tail = div.derivation.tail0
    if tail is None or math.isfinite(div.f0) or not (tail[2] == 0 and tail[1] < 0):
        return s_lo
    t = lower_tail(div, xp, x)
    use = ~sat_lo & ~(s_lo >= LOG_NORMAL) & (tail[1] * t >= TAIL_EXACT)
    return xp.where(use, t, s_lo)


def solve(div: Divergence, xp, inputs: Inputs, *, fixed_iter=None, tiny=None, at_one=None,
          closed_forms: bool = True, kernels=None, trace: bool = False):
    """Log-edges ``(log lower, log upper)`` for broadcast inputs (see :class:`Inputs`).

    ``tiny``: whether some ``log p`` lies below ``LP_CLOSED`` (closed forms then lose their
    coefficients to underflow and Newton takes over) or ``LP_TINY`` (the tails of f take
    over).  None looks at the data, which costs a host synchronisation on a device.
    ``at_one``: whether some ``p == 1`` (their lower edge is solved from the limit equation);
    None looks at the data.  ``closed_forms=False`` runs the root finder everywhere (to check
    the closed forms).  ``kernels`` are ``div.kernels(xp)`` when the caller has them at hand
    already (a traced torch function cannot call into sympy or look them up by identity).
    ``trace=True`` also returns ``(how lower, how upper, iterations lower, iterations
    upper)``: how each edge was found (:data:`SATURATED` ... :data:`AT_ONE`) and how many
    times Newton evaluated g for it (0 where no Newton step decided it).
    """
    x = inputs
    fun = BandFunction(div, xp, x, kernels)
    if not closed_forms:
        fun.closed = {}
    zero_s = 0.0 * x.lp
    no_closed = x.lp < LP_CLOSED
    if tiny is None:
        tiny = bool(no_closed.any())

    top = -x.lp
    sat_hi = fun.at_top() <= x.delta
    sat_lo = fun.at_zero() <= x.delta
    if not math.isfinite(div.f0):  # (a finite f(0) gives g(S_FLOOR) = g(0))
        sat_lo = sat_lo | (fun.value(zero_s + S_FLOOR) <= x.delta)
    ordinary = (x.lp >= LP_TINY) & (x.lp != 0)  # (solved apart below)
    s_hi, how_hi, n_hi = _edge(fun, "upper", zero_s, top, fixed_iter, tiny, no_closed,
                               ordinary & ~sat_hi)
    s_hi = xp.where(sat_hi, top, xp.minimum(xp.maximum(s_hi, zero_s), top))
    s_lo, how_lo, n_lo = _edge(fun, "lower", zero_s - math.inf, zero_s, fixed_iter, tiny,
                               no_closed, ordinary & ~sat_lo)
    s_lo = xp.where(sat_lo, -math.inf, xp.minimum(s_lo, zero_s))
    s_lo = _power_tail(div, xp, x, s_lo, sat_lo)
    if trace:
        how_hi, n_hi = xp.where(sat_hi, float(SATURATED), how_hi), xp.where(sat_hi, 0.0, n_hi)
        how_lo, n_lo = xp.where(sat_lo, float(SATURATED), how_lo), xp.where(sat_lo, 0.0, n_lo)
    if tiny:
        small = x.lp < LP_TINY
        t_lo, t_hi, t_n = _solve_where(small, x, fixed_iter,
                                       lambda part: _solve_tiny(div, xp, part, fixed_iter,
                                                                kernels))
        s_lo, s_hi = xp.where(small, t_lo, s_lo), xp.where(small, t_hi, s_hi)
        if trace:
            how_lo, how_hi = (xp.where(small, float(TINY), h) for h in (how_lo, how_hi))
            n_lo, n_hi = xp.where(small, 0.0, n_lo), xp.where(small, t_n, n_hi)
    one = x.lp == 0
    if at_one is None:
        at_one = bool(one.any())
    if at_one:
        a_lo, a_n = _solve_where(one, x, fixed_iter,
                                 lambda part: _solve_at_one(div, xp, part, fixed_iter, kernels))
        s_lo = xp.where(one, a_lo, s_lo)
        s_hi = xp.where(one, zero_s, s_hi)
        if trace:
            how_lo, how_hi = (xp.where(one, float(AT_ONE), h) for h in (how_lo, how_hi))
            n_lo, n_hi = xp.where(one, a_n, n_lo), xp.where(one, 0.0, n_hi)
    if trace:
        return s_lo, s_hi, (how_lo, how_hi, n_lo, n_hi)
    return s_lo, s_hi


# ----------------------------------------------------------------------------- numpy

#: The array namespace the generated kernels and the solver are bound to.
NAMESPACE = {name: getattr(np, name) for name in (
    "exp", "expm1", "log", "log1p", "sqrt", "sinh", "cosh", "tanh", "sign", "abs", "where",
    "minimum", "maximum", "isfinite")}


class Namespace:
    """An array namespace from a mapping of names to functions."""

    def __init__(self, table):
        self.__dict__.update(table)


#: numpy as the solver reads it.
NUMPY = Namespace(NAMESPACE)


def lower_limit_at_one(div: Divergence, delta: float, *, log: bool = False,
                       edges=None) -> float:
    """``lim_{p -> 1}`` of the lower edge (see :meth:`fbands.Divergence.lower_limit_at_one`;
    ``log``: its log): the lower edge at ``p = 1`` by ``edges(div, inputs)`` (a solver of
    prepared inputs; default: the array solver on numpy)."""
    x = Inputs(np.zeros(1), np.full(1, math.log(Q_FLOOR)), np.ones(1), np.full(1, Q_FLOOR),
               np.full(1, float(delta)))
    with np.errstate(all="ignore"):
        s_lo, _ = solve(div, NUMPY, x) if edges is None else edges(div, x)
    return float(s_lo[0]) if log else float(np.exp(s_lo[0]))
