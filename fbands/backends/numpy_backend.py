"""numpy backend: the shared solver (:mod:`fbands._solver`) on float64 numpy arrays.

Closed forms where the divergence has them, safeguarded Newton elsewhere; the loop stops as
soon as every element has converged.
"""

from __future__ import annotations

import math

import numpy as np

from fbands._inputs import NumpyInputs, check_values
from fbands._refine import refine_near_saturation, solve_huge_radius
from fbands._solver import NUMPY as xp
from fbands._solver import Inputs, solve


def solve_log_edges(div, x: NumpyInputs):
    """``(log lower, log upper)`` as float64 arrays for prepared inputs."""
    inputs = Inputs(x.lp, x.lq, x.p, x.q, x.delta)
    with np.errstate(all="ignore"):
        s_lo, s_hi = solve(div, xp, inputs)
        s_lo = refine_near_saturation(div, inputs, s_lo, from_logp=x.logp)
        return solve_huge_radius(div, inputs, s_lo, s_hi, from_logp=x.logp)


#: Elements the numpy backend solves at once.  The solver holds a few dozen float64
#: temporaries of its input's size, so a larger call goes by chunks of this many: its
#: memory stays a few times its input and output, however long the array.
CHUNK = 1 << 16


def exact(div, p, delta, *, logp, invalid, check, log):
    """The band of every element by the array solver (the numpy backend's one path), in
    chunks of :data:`CHUNK` elements."""
    pa, da = np.asarray(p), np.asarray(delta)
    try:
        shape = np.broadcast_shapes(pa.shape, da.shape)
    except ValueError:
        shape = None  # (NumpyInputs reports it)
    if shape is None or math.prod(shape) <= CHUNK or pa.dtype.kind not in "fiu":
        return _exact(div, p, delta, logp=logp, invalid=invalid, check=check, log=log)
    if check and invalid == "raise":  # the first invalid element of the whole array
        check_values(np.broadcast_to(pa, shape), np.broadcast_to(da, shape), logp)
        check = False
    flat = [a.reshape(()) if a.size == 1 else np.broadcast_to(a, shape).reshape(-1)
            for a in (pa, da)]
    n = math.prod(shape)
    lo = hi = None
    for start in range(0, n, CHUNK):
        part = slice(start, min(start + CHUNK, n))
        ps, ds = (a if a.ndim == 0 else a[part] for a in flat)
        ps = np.broadcast_to(ps, (part.stop - part.start,))
        c_lo, c_hi = _exact(div, ps, ds, logp=logp, invalid=invalid, check=check, log=log)
        if lo is None:
            lo, hi = np.empty(n, c_lo.dtype), np.empty(n, c_hi.dtype)
        lo[part], hi[part] = c_lo, c_hi
    return lo.reshape(shape), hi.reshape(shape)


def _exact(div, p, delta, *, logp, invalid, check, log):
    x = NumpyInputs(p, delta, logp=logp, invalid=invalid, check=check)
    lo, hi = solve_log_edges(div, x)
    return x.finish(lo, hi, log=log)
