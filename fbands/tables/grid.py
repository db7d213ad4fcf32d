"""Band grids: both log-edges of one (divergence, delta) as polynomials of ``x = log p`` on
cells that cover every float of one dtype, read by a small fixed graph on any device.

A grid is what the device path reads (:mod:`fbands.tables.torch_reader`).  Where the band
tables of :mod:`.layout` leave elements to an exact solver (rows that miss their
tolerance, ``p`` below their range, ``p`` next to 1), a grid has no such rows: its cells
are cut where the edges are not smooth, so that every float ``x`` of the dtype, from the
lowest finite one to 0, finds a cell whose polynomials are within tolerance.

Cells.  ``bounds`` (ascending, in the grid's dtype) cut the line into rows:
``searchsorted(bounds, x, right=True)`` gives row ``k`` for ``bounds[k-1] <= x <
bounds[k]``.  Row 0 holds only ``x = -inf`` (``p = 0``: the band ``[0, inf)``), the last
row everything above 0 and nan (nan edges: not a log-probability).  The cuts between are
found by bisection: a cell whose fit misses the tolerance is halved, which refines
geometrically towards the points where an edge bends without bound (a saturation
threshold, ``p -> 1``, the far tail).  The two saturation thresholds themselves are cuts,
placed between two adjacent floats of the dtype, so that no cell holds both sides.

Rows.  A row (shape :data:`ROW_SHAPE`) holds the centre ``c`` and scale ``s`` of its cell
(its coordinate is ``u = (x - c) s``, in ``[-1, 1]``; the last cell, which ends at
``x = 0``, has ``c = 0`` so that the limits at ``p = 1`` are its constant terms exactly),
each beside the :data:`DEG` + 1 coefficients (powers 0 to DEG of ``u``) of one edge: the
lower log-edge ``log r_lo``, the upper ``log r_hi``.  The reader takes
``min(upper, -x)``: where the upper edge saturates its row holds the constant ``+inf``
and the edge is ``-log p`` exactly.  A saturated lower edge (``r_lo = 0``, or a log-edge
beyond the dtype's range) is a row with constant term ``-inf`` and no other: ``-inf``
exactly.

Accuracy.  Fits are least squares on Chebyshev nodes, accepted when their float64 error at
:data:`CHECKS` points of the cell is at most ``tol * max(|edge|, floor)`` (of
:data:`GRIDS`), and the sum of its terms' magnitudes at most :data:`COND` times the edge;
the error after rounding the rows to the dtype and reading them in its arithmetic is
measured on the same points and kept as :attr:`Grid.worst` (in units of the dtype's
epsilon times the edge).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fbands._inputs import NumpyInputs, Request
from fbands._refine import exact_log_edges
from fbands.errors import BandError

__all__ = ["DEG", "GRIDS", "Grid", "build_grid", "pack_rows", "read_grid"]

#: Degree of the polynomials of both edges.
DEG = 5
#: Shape of a row: the centre then the lower edge's DEG + 1 coefficients, the scale then
#: the upper edge's.
ROW_SHAPE = (2, DEG + 2)
#: Per dtype: ``tol``, the fit's relative error bound (float64 arithmetic), and ``floor``:
#: below it in magnitude an edge's error is measured absolutely (``tol * floor``): a
#: log-edge of ``2^-40`` is a ratio within ``1e-12`` of 1.  Only float32 grids are made:
#: the code takes any float dtype, but a float64 grid needs tens of seconds to build
#: where a lower edge meets its saturation threshold (each point there is refined in
#: extended precision), and float64 input keeps the tables.
GRIDS = {"float32": {"tol": 2e-9, "floor": 2.0**-40}}
#: Fit nodes (Chebyshev points of the cell) and check points (evenly spaced, both ends
#: included) per cell.
NODES, CHECKS = 16, 33
#: A cell's polynomial is also refused where its terms add up to more than this many times
#: the edge (in absolute value): the dtype's rounding of the sum is then that many times
#: its rounding of the edge.
COND = 4.0
#: A lower log-edge below this share of the dtype's lowest float reads -inf (the rounding
#: of a polynomial's sum could otherwise overflow there).
OVERFLOW = 1.0 - 2.0**-16
#: What a float32 grid must meet, as measured at its build (:attr:`Grid.worst`): both
#: log-edges within this many float32 epsilons (``2^-23``) of the edge (of ``floor``
#: below it); the built-in divergences measure about 2.  A grid that misses it is not
#: read (the device path reads the tables instead).
FLOAT32_BOUND = 4.0
#: A grid with more cells than this is refused (no built-in divergence comes near).
MAX_CELLS = 1 << 16


@dataclass(frozen=True)
class Grid:
    """One grid: ``bounds`` (n,) and ``rows`` (n + 1, 2, DEG + 2) in ``dtype``, and
    ``worst``, the largest read error measured at build, in units of ``eps * |edge|``."""

    bounds: np.ndarray
    rows: np.ndarray
    dtype: str
    worst: float

    @property
    def cells(self) -> int:
        return len(self.rows) - 2  # (the rows of -inf and of invalid input aside)


# ----------------------------------------------------------------------------- reading


def pack_rows(rows: np.ndarray) -> np.ndarray:
    """A grid's ``rows`` as the torch reader keeps them: row ``k``'s pairs ``(centre,
    scale)``, ``(lo_0, hi_0)``, ..., ``(lo_DEG, hi_DEG)`` in that order, each pair of
    float32 values in one 64-bit word (bit for bit), so that a single gather of a narrow
    integer table fetches a token's whole row."""
    pairs = np.ascontiguousarray(np.swapaxes(rows, 1, 2))  # (n + 1, DEG + 2, 2)
    return pairs.view(np.int64 if pairs.dtype == np.float32 else np.complex128)[..., 0]


