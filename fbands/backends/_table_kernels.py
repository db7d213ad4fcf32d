"""The numba kernels that read the band tables: one module for every divergence.

A table (:func:`fbands.backends.numba_backend.build_tables`) holds numbers only, so the
pass that reads it does not depend on the divergence: it is compiled once (numba's
``cache=True`` keeps the machine code next to this file, or in numba's user cache where
that is read-only) and shared by every divergence, user-registered ones included.  Cells
and rows are found through :mod:`._table_layout`, the one definition of the layout.

The pass over the data has no data-dependent branch and no libm call, so it vectorises:
every choice is a select, and the exponentials and logarithms it needs are the
polynomials :func:`vexp`, :func:`p_and_z` and :func:`vlog` below.  An element the pass
cannot finish gets a nan lower edge and counts in its block's tally (:data:`BLOCK`
elements a block): rows whose lower edge is an exponential (:func:`finish_exp_rows`
completes those), and, for the caller to solve exactly, rows marked exact, invalid
input, ``log p = -inf`` and ``log p`` below ``LP_CLOSED`` (the shared solver's tail
forms).  ``p == 1``, common in
float32 log-softmax output, takes its limit ``(at_one, 1)`` without a row.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from fbands.backends import _table_layout as layout
from fbands.backends._table_layout import (
    DEG,
    EXP_BIAS,
    MANT_BITS,
    ROW,
    ROW_EXACT,
    ROW_EXP_LO,
    ROW_TOP,
    cell_index,
)

__all__ = ["BLOCK", "table_pass", "finish_exp_rows", "unfinished", "at", "lower_out",
           "touched_cells"]

OPTS = dict(cache=True, error_model="numpy", nogil=True)

#: Elements per block of the passes (each block keeps a tally of what it leaves unsolved):
#: large enough that a block's loop runs at full vector speed, small enough that finding
#: the few unsolved elements reads little.
BLOCK = 4096

INF = math.inf
NAN = math.nan

# ----------------------------------------------------------------------------- float64 format
# Constants of the float64 bit tricks in vexp and vlog (the float format, not the table
# layout; the field widths themselves are layout.MANT_BITS and layout.EXP_BIAS).

#: ln 2 split in two so that ``k * LN2_HI`` is exact for the ``|k| <= 1100`` of vexp.
LN2_HI = 6.93147180369123816490e-01
LN2_LO = 1.90821492927058770002e-10
LN2 = math.log(2.0)
INV_LN2 = 1.0 / LN2
SQRT2 = math.sqrt(2.0)
#: Smallest normal float64: vlog scales subnormal input up before reading its exponent.
TINY = float(np.finfo(np.float64).tiny)
#: 2^54: the scale of subnormal input in vlog (any power of 2 that makes them normal).
SUBNORMAL_SCALE_BITS = 54
#: Mask of a float64's exponent field (after the shift by MANT_BITS).
EXP_FIELD = (1 << 11) - 1
#: Mask of a float64's mantissa field.
MANT_FIELD = (1 << MANT_BITS) - 1
#: Above this exp overflows float64, below EXP_ZERO it rounds to 0.
EXP_OVER = 709.782712893384
EXP_ZERO = -745.2
#: Bound on |k| of exp's 2^k, past both ends of the float64 range (kept finite for the
#: integer conversion; the results there are set to inf or 0 above).
EXP_K_MAX = 1100.0

#: (exp(r) - 1) / r = sum r^j / (j + 1)! to r^12, highest power first (|r| <= ln2 / 2:
#: error below 1e-17).
EXPM1_SERIES = tuple(1.0 / math.factorial(k + 1) for k in range(12, -1, -1))
#: Taylor coefficients, highest power first: exp on [-ln2/2, ln2/2] to degree 13 (error
#: below 1e-17), and 2 atanh(s) / (2 s) for |s| <= 0.172 to s^22.
EXP_TAYLOR = tuple(1.0 / math.factorial(k) for k in range(13, -1, -1))
ATANH_SERIES = tuple(1.0 / (2 * k + 1) for k in range(11, -1, -1))


@njit(inline="always", **OPTS)
def at(a, i):
    """a[i] for an index known to be >= 0.  numba wraps a negative signed index around
    (i + size) before every access; that select turns the vector loads and stores of an
    element loop into gathers and scatters (three times slower, and slower still when
    the arrays lie next to each other).  An unsigned index has no such case; the element
    loops iterate over unsigned ranges for the same reason."""
    return a[np.uint64(i)]


# Horner chains written out: a loop over the tuple stays a loop when it is long (20
# terms), and the element loops around it then do not vectorise.


@njit(inline="always", **OPTS)
def exp_taylor(x):
    """Horner's rule for EXP_TAYLOR at x."""
    c = EXP_TAYLOR
    a = c[0]
    a = a * x + c[1]
    a = a * x + c[2]
    a = a * x + c[3]
    a = a * x + c[4]
    a = a * x + c[5]
    a = a * x + c[6]
    a = a * x + c[7]
    a = a * x + c[8]
    a = a * x + c[9]
    a = a * x + c[10]
    a = a * x + c[11]
    a = a * x + c[12]
    a = a * x + c[13]
    return a


