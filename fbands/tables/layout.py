"""The layout of the band tables: the one definition of how a table is encoded and read.

A table (built by :func:`fbands.tables.build.build_tables`) holds, for one
divergence at one radius, polynomials of both band edges on short cells of
``z = min(p, 1 - p)``.  Everything that knows where a cell, a row or a coordinate lies in
the bits of ``z`` is here: the build, the numba kernels (:mod:`fbands._jit.table_kernels`), torch
(:mod:`.torch_reader`) and the tests all go through it.

Cells.  ``z`` lies in binade ``b`` when ``2^-(b+1) <= z < 2^-b``; each binade is cut into
``2^kbits`` cells by the top ``kbits`` bits of the mantissa.  The cells of ``p <= 1/2``
come first (``NB_LO`` binades, then one catch-all cell for smaller ``p``), then those of
``1 - p < 1/2`` (``NB_HI`` binades and a catch-all cell).  ``cells_info[cell]`` packs the
cell's first row and how many more mantissa bits (one of :data:`SUBBITS`)
choose one of its rows; the mantissa bits below those give the coordinate
``u in [-1, 1)`` of ``z`` on its row, exactly.

Rows.  A row holds ``ROW`` float64 coefficients, powers ``DEG`` down to 0 of ``u``, lower
and upper edge interleaved (one contiguous read; the torch reader keeps them as columns, one
gather each), and a code of flag bits
(:data:`ROW_TOP`, :data:`ROW_EXACT`, :data:`ROW_EXP_LO`).

Reading comes in two forms with the same steps: :func:`prepare_z_array`,
:func:`cell_array` and :func:`locate_array` here, for numpy arrays or torch tensors (the
build's cell scan, the torch reader), and their scalar twins in the numba kernels
(:func:`fbands._jit.table_kernels.prepare_z`, ``cell_index``, ``locate``), which the tests hold
to the same cells, rows and coordinates.  This module imports no numba: the torch reader
and the build run without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fbands._band_function import LN2, LP_CLOSED, P_CLOSED

# ----------------------------------------------------------------------------- float64 bits

#: Stored mantissa bits of a float64 (the fraction field).
MANT_BITS = 52
#: Exponent bias of a float64: the exponent field of 1.0.
EXP_BIAS = 1023
#: Exponent field of z in [1/2, 1) (binade 0): the binade of z is ``HALF_EXP - field``.
HALF_EXP = EXP_BIAS - 1

# ----------------------------------------------------------------------------- the layout

#: Cells per binade are ``2^kbits``, by output precision: a cell then spans at most
#: ``2^-kbits`` of its own size, short enough for degree-``DEG`` rows to reach the
#: tolerance of :data:`fbands.tables.build.LAYOUTS`; float32 needs 1e-10, not
#: 1e-13, so it gets by with 16 times fewer (and smaller tables).
KBITS = {"float64": 6, "float32": 4}
#: Degree of the row polynomials: with Chebyshev nodes on cells that short, 5 reaches
#: 1e-13 on smooth cells; higher costs two more multiply-adds an edge per element.
DEG = 5
#: Coefficients per row: ``DEG + 1`` for each of the two edges.
ROW = 2 * (DEG + 1)
#: Row code bit: the upper edge is saturated (r = 1 / p, or log r = -log p).
ROW_TOP = 1
#: Row code bit: the polynomials miss the tolerance somewhere on the row; solve exactly.
ROW_EXACT = 2
#: Row code bit (ratio tables only): the lower polynomial is of log r, and the edge is its
#: exponential; set where r spans too many orders of magnitude over the row for a
#: polynomial in r itself (KL's r_lo ~ exp(-delta / p) at small p).
ROW_EXP_LO = 4
#: Extra mantissa bits a cell may take to choose one of ``2^bits`` rows, tried in this
#: order by the build: none (one row; most cells), 1 (two half rows, cheap to build), 6
#: (64 times shorter rows: they resolve all but the few at the saturation thresholds
#: themselves).
SUBBITS = (0, 1, 6)
#: Bits of ``cells_info`` that hold a cell's extra mantissa bits (all SUBBITS < 16); the
#: first row sits above them.
INFO_SHIFT = 4
#: Mask of the extra-bits field of ``cells_info``.
INFO_MASK = (1 << INFO_SHIFT) - 1
#: Binades of p below 1/2 with cells (p >= 2^-200, log p >= -138.6): the edges are smooth
#: in log p far below where every divergence's edges saturate or underflow; smaller p go
#: to the catch-all cell (solved exactly; the solver's tail forms take them from log p
#: below ``LP_CLOSED`` anyway).
NB_LO = 200
#: Binades of 1 - p with cells (1 - p >= 2^-90): a float64 p below 1 has 1 - p >= 2^-53,
#: so only log-probability input gets closer, and goes to the catch-all cell.
NB_HI = 90


def cell_count(kbits: int) -> int:
    """Length of ``cells_info``: both sides' cells and their two catch-all cells."""
    return ((NB_LO + NB_HI) << kbits) + 2


