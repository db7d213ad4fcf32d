"""Lower edges that float64 cannot resolve, found and solved again in finer arithmetic.

Where the radius is close to ``g(p, 0)`` (the radius at which the lower edge reaches 0), the
lower edge is small and ill-conditioned: the float64 root of ``g = delta`` can be off by far
more than its own size.  :func:`near_saturation` finds those elements from the float64 solve,
and :func:`refine_near_saturation` redoes them in extended precision, then with mpmath.  Part
of the numerics every array path shares (the numpy backend, the numba backend's
exact path, the tables' builder), next to the solver (:mod:`fbands._solver`).
"""

from __future__ import annotations

import math

import numpy as np

from fbands._solver import LP_TINY, NAMESPACE, BandFunction, Inputs, Namespace, solve
from fbands._solver import NUMPY as xp

__all__ = ["CLOSE_TO_SATURATION", "HUGE_DELTA", "REFINE_ABOVE", "SMALL_EDGE", "exact_log_edges",
           "is_huge", "near_saturation", "refine_near_saturation", "solve_huge_radius"]


#: Lower edges below this, with the ball this close to reaching r = 0 (relative to delta),
#: are candidates for refinement in extended precision ...
SMALL_EDGE, CLOSE_TO_SATURATION = 1e-3, 1e-2
#: ... and are refined when the float64 root's error bound exceeds this (relative).
REFINE_ABOVE = 1e-14


def near_saturation(div, x: Inputs, s_lo, above: float = REFINE_ABOVE, namespace=xp):
    """Mask of the lower edges that float64 cannot resolve (see :func:`refine_near_saturation`);
    with ``namespace=xp_extended``, of those that :data:`EXTENDED` precision cannot.

    An edge found as a root of ``g(s) = delta`` in float64 is off by about
    ``err(g) / |g'(s)|`` in ``s = log r``, i.e. relatively in ``r``, where ``err(g)`` is the
    rounding of ``g``'s two terms (a few ulp each; 8 ulp are assumed).  Those whose bound
    exceeds ``above`` are returned (float32 output needs far less than float64), and the
    saturated ones whose ``g(0)`` is within rounding of ``delta``.
    """
    with np.errstate(all="ignore"):
        fun = BandFunction(div, namespace, x)
        g0 = fun.at_zero()
        suspect = (s_lo < np.log(SMALL_EDGE)) & (
            np.abs(g0 - x.delta) <= CLOSE_TO_SATURATION * x.delta
        )
        suspect &= (x.lp > LP_TINY) & (x.lp < 0)
        if not suspect.any():
            return suspect
        s = np.where(suspect & np.isfinite(s_lo), s_lo, -1.0)
        bound = _root_error(fun, s)
        # A saturated edge (r = 0) is in doubt only when g(0) is within rounding of delta.
        tie = np.abs(g0 - x.delta) <= 32 * np.finfo(np.result_type(x.delta)).eps * x.delta
    return suspect & np.where(np.isfinite(s_lo), ~(bound <= above), tie)


def _root_error(fun: BandFunction, s):
    """Error bound of a root at ``s`` of ``g = delta`` found in the precision of ``s``'s
    dtype: ``8 eps (|p F| + |q F_c|) / |g'(s)|`` (eight ulp of each term of g; relative in
    r)."""
    g_r, g_c, slope = fun.terms_and_slope(s)
    eps = np.finfo(np.result_type(s)).eps
    return 8 * eps * (np.abs(g_r) + np.abs(g_c)) / np.abs(slope)


#: The extended type of the middle tier of refinement: 80-bit x87 on x86-64 Linux (eps 1e-19),
#: IEEE quad on aarch64 Linux (in software, still far cheaper than mpmath); where it is plain
#: float64 (Windows, macOS) the tier is skipped.
EXTENDED = np.longdouble
#: The kernels in :data:`EXTENDED`, with their constants (log 2, ...) to 30 digits.
xp_extended = Namespace({**NAMESPACE, "from_decimal": EXTENDED})
#: Newton steps in the extended type from the float64 root.  The tier can only succeed where
#: its error bound, the float64 one times eps_ext / eps_64 (1/2048 for 80-bit), is below the
#: threshold (1e-14 for float64 output), so the float64 root it starts from is good to
#: 2e-11 (to 2e-6 for float32 output's 1e-9): by quadratic convergence one step takes it
#: below 1e-20, and the second, as small as that error, shows that the root has settled.
EXTENDED_STEPS = 2