@njit(inline="always", **OPTS)
def expm1_series(x):
    """EXPM1_SERIES at x by Estrin's scheme: four levels of multiply-adds instead of a
    chain of twelve (the loops around it are bound by such chains' latency)."""
    c = EXPM1_SERIES  # highest power first: c[12 - j] multiplies x^j
    x2 = x * x
    x4 = x2 * x2
    x8 = x4 * x4
    b0 = c[12] + c[11] * x
    b1 = c[10] + c[9] * x
    b2 = c[8] + c[7] * x
    b3 = c[6] + c[5] * x
    b4 = c[4] + c[3] * x
    b5 = c[2] + c[1] * x
    d0 = b0 + b1 * x2
    d1 = b2 + b3 * x2
    d2 = b4 + b5 * x2
    return (d0 + d1 * x4) + (d2 + c[0] * x4) * x8


@njit(inline="always", **OPTS)
def atanh_series(x):
    """Horner's rule for ATANH_SERIES at x."""
    c = ATANH_SERIES
    a = c[0]
    a = a * x + c[1]
    a = a * x + c[2]
    a = a * x + c[3]
    a = a * x + c[4]
    a = a * x + c[5]
    a = a * x + c[6]
    a = a * x + c[7]
    a = a * x + c[8]
    a = a * x + c[9]
    a = a * x + c[10]
    a = a * x + c[11]
    return a


@njit(inline="always", **OPTS)
def pow2(k):
    """2^k for an integer-valued float64 k in the normal exponent range, from its bits."""
    return np.int64((np.int64(k) + EXP_BIAS) << MANT_BITS).view(np.float64)


@njit(inline="always", **OPTS)
def vexp(x):
    """exp(x) without a libm call, so that loops over it vectorise (error < 1 ulp + 1e-16).

    exp(x) = 2^k exp(r), r = x - k ln 2 in [-ln2/2, ln2/2]: Taylor to degree 13; 2^k is
    built from its bits in two halves so that subnormal results come out right.
    """
    k = math.floor(x * INV_LN2 + 0.5)
    k = min(max(k, -EXP_K_MAX), EXP_K_MAX)
    r = (x - k * LN2_HI) - k * LN2_LO
    e = exp_taylor(r)
    k1 = math.floor(k * 0.5)
    out = e * pow2(k1) * pow2(k - k1)
    out = INF if x > EXP_OVER else out
    return 0.0 if x < EXP_ZERO else out


@njit(inline="always", **OPTS)
def vlog(x):
    """log(x) for x > 0 (subnormals included) without a libm call (error about 1 ulp).

    x = 2^e m with m in [sqrt(1/2), sqrt(2)); log m = 2 atanh(s), s = (m - 1) / (m + 1),
    |s| <= 0.172, by its series to s^23.
    """
    tiny = x < TINY
    y = x * pow2(SUBNORMAL_SCALE_BITS) if tiny else x
    bits = np.float64(y).view(np.int64)
    e = ((bits >> MANT_BITS) & EXP_FIELD) - EXP_BIAS
    m = np.int64((bits & MANT_FIELD) | (np.int64(EXP_BIAS) << MANT_BITS)).view(np.float64)
    big = m > SQRT2
    m = m * 0.5 if big else m
    e = e + 1 if big else e
    e = e - SUBNORMAL_SCALE_BITS if tiny else e
    f = m - 1.0
    s = f / (2.0 + f)
    w = atanh_series(s * s)
    fe = np.float64(e)
    return fe * LN2_HI + (2.0 * s * w + fe * LN2_LO)


@njit(inline="always", **OPTS)
def p_and_z(lp):
    """``(p, z)`` of a log-probability ``lp`` in ``[LP_CLOSED, 0]``: ``p = exp(lp)`` and
    ``z = min(p, 1 - p)``, 1 - p without cancellation, from one polynomial.

    lp = k ln 2 + r with |r| <= ln2 / 2 and ``em = expm1(r)`` (r times a Taylor series),
    so p = 2^k (1 + em); above p = 1/2, k is 0 (1 - p = -em) or -1 (1 - p = (1 - em) / 2).
    """
    k = math.floor(lp * INV_LN2 + 0.5)
    r = (lp - k * LN2_HI) - k * LN2_LO
    em = r * expm1_series(r)
    p = (1.0 + em) * pow2(k)
    q = -em if k == 0 else 0.5 - 0.5 * em
    return p, (q if lp > -LN2 else p)


