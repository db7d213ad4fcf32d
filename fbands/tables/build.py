"""Building the band tables: Chebyshev rows of both edges, validated against the exact
solver, cell by cell as the data reaches them.

For each ``(divergence, delta)`` there is a table of both edges for ratios and one for
log-ratios, in the layout of :mod:`.layout` (fewer cells for float32 output).  Both edges
are smooth functions of ``log z``, ``z = min(p, 1 - p)``, between saturation thresholds
(``1 - p`` keeps the ``q log q`` term near ``p = 1`` smooth), so on a short cell a degree-5
polynomial in the cell's coordinate reaches the tolerance of :data:`LAYOUTS`.  Every row is
validated against the exact solver between its nodes; a cell that misses (a saturation
threshold inside, an edge bending fast next to one) takes
:data:`~.layout.SUBBITS` more mantissa bits to choose one of its subrows.  A ratio subrow
whose lower edge spans too many orders of magnitude for a polynomial in ``r`` (KL's
``exp(-delta / p)`` at small ``p``) gives it as ``exp`` of its log-edge's polynomial,
validated as a relative error in ``r``; where that edge rounds to 0 in a float32 output the
row stores 0.  A subrow that still misses is marked to be solved exactly, element by
element, as are the lower edges that float64 cannot resolve next to saturation (refined in
extended precision).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fbands import _refine, _solver
from fbands._state import STATE
from fbands.tables import layout as L

__all__ = ["LAYOUTS", "NUMPY_FILLER", "Filler", "Table", "TableSet", "build_tables"]

#: Accuracy of the tables per output precision (their cells, :data:`.layout.KBITS`,
#: follow from it): ``tol``, what a row must reach between its nodes (ratios: relative
#: error below ``tol``; log-edges ``s``: error below ``tol * max(|s|, 1e-6)``, and small
#: enough that ``exp(s)`` keeps ``tol`` too).  ``refine``: the float64 error bound above
#: which a lower edge next to saturation is redone in extended precision
#: (:func:`fbands._refine.refine_near_saturation`).  ``small_edge``: the
#: closed-form pass leaves lower edges below it to the exact solver.  A root of the
#: closed forms near r = 0 is off by about an ulp of their O(1) terms (~1e-16 absolute),
#: so it is trusted where that is a small enough share of it: from 1e-3 for float64's
#: 1e-12 bar (numpy's :data:`~fbands._refine.SMALL_EDGE`) and, with the
#: same margin, from 1e-6 for float32's 1e-9.  ``zero_below``: a
#: lower ratio below it everywhere on a row is stored as 0 (float32: a quarter of the
#: smallest subnormal, so that it and the edge round to the same 0).
LAYOUTS = {
    "float64": {"kbits": L.KBITS["float64"], "tol": 1e-13,
                "refine": _refine.REFINE_ABOVE, "small_edge": _refine.SMALL_EDGE,
                "zero_below": 0.0},
    "float32": {"kbits": L.KBITS["float32"], "tol": 1e-10, "refine": 1e-9,
                "small_edge": 1e-6, "zero_below": 2.0**-151},
}


class Table:
    """Interpolation table of both edges of one divergence at one delta, in one mode (the
    layout: :mod:`.layout`).

    ``coef``: :data:`~.layout.ROW` coefficients a row; ``row_code``: each row's
    flag bits; ``cells_info[cell]``: the cell's first row and extra mantissa bits.
    ``exp_lo``: whether any row gives its lower edge as the exponential of its polynomial.
    """

    def __init__(self, kbits, coef, row_code, cells_info):
        self.kbits, self.coef, self.row_code, self.cells_info = kbits, coef, row_code, cells_info
        self.exp_lo = bool(np.any((row_code & L.ROW_EXP_LO) != 0))

    @property
    def exact_fraction(self) -> float:
        """Share of the cells (refined cells counted by subrow) solved element by element."""
        rows, sh = L.unpack_info(self.cells_info)
        share = np.empty(rows.size)
        for k in range(rows.size):
            codes = self.row_code[rows[k] : rows[k] + (1 << sh[k])]
            share[k] = np.mean((codes & L.ROW_EXACT) != 0)
        return float(share.mean())


@dataclass(frozen=True)
class Filler:
    """The exact solver that fills a table's points: ``solve(div, inputs)`` gives the
    log-edges ``(lower, upper)`` of prepared flat float64 :class:`fbands._solver.Inputs`,
    and ``tag(div)`` names everything its bits depend on beyond this package's code (part
    of the disk cache's key).  Each path reads tables filled by its own exact solver, which
    also solves the elements the tables leave, so that its answers never depend on which
    solver a process met first."""

    name: str
    solve: Callable
    tag: Callable[[object], str]


def _numpy_edges(div, x: _solver.Inputs):
    return _solver.solve(div, _solver.NUMPY, x)


#: The array solver on numpy: what fills the tables the torch reader and the grids read.
NUMPY_FILLER = Filler("numpy", _numpy_edges, lambda div: "")


def _solve_z(div, z: np.ndarray, high: np.ndarray, delta: float, refine: float,
             filler: Filler):
    """Exact log-edges at z = min(p, 1 - p) (``high``: z is 1 - p), keeping z exact, by
    ``filler``'s solver."""
    with np.errstate(all="ignore"):
        other = 1.0 - z
        lz, lother = np.log(z), np.log1p(-z)
        p, q = np.where(high, other, z), np.where(high, z, other)
        lp, lq = np.where(high, lother, lz), np.where(high, lz, lother)
        flat = [np.ascontiguousarray(a, dtype=np.float64).reshape(-1) for a in (lp, lq, p, q)]
        x = _solver.Inputs(*flat, np.full_like(flat[0], delta))
        lo, hi = filler.solve(div, x)
        suspect = _refine.near_saturation(div, x, lo, refine)
        lo, hi = _refine.solve_huge_radius(div, x, lo, hi, from_logp=False)
    return lo.reshape(z.shape), hi.reshape(z.shape), lp, suspect.reshape(z.shape)