def read_grid(bounds, lowest: float, packed, x, xp: Any):
    """``(log lower, log upper)`` of the array ``x`` of log-probabilities (in the grid's
    dtype, any shape) from a grid's ``bounds``, its lowest float ``lowest`` and its rows
    packed by :func:`pack_rows` (arrays of ``x``'s library and device).  ``xp`` is numpy
    or torch: a search, one gather, the coordinate and two Horner chains side by side;
    in torch eighteen operations (twelve kernels, the rest views), no host read."""
    if xp is np:
        k = np.searchsorted(bounds, x, side="right")
        xc = np.maximum(x, lowest)
        row = packed[k]
        pairs = row.view(bounds.dtype).reshape(*row.shape, 2)
        cols = [pairs[..., j, :] for j in range(pairs.shape[-2])]
    else:
        k = xp.searchsorted(bounds, x, right=True)
        xc = x.clamp(min=lowest)
        cols = xp.embedding(packed, k).view(bounds.dtype).unflatten(
            -1, (-1, 2)).unbind(-2)
    centre, scale = _pair(cols[0], xp)
    u = ((xc - centre) * scale)[..., None]
    both = cols[-1]  # (lo, hi) of the highest power, then Horner's rule on both at once
    for col in cols[-2:0:-1]:
        both = both * u + col if xp is np else xp.addcmul(col, both, u)
    lo, hi = _pair(both, xp)
    return lo, xp.minimum(hi, 0.0 - x)


def _pair(a, xp):
    """The two entries of ``a``'s last axis of length 2 (one ``unbind`` in torch)."""
    return (a[..., 0], a[..., 1]) if xp is np else a.unbind(-1)


# ----------------------------------------------------------------------------- building


def _exact(div, delta, x):
    """The exact log-edges of float64 ``x`` (log p): the numpy backend's answer."""
    inputs = NumpyInputs(np.asarray(x, np.float64), delta,
                         Request(logp=True, log=True, invalid="nan", check=False))
    return inputs.finish(*exact_log_edges(div, inputs.inputs, from_logp=True))


def _ordinal(x, ft) -> int:
    """Position of a float ``x <= 0`` among the floats of ``ft`` (0 for 0, -1 for the
    largest negative one, and so on down)."""
    it = np.int64 if ft == np.float64 else np.int32
    return -int(np.abs(np.asarray(x, ft)).view(it))


def _from_ordinal(n: int, ft) -> float:
    it = np.int64 if ft == np.float64 else np.int32
    return -float(np.asarray(-n, it).view(ft))


def _first_true(pred, lo_x: float, hi_x: float, ft) -> float:
    """The smallest float (of ``ft``) in ``[lo_x, hi_x]`` where the monotone ``pred``
    holds, given it fails at ``lo_x`` and holds at ``hi_x``; by bisection of the floats
    between (at most 64 steps)."""
    a, b = _ordinal(lo_x, ft), _ordinal(hi_x, ft)
    while b - a > 1:
        m = (a + b) // 2
        if pred(_from_ordinal(m, ft)):
            b = m
        else:
            a = m
    return _from_ordinal(b, ft)


def _thresholds(div, delta, ft):
    """``(x_lo, x_hi)``: the smallest float with a lower edge above ``OVERFLOW`` times the
    dtype's lowest float (``-inf`` below), and the smallest from which the upper edge
    saturates (``None`` where it never does on ``[-1024, 0]``); the lowest float where the
    whole range qualifies."""
    lowest = float(np.finfo(ft).min)

    def lo_finite(x):
        lo, _ = _exact(div, delta, np.array([x]))
        return bool(lo[0] >= lowest * OVERFLOW)

    def hi_saturated(x):
        _, hi = _exact(div, delta, np.array([x]))
        return bool(hi[0] == -x)

    x_lo = lowest if lo_finite(lowest) else _first_true(lo_finite, lowest, -0.0, ft)
    # Saturation is a property of p, tested where x + hi resolves it (|x| <= 1024).
    if hi_saturated(-1024.0):
        x_hi = lowest
    elif hi_saturated(-0.0):
        x_hi = _first_true(hi_saturated, -1024.0, -0.0, ft)
    else:
        x_hi = None
    return x_lo, x_hi