# ----------------------------------------------------------------------------- table pass

locate = njit(inline="always", **OPTS)(layout.locate)


@njit(inline="always", **OPTS)
def horner(coef, row, u):
    """Both edges' polynomials of one row at ``u`` (coefficients interleaved, highest
    power first).  (Horner's chain: Estrin's scheme measured slower here, unlike in
    expm1_series: the two interleaved chains already overlap.)"""
    k = row * ROW
    a = at(coef, k)
    h = at(coef, k + 1)
    for j in range(1, DEG + 1):
        a = a * u + at(coef, k + 2 * j)
        h = h * u + at(coef, k + 2 * j + 1)
    return a, h


#: Row bits that leave an element out of the pass.
LEFT = ROW_EXACT | ROW_EXP_LO


@njit(inline="always", **OPTS)
def lower_out(lo, one, more, at_one):
    """The lower edge a pass stores: nan for an element left to the exact solver, the
    limit at p = 1, or ``lo``.  One select per statement: as one nested expression the
    loop stores three times under masks instead of once."""
    lo = at_one if one else lo
    return NAN if more else lo


# The loops below compute an element's cell and polynomials before its saturated upper
# edge: in the other order the same loop runs about 1.6 times slower (measured; the
# compiler then keeps fewer vectors in registers; a helper returning several values in
# the loop costs as much).  Rows whose lower edge is exp of its polynomial (ROW_EXP_LO)
# are left like exact rows by the pass (``exp_rows=False``: an exp per element in the
# loop would cost every element a third more, for the few that read such a row), and
# finish_exp_rows runs the same loop on those elements alone with ``exp_rows=True``.


@njit(inline="always", **OPTS)
def block_p(x, start, stop, want_log, exp_rows, coef, row_code, cells_info, kbits,
            p_closed, at_one, out_lo, out_hi):
    """One block of p input: how many elements it leaves (see table_pass)."""
    bad = 0
    for i in range(np.uint64(start), np.uint64(stop)):  # unsigned: see at()
        v = np.float64(x[i])
        valid = (v >= p_closed) & (v <= 1.0)  # (nan fails; p_closed > 0)
        v = v if valid else 0.5  # any p that reads a cell: the element is solved apart
        high = v > 0.5
        z = 1.0 - v if high else v  # exact (Sterbenz) on both sides
        row, u = locate(z, high, cells_info, kbits)
        lo, hi = horner(coef, row, u)
        code = at(row_code, row)
        if exp_rows:  # (a constant of each loop)
            lo = vexp(lo) if (code & ROW_EXP_LO) != 0 else lo
        top = 0.0 - vlog(v) if want_log else 1.0 / v  # (0.0 - : log 1 gives +0.0)
        one = v == 1.0
        more = (((code & (ROW_EXACT if exp_rows else LEFT)) != 0) & (not one)) | (not valid)
        out_lo[i] = lower_out(lo, one, more, at_one)
        out_hi[i] = top if ((code & ROW_TOP) != 0) | one else hi
        bad += more
    return bad


@njit(inline="always", **OPTS)
def block_logp(x, start, stop, want_log, exp_rows, coef, row_code, cells_info, kbits,
               lp_closed, at_one, out_lo, out_hi):
    """One block of log p input (as block_p)."""
    bad = 0
    for i in range(np.uint64(start), np.uint64(stop)):  # unsigned: see at()
        v = np.float64(x[i])
        valid = (v >= lp_closed) & (v <= 0.0)  # as in block_p
        lp = v if valid else -1.0
        high = lp > -LN2
        p, z = p_and_z(lp)
        row, u = locate(z, high, cells_info, kbits)
        lo, hi = horner(coef, row, u)
        code = at(row_code, row)
        if exp_rows:
            lo = vexp(lo) if (code & ROW_EXP_LO) != 0 else lo
        top = 0.0 - lp if want_log else 1.0 / p
        one = lp == 0.0
        more = (((code & (ROW_EXACT if exp_rows else LEFT)) != 0) & (not one)) | (not valid)
        out_lo[i] = lower_out(lo, one, more, at_one)
        out_hi[i] = top if ((code & ROW_TOP) != 0) | one else hi
        bad += more
    return bad


