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
(:func:`solve_one`, one element at a time, compiled by numba into each divergence's
generated module: see :func:`scalar_constants`).  Both take the same branches and iterate
the same number of times on the same element (``tests/test_solver_forms.py`` checks it,
through :func:`solve`'s ``trace`` and :func:`solve_one`'s counts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fbands.divergences import Divergence

#: Smallest q used in the equations: p = 1 is solved as p = 1 - 1e-300, which gives the
#: p -> 1 limit [r*, 1] exactly in float64.
Q_FLOOR = 1e-300

# -- constants of the method (shared by both forms) ---------------------------------------

#: Newton has converged once its step is below this share of ``|s|``: the error left is of
#: the order of the step squared, far below float64's 1e-16.
STEP_TOL = 1e-12
#: ... or once the bracket holds about two floats (relative width, two ulp) ...
BRACKET_TOL = 4e-16
#: ... relative to ``max(|hi|, WIDTH_FLOOR)``: a root at ``s = 0`` exactly has a bracket too.
WIDTH_FLOOR = 1e-300
#: Iterations before an element is declared unconverged (nan).  The safeguarded iteration
#: halves the bracket at worst, so 200 covers the whole float64 range of s many times over.
MAX_ITER = 200
#: Above ``FAR_ABOVE * delta`` a Newton step is taken on ``log g`` instead of ``g``.
FAR_ABOVE = 2.0
#: A positive float times this is the float just below it (or one further): the upper
#: edge's last step next to its bracket's end (see newton_edge).
JUST_BELOW = 1.0 - 2.0**-52
#: log 2: the upper edge steps in ``s_c = log c`` once ``c < 1/2`` (see newton_edge), and
#: log1mexp switches its formula at ``-LN2``.
LN2 = math.log(2.0)
#: A bracket whose ends (floored at 1 in magnitude) differ by more than this factor is
#: bisected geometrically: its arithmetic midpoint would gain one bit per step.
GEOMETRIC_SPLIT = 4.0
#: The lower edge's first guess switches from the small-delta form ``log(1 - w)`` to the
#: tail of f at 0 once ``w`` (the chi-square half-width) reaches this: log(1 - w) is then
#: far from the edge, and undefined for w >= 1.
TAIL_SWITCH = 0.5
#: A discriminant above ``-NEGATIVE_DISC a1^2`` is a double root rounded below zero.
NEGATIVE_DISC = 1e-12
#: Roots are ill-conditioned (polished by a Newton step on g) when the discriminant is below
#: ``NEAR_DOUBLE a1^2``: they then agree to about a decimal digit.
NEAR_DOUBLE = 1e-2
#: An upper closed-form root up to this factor past ``r = 1/p`` is kept (and clamped): the
#: rounding of the polynomial's coefficients can push an edge at saturation slightly past.
TOP_SLACK = 1.01

# -- how an edge was found (the ``trace`` of solve and the counts of solve_one) -----------

#: Saturated: ``r = 1/p`` (upper) or ``r = 0`` (lower), decided by g at that end.
SATURATED = 0
#: The closed form's root, as it is.
CLOSED = 1
#: The closed form's root, polished by one Newton step on g (nearly double roots).
POLISHED = 2
#: Safeguarded Newton on g.
NEWTON = 3
#: ``log p < LP_TINY``: from the tails of f (:class:`TinyUpper`, :func:`_lower_tail`).
TINY = 4
#: ``p = 1``: the limit equation (:class:`AtOne`).
AT_ONE = 5


@dataclass
class Inputs:
    """Broadcast float64 arrays describing the old probability and the radius."""

    lp: Any  # log p
    lq: Any  # log(1 - p), floored at log(Q_FLOOR)
    p: Any
    q: Any
    delta: Any


def log1mexp(xp, z):
    """``log(1 - exp(z))`` for ``z <= 0`` without cancellation (Maechler's switch)."""
    near = z > -LN2
    return xp.where(
        near,
        xp.log(-xp.expm1(xp.where(near, z, -1.0))),
        xp.log1p(-xp.exp(xp.where(near, -1.0, z))),
    )


class BandFunction:
    """``g(s)`` and ``g'(s)`` of one divergence for fixed inputs."""

    def __init__(self, div: Divergence, xp, inputs: Inputs, kernels=None):
        self.xp = xp
        self.div = div
        self.F, self.dF, self.closed = div.kernels(xp) if kernels is None else kernels
        self.x = inputs
        self.p_over_q = xp.exp(inputs.lp - inputs.lq)
        number = getattr(xp, "from_decimal", None)  # a namespace of extended precision
        self.f0 = div.f0 if number is None else number(div.derivation.f0_text)

    def s_c(self, s):
        xp, x = self.xp, self.x
        xc = -self.p_over_q * xp.expm1(s)  # c - 1
        use_log1p = xc > -0.5
        return xp.where(
            use_log1p,
            xp.log1p(xp.where(use_log1p, xc, 0.0)),
            log1mexp(xp, xp.minimum(x.lp + s, 0.0)) - x.lq,
        )

    #: Whether the upper edge may step in the complement variable (see newton_edge).
    has_complement = True

    def complement(self, s):
        """``(s_c, ds/ds_c)``: the other token's log-ratio and the slope of the map back."""
        sc = self.s_c(s)
        return sc, -self.xp.exp(sc - s) / self.p_over_q

    def from_complement(self, sc):
        """``s`` from ``s_c``: ``r p = 1 - q c`` (nan where ``q c >= 1``)."""
        return self.xp.log1p(-self.xp.exp(sc + self.x.lq)) - self.x.lp

    def tail_guess(self):
        s = _lower_tail(self.div, self.xp, self.x)
        return None if s is None else self.xp.minimum(s, -1.0)

    def _F_c(self, sc):
        # c = 0 (r = 1/p) gives s_c = -inf, where F is its limit f(0).
        xp = self.xp
        at_zero = sc == -math.inf
        return xp.where(at_zero, self.f0, self.F(xp.where(at_zero, 0.0, sc))), at_zero

    def value(self, s):
        x = self.x
        Fc, _ = self._F_c(self.s_c(s))
        return x.p * self.F(s) + x.q * Fc

    def value_and_slope(self, s):
        g_r, g_c, slope = self.terms_and_slope(s)
        return g_r + g_c, slope

    def terms_and_slope(self, s):
        """``(p F(s), q F(s_c), g'(s))``: g's two terms apart (their sizes bound its
        rounding)."""
        xp, x = self.xp, self.x
        sc = self.s_c(s)
        Fc, at_zero = self._F_c(sc)
        safe = xp.where(at_zero, 0.0, sc)
        slope = x.p * (self.dF(s) - xp.exp(s - safe) * self.dF(safe))
        return x.p * self.F(s), x.q * Fc, xp.where(at_zero, math.inf, slope)

    # -- saturation -----------------------------------------------------------------------

    def at_zero(self):
        """``g`` at ``r = 0``: ``p f(0) + q f(1/q)``."""
        g_r, g_c = self.zero_terms()
        return g_r + g_c

    def zero_terms(self):
        """The two terms of :meth:`at_zero` apart."""
        x = self.x
        return self._times(x.p, self.f0), x.q * self.F(-x.lq)

    def at_top(self):
        """``g`` at ``r = 1/p``: ``p f(1/p) + q f(0)``."""
        x = self.x
        return x.p * self.F(-x.lp) + self._times(x.q, self.f0)

    def _times(self, w, c):
        # w * c with 0 * inf = inf (the weights here are > 0) but without nan.
        return w * c if math.isfinite(c) else self.xp.where(w > 0, math.inf, 0.0) + 0.0 * w


#: Below this log p the band follows from the tails of f alone (the terms neglected are
#: O(p |log p|^2), below 1e-120 relative, for the built-in divergences), and above it F(s)
#: stays finite up to s = -log p for generators growing like u^2.
LP_TINY = -300.0
#: Below this log p the closed-form coefficients (products of several p) underflow.
LP_CLOSED = -150.0


class TinyUpper(BandFunction):
    """Upper edge for ``log p < LP_TINY``, in ``w = log v``, ``v = p r`` in ``(0, 1]``.

    With ``f(u) ~ u^k (A (log u)^m + B)`` as ``u -> inf`` (:attr:`Derivation.tail_inf`),
    ``p f(v / p) -> T(w) = exp(k w + (1 - k) log p) (A (w - log p)^m + B)`` and ``q -> 1``, so
    ``g = T(w) + F(log(1 - v))``.  Each quantity stays representable although ``p`` and
    ``1/p`` are not.
    """

    def __init__(self, div: Divergence, xp, inputs: Inputs, kernels=None):
        super().__init__(div, xp, inputs, kernels)
        self.A, self.k, self.m, self.B = div.derivation.tail_inf

    def _T(self, w):
        xp, lp = self.xp, self.x.lp
        z = w - lp  # = log r >= 0
        scale = xp.exp(self.k * w + (1 - self.k) * lp)
        if not self.m:
            T = self.A * scale
            return T, self.k * T
        T = scale * (self.A * z + self.B)
        return T, self.k * T + self.A * scale

    def value_and_slope(self, w):
        xp = self.xp
        sc = log1mexp(xp, xp.minimum(w, 0.0 * w))  # log(1 - v)
        Fc, at_zero = self._F_c(sc)
        T, dT = self._T(w)
        safe = xp.where(at_zero, 0.0, sc)
        slope = dT - xp.exp(w - safe) * self.dF(safe)
        return T + Fc, xp.where(at_zero, math.inf, slope)

    def value(self, w):
        return self.value_and_slope(w)[0]

    def complement(self, w):
        xp = self.xp
        sc = log1mexp(xp, xp.minimum(w, 0.0 * w))
        return sc, -xp.exp(sc - w)

    def from_complement(self, sc):
        xp = self.xp
        return xp.where(sc < 0, log1mexp(self.xp, xp.minimum(sc, -1e-300)), math.nan)

    def guess(self):
        """Root of ``T(w) = delta`` (the c-term dropped), at most ``log(1/2)``."""
        xp, x = self.xp, self.x
        m_term = xp.log(-x.lp) if self.m else 0.0
        w = (xp.log(x.delta / self.A) - (1 - self.k) * x.lp - m_term) / self.k
        return xp.minimum(w, -LN2)


class AtOne(BandFunction):
    """The lower edge at ``p = 1``: the root of ``f(r) + (1 - r) f'(inf) = delta``.

    As ``p -> 1`` the second token's term ``q f((1 - r p) / q)`` tends to ``(1 - r) f'(inf)``;
    ``p = 1`` itself is solved from that limit, exactly.
    """

    has_complement = False

    def value_and_slope(self, s):
        A = self.div.fprime_inf
        g = self.F(s) - self.xp.expm1(s) * A
        return g, self.dF(s) - self.xp.exp(s) * A

    def value(self, s):
        return self.value_and_slope(s)[0]


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


def _lower_tail(div: Divergence, xp, x: Inputs):
    """``log r`` solving ``p f(r) = delta`` from ``f ~ A r^k (log r)^m`` at 0, or None."""
    if div.derivation.tail0 is None:
        return None
    A, k, m, _ = div.derivation.tail0
    if m == 0 and k < 0:
        return (xp.log(x.delta / A) - x.lp) / k
    if m == 1 and k == 0 and A < 0:
        return -xp.exp(xp.log(x.delta / -A) - x.lp)
    return None


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
        s_hi = w - x.lp
    if math.isfinite(d.f0):
        s_lo = zero - math.inf  # p f(0) -> 0: the ball reaches r = 0
    else:
        s_lo = _lower_tail(div, xp, x)
        s_lo = zero + math.nan if s_lo is None else s_lo
    return s_lo, s_hi, n


def quadratic_roots(xp, a2, a1, a0):
    """Both real roots of ``a2 v^2 + a1 v + a0`` (nan where complex), without cancellation.

    ``t = -(a1 + sign(a1) sqrt(disc)) / 2`` adds numbers of one sign; the roots are ``t / a2``
    and ``a0 / t`` (Vieta).  A linear equation (``a2 = 0``) gives its root twice.
    """
    disc = a1 * a1 - 4.0 * a2 * a0
    disc = xp.where(disc >= -NEGATIVE_DISC * a1 * a1, xp.maximum(disc, 0.0 * disc), math.nan)
    root = xp.sqrt(disc)
    t = -0.5 * (a1 + xp.where(a1 >= 0, root, -root))
    linear = a2 == 0
    r1 = xp.where(linear, -a0 / a1, t / xp.where(linear, 1.0, a2))
    r2 = xp.where(linear, -a0 / a1, a0 / t)
    return r1, r2


def _closed_edge(fun: BandFunction, edge: str):
    """Log-edge from the closed form, before saturation (nan where it has no valid root), and
    where it needs a polish."""
    xp, x = fun.xp, fun.x
    (c2, c1, c0), squared = fun.closed[edge]
    a2, a1, a0 = (c(x.p, x.q, x.delta) + 0.0 * x.p for c in (c2, c1, c0))
    v1, v2 = quadratic_roots(xp, a2, a1, a0)
    if edge == "upper":  # v = r - 1 in (0, q/p]
        ok1, ok2 = ((v > 0) & (v * fun.p_over_q <= TOP_SLACK) for v in (v1, v2))
        s1, s2 = xp.log1p(v1), xp.log1p(v2)
    else:  # v = r in [0, 1)
        ok1, ok2 = ((v >= 0) & (v <= 1) for v in (v1, v2))
        s1, s2 = xp.log(v1), xp.log(v2)
    if squared:
        # A root of the squared equation may be extraneous: keep the one that solves g = delta.
        e1 = xp.abs(fun.value(xp.where(ok1, s1, 0.0)) - x.delta)
        e2 = xp.abs(fun.value(xp.where(ok2, s2, 0.0)) - x.delta)
        first = ok1 & (~ok2 | (e1 <= e2))
    elif edge == "upper":  # the root nearest r = 1: g increases from 0 on (1, 1/p]
        first = ok1 & (~ok2 | (v1 <= v2))
    else:
        first = ok1 & (~ok2 | (v1 >= v2))
    s = xp.where(first, s1, xp.where(ok2, s2, math.nan))
    # Two close roots make the polynomial ill-conditioned (and squaring may have merged a
    # root with its extraneous twin): flag those for a Newton polish on g.
    close = (a1 * a1 - 4.0 * a2 * a0 < NEAR_DOUBLE * a1 * a1) | squared
    return s, close


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
    w = xp.sqrt(2.0 * x.delta / (k * fun.p_over_q))
    if edge == "upper":
        return xp.minimum(xp.log1p(w), -0.5 * x.lp)
    # Far from 1, the leading behaviour of f at 0 (p f(r) = delta) is the better guess.
    tail = fun.tail_guess()
    return xp.where(w < TAIL_SWITCH, xp.log1p(-xp.minimum(w, TAIL_SWITCH)),
                    -w if tail is None else tail)


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
    for _ in range(n):
        iters = iters + xp.where(done, 0.0, 1.0)
        g, slope = fun.value_and_slope(s)
        r = g - x.delta
        above = ~(sign * r <= 0)  # the root is left of s (also where g is nan)
        hi = xp.where(above & ~done, s, hi)
        lo = xp.where(~above & ~done, s, lo)
        # Far above delta, Newton on log g: exact for an exponential g (a steep generator,
        # u**100), where plain Newton crawls by 1/k a step; its overshoot falls to bisection.
        far_above = g > FAR_ABOVE * x.delta
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
            small_c = ((xp.abs(step_c) <= STEP_TOL * xp.abs(sc))
                       | (xp.abs(cand_c - s) <= STEP_TOL * xp.abs(s)))
            cand = xp.where(near_top, cand_c, cand)
            small = xp.where(near_top, small_c, small)
        inside = (cand > lo) & (cand < hi)  # False for nan
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
        if fixed_iter is None and bool(done.all()):
            break
    if fixed_iter is None:
        s = xp.where(done, s, math.nan)  # never an unconverged iterate as an edge
    return s, iters


def _edge(fun: BandFunction, name: str, lo, hi, fixed_iter, tiny: bool, no_closed):
    """One edge before saturation: closed form where there is one (and log p is not below
    LP_CLOSED), Newton elsewhere; with how it was found and Newton's iterations."""
    xp = fun.xp
    zero = 0.0 * fun.x.lp
    newton = None
    if name not in fun.closed or tiny:
        guess = _initial_guess(fun, fun.div.curvature, name)
        newton, iters = newton_edge(fun, name, guess, lo, hi, fixed_iter=fixed_iter)
    if name not in fun.closed:
        return newton, zero + NEWTON, iters
    s, close = _closed_edge(fun, name)
    s = xp.where(close, polish(fun, s, lo, hi), s)
    how = xp.where(close, float(POLISHED), float(CLOSED)) + zero
    if newton is None:
        return s, how, zero
    return (xp.where(no_closed, newton, s), xp.where(no_closed, float(NEWTON), how),
            xp.where(no_closed, iters, 0.0))


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
    s_hi, how_hi, n_hi = _edge(fun, "upper", zero_s, top, fixed_iter, tiny, no_closed)
    sat_hi = fun.at_top() <= x.delta
    s_hi = xp.where(sat_hi, top, xp.minimum(xp.maximum(s_hi, zero_s), top))
    s_lo, how_lo, n_lo = _edge(fun, "lower", zero_s - math.inf, zero_s, fixed_iter, tiny,
                               no_closed)
    sat_lo = fun.at_zero() <= x.delta
    s_lo = xp.where(sat_lo, -math.inf, xp.minimum(s_lo, zero_s))
    if trace:
        how_hi, n_hi = xp.where(sat_hi, float(SATURATED), how_hi), xp.where(sat_hi, 0.0, n_hi)
        how_lo, n_lo = xp.where(sat_lo, float(SATURATED), how_lo), xp.where(sat_lo, 0.0, n_lo)
    if tiny:
        t_lo, t_hi, t_n = _solve_tiny(div, xp, x, fixed_iter, kernels)
        small = x.lp < LP_TINY
        s_lo, s_hi = xp.where(small, t_lo, s_lo), xp.where(small, t_hi, s_hi)
        if trace:
            how_lo, how_hi = (xp.where(small, float(TINY), h) for h in (how_lo, how_hi))
            n_lo, n_hi = xp.where(small, 0.0, n_lo), xp.where(small, t_n, n_hi)
    one = x.lp == 0
    if at_one is None:
        at_one = bool(one.any())
    if at_one:
        a_lo, a_n = _solve_at_one(div, xp, x, fixed_iter, kernels)
        s_lo = xp.where(one, a_lo, s_lo)
        s_hi = xp.where(one, zero_s, s_hi)
        if trace:
            how_lo, how_hi = (xp.where(one, float(AT_ONE), h) for h in (how_lo, how_hi))
            n_lo, n_hi = xp.where(one, a_n, n_lo), xp.where(one, 0.0, n_hi)
    if trace:
        return s_lo, s_hi, (how_lo, how_hi, n_lo, n_hi)
    return s_lo, s_hi


# ============================================================================================
# The scalar form: the same method, one element at a time, for numba.
#
# numba_backend.module_source pastes the source of the functions in SCALAR_FORM into each
# divergence's generated module, after the divergence's own definitions: its sympy-derived
# leaf functions (F_near, F_far, dF, and upper_a2 ... lower_a0 where it has closed forms) and
# the constants of scalar_constants(div).  Below, those names are stubs, so that this file
# reads, imports and lints as ordinary Python; the functions themselves are the ones numba
# compiles.  Each one mirrors the array function named in its docstring, step for step.
# ============================================================================================


def scalar_constants(div: Divergence) -> dict[str, float | int | bool]:
    """The divergence as the scalar form reads it: numbers and flags, for literals."""
    d = div.derivation
    curv = div.curvature
    tail0_kind, tail0_a, tail0_k = 0, math.nan, math.nan
    if d.tail0 is not None:
        A, k, m, _ = d.tail0
        if m == 0 and k < 0:
            tail0_kind, tail0_a, tail0_k = 1, A, k
        elif m == 1 and k == 0 and A < 0:
            tail0_kind, tail0_a, tail0_k = 2, A, k
    tail_inf = d.tail_inf if d.tail_inf is not None and d.tail_inf[0] > 0 else None
    A, k, m, B = tail_inf if tail_inf is not None else (math.nan,) * 4
    src = div.sources
    return {
        "F0": float(div.f0),
        "CURVATURE": float(curv) if math.isfinite(curv) and curv > 0 else 1.0,
        "FPRIME_INF": float(div.fprime_inf),
        "NEAR_DIFFERS": src["F_near"] != src["F_far"],
        "HAS_UPPER": d.upper is not None,
        "HAS_LOWER": d.lower is not None,
        "UPPER_SQUARED": bool(d.upper is not None and d.upper.squared),
        "LOWER_SQUARED": bool(d.lower is not None and d.lower.squared),
        "TAIL0_KIND": tail0_kind,
        "TAIL0_A": float(tail0_a),
        "TAIL0_K": float(tail0_k),
        "HAS_TAIL_INF": tail_inf is not None,
        "TAIL_INF_A": float(A),
        "TAIL_INF_K": float(k),
        "TAIL_INF_M": float(m),
        "TAIL_INF_B": float(B),
    }


# Stubs of the generated names (see above); never called here.
F0 = CURVATURE = FPRIME_INF = TAIL0_A = TAIL0_K = math.nan
TAIL_INF_A = TAIL_INF_K = TAIL_INF_M = TAIL_INF_B = math.nan
NEAR_DIFFERS = HAS_UPPER = HAS_LOWER = UPPER_SQUARED = LOWER_SQUARED = HAS_TAIL_INF = False
TAIL0_KIND = 0
NEAR = 0.5


def _stub(*args):  # pragma: no cover - replaced in every generated module
    raise NotImplementedError("a leaf of the scalar form: defined by the generated module")


F_near = F_far = dF = _stub
upper_a2 = upper_a1 = upper_a0 = lower_a2 = lower_a1 = lower_a0 = _stub

# The band function g, for the three equations (BandFunction, TinyUpper, AtOne).
BAND, TINY_UPPER, LIMIT_AT_ONE = 0, 1, 2


def fmin(a, b):
    """``numpy.minimum`` of two floats: nan wins."""
    return a if (a < b or a != a) else b


def fmax(a, b):
    """``numpy.maximum`` of two floats: nan wins."""
    return a if (a > b or a != a) else b


def F(s):
    """``F(s) = f(e^s)`` (``Divergence.kernels``: the near form for ``|s| < NEAR``)."""
    if NEAR_DIFFERS and abs(s) < NEAR:
        return F_near(s)
    return F_far(s)


def log1mexp_one(z):
    """:func:`log1mexp` of one float."""
    if z > -LN2:
        return math.log(-math.expm1(z))
    return math.log1p(-math.exp(z))


def s_c_one(s, lp, lq, poq):
    """``BandFunction.s_c``."""
    xc = -poq * math.expm1(s)
    if xc > -0.5:
        return math.log1p(xc)
    return log1mexp_one(fmin(lp + s, 0.0)) - lq


def times_one(w, c):
    """``BandFunction._times``: ``w * c`` with ``0 * inf = 0``."""
    if math.isfinite(c):
        return w * c
    return math.inf if w > 0 else 0.0


def tiny_terms(w, lp):
    """``TinyUpper._T``: ``(T(w), T'(w))``."""
    scale = math.exp(TAIL_INF_K * w + (1.0 - TAIL_INF_K) * lp)
    if TAIL_INF_M == 0:
        T = TAIL_INF_A * scale
        return T, TAIL_INF_K * T
    T = scale * (TAIL_INF_A * (w - lp) + TAIL_INF_B)
    return T, TAIL_INF_K * T + TAIL_INF_A * scale


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


def complement_one(kind, s, lp, lq, poq):
    """``complement`` of BandFunction (``kind`` BAND) or TinyUpper: ``(s_c, ds/ds_c)``."""
    if kind == TINY_UPPER:
        sc = log1mexp_one(fmin(s, 0.0))
        return sc, -math.exp(sc - s)
    sc = s_c_one(s, lp, lq, poq)
    return sc, -math.exp(sc - s) / poq


def from_complement_one(kind, sc, lp, lq):
    """``from_complement`` of BandFunction or TinyUpper."""
    if kind == TINY_UPPER:
        return log1mexp_one(fmin(sc, -1e-300)) if sc < 0 else math.nan
    return math.log1p(-math.exp(sc + lq)) - lp


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
        num = math.log(g / delta) * g if g > FAR_ABOVE * delta else r
        step = num / slope
        cand = s - step
        small = abs(step) <= STEP_TOL * abs(s)
        if upper and kind != LIMIT_AT_ONE:
            sc, ds_dsc = complement_one(kind, s, lp, lq, poq)
            if sc < -LN2:
                step_c = num / (slope * ds_dsc)
                cand = fmin(from_complement_one(kind, sc - step_c, lp, lq), hi * JUST_BELOW)
                small = (abs(step_c) <= STEP_TOL * abs(sc)
                         or abs(cand - s) <= STEP_TOL * abs(s))
        inside = cand > lo and cand < hi
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


def lower_tail_one(lp, delta):
    """:func:`_lower_tail` (nan where f has no usable tail at 0)."""
    if TAIL0_KIND == 1:
        return (math.log(delta / TAIL0_A) - lp) / TAIL0_K
    if TAIL0_KIND == 2:
        return -math.exp(math.log(delta / -TAIL0_A) - lp)
    return math.nan


def initial_guess_one(upper, lp, poq, delta):
    """:func:`_initial_guess`."""
    w = math.sqrt(2.0 * delta / (CURVATURE * poq))
    if upper:
        return fmin(math.log1p(w), -0.5 * lp)
    if w < TAIL_SWITCH:
        return math.log1p(-w)
    if TAIL0_KIND == 0:
        return -w
    return fmin(lower_tail_one(lp, delta), -1.0)


def quadratic_roots_one(a2, a1, a0):
    """:func:`quadratic_roots`."""
    disc = a1 * a1 - 4.0 * a2 * a0
    disc = fmax(disc, 0.0) if disc >= -NEGATIVE_DISC * a1 * a1 else math.nan
    root = math.sqrt(disc) if disc == disc else math.nan
    t = -0.5 * (a1 + (root if a1 >= 0 else -root))
    if a2 == 0:
        return -a0 / a1, -a0 / a1
    return t / a2, a0 / t


def closed_edge_one(upper, lp, lq, p, q, poq, delta):
    """:func:`_closed_edge`: ``(log-edge, needs a polish)``."""
    if upper:
        a2, a1, a0 = upper_a2(p, q, delta), upper_a1(p, q, delta), upper_a0(p, q, delta)
        squared = UPPER_SQUARED
    else:
        a2, a1, a0 = lower_a2(p, q, delta), lower_a1(p, q, delta), lower_a0(p, q, delta)
        squared = LOWER_SQUARED
    a2, a1, a0 = a2 + 0.0, a1 + 0.0, a0 + 0.0
    v1, v2 = quadratic_roots_one(a2, a1, a0)
    if upper:
        ok1 = v1 > 0 and v1 * poq <= TOP_SLACK
        ok2 = v2 > 0 and v2 * poq <= TOP_SLACK
        s1 = math.log1p(v1) if v1 > -1 else math.nan
        s2 = math.log1p(v2) if v2 > -1 else math.nan
    else:
        ok1 = v1 >= 0 and v1 <= 1
        ok2 = v2 >= 0 and v2 <= 1
        s1 = math.log(v1) if v1 > 0 else (-math.inf if v1 == 0 else math.nan)
        s2 = math.log(v2) if v2 > 0 else (-math.inf if v2 == 0 else math.nan)
    if squared:
        e1 = abs(value_and_slope_one(BAND, s1 if ok1 else 0.0, lp, lq, p, q, poq)[0] - delta)
        e2 = abs(value_and_slope_one(BAND, s2 if ok2 else 0.0, lp, lq, p, q, poq)[0] - delta)
        first = ok1 and ((not ok2) or e1 <= e2)
    elif upper:
        first = ok1 and ((not ok2) or v1 <= v2)
    else:
        first = ok1 and ((not ok2) or v1 >= v2)
    s = s1 if first else (s2 if ok2 else math.nan)
    close = (a1 * a1 - 4.0 * a2 * a0 < NEAR_DOUBLE * a1 * a1) or squared
    return s, close


def polish_one(s, lo, hi, lp, lq, p, q, poq, delta):
    """:func:`polish`."""
    g, slope = value_and_slope_one(BAND, s, lp, lq, p, q, poq)
    cand = s - (g - delta) / slope
    if cand >= lo and cand <= hi and math.isfinite(s):
        return cand
    return s


def edge_one(upper, lo, hi, lp, lq, p, q, poq, delta):
    """:func:`_edge`: ``(log-edge before saturation, how, iterations)``."""
    has_closed = HAS_UPPER if upper else HAS_LOWER
    if not has_closed or lp < LP_CLOSED:
        s0 = initial_guess_one(upper, lp, poq, delta)
        s, n = newton_one(BAND, upper, s0, lo, hi, lp, lq, p, q, poq, delta)
        return s, NEWTON, n
    s, close = closed_edge_one(upper, lp, lq, p, q, poq, delta)
    if close:
        return polish_one(s, lo, hi, lp, lq, p, q, poq, delta), POLISHED, 0
    return s, CLOSED, 0


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
        s_hi = w - lp
    if math.isfinite(F0):
        return -math.inf, s_hi, n
    return lower_tail_one(lp, delta), s_hi, n


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
    if times_one(p, F0) + q * F(-lq) <= delta:
        s_lo, how_lo, n_lo = -math.inf, SATURATED, 0
    else:
        s_lo, how_lo, n_lo = edge_one(False, -math.inf, 0.0, lp, lq, p, q, poq, delta)
        s_lo = fmin(s_lo, 0.0)
    return s_lo, s_hi, how_lo, how_hi, n_lo, n_hi


#: The scalar form, in dependency order: what numba_backend pastes into generated modules.
SCALAR_FORM = (
    fmin, fmax, F, log1mexp_one, s_c_one, times_one, tiny_terms, value_and_slope_one,
    complement_one, from_complement_one, newton_one, lower_tail_one, initial_guess_one,
    quadratic_roots_one, closed_edge_one, polish_one, edge_one, tiny_one, at_one_one,
    solve_one,
)
#: The module-level names of this file the scalar form reads (copied as literals).
SCALAR_SHARED = (
    "STEP_TOL", "BRACKET_TOL", "WIDTH_FLOOR", "MAX_ITER", "FAR_ABOVE", "GEOMETRIC_SPLIT",
    "TAIL_SWITCH", "NEGATIVE_DISC", "NEAR_DOUBLE", "TOP_SLACK", "JUST_BELOW", "LN2",
    "SATURATED", "CLOSED", "POLISHED", "NEWTON", "TINY", "AT_ONE", "LP_TINY", "LP_CLOSED",
    "BAND", "TINY_UPPER", "LIMIT_AT_ONE",
)
