r"""numba backend: JIT-compiled, parallel band solvers generated from each divergence's maths.

For every divergence (user-registered ones included) the generated Python source of its
kernels (:attr:`fbands.Divergence.sources`: ``F`` in ``s = log r``, ``F'``, closed-form
coefficients) and the scalar form of the solver (:data:`fbands._solver.SCALAR_FORM`, real
Python read from its file) make one module (:mod:`fbands.backends._numba_template`),
written to a file in the cache directory and compiled by numba with ``cache=True``: a
second process loads the machine code from disk instead of compiling again.  Nothing is
compiled at ``import fbands``; the first call for a divergence and dtype pays for it (a few
seconds, once per machine).

Two paths:

* **General** (per-element ``delta``, any dtype, scalars): the inputs are prepared by
  :class:`fbands.bands.NumpyInputs` and each element is solved exactly by the scalar form of
  :func:`fbands._solver.solve` (closed form, or safeguarded Newton stopping per element),
  in parallel over the cores.
* **Table** (a float32 or float64 array with one scalar ``delta``, the usual case): for each
  ``(divergence, delta)`` a table of both edges, one for ratios and one for log-ratios,
  built from the exact solver cell by cell as the data reaches the cells
  (:class:`TableSet`), and cached.  A cell is found from the bits of
  ``z = min(p, 1 - p)`` alone: its binade and the top ``kbits`` bits of its mantissa
  (:mod:`._table_layout`, the one definition of the layout: fewer bits for float32
  output), so every cell spans a fixed share of its own size.  Both edges are smooth
  functions of ``log z`` between saturation thresholds (``1 - p`` keeps the ``q log q``
  term near ``p = 1`` smooth), so on such a short cell a degree-5 polynomial in the
  cell's coordinate, read exactly off the remaining mantissa bits, reaches the
  tolerance.  Every row is validated against the exact solver between its nodes; a cell
  that misses (a saturation threshold inside, an edge bending fast next to one) takes
  :data:`~._table_layout.SUBBITS` more mantissa bits to choose one of its subrows.  A
  ratio subrow whose lower edge spans too many orders of magnitude for a polynomial in
  ``r`` (KL's ``exp(-delta / p)`` at small ``p``) gives it as ``exp`` of its log-edge's
  polynomial, validated as a relative error in ``r``; where that edge rounds to 0 in a
  float32 output the row stores 0.  (The pass leaves those few elements like exact ones,
  and :func:`._table_kernels.finish_exp_rows` finishes them from the table.)  A subrow
  that still misses is solved exactly, element by element, as are ``p`` below
  ``2^-200``, ``1 - p`` below ``2^-90`` (log-probability input only) and the lower
  edges that float64 cannot resolve next to saturation (refined in extended precision).
  The pass (:mod:`._table_kernels`, one compiled module for every divergence) has no
  data-dependent branch and no libm call, so it vectorises (gathers for the table
  reads): per element two integer bit-field reads, two table reads, two Horner chains of
  six terms, and ``1 / p`` for a saturated upper edge.
* **Closed-form pass** (ratios of ``p`` with one scalar ``delta``, for divergences whose
  closed forms needed no squaring, :func:`has_closed_pass`): the roots of the sympy
  polynomials, chosen and clamped without a branch (see the closed-forms page of the
  docs); no table to build.

Both passes write a nan lower edge for what they leave to the exact solver and keep a
tally per block of :data:`BLOCK` elements, so that finding those few elements afterwards
reads only the blocks that hold one.

Environment: ``FBANDS_CACHE_DIR`` (default ``~/.cache/fbands``) holds the generated modules
and numba's cache next to them, in a directory only this user can write
(:mod:`fbands._cache`); a generated module is imported only when its text is the one this
process generated.  Complete tables (what the torch device path reads, :func:`tables`) are
kept there too, as verified numeric arrays (:mod:`._table_store`), so a later process with
the same radius reads them; the CPU path builds only the cells its data reaches, which
costs milliseconds, and keeps them in memory.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import math
import os
import sys
import threading
from collections import OrderedDict
from pathlib import Path

import numba  # (the import error tells bands.py that this backend is unusable)
import numba.extending
import numpy as np

from fbands import _cache, _solver, bands, symbolic
from fbands._inputs import NumpyInputs, check_values, invalid_masks, scalar_delta
from fbands._solver import LP_CLOSED
from fbands.backends import _numba_template as template
from fbands.backends import _table_kernels, _table_layout, _table_store, _threads, numpy_backend

__all__ = ["LAYOUTS", "kernels", "tables", "log_edges", "edges"]

#: Accuracy of the tables per output precision (their cells, :data:`._table_layout.KBITS`,
#: follow from it): ``tol``, what a row must reach between its nodes (ratios: relative
#: error below ``tol``; log-edges ``s``: error below ``tol * max(|s|, 1e-6)``, and small
#: enough that ``exp(s)`` keeps ``tol`` too).  ``refine``: the float64 error bound above
#: which a lower edge next to saturation is redone in extended precision
#: (:func:`fbands.backends.numpy_backend.refine_near_saturation`).  ``small_edge``: the
#: closed-form pass leaves lower edges below it to the exact solver.  A root of the
#: closed forms near r = 0 is off by about an ulp of their O(1) terms (~1e-16 absolute),
#: so it is trusted where that is a small enough share of it: from 1e-3 for float64's
#: 1e-12 bar (numpy's :data:`~fbands.backends.numpy_backend.SMALL_EDGE`) and, with the
#: same margin, from 1e-6 for float32's 1e-9.  ``zero_below``: a
#: lower ratio below it everywhere on a row is stored as 0 (float32: a quarter of the
#: smallest subnormal, so that it and the edge round to the same 0).
LAYOUTS = {
    "float64": {"kbits": _table_layout.KBITS["float64"], "tol": 1e-13,
                "refine": numpy_backend.REFINE_ABOVE, "small_edge": numpy_backend.SMALL_EDGE,
                "zero_below": 0.0},
    "float32": {"kbits": _table_layout.KBITS["float32"], "tol": 1e-10, "refine": 1e-9,
                "small_edge": 1e-6, "zero_below": 2.0**-151},
}
#: Elements per block of the passes (see :data:`._table_kernels.BLOCK`).
BLOCK = _table_kernels.BLOCK
#: How many (divergence, delta, layout) table sets are kept (least recently used go first).
#: A complete float64 pair takes about 9 MB and a float32 pair about 2.5 MB; one built for a
#: batch's data holds only the cells the batch reached.
MAX_TABLES = 16

_LOCK = threading.Lock()
_MODULES: dict[tuple[str, str], object] = {}
_TABLES: OrderedDict = OrderedDict()
_AT_ONE: dict = {}


# ----------------------------------------------------------------------------- generated code


def is_float64(a):
    """Whether array ``a`` holds float64: in the generated kernels, a constant of each
    compiled type, so a branch on it is decided at compile time."""
    return a.dtype == np.float64


@numba.extending.overload(is_float64)
def _is_float64(a):
    value = a.dtype == numba.types.float64
    return lambda a: value


def cache_dir() -> Path:
    """Where generated modules (and numba's cache files beside them) live: ``numba`` in the
    private cache directory (:mod:`fbands._cache`), or in a directory of this process alone
    when that is not safe to use (numba loads its cache files with pickle)."""
    path = _cache.private_dir("numba")
    if path is None:
        path = _cache.process_dir() / "numba"
        path.mkdir(mode=0o700, exist_ok=True)
    return path


def module_source(div) -> str:
    """The complete numba module of one divergence (see :mod:`._numba_template`)."""
    src = div.sources
    parts = [template.HEADER.format(name=div.name)]

    def fn(key: str, name: str, inline: bool = False) -> str:
        deco = '@njit(inline="always", **OPTS)' if inline else "@njit(**OPTS)"
        return f"{deco}\n" + src[key].replace("def _fn(", f"def {name}(", 1) + "\n"

    parts.append(fn("F_far", "F_far"))
    near_differs = src["F_near"] != src["F_far"]
    parts.append(fn("F_near", "F_near") if near_differs else "F_near = F_far\n")
    parts.append(fn("dF", "dF"))
    d = div.derivation
    forms = {"upper": d.upper, "lower": d.lower, "lower_y": d.lower_y}
    for edge, cf in forms.items():
        for i in (2, 1, 0):
            if cf is not None:
                # inlined: a call would keep closed_pass's loop from vectorising
                parts.append(fn(f"{edge}_a{i}", f"{edge}_a{i}", inline=True))
            else:  # never called (HAS_... is False), but numba resolves every name
                parts.append(f"@njit(**OPTS)\ndef {edge}_a{i}(p, q, delta):\n    return NAN\n")
    parts.append(_scalar_form(div))
    parts.append(template.SOLVE_ARRAYS)
    if has_closed_pass(div):
        zero = {f"{k}_zero": (cf.coeffs[0] == 0, cf.coeffs[1] == 0) for k, cf in forms.items()}
        parts.append(template.CLOSED_PASS.format(**zero))
    return "".join(parts)


def _scalar_form(div) -> str:
    """The scalar form of the solver (:data:`fbands._solver.SCALAR_FORM`, taken from its
    source file as it is), its constants and the divergence's, each function jitted."""
    constants = {name: getattr(_solver, name) for name in _solver.SCALAR_SHARED}
    constants.update(_solver.scalar_constants(div), NEAR=symbolic.NEAR)
    lines = ["\n# -- fbands._solver's constants and the divergence's\n"]
    for name, value in constants.items():
        text = repr(value) if isinstance(value, (bool, int)) else f"float({repr(float(value))!r})"
        lines.append(f"{name} = {text}\n")
    lines.append("\n# -- the scalar form of the solver, from fbands/_solver.py\n")
    for func in _solver.SCALAR_FORM:
        lines.append("\n\n" + inspect.getsource(func))
    names = ", ".join(func.__name__ for func in _solver.SCALAR_FORM)
    lines.append(f"\n\nfor _name in ({names},):\n"
                 "    globals()[_name.__name__] = njit(**OPTS)(_name)\n")
    return "".join(lines)


def has_closed_pass(div) -> bool:
    """Whether ``div`` gets :func:`closed_pass`: closed forms for both edges (the lower one
    in ``r`` and in ``1 - r``), none of them squared (no root needs checking against g)."""
    d = div.derivation
    forms = (d.upper, d.lower, d.lower_y)
    return all(cf is not None and not cf.squared for cf in forms)


def _key(div) -> tuple[str, str]:
    key = div.__dict__.get("_numba_key")
    if key is None:
        key = div.__dict__["_numba_key"] = (div.name, str(div.f))
    return key


def kernels(div):
    """The imported generated module of ``div`` (compiled lazily by numba on first use)."""
    key = _key(div)
    mod = _MODULES.get(key)
    if mod is not None:
        return mod
    with _LOCK:
        if key in _MODULES:
            return _MODULES[key]
        source = module_source(div)
        digest = hashlib.sha256(source.encode()).hexdigest()[:32]
        safe = "".join(c if c.isalnum() else "_" for c in div.name)
        path = cache_dir() / f"fbands_{safe}_{digest}.py"
        # Import only what this process generated: a file whose text differs (damaged, or
        # not ours) is replaced.  An equal one is kept: numba's cache is keyed by its stamp.
        if not _holds(path, source):
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(source)
            os.replace(tmp, path)
        name = f"_fbands_numba_{safe}_{digest}"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        _MODULES[key] = mod
        return mod


def _holds(path: Path, text: str) -> bool:
    """Whether ``path`` is a regular file (not a link) whose content is exactly ``text``."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    with os.fdopen(fd, "rb") as fh:
        return fh.read(len(text.encode()) + 1) == text.encode()


# ----------------------------------------------------------------------------- tables


class Table:
    """Interpolation table of both edges of one divergence at one delta, in one mode (the
    layout: :mod:`._table_layout`).

    ``coef``: :data:`~._table_layout.ROW` coefficients a row; ``row_code``: each row's
    flag bits; ``cells_info[cell]``: the cell's first row and extra mantissa bits.
    ``exp_lo``: whether any row gives its lower edge as the exponential of its polynomial.
    """

    def __init__(self, kbits, coef, row_code, cells_info):
        self.kbits, self.coef, self.row_code, self.cells_info = kbits, coef, row_code, cells_info
        self.exp_lo = bool(np.any((row_code & _table_layout.ROW_EXP_LO) != 0))

    @property
    def exact_fraction(self) -> float:
        """Share of the cells (refined cells counted by subrow) solved element by element."""
        rows, sh = _table_layout.unpack_info(self.cells_info)
        share = np.empty(rows.size)
        for k in range(rows.size):
            codes = self.row_code[rows[k] : rows[k] + (1 << sh[k])]
            share[k] = np.mean((codes & _table_layout.ROW_EXACT) != 0)
        return float(share.mean())


def _solve_z(div, z: np.ndarray, high: np.ndarray, delta: float, refine: float):
    """Exact log-edges at z = min(p, 1 - p) (``high``: z is 1 - p), keeping z exact."""
    with np.errstate(all="ignore"):
        other = 1.0 - z
        lz, lother = np.log(z), np.log1p(-z)
    p, q = np.where(high, other, z), np.where(high, z, other)
    lp, lq = np.where(high, lother, lz), np.where(high, lz, lother)
    flat = [np.ascontiguousarray(a, dtype=np.float64).reshape(-1) for a in (lp, lq, p, q)]
    lo, hi = np.empty_like(flat[0]), np.empty_like(flat[0])
    d = np.full_like(flat[0], delta)
    with _threads.sized(lo.size, "exact"):
        kernels(div).solve_arrays(*flat, d, lo, hi)
    suspect = numpy_backend.near_saturation(div, _solver.Inputs(*flat, d), lo, refine)
    return lo.reshape(z.shape), hi.reshape(z.shape), lp, suspect.reshape(z.shape)


def _horner(coef: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Rows of polynomials (highest power first) at ``u``, in the kernels' order of
    operations (:func:`._table_kernels.horner`), so that a check sees their rounding."""
    acc = np.broadcast_to(coef[:, :1], (coef.shape[0], u.size)).copy()
    for j in range(1, coef.shape[1]):
        acc = acc * u + coef[:, j : j + 1]
    return acc


class _Fitter:
    """Chebyshev interpolation of both edges on rows of points, in both modes, validated
    between the nodes."""

    def __init__(self, tol: float, zero_below: float):
        m = _table_layout.DEG + 1
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
        base = finite.mean(axis=1)
        mono = ((finite - base[:, None]) @ self.fit_matrix)[:, ::-1]
        mono[:, -1] += base
        with np.errstate(invalid="ignore", over="ignore"):
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
            code = _table_layout.row_code(sat_hi, exact, exp_lo & ~exact)
            coef = np.stack((c_lo, c_hi), axis=2).reshape(-1, _table_layout.ROW)
            out[log] = (coef, code)
        return out


def _allowed(s: np.ndarray, tol: float) -> np.ndarray:
    """Largest error of a log-edge that keeps it and its ratio within ``tol``."""
    with np.errstate(over="ignore"):
        ratio = np.maximum(1.0, 1e-6 * np.exp(-s))  # r >= 1e-6: relative; below: absolute
    # No table can beat the rounding of the solver that fills it: allow 16 ulp of s.
    floor = 16 * np.finfo(np.float64).eps * np.abs(s)
    return np.maximum(tol * np.minimum(np.maximum(np.abs(s), 1e-6), ratio), floor)


@functools.cache
def _fitter(layout: str) -> _Fitter:
    cfg = LAYOUTS[layout]
    return _Fitter(cfg["tol"], cfg["zero_below"])


def _cell_rows(div, delta: float, layout: str, cells: np.ndarray, first_row: int,
               levels=_table_layout.SUBBITS):
    """The rows of table cells ``cells`` (indices into ``cells_info``, no catch-all cell):
    ``({log: (coef, code)}, info, provisional)``, the rows numbered from ``first_row`` on.

    One row per cell, unless ``levels`` starts with 0.  A cell whose row misses the
    tolerance takes the extra mantissa bits of the first of ``levels`` (see
    :data:`~._table_layout.SUBBITS`) whose subrows all meet it, or of the last, where
    a subrow that still misses is marked to be solved exactly.  ``provisional``: the cells
    kept at an earlier level with ratio subrows that take an exp (:meth:`TableSet.refine`
    gives them the last level's rows).
    """
    L = _table_layout
    kbits, refine = LAYOUTS[layout]["kbits"], LAYOUTS[layout]["refine"]
    fit = _fitter(layout)
    high = cells > L.NB_LO << kbits  # past the low side's catch-all cell
    b, j = L.cell_of_row(kbits, np.where(high, cells - 1, cells))
    modes = {log: (np.empty((0, L.ROW)), np.empty(0, dtype=np.int64)) for log in (True, False)}
    info = np.zeros(cells.size, dtype=np.int64)
    provisional = np.zeros(cells.size, dtype=bool)
    left = np.arange(cells.size)
    for level, bits in enumerate(levels):
        nsub = 1 << bits
        frac = ((np.arange(nsub)[:, None] + fit.w) / nsub)[None]  # (1, nsub, points)
        z = L.cell_z(kbits, b[left][:, None, None], j[left][:, None, None], frac)
        z = z.reshape(left.size * nsub, -1)
        on_high = np.broadcast_to(np.repeat(high[left], nsub)[:, None], z.shape)
        # A whole cell's row fits r itself or goes to subrows: an exp per element costs
        # the pass more than subrows cost the build (see ROW_EXP_LO).
        sub = fit(*_solve_z(div, z, on_high, delta, refine), allow_exp=bits > 0)
        missed = (((sub[True][1] | sub[False][1]) & L.ROW_EXACT) != 0).reshape(left.size, -1)
        last = level == len(levels) - 1
        keep = np.ones(left.size, dtype=bool) if last else ~missed.any(axis=1)
        rows = np.repeat(keep, nsub)
        first = first_row + modes[True][0].shape[0]
        modes = {log: tuple(np.concatenate((m, s[rows])) for m, s in zip(modes[log], sub[log],
                                                                         strict=True))
                 for log in modes}
        info[left[keep]] = L.pack_info(first + nsub * np.arange(int(keep.sum())), bits)
        if not last:
            exp_rows = ((sub[False][1] & L.ROW_EXP_LO) != 0).reshape(left.size, -1)
            provisional[left[keep]] = exp_rows[keep].any(axis=1)
        left = left[~keep]
        if not left.size:
            break
    return modes, info, provisional


class TableSet:
    """Both modes' tables (log-edges and ratios) of one divergence at one radius in one
    layout, built cell by cell as the data reaches them.

    Row 0 is an exact row (its elements go to the exact solver): every cell points at it
    until it is built, and the two catch-all cells for good.  :meth:`cover` builds the
    cells that given elements fall in, :meth:`complete` all of them; either publishes new
    arrays (:attr:`modes`, ``{log: Table}``) in one assignment, so that a reader never sees
    a half-built table.  A radius that changes every call thus costs the cells its data
    touches (a few hundred of a table's thousands for a typical batch), not a whole table.

    A cell that needs shorter rows first tries two half rows (:data:`~._table_layout.SUBBITS`).
    Where those give a lower edge as an exp, the cell is *provisional*: right for a radius
    met once, at the price of an exp per element; :meth:`refine`, called when the radius
    comes back, and :meth:`complete` give it the 64 short rows that fit ``r`` itself.  (The
    rows it leaves stay in the arrays, unread.)
    """

    def __init__(self, div, delta: float, layout: str):
        L = _table_layout
        self.div, self.delta, self.layout = div, float(delta), layout
        self.kbits = LAYOUTS[layout]["kbits"]
        n = L.cell_count(self.kbits)
        self.built = np.zeros(n, dtype=bool)
        self.built[[L.NB_LO << self.kbits, n - 1]] = True  # the catch-all cells stay exact
        self.provisional = np.zeros(n, dtype=bool)
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

    def cover(self, x: np.ndarray, logp: bool) -> bool:
        """Build the cells that the elements of the flat array ``x`` (p, or log p) fall
        in; whether there was any to build."""
        touched = np.zeros(self.built.size, dtype=np.uint8)
        closed = LP_CLOSED if logp else math.exp(LP_CLOSED)
        with _threads.sized(x.size, "touch"):
            _table_kernels.touched_cells(x, bool(logp), self.kbits, closed, touched)
        return self._add(np.nonzero(touched.view(bool) & ~self.built)[0])

    def complete(self) -> dict[bool, Table]:
        """Every cell built, none provisional: ``{log: Table}``."""
        self._add(np.nonzero(~self.built)[0])
        self.refine()
        return self.modes

    def refine(self) -> None:
        """Give the provisional cells (half rows with an exp, built for a radius met once)
        the rows of the last level: called when the radius is used again."""
        if self.provisional.any():
            self._add(np.nonzero(self.provisional)[0], _table_layout.SUBBITS[-1:])

    def _add(self, cells: np.ndarray, levels=_table_layout.SUBBITS) -> bool:
        """Build ``cells`` (again, for provisional ones) at ``levels``; whether any."""
        with self._lock:
            cells = cells[~self.built[cells] | self.provisional[cells]]
            if not cells.size:
                return False
            first = self._rows[True][0].shape[0]
            rows, info_new, provisional = _cell_rows(self.div, self.delta, self.layout, cells,
                                                     first, levels)
            for log, (coef, code) in rows.items():
                old_coef, old_code = self._rows[log]
                self._rows[log] = (np.concatenate((old_coef, coef)),
                                   np.concatenate((old_code, code)))
            info = self.modes[True].cells_info.copy()
            info[cells] = info_new
            self.built[cells] = True
            self.provisional[cells] = provisional
            self._publish(info)
            return True

    @classmethod
    def from_tables(cls, div, delta: float, layout: str, found: dict[bool, Table]):
        """A complete set from stored tables (:mod:`._table_store`)."""
        out = cls(div, delta, layout)
        out._rows = {log: (t.coef.reshape(-1, _table_layout.ROW), t.row_code)
                     for log, t in found.items()}
        out.built[:] = True
        out._publish(found[True].cells_info)
        return out


def build_tables(div, delta: float, layout: str = "float64") -> dict[bool, Table]:
    """Build and validate every cell of the tables of ``div`` at ``delta``: ``{log: Table}``
    for log-edges (``True``) and ratios (``False``); see :class:`TableSet` and
    :mod:`._table_layout`."""
    return TableSet(div, delta, layout).complete()


def table_set(div, delta: float, layout: str = "float64") -> TableSet:
    """The cached :class:`TableSet` of ``div`` at ``delta`` (nothing built yet when new)."""
    key = (*_key(div), float(delta), layout)
    with _LOCK:
        found = _TABLES.get(key)
        if found is None:
            found = _TABLES[key] = TableSet(div, delta, layout)
            while len(_TABLES) > MAX_TABLES:
                _TABLES.popitem(last=False)
        _TABLES.move_to_end(key)
        return found


def tables(div, delta: float, layout: str = "float64") -> dict[bool, Table]:
    """The complete tables of ``div`` at ``delta`` (what the device path copies to its
    device): from the private cache when an earlier process stored them, else built and
    stored (:mod:`._table_store`: verified arrays, no pickle)."""
    ts = table_set(div, delta, layout)
    if ts.is_complete:
        return ts.modes
    if ts.is_empty:
        kbits = LAYOUTS[layout]["kbits"]
        k = _table_store.key(kernels(div).__name__, delta,
                             f"{layout} {sorted(LAYOUTS[layout].items())}")
        found = _table_store.load(k, kbits, _table_layout.cell_count(kbits),
                                  _table_layout.ROW, Table)
        if found is None:
            found = build_tables(div, delta, layout)
            _table_store.store(k, found)
        ts = TableSet.from_tables(div, delta, layout, found)
        with _LOCK:
            _TABLES[(*_key(div), float(delta), layout)] = ts
        return ts.modes
    return ts.complete()


# ----------------------------------------------------------------------------- backend


def _fast(div, p, delta, *, logp, invalid, check, log, closed_pass: bool):
    """The closed-form pass (``closed_pass``) or the table path, for a float32 or float64
    array ``p`` and one valid scalar ``delta`` (:func:`fbands.bands.choose_path` decided)."""
    d = scalar_delta(delta)
    mod = kernels(div)
    x = np.ascontiguousarray(p).reshape(-1)
    out_lo = np.empty(x.shape, dtype=p.dtype)
    out_hi = np.empty(x.shape, dtype=p.dtype)
    closed = LP_CLOSED if logp else math.exp(LP_CLOSED)
    at_one = lower_at_one(div, d, log)
    layout = "float32" if p.dtype == np.float32 else "float64"
    if closed_pass:
        block_bad = np.empty(_blocks(x.size), dtype=np.int64)
        with _threads.sized(x.size, "pass"):
            mod.closed_pass(x, d, closed, at_one, LAYOUTS[layout]["small_edge"], out_lo,
                            out_hi, block_bad)
            idx = (_table_kernels.unfinished(out_lo, block_bad) if block_bad.any()
                   else np.arange(0))
    else:
        ts = table_set(div, d, layout)
        if ts.is_empty:  # a radius new to this process: first the cells the data reaches
            ts.cover(x, logp)
        else:  # a radius used again: its provisional cells take their final rows (once)
            ts.refine()
        idx = _read_table(ts.modes[bool(log)], x, logp, log, closed, at_one, out_lo, out_hi)
        if idx.size and not ts.is_complete and ts.cover(x[idx], logp):
            # Some elements fell in cells not built yet (row 0, exact): read them again.
            sub = x[idx]
            sub_lo, sub_hi = np.empty_like(out_lo[idx]), np.empty_like(out_hi[idx])
            left = _read_table(ts.modes[bool(log)], sub, logp, log, closed, at_one, sub_lo,
                               sub_hi)
            out_lo[idx], out_hi[idx] = sub_lo, sub_hi
            idx = idx[left]
    if idx.size:  # a few elements left: the exact path, on those alone
        sub = x[idx]
        if check and invalid == "raise":
            with np.errstate(invalid="ignore"):
                bad_p, _ = invalid_masks(sub, d, logp)
            if bad_p.any():  # report the first invalid element of the whole array
                check_values(p, d, logp)
        out_lo[idx], out_hi[idx] = solve_exact(div, sub, d, logp=logp, invalid="nan",
                                               check=False, log=log)
    return out_lo.reshape(p.shape), out_hi.reshape(p.shape)


def _blocks(n: int) -> int:
    return -(-n // BLOCK)


def _read_table(tab: Table, x, logp, log, closed, at_one, out_lo, out_hi) -> np.ndarray:
    """The table pass over the flat array ``x`` into ``out_lo``, ``out_hi``, then the rows
    whose lower edge is an exponential; returns the indices of the elements left to the
    exact solver."""
    block_bad = np.empty(_blocks(x.size), dtype=np.int64)
    with _threads.sized(x.size, "pass"):
        _table_kernels.table_pass(x, bool(logp), bool(log), tab.coef, tab.row_code,
                                  tab.cells_info, tab.kbits, closed, at_one, out_lo, out_hi,
                                  block_bad)
        idx = (_table_kernels.unfinished(out_lo, block_bad) if block_bad.any()
               else np.arange(0))
        if idx.size and tab.exp_lo:
            idx = idx[_table_kernels.finish_exp_rows(x, idx, bool(logp), tab.coef,
                                                     tab.row_code, tab.cells_info, tab.kbits,
                                                     closed, at_one, out_lo, out_hi)]
    return idx


def lower_at_one(div, delta: float, log: bool) -> float:
    """The lower edge at ``p = 1`` (:meth:`fbands.Divergence.lower_limit_at_one`; ``log``:
    its log), by the exact path, cached per divergence and delta."""
    key = (*_key(div), float(delta), bool(log))
    found = _AT_ONE.get(key)
    if found is None:
        one = NumpyInputs(np.ones(1), float(delta), logp=False, invalid="raise", check=False)
        found = _AT_ONE[key] = float(_solved(div, one, False, log)[0][0])
        if len(_AT_ONE) > 4 * MAX_TABLES:
            _AT_ONE.pop(next(iter(_AT_ONE)))
    return found


def solve_exact(div, p, delta, *, logp, invalid, check, log):
    """Every element by the scalar form of the solver (refined in extended precision where
    float64 cannot resolve a lower edge, as the numpy backend does)."""
    return _solved(div, NumpyInputs(p, delta, logp=logp, invalid=invalid, check=check),
                   logp, log)


def _solved(div, x: NumpyInputs, logp: bool, log: bool):
    """The edges of prepared inputs ``x`` (see :func:`solve_exact`)."""
    flat = [np.ascontiguousarray(a, dtype=np.float64).reshape(-1)
            for a in (x.lp, x.lq, x.p, x.q, x.delta)]
    lo, hi = np.empty_like(flat[0]), np.empty_like(flat[0])
    with _threads.sized(lo.size, "exact"):
        kernels(div).solve_arrays(*flat, lo, hi)
    with np.errstate(all="ignore"):
        refine = LAYOUTS["float32" if x.dtype == np.float32 else "float64"]["refine"]
        lo = numpy_backend.refine_near_saturation(div, _solver.Inputs(*flat), lo,
                                                  from_logp=logp, above=refine)
    return x.finish(lo.reshape(x.shape), hi.reshape(x.shape), log=log)


def _run(div, p, delta, *, logp, invalid, check, log):
    path = bands.choose_path("numba", div, p, delta, logp=logp, log=log)
    if path == bands.EXACT:
        return solve_exact(div, p, delta, logp=logp, invalid=invalid, check=check, log=log)
    return _fast(div, p, delta, logp=logp, invalid=invalid, check=check, log=log,
                 closed_pass=path == bands.CLOSED_PASS)


def log_edges(div, p, delta, *, logp, invalid, check):
    """``(log lower, log upper)`` of the band (see :func:`fbands.log_bounds`)."""
    return _run(div, p, delta, logp=logp, invalid=invalid, check=check, log=True)


def edges(div, p, delta, *, logp, invalid, check):
    """``(lower, upper)`` of the band (see :func:`fbands.bounds`)."""
    return _run(div, p, delta, logp=logp, invalid=invalid, check=check, log=False)