@njit(parallel=True, **OPTS)
def table_pass(x, logp, want_log, coef, row_code, cells_info, kbits, closed, at_one, out_lo,
               out_hi, block_bad):
    """Band edges of a flat array for one scalar delta, from a (divergence, delta) table.

    ``x``: p (or log p when ``logp``); ``want_log``: write log-edges, else ratios;
    ``coef``, ``row_code``, ``cells_info``, ``kbits``: the table (:mod:`._table_layout`).
    ``closed``: p (> 0; or log p) below which the shared solver's tail forms take over:
    those elements, like invalid ones, are left to the exact solver.  ``at_one``: the
    lower edge (or its log) at p = 1, the limit of the shared solver.  ``block_bad[b]``:
    how many elements of block ``b`` are left (see :func:`unfinished`): rows marked exact
    or exp (:func:`finish_exp_rows` takes those first), invalid input, tails.
    """
    n = x.size
    for blk in prange(block_bad.size):
        start = blk * BLOCK
        stop = min(start + BLOCK, n)
        if logp:
            bad = block_logp(x, start, stop, want_log, False, coef, row_code, cells_info,
                             kbits, closed, at_one, out_lo, out_hi)
        else:
            bad = block_p(x, start, stop, want_log, False, coef, row_code, cells_info,
                          kbits, closed, at_one, out_lo, out_hi)
        block_bad[blk] = bad


@njit(parallel=True, **OPTS)
def finish_exp_rows(x, idx, logp, coef, row_code, cells_info, kbits, closed, at_one, out_lo,
                    out_hi):
    """Finish the elements ``idx`` that a ratio pass left: those of ROW_EXP_LO rows get
    ``exp`` of their polynomial (the same loop, with ``exp_rows=True``, over those
    elements gathered into a dense array so that it vectorises too).  Returns the mask
    of ``idx`` still left to the exact solver."""
    m = idx.size
    xs = np.empty(m, x.dtype)
    for k in prange(m):
        xs[k] = x[idx[k]]
    lo = np.empty(m, out_lo.dtype)
    hi = np.empty(m, out_hi.dtype)
    for blk in prange(-(-m // BLOCK)):
        start = blk * BLOCK
        stop = min(start + BLOCK, m)
        if logp:
            block_logp(xs, start, stop, False, True, coef, row_code, cells_info, kbits,
                       closed, at_one, lo, hi)
        else:
            block_p(xs, start, stop, False, True, coef, row_code, cells_info, kbits,
                    closed, at_one, lo, hi)
    left = np.empty(m, np.bool_)
    for k in prange(m):
        out_lo[idx[k]] = lo[k]
        out_hi[idx[k]] = hi[k]
        left[k] = lo[k] != lo[k]  # (nan: left by the loop)
    return left


@njit(parallel=True, **OPTS)
def unfinished(out_lo, block_bad):
    """Indices of the elements a pass left (nan lower edge), in order: only the blocks
    whose tally is not zero are read, in parallel, each until its tally is found."""
    blocks = np.nonzero(block_bad)[0]
    ends = np.cumsum(block_bad[blocks])
    idx = np.empty(ends[-1] if blocks.size else 0, np.int64)
    for j in prange(blocks.size):
        blk = blocks[j]
        k, stop = ends[j] - block_bad[blk], ends[j]
        i, end = blk * BLOCK, min((blk + 1) * BLOCK, out_lo.size)
        while (k < stop) & (i < end):
            if at(out_lo, i) != at(out_lo, i):
                idx[k] = i
                k += 1
            i += 1
    return idx




@njit(parallel=True, **OPTS)
def touched_cells(x, logp, kbits, closed, touched):
    """Set ``touched[cell] = 1`` for the cell of every element of ``x`` (p, or log p when
    ``logp``) in a table of ``kbits`` (invalid and tail elements mark the cell the pass
    reads for them).  The element's ``z`` and side are those of block_p and block_logp
    (written there inline: see the note above block_p).  Each block finds its cells in one
    loop (which vectorises) and marks them in a second."""
    n = x.size
    for blk in prange(-(-n // BLOCK)):
        start, stop = blk * BLOCK, min((blk + 1) * BLOCK, n)
        cell = np.empty(stop - start, dtype=np.int64)
        for i in range(np.uint64(start), np.uint64(stop)):
            v = np.float64(x[i])
            if logp:
                lp = v if (v >= closed) & (v <= 0.0) else -1.0
                high = lp > -LN2
                z = p_and_z(lp)[1]
            else:
                v = v if (v >= closed) & (v <= 1.0) else 0.5
                high = v > 0.5
                z = 1.0 - v if high else v
            cell[i - np.uint64(start)] = cell_index(np.float64(z).view(np.int64), high, kbits)
        for k in range(cell.size):
            if touched[cell[k]] == 0:  # (a read keeps the line shared between the cores)
                touched[cell[k]] = 1
