"""The numba kernels that read the band tables: one module for every divergence.

A table (:func:`fbands.tables.build.build_tables`) holds numbers only, so the pass that
reads it does not depend on the divergence: it is compiled once (its machine code cached in
fbands' private folder, :mod:`fbands._jit.disk_cache`) and shared by every divergence,
user-registered ones included. Elements, cells and rows are found by :func:`prepare_z`,
:func:`cell_index` and :func:`locate`, the scalar twins of the array forms of :mod:`.layout`
(the one definition of the layout).

The pass over the data has no data-dependent branch and no libm call, so it vectorises:
every choice is a select, and the exponentials and logarithms it needs are the
polynomials of :mod:`fbands._jit.vmath`.  An element the pass
cannot finish gets a nan lower edge and counts in its block's tally (:data:`BLOCK`
elements a block): rows whose lower edge is an exponential (:func:`finish_exp_rows`
completes those, unless the pass was asked to), and, for the caller to solve exactly,
rows marked exact, invalid input, ``log p = -inf`` and ``log p`` below ``LP_CLOSED`` (the
shared solver's tail forms).  ``p == 1``, common in float32 log-softmax output, takes its limit
``(at_one, 1)`` without a row.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from fbands._jit import disk_cache
from fbands._jit.prims import BLOCK, INLINE, OPTS, at, lower_out, unfinished
from fbands._jit.vmath import LN2, p_and_z, vexp, vlog
from fbands.tables import layout as L
from fbands.tables.layout import DEG, ROW, ROW_EXACT, ROW_EXP_LO, ROW_TOP

__all__ = ["BLOCK", "table_pass", "finish_exp_rows", "unfinished", "touched_cells", "locate",
           "prepare_z"]

# ----------------------------------------------------------------------------- table pass

# The scalar twins of the layout's array forms (.layout), inlined into every pass.


@njit(**INLINE)
def prepare_z(x, logp, closed):
    """``(p, z, high, valid)`` of one element ``x`` (``log p`` when ``logp``): ``p``,
    ``z = min(p, 1 - p)`` (exact on both sides; from one polynomial for log input,
    :func:`fbands._jit.vmath.p_and_z`), whether ``z`` is ``1 - p``, and whether ``x`` lies
    in ``[closed, 1]`` (``[closed, 0]``), the domain of the tables (nan fails).  Outside it
    the element reads :data:`.layout.OUTSIDE_P` instead: the scalar twin of
    :func:`.layout.prepare_z_array`.

    The two flags are floats, 1.0 or 0.0: inlined into a pass, a tuple holding bools
    (which numba stores as bytes) keeps the loop from vectorising, and costs it half its
    speed; :func:`cell_index` takes the float flag as it is."""
    v = np.float64(x)
    if logp:
        valid = (v >= closed) & (v <= 0.0)
        lp = v if valid else L.OUTSIDE_LOGP
        p, z = p_and_z(lp)
        high = lp > -LN2
    else:
        valid = (v >= closed) & (v <= 1.0)
        p = v if valid else L.OUTSIDE_P
        high = p > 0.5
        z = 1.0 - p if high else p
    return p, z, np.float64(high), np.float64(valid)




@njit(**INLINE)
def cell_index(bits, high, kbits):
    """Index in ``cells_info`` of the cell of one float64 ``z = min(p, 1 - p) > 0`` given as
    its int64 ``bits`` (``high``, a bool or 1.0 / 0.0: z is ``1 - p``): the scalar twin of
    :func:`.layout.cell_array`, inlined into :func:`locate` and the cell scan."""
    cells = np.int64(1) << kbits
    b = L.HALF_EXP - (bits >> L.MANT_BITS)
    j = (bits >> (L.MANT_BITS - kbits)) & (cells - 1)
    # Arithmetic, not conditional expressions: numba's inliner warns about the latter here.
    side = np.int64(high)
    nb = L.NB_LO + (L.NB_HI - L.NB_LO) * side
    inside = np.int64(b < nb)
    return min(b, nb) * cells + inside * j + side * ((np.int64(L.NB_LO) << kbits) + 1)


@njit(**INLINE)
def locate(z, high, cells_info, kbits):
    """Row index and coordinate ``u in [-1, 1)`` of one float64 ``z = min(p, 1 - p) > 0``
    (``high``: z is ``1 - p``): the scalar twin of :func:`.layout.locate_array`."""
    bits = np.float64(z).view(np.int64)
    cell = cell_index(bits, high, kbits)
    info = cells_info[np.uint64(cell)]  # unsigned: no wrap-around select (see fbands._jit.prims.at)
    sh = info & L.INFO_MASK
    rest = L.MANT_BITS - kbits - sh
    row = (info >> L.INFO_SHIFT) + ((bits >> rest) & ((np.int64(1) << sh) - 1))
    # 1 + (the bits below rest) / 2^rest, built as a float in [1, 2) from those bits
    one_frac = (((bits << (L.MANT_BITS - rest)) & ((np.int64(1) << L.MANT_BITS) - 1))
                | (np.int64(L.EXP_BIAS) << L.MANT_BITS))
    u = 2.0 * np.int64(one_frac).view(np.float64) - 3.0
    return row, u


@njit(**INLINE)
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


# The loops below compute an element's cell and polynomials before its saturated upper
# edge: in the other order the same loop runs about 1.6 times slower (measured; the
# compiler then keeps fewer vectors in registers; a helper returning several values in
# the loop costs as much).  Rows whose lower edge is exp of its polynomial (ROW_EXP_LO)
# are left like exact rows by the pass (``exp_rows=False``: an exp per element in the
# loop would cost every element a third more, for the few that read such a row), and
# finish_exp_rows runs the same loop on those elements alone with ``exp_rows=True``; where
# many elements read such rows, the caller runs the pass itself with ``exp_rows=True``.


@njit(**INLINE)
def block(x, start, stop, logp, want_log, exp_rows, coef, row_code, cells_info, kbits,
          closed, at_one, out_lo, out_hi):
    """One block of p (or log p, ``logp``): how many elements it leaves (see table_pass).
    ``logp`` and ``exp_rows`` are constants at every call site, so each call compiles to
    its own loop without those branches (``want_log`` is loop-invariant)."""
    bad = 0
    for i in range(np.uint64(start), np.uint64(stop)):  # unsigned: see prims.at
        v = np.float64(x[i])
        p, z, high, valid = prepare_z(v, logp, closed)  # (flags as floats: see prepare_z)
        row, u = locate(z, high, cells_info, kbits)
        lo, hi = horner(coef, row, u)
        code = at(row_code, row)
        if exp_rows:
            lo = vexp(lo) if (code & ROW_EXP_LO) != 0 else lo
        if logp:
            top = 0.0 - v if want_log else 1.0 / p
            one = v == 0.0
        else:  # (0.0 - : log 1 gives +0.0)
            top = 0.0 - vlog(p) if want_log else 1.0 / p
            one = v == 1.0
        more = (((code & (ROW_EXACT if exp_rows else LEFT)) != 0) & (not one)) | (valid == 0.0)
        out_lo[i] = lower_out(lo, one, more, at_one)
        out_hi[i] = top if ((code & ROW_TOP) != 0) | one else hi
        bad += more
    return bad


@njit(parallel=True, **OPTS)
def table_pass(x, logp, want_log, exp_rows, coef, row_code, cells_info, kbits, closed, at_one,
               out_lo, out_hi, block_bad):
    """Band edges of a flat array for one scalar delta, from a (divergence, delta) table.

    ``x``: p (or log p when ``logp``); ``want_log``: write log-edges, else ratios;
    ``exp_rows``: finish the rows whose lower edge is an exponential in this pass (an exp
    per element), else leave them (:func:`finish_exp_rows` takes them after);
    ``coef``, ``row_code``, ``cells_info``, ``kbits``: the table (:mod:`.layout`).
    ``closed``: p (> 0; or log p) below which the shared solver's tail forms take over:
    those elements, like invalid ones, are left to the exact solver.  ``at_one``: the
    lower edge (or its log) at p = 1, the limit of the shared solver.  ``block_bad[b]``:
    how many elements of block ``b`` are left (see :func:`unfinished`): rows marked exact
    (or exp, without ``exp_rows``), invalid input, tails.
    """
    n = x.size
    for blk in prange(block_bad.size):
        start = blk * BLOCK
        stop = min(start + BLOCK, n)
        if logp and exp_rows:
            bad = block(x, start, stop, True, want_log, True, coef, row_code, cells_info,
                        kbits, closed, at_one, out_lo, out_hi)
        elif logp:
            bad = block(x, start, stop, True, want_log, False, coef, row_code, cells_info,
                        kbits, closed, at_one, out_lo, out_hi)
        elif exp_rows:
            bad = block(x, start, stop, False, want_log, True, coef, row_code, cells_info,
                        kbits, closed, at_one, out_lo, out_hi)
        else:
            bad = block(x, start, stop, False, want_log, False, coef, row_code, cells_info,
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
            block(xs, start, stop, True, False, True, coef, row_code, cells_info, kbits,
                  closed, at_one, lo, hi)
        else:
            block(xs, start, stop, False, False, True, coef, row_code, cells_info, kbits,
                  closed, at_one, lo, hi)
    left = np.empty(m, np.bool_)
    for k in prange(m):
        out_lo[idx[k]] = lo[k]
        out_hi[idx[k]] = hi[k]
        left[k] = lo[k] != lo[k]  # (nan: left by the loop)
    return left


@njit(parallel=True, **OPTS)
def touched_cells(x, logp, kbits, closed, touched):
    """Set ``touched[cell] = 1`` for the cell of every element of ``x`` (p, or log p when
    ``logp``) in a table of ``kbits`` (invalid and tail elements mark the cell the pass
    reads for them), found as the pass finds them (:func:`prepare_z`).  Each block finds
    its cells in one loop (which vectorises) and marks them in a second."""
    n = x.size
    for blk in prange(-(-n // BLOCK)):
        start, stop = blk * BLOCK, min((blk + 1) * BLOCK, n)
        cell = np.empty(stop - start, dtype=np.int64)
        for i in range(np.uint64(start), np.uint64(stop)):
            _, z, high, _ = prepare_z(x[i], logp, closed)
            cell[i - np.uint64(start)] = cell_index(np.float64(z).view(np.int64), high, kbits)
        for k in range(cell.size):
            if touched[cell[k]] == 0:  # (a read keeps the line shared between the cores)
                touched[cell[k]] = 1


disk_cache.tolerate(globals())  # (a damaged cache file costs a compile, not a call)