def _refine_extended(div, x: Inputs, s_lo, suspect, *, from_logp: bool, above: float):
    """Newton steps in :data:`EXTENDED` precision, vectorised over the suspects, on the same
    kernels as float64.  Returns the refined log-edges and the suspects still in doubt: the
    saturation undecided within the extended rounding of g(0), a float64 edge that was
    saturated but is not, no convergence, or an extended error bound still above ``above``."""
    if np.finfo(EXTENDED).eps >= np.finfo(np.float64).eps / 8:
        return s_lo, suspect
    ld = EXTENDED
    if from_logp:
        lp = x.lp[suspect].astype(ld)
        p, q = np.exp(lp), -np.expm1(lp)
    else:
        p = x.p[suspect].astype(ld)
        q, lp = 1 - p, np.log(p)
    # log1p(-p), not log(q): 1 - p of a small float64 p rounds in the extended type too
    # (its bits reach below 2^-64), and log of it would be off by an ulp of 1, a relative
    # eps / p in the other token's f(1 / q), far above the tie that decides saturation.
    lq = np.log(q) if from_logp else np.log1p(-p)
    xe = Inputs(lp, lq, p, q, x.delta[suspect].astype(ld))
    fun = BandFunction(div, xp_extended, xe)
    eps = np.finfo(ld).eps
    g0_r, g0_c = fun.zero_terms()
    g0 = g0_r + g0_c
    tie = 8 * eps * (np.abs(g0_r) + np.abs(g0_c))
    saturated = g0 - xe.delta < -tie
    start = s_lo[suspect]
    s = np.where(np.isfinite(start), start, -1.0).astype(ld)
    step = np.zeros_like(s)
    for _ in range(EXTENDED_STEPS):
        g, slope = fun.value_and_slope(s)
        step = (g - xe.delta) / slope
        s = np.minimum(s - step, 0.0)
    bound = _root_error(fun, s)
    root = (g0 - xe.delta > tie) & np.isfinite(start) & (np.abs(step) <= above) & (bound <= above)
    done = saturated | root
    out = np.array(s_lo, dtype=np.float64, copy=True)
    out[suspect] = np.where(saturated, -np.inf, np.where(root, s.astype(np.float64), start))
    left = np.array(suspect, copy=True)  # (an array even for one element)
    left[suspect] = ~done
    return out, left


def refine_near_saturation(
    div, x: Inputs, s_lo, *, from_logp: bool, digits: int = 40, above: float = REFINE_ABOVE
):
    """Redo, in ``digits``-digit arithmetic, the lower edges that float64 cannot resolve.

    Where ``delta`` is close to ``g(p, 0)`` (the radius at which the lower edge reaches 0) the
    edge is small and ill-conditioned: a rounding of ``g`` by ``eps delta`` moves it by
    ``eps delta / |g'(r)|``, far more than its own size allows.  Those few elements are found
    in float64 (:func:`near_saturation`) and solved again: first all at once by Newton steps
    in the platform's extended precision (:func:`_refine_extended`), which settles nearly
    all of them; the rest with mpmath on ``g`` built from the same sympy generator: the
    decision whether the edge is 0 at all, then secant steps from the float64 root
    (bisection if they leave the bracket).  ``p`` is taken exactly as given: from ``p``
    itself, or as ``exp(log p)`` for log-probability input.
    """
    suspect = near_saturation(div, x, s_lo, above)
    if not suspect.any():
        return s_lo
    with np.errstate(all="ignore"):
        s_lo, suspect = _refine_extended(div, x, s_lo, suspect, from_logp=from_logp,
                                         above=above)
    if not suspect.any():
        return s_lo
    return _refine_mpmath(div, x, s_lo, suspect, from_logp=from_logp, digits=digits)


def _refine_mpmath(div, x: Inputs, s_lo, suspect, *, from_logp: bool, digits: int = 40):
    """The lower edges ``suspect`` solved again with mpmath (see
    :func:`refine_near_saturation`): whether the edge is 0 at all, then secant steps from
    ``s_lo``."""
    import mpmath as mp

    f = div.mpmath_f
    s_lo = np.array(s_lo, dtype=np.float64, copy=True)
    for i in np.argwhere(suspect):
        i = tuple(i)
        # 1 - p and c - 1 = p (1 - r) / q cancel about log10(1 / p) digits: add them, so that
        # g's terms keep ``digits`` (the bits of a float64 p reach 2^-52 p).
        extra = max(0, math.ceil(-float(x.lp[i]) / math.log(10))) + 5
        with mp.workdps(digits + extra):
            if from_logp:  # q from expm1: exp(log p) of a p within 1e-60 of 1 rounds to 1
                lp = mp.mpf(float(x.lp[i]))
                p, q = mp.exp(lp), -mp.expm1(lp)
            else:
                p = mp.mpf(float(x.p[i]))
                q = 1 - p
            delta = mp.mpf(float(x.delta[i]))
            f0 = div.mpmath_f0()

            def h(r, p=p, q=q, delta=delta, f0=f0):  # decreasing on [0, 1]
                c = (1 - r * p) / q
                return p * (f(r) if r > 0 else f0) + q * f(c) - delta

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