def _cell_points(a: float, b: float, last: bool, ft):
    """``(centre, scale, true scale, fit points, check points)`` of the cell ``[a, b)``
    (``[a, 0]`` when ``last``).  The scale is the true one rounded to the dtype, or its
    largest float where the true one is beyond it (a cell of subnormal width); the
    polynomials are fitted in the true coordinate, and rescaled to the stored one.  A
    cell of few floats is fitted and checked on all of them; a wider one on Chebyshev
    nodes, and checked on evenly spaced floats of the dtype."""
    true = 1.0 / -a if last else 2.0 / (b - a)
    c = ft(0.0) if last else ft(0.5 * a + 0.5 * b)
    s = ft(min(true, float(np.finfo(ft).max)))
    n = _ordinal(b, ft) - _ordinal(a, ft) + (1 if last else 0)
    if n <= NODES + CHECKS:
        every = np.array([_from_ordinal(_ordinal(a, ft) + i, ft) for i in range(n)])
        return c, s, true, every, every
    lo_u, hi_u = (-1.0, 0.0) if last else (-1.0, 1.0)
    t = np.cos(np.pi * (np.arange(NODES) + 0.5) / NODES)
    fit = float(c) + (lo_u + (t + 1.0) * 0.5 * (hi_u - lo_u)) / true
    check = np.linspace(a, b, CHECKS).astype(ft).astype(np.float64)  # (the dtype's floats)
    if not last:
        check[-1] = _from_ordinal(_ordinal(b, ft) - 1, ft)  # the cell's largest float
    return c, s, true, np.clip(fit, a, b), check


def _fit(values, u, fixed0=None):
    """Least-squares coefficients (powers 0..DEG) of ``values`` at ``u`` (an exact
    interpolant when there are at most DEG + 1 points); with ``fixed0`` the constant term
    is that value exactly."""
    v = np.vander(u, DEG + 1, increasing=True)
    if fixed0 is None:
        return np.linalg.lstsq(v, values, rcond=None)[0]
    rest = np.linalg.lstsq(v[:, 1:], values - fixed0, rcond=None)[0]
    return np.concatenate(([fixed0], rest))


def _edge_row(values, u, fixed0, saturated, fill, ft, tol, floor, cap=None):
    """Coefficients of one edge on one cell and its error over the tolerance (at most 1:
    accepted).  ``saturated``: the edge is ``fill`` (the constant -inf or +inf) on the
    whole cell; ``cap``: the reader takes ``min(polynomial, cap)``.  (The exact solver's
    choice between a saturated upper edge and a root one float64 ulp below it is noise
    at the grid's tolerance: a saturated row is checked against it within tolerance.)"""
    fit_v, chk_v = values
    fit_u, chk_u = u
    if saturated:  # lower: beyond the dtype's range; upper: -x within the tolerance
        coef = np.zeros(DEG + 1)
        coef[0] = fill
        if cap is None:
            below = np.all(chk_v <= float(np.finfo(ft).min) * OVERFLOW)
            return coef, 0.0 if below else math.inf
        with np.errstate(invalid="ignore"):
            err = np.abs(chk_v - cap) / (tol * np.maximum(np.abs(chk_v), floor))
        return coef, float(np.max(np.where(np.isnan(err), math.inf, err)))
    if not (np.all(np.isfinite(fit_v)) and np.all(np.isfinite(chk_v))):
        return np.zeros(DEG + 1), math.inf
    coef = _fit(fit_v, fit_u, fixed0)
    got = np.polynomial.polynomial.polyval(chk_u, coef)
    terms = np.polynomial.polynomial.polyval(np.abs(chk_u), np.abs(coef))
    if cap is not None:
        got = np.minimum(got, cap)
    scale = np.maximum(np.abs(chk_v), floor)
    err = np.abs(got - chk_v) / (tol * scale)
    return coef, max(float(np.max(err)), float(np.max(terms / (COND * scale))))


