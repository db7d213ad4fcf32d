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
below ``1e-12 |s|`` (the error left after it is of the order of that step squared).  Saturation is
decided by ``g`` itself at ``r = 0`` and ``r = 1/p``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fbands.divergences import Divergence

#: Smallest q used in the equations: p = 1 is solved as p = 1 - 1e-300, which gives the
#: p -> 1 limit [r*, 1] exactly in float64.
Q_FLOOR = 1e-300


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
    near = z > -math.log(2.0)
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

    def guess(self):
        """Root of ``T(w) = delta`` (the c-term dropped), at most ``log(1/2)``."""
        xp, x = self.xp, self.x
        m_term = xp.log(-x.lp) if self.m else 0.0
        w = (xp.log(x.delta / self.A) - (1 - self.k) * x.lp - m_term) / self.k
        return xp.minimum(w, -math.log(2.0))


class AtOne(BandFunction):
    """The lower edge at ``p = 1``: the root of ``f(r) + (1 - r) f'(inf) = delta``.

    As ``p -> 1`` the second token's term ``q f((1 - r p) / q)`` tends to ``(1 - r) f'(inf)``;
    ``p = 1`` itself is solved from that limit, exactly.
    """

    def value_and_slope(self, s):
        A = self.div.fprime_inf
        g = self.F(s) - self.xp.expm1(s) * A
        return g, self.dF(s) - self.xp.exp(s) * A

    def value(self, s):
        return self.value_and_slope(s)[0]


def _solve_at_one(div: Divergence, xp, x: Inputs, fixed_iter, kernels=None):
    zero = 0.0 * x.lp
    if math.isinf(div.fprime_inf):
        return zero  # f'(inf) = inf: nothing may leave a token of probability 1
    if div.f0 + div.fprime_inf <= 0:  # pragma: no cover - excluded by convexity
        return zero - math.inf
    fun = AtOne(div, xp, x, kernels)
    s = newton_edge(fun, "lower", zero - 0.1, zero - math.inf, zero, fixed_iter=fixed_iter)
    return xp.where(div.f0 + div.fprime_inf <= x.delta, -math.inf, xp.minimum(s, zero))


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
    """Log-edges for ``log p < LP_TINY`` (nan where the tails of f are unknown)."""
    d = div.derivation
    nan = 0.0 * x.lp + math.nan
    minus_inf = 0.0 * x.lp - math.inf
    if d.tail_inf is None or not d.tail_inf[0] > 0:
        s_hi = nan
    else:
        fun = TinyUpper(div, xp, x, kernels)
        w = newton_edge(fun, "upper", fun.guess(), minus_inf, 0.0 * x.lp,
                        fixed_iter=fixed_iter)
        T1, _ = fun._T(0.0 * x.lp)
        w = xp.where(T1 + div.f0 <= x.delta, 0.0, w)
        s_hi = w - x.lp
    if math.isfinite(d.f0):
        s_lo = minus_inf  # p f(0) -> 0: the ball reaches r = 0
    else:
        s_lo = _lower_tail(div, xp, x)
        s_lo = nan if s_lo is None else s_lo
    return s_lo, s_hi


def quadratic_roots(xp, a2, a1, a0):
    """Both real roots of ``a2 v^2 + a1 v + a0`` (nan where complex), without cancellation.

    ``t = -(a1 + sign(a1) sqrt(disc)) / 2`` adds numbers of one sign; the roots are ``t / a2``
    and ``a0 / t`` (Vieta).  A linear equation (``a2 = 0``) gives its root twice.
    """
    disc = a1 * a1 - 4.0 * a2 * a0
    # A double root may come out slightly negative by rounding: read that as 0.
    disc = xp.where(disc >= -1e-12 * a1 * a1, xp.maximum(disc, 0.0 * disc), math.nan)
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
        ok1, ok2 = ((v > 0) & (v * fun.p_over_q <= 1.01) for v in (v1, v2))
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
    close = (a1 * a1 - 4.0 * a2 * a0 < 1e-2 * a1 * a1) | squared
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


#: Above ``FAR_ABOVE * delta`` a Newton step is taken on ``log g`` instead of ``g``.
FAR_ABOVE = 2.0


def _initial_guess(fun: BandFunction, curvature: float, edge: str):
    """The small-delta (chi-square shaped) band, ``1 -+ sqrt(2 delta q / (f''(1) p))``."""
    xp, x = fun.xp, fun.x
    k = curvature if math.isfinite(curvature) and curvature > 0 else 1.0
    w = xp.sqrt(2.0 * x.delta / (k * fun.p_over_q))
    if edge == "upper":
        return xp.minimum(xp.log1p(w), -0.5 * x.lp)
    # Far from 1, the leading behaviour of f at 0 (p f(r) = delta) is the better guess.
    tail = fun.tail_guess()
    return xp.where(w < 0.5, xp.log1p(-xp.minimum(w, 0.5)), -w if tail is None else tail)


