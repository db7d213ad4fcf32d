"""numpy backend: the shared solver (:mod:`fbands._solver`) on float64 numpy arrays.

Closed forms where the divergence has them, safeguarded Newton elsewhere; the loop stops as
soon as every element has converged.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from fbands._inputs import NumpyInputs, Request, check_values
from fbands._paths import Plan
from fbands._refine import exact_log_edges

#: Elements the numpy backend solves at once.  The solver holds a few dozen float64
#: temporaries of its input's size, so a larger call goes by chunks of this many: its
#: memory stays a few times its input and output, however long the array.
CHUNK = 1 << 16


def run(plan: Plan, div, p, delta, request: Request):
    """Carry out ``plan`` (its one path, :data:`~fbands._paths.EXACT`)."""
    return exact(div, p, delta, request)


def exact(div, p, delta, request: Request):
    """The band of every element by the array solver (the numpy backend's one path), in
    chunks of :data:`CHUNK` elements."""
    pa, da = np.asarray(p), np.asarray(delta)
    try:
        shape = np.broadcast_shapes(pa.shape, da.shape)
    except ValueError:
        shape = None  # (NumpyInputs reports it)
    if shape is None or math.prod(shape) <= CHUNK or pa.dtype.kind not in "fiu":
        return _exact(div, p, delta, request)
    if request.raises:  # the first invalid element of the whole array
        check_values(np.broadcast_to(pa, shape), np.broadcast_to(da, shape), request.logp)
        request = replace(request, check=False)
    flat = [a.reshape(()) if a.size == 1 else np.broadcast_to(a, shape).reshape(-1)
            for a in (pa, da)]
    n = math.prod(shape)
    lo = hi = None
    for start in range(0, n, CHUNK):
        part = slice(start, min(start + CHUNK, n))
        ps, ds = (a if a.ndim == 0 else a[part] for a in flat)
        ps = np.broadcast_to(ps, (part.stop - part.start,))
        c_lo, c_hi = _exact(div, ps, ds, request)
        if lo is None:
            lo, hi = np.empty(n, c_lo.dtype), np.empty(n, c_hi.dtype)
        lo[part], hi[part] = c_lo, c_hi
    return lo.reshape(shape), hi.reshape(shape)


def _exact(div, p, delta, request: Request):
    x = NumpyInputs(p, delta, request)
    return x.finish(*exact_log_edges(div, x.inputs, from_logp=request.logp))