def build_grid(div, delta: float, dtype: str = "float32") -> Grid:
    """The grid of ``div`` at ``delta`` for log-probabilities of ``dtype`` (a key of
    :data:`GRIDS`: ``"float32"``, which serves float32, bfloat16 and float16 input)."""
    ft = np.dtype(dtype).type
    tol, floor = GRIDS[dtype]["tol"], GRIDS[dtype]["floor"]
    lowest = float(np.finfo(ft).min)
    x_lo, x_hi = _thresholds(div, delta, ft)
    x_hi = math.inf if x_hi is None else x_hi
    cuts = sorted({lowest, x_lo, 0.0} | ({x_hi} if math.isfinite(x_hi) else set()))
    todo = [(a, b) for a, b in zip(cuts[:-1], cuts[1:], strict=True) if a < b]
    done: list[tuple] = []
    while todo:
        cells = [(a, b, *_cell_points(a, b, b == 0.0, ft)) for a, b in todo]
        xs = np.concatenate([np.concatenate((fit, chk)) for *_, fit, chk in cells])
        lo_all, hi_all = _exact(div, delta, xs)
        todo, at = [], 0
        for a, b, c, s, true, fit, chk in cells:
            nf, nc = len(fit), len(chk)
            both = slice(at, at + nf + nc)
            at += nf + nc
            lo_v, hi_v = lo_all[both], hi_all[both]
            u = ((fit - float(c)) * true, (chk - float(c)) * true)
            last = b == 0.0
            c_lo, e_lo = _edge_row((lo_v[:nf], lo_v[nf:]), u, lo_v[-1] if last else None,
                                   b <= x_lo, -math.inf, ft, tol, floor)
            c_hi, e_hi = _edge_row((hi_v[:nf], hi_v[nf:]), u, 0.0 if last else None,
                                   a >= x_hi, math.inf, ft, tol, floor, cap=-chk)
            m = float(ft(0.5 * a + 0.5 * b))
            if max(e_lo, e_hi) <= 1.0 or not a < m < b:
                rescale = (true / float(s)) ** np.arange(DEG + 1)  # (1 unless s was capped)
                done.append((a, b, c, s, np.concatenate((c_lo * rescale, c_hi * rescale))))
            else:
                todo += [(a, m), (m, b)]
        if len(done) + len(todo) > MAX_CELLS:
            raise BandError(f"the grid of {div.name} at delta={delta} needs more than "
                            f"{MAX_CELLS} cells for {dtype}")
    done.sort(key=lambda cell: cell[0])
    return _assemble(div, delta, done, ft, dtype)


def _assemble(div, delta, done, ft, dtype) -> Grid:
    lowest = float(np.finfo(ft).min)
    first = np.zeros(ROW_SHAPE)  # x = -inf: lower -inf, upper min(inf, inf)
    first[0, 1], first[1, 1] = -math.inf, math.inf
    nan = np.zeros(ROW_SHAPE)  # x > 0 or nan
    nan[:, 1:] = math.nan
    rows = [first]
    for *_, c, s, coef in done:
        row = np.empty(ROW_SHAPE)
        row[:, 0] = float(c), float(s)
        row[:, 1:] = coef.reshape(2, DEG + 1)
        rows.append(row)
    rows.append(nan)
    bounds = [lowest] + [b for _, b, *_ in done]
    bounds[-1] = float(np.nextafter(ft(0.0), ft(1.0)))  # x = 0 is in the last cell
    bounds_arr = np.array(bounds, ft)
    with np.errstate(over="ignore"):
        rows_arr = np.array(rows, ft)
    return Grid(bounds_arr, rows_arr, dtype, _measure(div, delta, bounds_arr, rows_arr,
                                                      done, ft))


def _measure(div, delta, bounds, rows, done, ft) -> float:
    """Largest error of the rounded grid read in its dtype, over every cell's check
    points, in units of ``eps * max(|edge|, floor)``."""
    x = np.concatenate([_cell_points(a, b, b == 0.0, ft)[4] for a, b, *_ in done])
    x = x.astype(ft)
    want_lo, want_hi = _exact(div, delta, x.astype(np.float64))
    with np.errstate(all="ignore"):
        lo, hi = read_grid(bounds, float(bounds[0]), pack_rows(rows), x, np)
    eps = float(np.finfo(ft).eps)
    floor = GRIDS[np.dtype(ft).name]["floor"]
    worst = 0.0
    for got, want in ((lo, want_lo), (hi, want_hi)):
        got = got.astype(np.float64)
        with np.errstate(all="ignore"):  # (truth beyond the dtype's range: its rounding)
            rounded = np.where(np.abs(want) > float(np.finfo(ft).max) * OVERFLOW,
                               np.sign(want) * math.inf, want)
            err = np.where(got == rounded, 0.0,
                           np.abs(got - want) / (eps * np.maximum(np.abs(want), floor)))
        err = np.where(np.isnan(got) & np.isnan(want), 0.0, err)
        worst = max(worst, float(np.max(np.where(np.isnan(err), math.inf, err))))
    return worst
