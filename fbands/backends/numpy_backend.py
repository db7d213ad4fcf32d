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
#: are refined in extended precision.
SMALL_EDGE, CLOSE_TO_SATURATION = 1e-3, 1e-2


def refine_near_saturation(div, x: Inputs, s_lo, *, from_logp: bool, digits: int = 40):
    """Redo, in ``digits``-digit arithmetic, the lower edges that float64 cannot resolve.

    Where ``delta`` is close to ``g(p, 0)`` (the radius at which the lower edge reaches 0) the
    edge is small and ill-conditioned: a rounding of ``g`` by ``eps delta`` moves it by
    ``eps delta / |g'(r)|``, far more than its own size allows.  Those few elements are found
    in float64 and solved again with mpmath (bisection on ``g`` built from the same sympy
    generator), including the decision whether the edge is 0 at all.  ``p`` is taken exactly
    as given: from ``p`` itself, or as ``exp(log p)`` for log-probability input.
    """
    fun = BandFunction(div, xp, x)
    with np.errstate(all="ignore"):
        g0 = fun.at_zero()
    suspect = (s_lo < np.log(SMALL_EDGE)) & (np.abs(g0 - x.delta) <= CLOSE_TO_SATURATION * x.delta)
    suspect &= (x.lp > LP_TINY) & (x.lp < 0)
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

            def g(r, p=p, q=q):
                c = (1 - r * p) / q
                return p * (f(r) if r > 0 else mp.mpf(div.f0)) + q * f(c)

            if g(mp.mpf(0)) <= delta * (1 + mp.mpf(10) ** (5 - digits)):  # ties: saturated
                s_lo[i] = -np.inf
                continue
            lo, hi = mp.mpf(0), mp.mpf(SMALL_EDGE) * 10
            while g(hi) > delta:  # pragma: no cover - the float64 edge is below SMALL_EDGE
                hi = (hi + 1) / 2
            for _ in range(4 * digits):  # bisection: g decreases on [0, 1]
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if g(mid) > delta else (lo, mid)
            s_lo[i] = float(mp.log((lo + hi) / 2))
    return s_lo


def log_edges(div, p, delta, *, logp, invalid, check):
    x = NumpyInputs(p, delta, logp=logp, invalid=invalid, check=check)
    lo, hi = solve_log_edges(div, x)
    return x.finish(lo, hi, log=True)


def edges(div, p, delta, *, logp, invalid, check):
    x = NumpyInputs(p, delta, logp=logp, invalid=invalid, check=check)
    lo, hi = solve_log_edges(div, x)
    return x.finish(lo, hi, log=False)
