"""The closed-form pass: ratio edges of an array of ``p`` for one scalar ``delta``, from
the closed forms, with no table, no iteration and no data-dependent branch.

For a divergence whose three closed forms needed no squaring
(:func:`fbands._jit.codegen.has_closed_pass`), every root inside the simplex is genuine
and ``g`` is monotone on each side of 1, so the upper edge is the smallest positive root
in ``y = r - 1``, clamped to ``1 / p``, and the lower edge comes from the smallest positive
root of the form in ``y = 1 - r`` (none, or one at ``y >= 1``: saturated), which has no
cancellation when the edge is near 1.  Below ``r = 1/2`` its absolute error of an ulp of 1
is too much for a small edge, and one Newton step on the form in ``r`` brings it to that
form's accuracy (float32 output skips it: an ulp of 1 is far below an ulp of float32 for
the edges the pass keeps).  What the roots cannot vouch for is left to the exact solver
with a nan lower edge, counted per block of :data:`~fbands._jit.prims.BLOCK` elements:
nearly double roots (:data:`fbands._solver.NEAR_DOUBLE`, the solver's own test), lower
edges below ``small_edge`` (next to saturation: they may need extended precision, and the
side of 0 the root falls on is in doubt), invalid ``p`` and ``p`` below ``p_closed``.
Like :mod:`.scalar`, this file is compiled in the package of one divergence
(:mod:`fbands._jit.loader`).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from fbands._jit.prims import BLOCK, INLINE, OPTS, is_float64, lower_out
from fbands._solver import NEAR_DOUBLE

from .leaves import (
    LOWER_Y_ZERO,
    LOWER_ZERO,
    UPPER_ZERO,
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


@numba.njit(**INLINE)
def real_roots(a2, a1, a0, zero):
    """The real roots of ``a2 v^2 + a1 v + a0`` (nan where there is none; a linear equation
    gives its root twice), and whether they are ill-conditioned (nearly equal).  ``zero``:
    which of ``(a2, a1)`` vanish identically, constants of the leaves, so that the branches
    on them fold away at compile time (tv's forms are linear, chi2's forms in y have no
    linear term).  The cancellation-free formula of :func:`fbands._solver.quadratic_roots`,
    with each division written as a product with a reciprocal, which the compiler shares
    between the forms (``1 / p`` for tv and chi2): one ulp of a root, far below the band's
    tolerance, for the divider's time that bounds this loop."""
    if zero[0]:
        v = -a0 * (1.0 / a1)
        return v, v, False
    if zero[1]:
        v = math.sqrt(-a0 * (1.0 / a2))
        return v, -v, False
    disc = a1 * a1 - 4.0 * a2 * a0
    t = -0.5 * (a1 + math.copysign(math.sqrt(disc), a1))
    return t * (1.0 / a2), a0 / t, nearly_double(a2, a1, a0, zero)


@numba.njit(**INLINE)
def nearly_double(a2, a1, a0, zero):
    """Whether the roots of ``a2 v^2 + a1 v + a0`` are ill-conditioned, as the solver judges
    its closed forms (:data:`fbands._solver.NEAR_DOUBLE`)."""
    if zero[0] | zero[1]:
        return False
    return a1 * a1 - 4.0 * a2 * a0 < NEAR_DOUBLE * a1 * a1


@numba.njit(**INLINE)
def newton_step(a2, a1, a0, v, zero):
    """The Newton step ``P(v) / P'(v)`` of ``P = a2 v^2 + a1 v + a0`` (a linear ``P``: its
    exact root's distance, through the reciprocal that real_roots shares)."""
    if zero[0]:
        return (a1 * v + a0) * (1.0 / a1)
    return ((a2 * v + a1) * v + a0) / (2.0 * a2 * v + a1)


@numba.njit(**INLINE)
def closed_block(x, start, stop, delta, p_closed, at_one, small_edge, out_lo, out_hi):
    """One block of :func:`closed_pass`: how many elements it leaves."""
    bad = 0
    for i in range(np.uint64(start), np.uint64(stop)):  # unsigned: see prims.at
        p = np.float64(x[i])
        # p outside [p_closed, 1], nan included, is left to the exact solver (which judges
        # it); the results computed for it here are never stored.
        valid = (p >= p_closed) & (p <= 1.0)
        q = 1.0 - p
        inv = 1.0 / p
        u1, u2, u_close = real_roots(np.float64(upper_a2(p, q, delta)),
                                     np.float64(upper_a1(p, q, delta)),
                                     np.float64(upper_a0(p, q, delta)), UPPER_ZERO)
        y = min(u1 if u1 > 0.0 else math.inf, u2 if u2 > 0.0 else math.inf)
        hi = min(1.0 + y, inv)
        l1, l2, y_close = real_roots(np.float64(lower_y_a2(p, q, delta)),
                                     np.float64(lower_y_a1(p, q, delta)),
                                     np.float64(lower_y_a0(p, q, delta)), LOWER_Y_ZERO)
        r_raw = 1.0 - min(l1 if l1 > 0.0 else math.inf, l2 if l2 > 0.0 else math.inf)
        below_half = r_raw < 0.5
        rl = r_raw
        polish_doubt = False
        if is_float64(out_lo):  # (a constant of each compiled loop)
            a2 = np.float64(lower_a2(p, q, delta))
            a1 = np.float64(lower_a1(p, q, delta))
            a0 = np.float64(lower_a0(p, q, delta))
            polish = below_half & (r_raw > 0.0)
            rl = r_raw - newton_step(a2, a1, a0, r_raw, LOWER_ZERO) if polish else r_raw
            polish_doubt = below_half & nearly_double(a2, a1, a0, LOWER_ZERO)
        # (Bitwise, not a conditional expression: that one keeps the loop from vectorising.)
        doubt = u_close | y_close | polish_doubt | (abs(rl) < small_edge)
        one = p == 1.0
        more = (doubt & (not one)) | (not valid)
        out_lo[i] = lower_out(max(rl, 0.0), one, more, at_one)
        out_hi[i] = 1.0 if one else hi
        bad += more
    return bad


@numba.njit(parallel=True, **OPTS)
def closed_pass(x, delta, p_closed, at_one, small_edge, out_lo, out_hi, block_bad):
    """Ratio edges of a flat array ``x`` of p for one scalar ``delta`` into ``out_lo``,
    ``out_hi``.  ``p_closed`` (> 0): p below which the solver's tail forms take over;
    ``at_one``: the lower edge at p = 1; ``small_edge``: lower edges below it go to the
    exact solver (the output precision sets it); ``block_bad[b]``: how many elements of
    block ``b`` are left (see :func:`fbands._jit.prims.unfinished`)."""
    n = x.size
    for blk in numba.prange(block_bad.size):
        start = blk * BLOCK
        stop = min(start + BLOCK, n)
        block_bad[blk] = closed_block(x, start, stop, delta, p_closed, at_one, small_edge,
                                      out_lo, out_hi)