#: Radii from this one on are solved in :data:`EXTENDED` precision (its wider exponent
#: range, not its digits): there the terms of g (``F(s)`` up to ``delta / p``, ``1 / q``
#: for a log p near 0) and the tiny-p equation's ``T(w)`` overflow float64 on the way to the
#: root, and Newton stops at the overflow instead of the edge.  Below it every term at and
#: around the root is a float64 (issue 42, P7; ``tests/core/test_extreme_radii.py``).
HUGE_DELTA = 1e60
#: ... and where ``log(delta / q)`` passes this (``delta / q`` about 2e282, with room for a
#: generator's constant: alpha(10) at ``q = 1e-300`` overflowed from ``delta = 1e8``).
HUGE_OVER_Q = 650.0
#: The binary exponents the extended type must reach: ``F`` at the root, ``delta / p`` (up
#: to 1e308 / 5e-324, about 2^2100), with room for Newton's steps around it.
_EXTENDED_EXPONENT = 4096


def extended_has_range() -> bool:
    """Whether :data:`EXTENDED` reaches far beyond float64 (80-bit and quad: 2^16384)."""
    return int(np.finfo(EXTENDED).maxexp) >= _EXTENDED_EXPONENT


def is_huge(xp, x: Inputs):
    """Mask of the elements whose terms of g can overflow float64 near the root: a radius
    of at least :data:`HUGE_DELTA`, or ``delta / q`` beyond ``exp(HUGE_OVER_Q)`` next to
    ``p = 1`` (the other token's ``q F(s_c) = delta`` asks for ``F = delta / q``; ``p = 1``
    itself takes its limit)."""
    return (x.delta >= HUGE_DELTA) | ((x.lq < xp.log(x.delta) - HUGE_OVER_Q) & (x.lp < 0))


def solve_huge_radius(div, x: Inputs, s_lo, s_hi, *, from_logp: bool):
    """``(s_lo, s_hi)`` with the elements of a huge radius (:func:`is_huge`) solved again
    by the same solver in :data:`EXTENDED` precision, and rounded once to float64; nan where
    the platform's extended type has float64's range (Windows, macOS on ARM), never a
    wrong edge."""
    with np.errstate(all="ignore"):
        huge = np.broadcast_to(is_huge(np, x), np.shape(s_lo))
    if not huge.any():
        return s_lo, s_hi
    s_lo, s_hi = np.array(s_lo, dtype=np.float64), np.array(s_hi, dtype=np.float64)
    if not extended_has_range():
        s_lo[huge], s_hi[huge] = np.nan, np.nan
        return s_lo, s_hi
    ld = EXTENDED
    pick = [np.broadcast_to(a, huge.shape)[huge] for a in (x.lp, x.lq, x.p, x.q, x.delta)]
    lp, lq, p, q, delta = (a.astype(ld) for a in pick)
    if from_logp:  # p and q again from log p, with the extended type's digits
        p, q = np.exp(lp), -np.expm1(lp)
        lq = np.log(q)
    xe = Inputs(lp, lq, p, q, delta)
    with np.errstate(all="ignore"):
        lo, hi = solve(div, xp_extended, xe, closed_forms=False)
        doubt = near_saturation(div, xe, lo, namespace=xp_extended)
    s_lo[huge], s_hi[huge] = lo.astype(np.float64), hi.astype(np.float64)
    if doubt.any():  # next to saturation, where even the extended digits are too few
        suspect = np.zeros(huge.shape, dtype=bool)
        suspect[huge] = doubt
        s_lo = _refine_mpmath(div, x, s_lo, suspect, from_logp=from_logp)
    return s_lo, s_hi


def exact_log_edges(div, x: Inputs, *, from_logp: bool):
    """``(log lower, log upper)`` of prepared float64 inputs by the array solver on numpy,
    with the lower edges float64 cannot resolve refined (:func:`refine_near_saturation`)
    and a huge radius solved again (:func:`solve_huge_radius`): the numpy backend's exact
    path, which the grids' builder reads too."""
    with np.errstate(all="ignore"):
        s_lo, s_hi = solve(div, xp, x)
        s_lo = refine_near_saturation(div, x, s_lo, from_logp=from_logp)
        return solve_huge_radius(div, x, s_lo, s_hi, from_logp=from_logp)
