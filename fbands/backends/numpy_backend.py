"""numpy backend: the shared solver (:mod:`fbands._solver`) on float64 numpy arrays.

Closed forms where the divergence has them, safeguarded Newton elsewhere; the loop stops as
soon as every element has converged.
"""

from __future__ import annotations

import numpy as np

from fbands._solver import LP_TINY, BandFunction, Inputs, solve
from fbands.bands import NumpyInputs

#: The array namespace the generated kernels and the solver are bound to.
NAMESPACE = {
    "exp": np.exp,
    "expm1": np.expm1,
    "log": np.log,
    "log1p": np.log1p,
    "sqrt": np.sqrt,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "sign": np.sign,
    "abs": np.abs,
    "where": np.where,
    "minimum": np.minimum,
    "maximum": np.maximum,
    "isfinite": np.isfinite,
}


class _Namespace:
    def __init__(self, table):
        self.__dict__.update(table)


xp = _Namespace(NAMESPACE)


def solve_log_edges(div, x: NumpyInputs):
    """``(log lower, log upper)`` as float64 arrays for prepared inputs."""
    inputs = Inputs(x.lp, x.lq, x.p, x.q, x.delta)
    with np.errstate(all="ignore"):
        s_lo, s_hi = solve(div, xp, inputs)
        s_lo = refine_near_saturation(div, inputs, s_lo, from_logp=x.logp)
    return s_lo, s_hi


#: Lower edges below this, with the ball this close to reaching r = 0 (relative to delta),
#: are candidates for refinement in extended precision ...
SMALL_EDGE, CLOSE_TO_SATURATION = 1e-3, 1e-2
#: ... and are refined when the float64 root's error bound exceeds this (relative).
REFINE_ABOVE = 1e-14


def near_saturation(div, x: Inputs, s_lo, above: float = REFINE_ABOVE):
    """Mask of the lower edges that float64 cannot resolve (see :func:`refine_near_saturation`).

    An edge found as a root of ``g(s) = delta`` in float64 is off by about
    ``err(g) / |g'(s)|`` in ``s = log r``, i.e. relatively in ``r``, where ``err(g)`` is the
    rounding of ``g``'s two terms (a few ulp each; 8 ulp are assumed).  Those whose bound
    exceeds ``above`` are returned (float32 output needs far less than float64), and the
    saturated ones whose ``g(0)`` is within rounding of ``delta``.
    """
    with np.errstate(all="ignore"):
        fun = BandFunction(div, xp, x)
        g0 = fun.at_zero()
        suspect = (s_lo < np.log(SMALL_EDGE)) & (
            np.abs(g0 - x.delta) <= CLOSE_TO_SATURATION * x.delta
        )
        suspect &= (x.lp > LP_TINY) & (x.lp < 0)
        if not suspect.any():
            return suspect
        s = np.where(suspect & np.isfinite(s_lo), s_lo, -1.0)
        fc, _ = fun._F_c(fun.s_c(s))
        _, slope = fun.value_and_slope(s)
        err_g = 8 * np.finfo(np.float64).eps * (np.abs(x.p * fun.F(s)) + np.abs(x.q * fc))
        bound = err_g / np.abs(slope)
        # A saturated edge (r = 0) is in doubt only when g(0) is within rounding of delta.
        tie = np.abs(g0 - x.delta) <= 32 * np.finfo(np.float64).eps * x.delta
    return suspect & np.where(np.isfinite(s_lo), ~(bound <= above), tie)


def refine_near_saturation(
    div, x: Inputs, s_lo, *, from_logp: bool, digits: int = 40, above: float = REFINE_ABOVE
):
    """Redo, in ``digits``-digit arithmetic, the lower edges that float64 cannot resolve.

    Where ``delta`` is close to ``g(p, 0)`` (the radius at which the lower edge reaches 0) the
    edge is small and ill-conditioned: a rounding of ``g`` by ``eps delta`` moves it by
    ``eps delta / |g'(r)|``, far more than its own size allows.  Those few elements are found
    in float64 (:func:`near_saturation`) and solved again with mpmath on ``g`` built from the
    same sympy generator: the decision whether the edge is 0 at all, then secant steps from
    the float64 root (bisection if they leave the bracket).  ``p`` is taken exactly as
    given: from ``p`` itself, or as ``exp(log p)`` for log-probability input.
    """
    suspect = near_saturation(div, x, s_lo, above)
    if not suspect.any():
        return s_lo
    import mpmath as mp

    f = div.mpmath_f
    s_lo = np.array(s_lo, dtype=np.float64, copy=True)
    with mp.workdps(digits):
        for i in np.argwhere(suspect):
            i = tuple(i)
            p = mp.exp(mp.mpf(float(x.lp[i]))) if from_logp else mp.mpf(float(x.p[i]))
            delta = mp.mpf(float(x.delta[i]))
            q = 1 - p

            def h(r, p=p, q=q, delta=delta):  # decreasing on [0, 1]
                c = (1 - r * p) / q
                return p * (f(r) if r > 0 else mp.mpf(div.f0)) + q * f(c) - delta

            if h(mp.mpf(0)) <= delta * mp.mpf(10) ** (5 - digits):  # ties: saturated
                s_lo[i] = -np.inf
                continue
            r = _secant_root(mp, h, float(np.exp(s_lo[i])), digits)
            s_lo[i] = float(mp.log(r))
    return s_lo


def _secant_root(mp, h, guess: float, digits: int):
    """The root of ``h`` (decreasing, ``h(0) > 0``) near ``guess``: a bracket grown from
    ``guess (1 -+ 1e-6)``, then Illinois (safeguarded secant) steps."""
    tol = mp.mpf(10) ** (6 - digits)
    top = mp.mpf(SMALL_EDGE) * 10
    while h(top) > 0:  # pragma: no cover - the float64 edge is below SMALL_EDGE
        top = (top + 1) / 2
    g = mp.mpf(guess) if 0 < guess < top else top / 2
    a, b = g * (1 - mp.mpf(10) ** -6), min(g * (1 + mp.mpf(10) ** -6), top)
    ha, hb = h(a), h(b)
    while ha <= 0:  # h(0) > 0: the root lies below a
        a, b, hb = a / 10, a, ha
        ha = h(a)
    while hb > 0:
        a, ha, b = b, hb, min(b * 10, top)
        hb = h(b)
    side = 0
    for _ in range(200):
        c = b - hb * (b - a) / (hb - ha)
        if not a < c < b:
            c = (a + b) / 2
        hc = h(c)
        if hc > 0:
            a, ha = c, hc
            hb = hb / 2 if side == 1 else hb  # Illinois: halve the stale end
            side = 1
        else:
            b, hb = c, hc
            ha = ha / 2 if side == -1 else ha
            side = -1
        if hc == 0 or b - a <= tol * b:
            return c
    return (a + b) / 2  # pragma: no cover - converges well within the limit


def log_edges(div, p, delta, *, logp, invalid, check):
    x = NumpyInputs(p, delta, logp=logp, invalid=invalid, check=check)
    lo, hi = solve_log_edges(div, x)
    return x.finish(lo, hi, log=True)


def edges(div, p, delta, *, logp, invalid, check):
    x = NumpyInputs(p, delta, logp=logp, invalid=invalid, check=check)
    lo, hi = solve_log_edges(div, x)
    return x.finish(lo, hi, log=False)