def newton_edge(fun: BandFunction, edge: str, s0, lo, hi, *, max_iter: int = 200, fixed_iter=None):
    """Safeguarded Newton on ``g(s) = delta`` inside the bracket ``[lo, hi]``.

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
    n = fixed_iter if fixed_iter is not None else max_iter
    for _ in range(n):
        g, slope = fun.value_and_slope(s)
        r = g - x.delta
        above = ~(sign * r <= 0)  # the root is left of s (also where g is nan)
        hi = xp.where(above & ~done, s, hi)
        lo = xp.where(~above & ~done, s, lo)
        step = r / slope
        # Far above delta, Newton on log g: exact for an exponential g (a steep generator,
        # u**100), where plain Newton crawls by 1/k a step; its overshoot falls to bisection.
        far_above = g > FAR_ABOVE * x.delta
        step = xp.where(far_above, xp.log(xp.where(far_above, g, 1.0) / x.delta) * g, r) / slope
        cand = s - step
        inside = (cand > lo) & (cand < hi)  # False for nan
        # Bisection: arithmetic, geometric across orders of magnitude, doubling while the
        # bracket is open to the left.
        alo, ahi = xp.maximum(xp.abs(lo), 1.0), xp.maximum(xp.abs(hi), 1.0)
        far = (lo * hi >= 0) & ((alo > 4.0 * ahi) | (ahi > 4.0 * alo))
        mid = xp.where(far, xp.sign(lo + hi) * xp.sqrt(alo * ahi), 0.5 * (lo + hi))
        mid = xp.where(xp.isfinite(lo), mid, hi - xp.maximum(xp.abs(hi), 1.0))
        small = xp.abs(step) <= 1e-12 * xp.abs(s)
        converged = (r == 0) | (small & xp.isfinite(r) & xp.isfinite(slope) & (slope != 0))
        converged = converged | (hi - lo <= 4e-16 * xp.maximum(xp.abs(hi), 1e-300))
        new = xp.where(converged | inside, xp.minimum(xp.maximum(cand, lo), hi), mid)
        s = xp.where(done, s, new)
        done = done | converged
        if fixed_iter is None and bool(done.all()):
            break
    if fixed_iter is None:
        s = xp.where(done, s, math.nan)  # never an unconverged iterate as an edge
    return s


def _edge(fun: BandFunction, name: str, lo, hi, fixed_iter, tiny: bool, no_closed):
    """One edge before saturation: closed form where there is one (and log p is not below
    LP_CLOSED), Newton elsewhere."""
    xp = fun.xp
    newton = None
    if name not in fun.closed or tiny:
        guess = _initial_guess(fun, fun.div.curvature, name)
        newton = newton_edge(fun, name, guess, lo, hi, fixed_iter=fixed_iter)
    if name not in fun.closed:
        return newton
    s, close = _closed_edge(fun, name)
    s = xp.where(close, polish(fun, s, lo, hi), s)
    return s if newton is None else xp.where(no_closed, newton, s)


def solve(div: Divergence, xp, inputs: Inputs, *, fixed_iter=None, tiny=None, at_one=None,
          closed_forms: bool = True, kernels=None):
    """Log-edges ``(log lower, log upper)`` for broadcast inputs (see :class:`Inputs`).

    ``tiny``: whether some ``log p`` lies below ``LP_CLOSED`` (closed forms then lose their
    coefficients to underflow and Newton takes over) or ``LP_TINY`` (the tails of f take
    over).  None looks at the data, which costs a host synchronisation on a device.
    ``at_one``: whether some ``p == 1`` (their lower edge is solved from the limit equation);
    None looks at the data.  ``closed_forms=False`` runs the root finder everywhere (to check
    the closed forms).  ``kernels`` are ``div.kernels(xp)`` when the caller has them at hand
    already (a traced torch function cannot call into sympy or look them up by identity).
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
    s_hi = _edge(fun, "upper", zero_s, top, fixed_iter, tiny, no_closed)
    s_hi = xp.where(fun.at_top() <= x.delta, top, xp.minimum(xp.maximum(s_hi, zero_s), top))
    s_lo = _edge(fun, "lower", zero_s - math.inf, zero_s, fixed_iter, tiny, no_closed)
    s_lo = xp.where(fun.at_zero() <= x.delta, -math.inf, xp.minimum(s_lo, zero_s))
    if tiny:
        t_lo, t_hi = _solve_tiny(div, xp, x, fixed_iter, kernels)
        small = x.lp < LP_TINY
        s_lo, s_hi = xp.where(small, t_lo, s_lo), xp.where(small, t_hi, s_hi)
    one = x.lp == 0
    if at_one is None:
        at_one = bool(one.any())
    if at_one:
        s_lo = xp.where(one, _solve_at_one(div, xp, x, fixed_iter, kernels), s_lo)
        s_hi = xp.where(one, zero_s, s_hi)
    return s_lo, s_hi
