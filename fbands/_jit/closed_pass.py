"""The closed-form pass: ratio edges of an array of ``p`` for one scalar ``delta``, from
the closed forms, with no table, no iteration and no data-dependent branch.

For a divergence whose edges both have unsquared closed forms
(:attr:`fbands.divergences.Divergence.closed_form_edges`), every root inside the simplex is
genuine and ``g`` is monotone on each side of 1, so each edge is the root that the solver
itself takes: :func:`.scalar.upper_root_one` and :func:`.scalar.lower_root_one`, the scalar forms of
:func:`fbands._solver.upper_root` and :func:`fbands._solver.lower_root`, inlined here so
that the loop vectorises.  The upper edge is clamped to ``1 / p``; float32 output skips the
lower edge's Newton step (an ulp of 1 is far below an ulp of float32 for the edges the pass
keeps).  What the roots cannot vouch for is left to the exact solver with a nan lower edge,
counted per block of :data:`~fbands._jit.prims.BLOCK` elements: ill-conditioned roots,
lower edges below ``small_edge`` (next to saturation: they may need extended precision,
and the side of 0 the root falls on is in doubt), invalid ``p`` and ``p`` below
``p_closed``.  Like :mod:`.scalar`, this file is compiled in the package of one divergence
(:mod:`fbands._jit.loader`).
"""

from __future__ import annotations

import numba
import numpy as np

from fbands._jit import disk_cache
from fbands._jit.prims import BLOCK, INLINE, OPTS, is_float64, lower_out

from .scalar import lower_root_one, upper_root_one


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
        y, ill_hi = upper_root_one(p, q, delta)
        hi = min(1.0 + y, 1.0 / p)
        r, _, ill_lo = lower_root_one(p, q, delta, is_float64(out_lo))
        # (Bitwise, not a conditional expression: that one keeps the loop from vectorising.)
        doubt = ill_hi | ill_lo | (abs(r) < small_edge)
        one = p == 1.0
        more = (doubt & (not one)) | (not valid)
        out_lo[i] = lower_out(max(r, 0.0), one, more, at_one)
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


disk_cache.tolerate(globals())  # (a damaged cache file costs a compile, not a call)