def high_offset(kbits: int) -> int:
    """Index of the first cell of ``1 - p`` (after the low side and its catch-all)."""
    return (NB_LO << kbits) + 1


# ----------------------------------------------------------------------------- encode


def pack_info(first_row, extra_bits):
    """``cells_info`` entries: a cell's first row and its extra mantissa bits."""
    return (first_row << INFO_SHIFT) | extra_bits


def unpack_info(info):
    """``(first_row, extra_bits)`` of ``cells_info`` entries (inverse of :func:`pack_info`)."""
    return info >> INFO_SHIFT, info & INFO_MASK


def row_code(top, exact, exp_lo=False):
    """Row codes from boolean arrays: upper edge saturated, solve exactly, lower edge as
    the exponential of its polynomial."""
    top, exact, exp_lo = (np.asarray(a, dtype=bool) for a in (top, exact, exp_lo))
    code = np.where(top, ROW_TOP, 0) | np.where(exact, ROW_EXACT, 0)
    return (code | np.where(exp_lo, ROW_EXP_LO, 0)).astype(np.int32)


def cell_z(kbits: int, binade, index, frac):
    """z at fractions ``frac`` (in [0, 1]) of the cells ``index`` of binades ``binade``
    (arrays that broadcast): the inverse of :func:`locate` on a cell without extra bits."""
    return np.ldexp(1.0 + (index + frac) / (1 << kbits), -(binade + 1))


def cell_of_row(kbits: int, table_cell):
    """``(binade, index)`` of table cells that are not catch-all cells (their position
    counted without the low side's catch-all: 0 to ``(NB_LO + NB_HI) 2^kbits - 1``)."""
    n_low = NB_LO << kbits
    c = np.where(table_cell < n_low, table_cell, table_cell - n_low)
    return c >> kbits, c & ((1 << kbits) - 1)


# ----------------------------------------------------------------------------- decode

#: What an element outside the tables' domain (invalid, or in the solver's tails) reads
#: instead, so that it finds a cell like any other; its result is never stored.
OUTSIDE_P, OUTSIDE_LOGP = 0.5, -1.0


def prepare_z_array(x, logp: bool, closed: float, where, exp, expm1):
    """:func:`prepare_z` on an array ``x`` of float64; ``where``, ``exp``, ``expm1`` from
    numpy or torch."""
    if logp:
        valid = (x >= closed) & (x <= 0)
        lp = where(valid, x, OUTSIDE_LOGP)
        high = lp > -LN2
        p = exp(lp)
        return p, where(high, -expm1(lp), p), high, valid
    valid = (x >= closed) & (x <= 1)
    p = where(valid, x, OUTSIDE_P)
    high = p > 0.5
    return p, where(high, 1.0 - p, p), high, valid



def cell_array(bits, high, kbits: int, where):
    """:func:`cell_index` on arrays (``bits``: the int64 view of float64 ``z``; ``high``: a
    boolean array; ``where``: ``numpy.where`` or ``torch.where``)."""
    cells = 1 << kbits
    b = HALF_EXP - (bits >> MANT_BITS)
    j = (bits >> (MANT_BITS - kbits)) & (cells - 1)
    nb = where(high, NB_HI, NB_LO)
    return where(b < nb, b * cells + j, nb * cells) + where(high, high_offset(kbits), 0)