def _horner(coef: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Rows of polynomials (highest power first) at ``u``, in the kernels' order of
    operations (:func:`.kernels.horner`), so that a check sees their rounding."""
    acc = np.broadcast_to(coef[:, :1], (coef.shape[0], u.size)).copy()
    for j in range(1, coef.shape[1]):
        acc = acc * u + coef[:, j : j + 1]
    return acc


class _Fitter:
    """Chebyshev interpolation of both edges on rows of points, in both modes, validated
    between the nodes."""

    def __init__(self, tol: float, zero_below: float):
        m = L.DEG + 1
        self.m, self.tol, self.zero_below = m, tol, zero_below
        self.nodes = np.cos(np.pi * (np.arange(m) + 0.5) / m)[::-1]
        self.checks = np.concatenate(([-1.0], 0.5 * (self.nodes[1:] + self.nodes[:-1]), [1.0]))
        theta = np.pi * (np.arange(m) + 0.5) / m
        basis = np.cos(np.outer(np.arange(m), theta))[:, ::-1] * (2.0 / m)  # T_j at the nodes
        basis[0] /= 2.0
        to_mono = np.zeros((m, m))  # row j: ascending monomial coefficients of T_j
        for j in range(m):
            c = np.polynomial.chebyshev.cheb2poly(np.eye(m)[j])
            to_mono[j, : c.size] = c
        self.fit_matrix = basis.T @ to_mono  # node values -> ascending monomials
        self.check_matrix = np.vander(self.checks, m)  # highest power first

    @property
    def w(self) -> np.ndarray:
        """Where the points of a row lie, as fractions of the row: nodes, then checks."""
        return (np.concatenate((self.nodes, self.checks)) + 1.0) / 2.0

    def _edge(self, vals, saturated, allowed):
        """(coef highest power first, ok, all_saturated) of one edge on every row."""
        m = self.m
        finite = np.where(saturated[:, :m] | ~np.isfinite(vals[:, :m]), 0.0, vals[:, :m])
        # Fit the variation about the mean and add the mean back to the constant term:
        # the other coefficients then carry rounding of the variation alone, not of the
        # value (a log-edge of -500 varying by 0.1 would lose a hundred ulp otherwise).
        with np.errstate(invalid="ignore", over="ignore"):  # (ratios near 1e308: not good)
            base = finite.mean(axis=1)
            mono = ((finite - base[:, None]) @ self.fit_matrix)[:, ::-1]
            mono[:, -1] += base
            err = np.abs(mono @ self.check_matrix.T - vals[:, m:])
            ok = (err <= allowed(vals[:, m:])).all(axis=1)
        good = np.isfinite(vals).all(axis=1) & ~saturated.any(axis=1) & ok
        return mono, good, saturated.all(axis=1)

    def _exp_ok(self, c_log, s_lo):
        """Rows whose lower edge ``exp(poly)`` of the log fit ``c_log`` is within ``tol``
        of ``r = exp(s_lo)``, relatively, at the checks: an error ``e`` in ``s`` is one of
        ``e`` in ``r``.  Rounding of ``s`` itself (|s| up to 745) is allowed 4 ulp."""
        s = s_lo[:, self.m:]
        with np.errstate(invalid="ignore", over="ignore"):
            err = np.abs(_horner(c_log, self.checks) - s)
            bar = np.maximum(self.tol, 4.0 * np.spacing(np.abs(s)))
            ok = (err <= bar).all(axis=1)
        return ok & np.isfinite(s_lo).all(axis=1) & (s_lo < 0).all(axis=1)

    def __call__(self, s_lo, s_hi, lp, suspect, allow_exp=True):
        """Both modes' (coef, row_code) from the exact log-edges at each row's points.
        ``allow_exp``: ratio rows may give the lower edge as exp of the log fit (only
        subrows do: a shorter row fits r itself, at no exp per element, far further)."""
        tol = self.tol
        top = (s_hi == -lp) | (np.abs(s_hi + lp) <= _allowed(s_hi, tol))
        zero = s_lo == -math.inf
        out = {}
        c_log = None
        for log in (True, False):
            if log:
                lo, hi = s_lo, s_hi
                allowed = lambda v: _allowed(v, tol)  # noqa: E731
            else:
                with np.errstate(over="ignore"):
                    lo, hi = np.exp(s_lo), np.exp(s_hi)
                allowed = lambda v: tol * np.abs(v)  # noqa: E731
            # (ratios: an edge that rounds to 0 in the output is stored as 0)
            gone = zero if log else zero | (lo < self.zero_below)
            c_lo, ok_lo, sat_lo = self._edge(lo, gone, allowed)
            c_hi, ok_hi, sat_hi = self._edge(hi, top, allowed)
            exp_lo = np.zeros_like(ok_lo)
            if log:
                c_log = c_lo.copy()
            elif allow_exp:  # a lower edge that spans many orders of magnitude
                exp_lo = ~(ok_lo | sat_lo) & self._exp_ok(c_log, s_lo)
                c_lo[exp_lo] = c_log[exp_lo]
                ok_lo = ok_lo | exp_lo
            c_lo[sat_lo] = 0.0
            c_lo[sat_lo, -1] = -math.inf if log else 0.0
            c_hi[sat_hi] = 0.0
            exact = ~((ok_lo | sat_lo) & (ok_hi | sat_hi)) | suspect.any(axis=1)
            code = L.row_code(sat_hi, exact, exp_lo & ~exact)
            coef = np.stack((c_lo, c_hi), axis=2).reshape(-1, L.ROW)
            out[log] = (coef, code)
        return out


def _allowed(s: np.ndarray, tol: float) -> np.ndarray:
    """Largest error of a log-edge that keeps it and its ratio within ``tol``."""
    with np.errstate(over="ignore"):
        ratio = np.maximum(1.0, 1e-6 * np.exp(-s))  # r >= 1e-6: relative; below: absolute
    # No table can beat the rounding of the solver that fills it: allow 16 ulp of s.
    floor = 16 * np.finfo(np.float64).eps * np.abs(s)
    return np.maximum(tol * np.minimum(np.maximum(np.abs(s), 1e-6), ratio), floor)


def _fitter(layout: str) -> _Fitter:
    cfg = LAYOUTS[layout]
    return _FITTERS.get_or_make(layout, lambda: _Fitter(cfg["tol"], cfg["zero_below"]))


_FITTERS = STATE.memo("table fitters", "the least-squares fit of each table layout")


def _cell_rows(div, delta: float, layout: str, cells: np.ndarray, first_row: int,
               filler: Filler):
    """The rows of table cells ``cells`` (indices into ``cells_info``, no catch-all cell):
    ``({log: (coef, code)}, info)``, the rows numbered from ``first_row`` on.

    One row per cell where it meets the tolerance.  A cell whose row misses it takes the
    extra mantissa bits of the first level of :data:`~.layout.SUBBITS` whose subrows all
    meet it (a ratio subrow may give its lower edge as an exp), or of the last, where a
    subrow that still misses is marked to be solved exactly.  A cell's rows therefore
    depend on the cell alone, never on which other cells are built with it or before it:
    a table built cell by cell answers with the bits of a complete one.
    """
    kbits, refine = LAYOUTS[layout]["kbits"], LAYOUTS[layout]["refine"]
    fit = _fitter(layout)
    high = cells > L.NB_LO << kbits  # past the low side's catch-all cell
    b, j = L.cell_of_row(kbits, np.where(high, cells - 1, cells))
    modes = {log: (np.empty((0, L.ROW)), np.empty(0, dtype=np.int64)) for log in (True, False)}
    info = np.zeros(cells.size, dtype=np.int64)
    left = np.arange(cells.size)
    for level, bits in enumerate(L.SUBBITS):
        nsub = 1 << bits
        frac = ((np.arange(nsub)[:, None] + fit.w) / nsub)[None]  # (1, nsub, points)
        z = L.cell_z(kbits, b[left][:, None, None], j[left][:, None, None], frac)
        z = z.reshape(left.size * nsub, -1)
        on_high = np.broadcast_to(np.repeat(high[left], nsub)[:, None], z.shape)
        # A whole cell's row fits r itself or goes to subrows: an exp per element costs
        # the pass more than subrows cost the build (see ROW_EXP_LO).
        sub = fit(*_solve_z(div, z, on_high, delta, refine, filler), allow_exp=bits > 0)
        last = level == len(L.SUBBITS) - 1
        if last:
            keep = np.ones(left.size, dtype=bool)
        else:
            codes = sub[True][1] | sub[False][1]
            keep = ~((codes & L.ROW_EXACT) != 0).reshape(left.size, -1).any(axis=1)
        rows = np.repeat(keep, nsub)
        first = first_row + modes[True][0].shape[0]
        modes = {log: tuple(np.concatenate((m, s[rows])) for m, s in zip(modes[log], sub[log],
                                                                         strict=True))
                 for log in modes}
        info[left[keep]] = L.pack_info(first + nsub * np.arange(int(keep.sum())), bits)
        left = left[~keep]
        if not left.size:
            break
    return modes, info


class TableSet:
    """Both modes' tables (log-edges and ratios) of one divergence at one radius in one
    layout, built cell by cell as the data reaches them.

    ``filler`` (:class:`Filler`) is the exact solver its points come from.

    Row 0 is an exact row (its elements go to the exact solver): every cell points at it
    until it is built, and the two catch-all cells for good.  :meth:`cover` builds the
    cells that given elements fall in, :meth:`complete` all of them; either publishes new
    arrays (:attr:`modes`, ``{log: Table}``) in one assignment, so that a reader never sees
    a half-built table.

    Which cells a reading call builds is the table-completion policy's choice
    (:data:`fbands.tables.cache.COMPLETION`): by default the cells its data reaches (a few
    hundred of a table's thousands for a typical batch) on a radius's first call, and all
    of them on its next.  A cell's rows depend on that cell alone (:func:`_cell_rows`), so
    a call answers with the same bits whatever was built before.
    """

    def __init__(self, div, delta: float, layout: str, filler: Filler = NUMPY_FILLER):
        self.div, self.delta, self.layout, self.filler = div, float(delta), layout, filler
        self.kbits = LAYOUTS[layout]["kbits"]
        n = L.cell_count(self.kbits)
        self.built = np.zeros(n, dtype=bool)
        self.built[[L.NB_LO << self.kbits, n - 1]] = True  # the catch-all cells stay exact
        exact = (np.zeros((1, L.ROW)), L.row_code([False], [True]))
        self._rows = {log: exact for log in (True, False)}
        self._lock = threading.Lock()
        self._publish(np.zeros(n, dtype=np.int64))

    def _publish(self, info: np.ndarray) -> None:
        self.modes = {log: Table(self.kbits, np.ascontiguousarray(coef).reshape(-1),
                                 code.astype(np.int32), info)
                      for log, (coef, code) in self._rows.items()}

    @property
    def is_complete(self) -> bool:
        return bool(self.built.all())

    @property
    def is_empty(self) -> bool:
        return self._rows[True][0].shape[0] == 1

    def cover(self, touched: np.ndarray) -> bool:
        """Build the cells that ``touched`` marks (a boolean mask over the cells: the
        numba backend's cell scan, or :func:`.torch_reader.cells_reached`); whether there
        was any to build."""
        return self._add(np.nonzero(touched & ~self.built)[0])

    def complete(self) -> dict[bool, Table]:
        """Every cell built: ``{log: Table}``."""
        self._add(np.nonzero(~self.built)[0])
        return self.modes

    def _add(self, cells: np.ndarray) -> bool:
        """Build ``cells`` (those not built yet); whether there was any."""
        with self._lock:
            cells = cells[~self.built[cells]]
            if not cells.size:
                return False
            first = self._rows[True][0].shape[0]
            rows, info_new = _cell_rows(self.div, self.delta, self.layout, cells, first,
                                        self.filler)
            for log, (coef, code) in rows.items():
                old_coef, old_code = self._rows[log]
                self._rows[log] = (np.concatenate((old_coef, coef)),
                                   np.concatenate((old_code, code)))
            info = self.modes[True].cells_info.copy()
            info[cells] = info_new
            self.built[cells] = True
            self._publish(info)
            return True

    @classmethod
    def from_tables(cls, div, delta: float, layout: str, found: dict[bool, Table],
                    filler: Filler = NUMPY_FILLER):
        """A complete set from stored tables (:mod:`.store`)."""
        out = cls(div, delta, layout, filler)
        out._rows = {log: (t.coef.reshape(-1, L.ROW), t.row_code)
                     for log, t in found.items()}
        out.built[:] = True
        out._publish(found[True].cells_info)
        return out


def build_tables(div, delta: float, layout: str = "float64",
                 filler: Filler = NUMPY_FILLER) -> dict[bool, Table]:
    """Build and validate every cell of the tables of ``div`` at ``delta``: ``{log: Table}``
    for log-edges (``True``) and ratios (``False``); see :class:`TableSet` and
    :mod:`.layout`."""
    return TableSet(div, delta, layout, filler).complete()
