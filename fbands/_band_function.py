"""The band function ``g(s)`` and its slope, for the three equations the solver meets.

:class:`BandFunction` is the equation of every ordinary element,
``g(s) = p F(s) + q F(s_c) = delta`` in ``s = log r``; :class:`TinyUpper` the upper edge
below ``log p = LP_TINY``, where ``p`` and ``1/p`` are not representable; :class:`AtOne` the
lower edge at ``p = 1``.  Each evaluates without cancellation on arrays of one namespace
``xp`` (see :mod:`fbands._solver`, which solves them).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fbands.divergences import Divergence

#: log 2: the upper edge steps in ``s_c = log c`` once ``c < 1/2`` (see
#: :func:`fbands._solver.newton_edge`), and log1mexp switches its formula at ``-LN2``.
LN2 = math.log(2.0)


@dataclass
class Inputs:
    """Broadcast float64 arrays describing the old probability and the radius."""

    lp: Any  # log p
    lq: Any  # log(1 - p), floored at log(Q_FLOOR)
    p: Any
    q: Any
    delta: Any


def take_inputs(x: Inputs, shape, index) -> Inputs:
    """The inputs ``x`` broadcast to ``shape``, at the numpy index ``index`` (1-d)."""
    import numpy as np

    return Inputs(*(np.broadcast_to(getattr(x, f.name), shape)[index] for f in fields(Inputs)))


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

    def take(self, index):
        """The same function on the elements ``index`` (a numpy index) of its inputs, as a
        1-d problem: what the solver goes on with once most elements have converged."""
        shape = self.p_over_q.shape
        part = copy.copy(self)
        part.x = take_inputs(self.x, shape, index)
        part.p_over_q = self.p_over_q[index]
        return part

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
        s = lower_tail(self.div, self.xp, self.x)
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
#: ... and below this p: ``exp(LP_CLOSED)``.
P_CLOSED = math.exp(LP_CLOSED)


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


def lower_tail(div: Divergence, xp, x: Inputs):
    """``log r`` solving ``p f(r) = delta`` from ``f ~ A r^k (log r)^m`` at 0, or None."""
    if div.derivation.tail0 is None:
        return None
    A, k, m, _ = div.derivation.tail0
    # (log delta - log |A|: delta / |A| overflows for a radius near the largest float)
    if m == 0 and k < 0:
        return (xp.log(x.delta) - math.log(A) - x.lp) / k
    if m == 1 and k == 0 and A < 0:
        return -xp.exp(xp.log(x.delta) - math.log(-A) - x.lp)
    return None