def locate_array(bits, high, cells_info, kbits: int, where, float64):
    """:func:`locate` on arrays: ``bits``, the int64 view of float64 ``z``; ``high`` a
    boolean array; ``where`` and ``float64``: ``numpy.where`` and ``numpy.float64``, or
    ``torch.where`` and ``torch.float64``.  Returns ``(row, u)``."""
    info = cells_info[cell_array(bits, high, kbits, where)]
    sh = info & INFO_MASK
    rest = MANT_BITS - kbits - sh
    unit = sh * 0 + 1  # an integer array of ones (shifts of arrays by arrays)
    row = (info >> INFO_SHIFT) + ((bits >> rest) & ((unit << sh) - 1))
    one_frac = (((bits << (MANT_BITS - rest)) & ((1 << MANT_BITS) - 1))
                | (EXP_BIAS << MANT_BITS))
    u = 2.0 * one_frac.view(float64) - 3.0
    return row, u


@dataclass(frozen=True)
class ArrayOps:
    """The few functions and types of an array library (numpy's, or torch's:
    :data:`.torch_reader.TORCH_OPS`) that reading a table takes."""

    where: Any
    exp: Any
    log: Any
    expm1: Any
    int64: Any
    float64: Any
    take: Any


def _closed(logp: bool) -> float:
    return LP_CLOSED if logp else P_CLOSED


def cells_of(x, logp: bool, kbits: int, ops: ArrayOps):
    """The cell of every element of the flat float64 array ``x`` (p, or log p): what a
    radius's first call builds.  Elements outside the tables' domain count as
    :data:`OUTSIDE_P` does, as in the numba backend's cell scan (its scalar twin)."""
    _, z, high, _ = prepare_z_array(x, logp, _closed(logp), ops.where, ops.exp, ops.expm1)
    return cell_array(z.view(ops.int64), high, kbits, ops.where)


def read_array(table, at_one: float, x, *, logp: bool, log: bool, ops: ArrayOps):
    """``(lower, upper, more)`` of the flat float64 array ``x`` (p, or log p) from
    ``table`` (its ``columns``, ``row_code``, ``cells_info``, ``kbits`` and ``exp_lo``, arrays
    of ``x``'s library and device; ``at_one``, the lower edge, or its log, at ``p = 1``):
    the cell from the bits of ``z``,
    the coordinate from the remaining mantissa bits, two Horner chains (the lower one
    exponentiated on rows so marked), ``1 / p`` (or ``-log p``) where the upper edge is
    saturated, and the limit ``(at_one, 1)`` at ``p == 1``.  ``more`` marks the elements
    to solve exactly: rows marked so, invalid input, and ``p`` (``log p``) below
    ``LP_CLOSED``, the solver's tails.  The numba pass (:mod:`fbands._jit.table_kernels`)
    takes the same steps, one element at a time."""
    where = ops.where
    p, z, high, valid = prepare_z_array(x, logp, _closed(logp), where, ops.exp, ops.expm1)
    if log:  # (0.0 - : log 1 gives +0.0)
        top = 0.0 - (where(valid, x, 0.0) if logp else ops.log(p))
    else:
        top = 1.0 / p
    one = x == (0.0 if logp else 1.0)
    row, u = locate_array(z.view(ops.int64), high, table.cells_info, table.kbits, where,
                          ops.float64)
    col, take = table.columns, ops.take  # (one gather a coefficient, no index arithmetic)
    lo, hi = take(col[0], row), take(col[1], row)
    for i in range(1, DEG + 1):
        lo = lo * u + take(col[2 * i], row)
        hi = hi * u + take(col[2 * i + 1], row)
    code = take(table.row_code, row)
    if table.exp_lo:  # rows whose lower polynomial is of log r
        lo = where((code & ROW_EXP_LO) != 0, ops.exp(lo), lo)
    hi = where(((code & ROW_TOP) != 0) | one, top, hi)
    lo = where(one, at_one, lo)
    more = (((code & ROW_EXACT) != 0) & ~one) | ~valid
    return lo, hi, more
