"""What every numba kernel of fbands shares: compile options, math names, small helpers.

The generated leaves (:mod:`fbands._jit.codegen`) import their math names from here, and
the solver and the passes import the helpers; a divergence adds nothing to this module.
Every function is plain Python that numba compiles, so that it also runs as it is under
``NUMBA_DISABLE_JIT=1``.
"""

from __future__ import annotations

import math
import types

import numba
import numba.extending
import numpy as np

from fbands._jit import disk_cache

__all__ = [
    "OPTS", "INLINE", "BLOCK", "exp", "expm1", "log", "log1p", "sqrt", "sinh", "cosh", "tanh",
    "nan", "where", "sign", "fmin", "fmax", "is_float64", "at", "lower_out", "unfinished",
]

#: Options of every kernel: machine code cached on disk, numpy's float semantics (a
#: division by zero gives inf or nan, not an exception), no GIL held.
OPTS = dict(cache=True, error_model="numpy", nogil=True)
#: ... and of the small helpers the element loops call: inlined in numba's IR, since a
#: call keeps the loop around it from vectorising.
INLINE = dict(inline="always", **OPTS)

#: Elements per block of the passes (each block keeps a tally of what it leaves unsolved):
#: large enough that a block's loop runs at full vector speed, small enough that finding
#: the few unsolved elements reads little.
BLOCK = 4096

#: The math of the kernels.  Compiled with ``error_model="numpy"`` it has IEEE semantics
#: (nan and inf, never an exception), which the solver relies on; :data:`IEEE` is the same
#: math for the kernels' modules run as plain Python (:func:`fbands._jit.loader.python_kernels`).
exp = math.exp
expm1 = math.expm1
log = math.log
log1p = math.log1p
sqrt = math.sqrt
sinh = math.sinh
nan = math.nan
cosh = math.cosh
tanh = math.tanh


#: numpy's scalar functions in place of math's, and ``math`` itself, for plain Python.
IEEE = {"exp": np.exp, "expm1": np.expm1, "log": np.log, "log1p": np.log1p, "sqrt": np.sqrt,
        "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh,
        "math": types.SimpleNamespace(exp=np.exp, expm1=np.expm1, log=np.log, log1p=np.log1p,
                                      sqrt=np.sqrt, isfinite=np.isfinite, isinf=np.isinf,
                                      copysign=np.copysign, floor=np.floor, inf=math.inf,
                                      nan=math.nan)}


@numba.njit(**INLINE)
def where(c, a, b):
    """``numpy.where`` of one element (the generated leaves use it)."""
    return a if c else b


@numba.njit(**INLINE)
def sign(x):
    """``numpy.sign`` of one float (nan stays nan)."""
    return 1.0 if x > 0 else (-1.0 if x < 0 else (0.0 if x == 0 else x))


@numba.njit(**OPTS)
def fmin(a, b):
    """``numpy.minimum`` of two floats: nan wins."""
    return a if (a < b or a != a) else b


@numba.njit(**OPTS)
def fmax(a, b):
    """``numpy.maximum`` of two floats: nan wins."""
    return a if (a > b or a != a) else b


def is_float64(a):
    """Whether array ``a`` holds float64: in compiled kernels a constant of each compiled
    type, so that a branch on it is decided at compile time."""
    return a.dtype == np.float64


@numba.extending.overload(is_float64)
def _is_float64(a):
    value = a.dtype == numba.types.float64
    return lambda a: value


@numba.njit(**INLINE)
def at(a, i):
    """a[i] for an index known to be >= 0.  numba wraps a negative signed index around
    (i + size) before every access; that select turns the vector loads and stores of an
    element loop into gathers and scatters (three times slower, and slower still when
    the arrays lie next to each other).  An unsigned index has no such case; the element
    loops iterate over unsigned ranges for the same reason."""
    return a[np.uint64(i)]


@numba.njit(**INLINE)
def lower_out(lo, one, more, at_one):
    """The lower edge a pass stores: nan for an element left to the exact solver, the
    limit at p = 1, or ``lo``.  One select per statement: as one nested expression the
    loop stores three times under masks instead of once."""
    lo = at_one if one else lo
    return math.nan if more else lo


@numba.njit(parallel=True, **OPTS)
def unfinished(out_lo, block_bad):
    """Indices of the elements a pass left (nan lower edge), in order: only the blocks
    whose tally is not zero are read, in parallel, each until its tally is found."""
    blocks = np.nonzero(block_bad)[0]
    ends = np.cumsum(block_bad[blocks])
    idx = np.empty(ends[-1] if blocks.size else 0, np.int64)
    for j in numba.prange(blocks.size):
        blk = blocks[j]
        k, stop = ends[j] - block_bad[blk], ends[j]
        i, end = blk * BLOCK, min((blk + 1) * BLOCK, out_lo.size)
        while (k < stop) & (i < end):
            if at(out_lo, i) != at(out_lo, i):
                idx[k] = i
                k += 1
            i += 1
    return idx


disk_cache.tolerate(globals())  # (a damaged cache file costs a compile, not a call)
