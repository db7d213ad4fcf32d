r"""numba backend: JIT-compiled, parallel band solvers generated from each divergence's maths.

For every divergence (user-registered ones included) the generated Python source of its
kernels (:attr:`fbands.Divergence.sources`: ``F`` in ``s = log r``, ``F'``, closed-form
coefficients) is pasted into a template of scalar solver code
(:mod:`fbands.backends._numba_template`), written to a file in the cache directory and
compiled by numba with ``cache=True``: a second process loads the machine code from disk
instead of compiling again.  Nothing is compiled at ``import fbands``; the first call for a
divergence and dtype pays for it (a few seconds, once per machine).

Two paths:

* **General** (per-element ``delta``, any dtype, scalars): the inputs are prepared by
  :class:`fbands.bands.NumpyInputs` and each element is solved exactly by the scalar form of
  :func:`fbands._solver.solve` (closed form, or safeguarded Newton stopping per element),
  in parallel over the cores.
* **Table** (a float32 or float64 array with one scalar ``delta``, the usual case): for each
  ``(divergence, delta)`` a table of both edges is built once from the exact solver and
  cached, one for ratios and one for log-ratios.  A cell is found from the bits of
  ``z = min(p, 1 - p)`` alone: its binade and the top ``kbits`` bits of its mantissa
  (:data:`LAYOUTS`: fewer for float32 output), so every cell spans a fixed share of its own
  size.  Both edges are smooth functions of ``log z`` between saturation thresholds
  (``1 - p`` keeps the ``q log q`` term near ``p = 1`` smooth), so on such a short cell a
  degree-5 polynomial in the cell's coordinate, read exactly off the remaining mantissa
  bits, reaches the tolerance.  Every row is validated against the exact solver between
  its nodes; a cell that misses (a saturation threshold inside, an edge bending fast next
  to one) takes :data:`SUBBITS` more mantissa bits to choose one of its subrows, and a
  subrow that still misses is solved exactly, element by element, as are ``p`` below
  ``2^-200``, ``1 - p`` below ``2^-90`` (log-probability input only) and the lower edges
  that float64 cannot resolve next to saturation (refined in extended precision).  The
  pass over the data has no data-dependent branch and no libm call, so it vectorises
  (gathers for the table reads): per element two integer bit-field reads, two table
  reads, two Horner chains of six terms, and ``1 / p`` for a saturated upper edge.
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
process generated.  The tables are kept there too, as verified numeric arrays
(:mod:`._table_store`), so a later process with the same radius reads them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import sys
import threading
from collections import OrderedDict
from pathlib import Path

import numba  # (the import error tells bands.py that this backend is unusable)
import numba.extending
import numpy as np

from fbands import _cache, _solver, symbolic
from fbands._solver import LP_CLOSED
from fbands.backends import _numba_template as template
from fbands.backends import _table_store, numpy_backend
from fbands.bands import NumpyInputs, invalid_masks, raise_invalid
from fbands.errors import BandError

__all__ = ["LAYOUTS", "kernels", "tables", "log_edges", "edges"]

#: Table layout per output precision: ``2^kbits`` cells per binade of ``min(p, 1 - p)``, and
#: the accuracy a row must reach between its nodes (ratios: relative error below ``tol``;
#: log-edges ``s``: error below ``tol * max(|s|, 1e-6)``, and small enough that ``exp(s)``
#: keeps ``tol`` too).  A cell spans at most 1/2^kbits of its own size, so the
#: polynomials of degree :data:`DEG` converge fast (the nearest singularity, p = 0 or
#: p = 1, is over 2^(kbits+1) half-widths away).  ``refine``: the float64 error bound above
#: which a lower edge next to saturation is redone in extended precision
#: (:func:`fbands.backends.numpy_backend.refine_near_saturation`).  ``small_edge``: the
#: closed-form pass leaves lower edges below it to the exact solver.  A root of the
#: closed forms near r = 0 is off by about an ulp of their O(1) terms (~1e-16 absolute),
#: so it is trusted where that is a small enough share of it: from 1e-3 for float64's
#: 1e-12 bar (numpy's :data:`~fbands.backends.numpy_backend.SMALL_EDGE`) and, with the
#: same margin, from 1e-6 for float32's 1e-9.
LAYOUTS = {
    "float64": {"kbits": 6, "tol": 1e-13, "refine": numpy_backend.REFINE_ABOVE,
                "small_edge": numpy_backend.SMALL_EDGE},
    "float32": {"kbits": 4, "tol": 1e-10, "refine": 1e-9, "small_edge": 1e-6},
}
#: Degree of the polynomials, coefficients per table row, and the bits of a row's code (see
#: the template: the kernel's Horner chains are generated for this degree).
DEG, ROW, ROW_TOP, ROW_EXACT = template.DEG, template.ROW, template.ROW_TOP, template.ROW_EXACT
#: Elements per block of the passes (each block keeps a tally of what it leaves unsolved).
BLOCK = 4096
#: Extra mantissa bits (2^SUBBITS subrows) of a cell its polynomials do not resolve (a
#: saturation threshold inside it, an edge that bends too fast).
SUBBITS = 6
#: Binades of p below 1/2 in the table (p >= 2^-200, log p >= -138): smaller p are
#: solved exactly.
NB_LO = 200
#: Binades of 1 - p in the table (1 - p >= 2^-90): closer to 1 only log-probability
#: input gets, and it is solved exactly.
NB_HI = 90
#: How many (divergence, delta, layout) table pairs are kept (least recently used go first).
#: A float64 pair takes about 9 MB and a float32 pair about 2.5 MB; each takes a second or
#: so to build, once per process, so a radius that changes every step is better passed as
#: a per-token array (the exact path) than as a new scalar each time.
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
    curv = div.curvature
    curv = curv if math.isfinite(curv) and curv > 0 else 1.0
    parts = [template.HEADER.format(name=div.name, f0=div.f0, curv=curv, near=symbolic.NEAR,
                                    far_above=_solver.FAR_ABOVE,
                                    slow_at_one=math.isinf(div.fprime_inf))]

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
        if cf is not None:
            for i in (2, 1, 0):
                # inlined: a call would keep closed_pass's loop from vectorising
                parts.append(fn(f"{edge}_a{i}", f"{edge}_a{i}", inline=True))
    parts.append(f"\nNEAR_DIFFERS = {near_differs}\n")
    parts.append(f"HAS_UPPER = {d.upper is not None}\nHAS_LOWER = {d.lower is not None}\n")
    parts.append(template.SOLVER)
    for edge, cf in (("upper", d.upper), ("lower", d.lower)):
        if cf is not None:
            parts.append(template.CLOSED_EDGE.format(
                edge=edge, is_upper=edge == "upper", squared=cf.squared))
        else:  # never called (HAS_... is False) but numba must resolve the name
            parts.append(f"\n@njit(**OPTS)\ndef closed_{edge}(lp, lq, p, q, poq, delta):\n"
                         "    return NAN, False\n")
    parts.append(template.SOLVE_ONE)
    parts.append(f"\nBLOCK, ROW, ROW_TOP, ROW_EXACT = {BLOCK}, {ROW}, {ROW_TOP}, {ROW_EXACT}\n")
    parts.append(template.TABLE)
    if has_closed_pass(div):
        zero = {f"{k}_zero": (cf.coeffs[0] == 0, cf.coeffs[1] == 0) for k, cf in forms.items()}
        parts.append(template.CLOSED_PASS.format(**zero))
    return "".join(parts)


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
    """Interpolation table of both edges of one divergence at one delta, in one mode.

    ``coef``: :data:`ROW` coefficients a row (powers 5 to 0 of ``u``, lower and upper
    interleaved, so a row is one contiguous read); ``row_code``: :data:`ROW_TOP` (upper
    edge at ``1 / p``) and :data:`ROW_EXACT` bits; ``cells_info[cell]``: first row << 4 |
    extra mantissa bits (0, or :data:`SUBBITS` for a refined cell).
    """

    def __init__(self, kbits, coef, row_code, cells_info):
        self.kbits, self.coef, self.row_code, self.cells_info = kbits, coef, row_code, cells_info

    @property
    def exact_fraction(self) -> float:
        """Share of the cells (refined cells counted by subrow) solved element by element."""
        info = self.cells_info
        sh = info & 15
        rows = info >> 4
        share = np.empty(info.size)
        for k in range(info.size):
            codes = self.row_code[rows[k] : rows[k] + (1 << sh[k])]
            share[k] = np.mean((codes & ROW_EXACT) != 0)
        return float(share.mean())


def _cell_points(kbits: int, nb: int, w: np.ndarray) -> np.ndarray:
    """z at the fractions ``w`` (shape (points,) or (cells, points)) of every cell of ``nb``
    binades: cell ``b * 2^kbits + j`` covers ``2^-(b+1) [1 + j / 2^kbits, 1 + (j+1) / 2^kbits)``."""
    cells = 1 << kbits
    b = np.repeat(np.arange(nb), cells)[:, None]
    j = np.tile(np.arange(cells), nb)[:, None]
    return np.ldexp(1.0 + (j + w) / cells, -(b + 1))


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
    kernels(div).solve_arrays(*flat, d, lo, hi)
    suspect = numpy_backend.near_saturation(div, _solver.Inputs(*flat, d), lo, refine)
    return lo.reshape(z.shape), hi.reshape(z.shape), lp, suspect.reshape(z.shape)


class _Fitter:
    """Chebyshev interpolation of both edges on rows of points, in both modes, validated
    between the nodes."""

    def __init__(self, tol: float):
        m = DEG + 1
        self.m, self.tol = m, tol
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
        mono = (finite @ self.fit_matrix)[:, ::-1]
        with np.errstate(invalid="ignore", over="ignore"):
            err = np.abs(mono @ self.check_matrix.T - vals[:, m:])
            ok = (err <= allowed(vals[:, m:])).all(axis=1)
        good = np.isfinite(vals).all(axis=1) & ~saturated.any(axis=1) & ok
        return mono, good, saturated.all(axis=1)

    def __call__(self, s_lo, s_hi, lp, suspect):
        """Both modes' (coef, row_code) from the exact log-edges at each row's points."""
        tol = self.tol
        top = (s_hi == -lp) | (np.abs(s_hi + lp) <= _allowed(s_hi, tol))
        zero = s_lo == -math.inf
        out = {}
        for log in (True, False):
            if log:
                lo, hi = s_lo, s_hi
                allowed = lambda v: _allowed(v, tol)  # noqa: E731
            else:
                with np.errstate(over="ignore"):
                    lo, hi = np.exp(s_lo), np.exp(s_hi)
                allowed = lambda v: tol * np.abs(v)  # noqa: E731
            c_lo, ok_lo, sat_lo = self._edge(lo, zero, allowed)
            c_hi, ok_hi, sat_hi = self._edge(hi, top, allowed)
            c_lo[sat_lo] = 0.0
            c_lo[sat_lo, -1] = -math.inf if log else 0.0
            c_hi[sat_hi] = 0.0
            exact = ~((ok_lo | sat_lo) & (ok_hi | sat_hi)) | suspect.any(axis=1)
            code = np.where(sat_hi, ROW_TOP, 0) | np.where(exact, ROW_EXACT, 0)
            coef = np.stack((c_lo, c_hi), axis=2).reshape(-1, ROW)
            out[log] = (coef, code.astype(np.int32))
        return out


def _allowed(s: np.ndarray, tol: float) -> np.ndarray:
    """Largest error of a log-edge that keeps it and its ratio within ``tol``."""
    with np.errstate(over="ignore"):
        ratio = np.maximum(1.0, 1e-6 * np.exp(-s))  # r >= 1e-6: relative; below: absolute
    # No table can beat the rounding of the solver that fills it: allow 16 ulp of s.
    floor = 16 * np.finfo(np.float64).eps * np.abs(s)
    return np.maximum(tol * np.minimum(np.maximum(np.abs(s), 1e-6), ratio), floor)


def build_tables(div, delta: float, layout: str = "float64") -> dict[bool, Table]:
    """Build and validate the tables of ``div`` at ``delta``: ``{log: Table}`` for log-edges
    (``True``) and ratios (``False``); see the module docstring."""
    kbits, tol, refine = (LAYOUTS[layout][k] for k in ("kbits", "tol", "refine"))
    fit = _Fitter(tol)
    w = fit.w
    z = np.concatenate((_cell_points(kbits, NB_LO, w), _cell_points(kbits, NB_HI, w)))
    high = np.zeros(z.shape, dtype=bool)
    n_low = NB_LO << kbits
    high[n_low:] = True
    modes = fit(*_solve_z(div, z, high, delta, refine))

    # Rows that miss: SUBBITS more mantissa bits pick one of 2^SUBBITS subrows, appended
    # after the main rows; subrows that still miss are solved exactly.  Then the two
    # catch-all cells (p below 2^-NB_LO, 1 - p below 2^-NB_HI): always exact.
    nsub = 1 << SUBBITS
    failed = np.nonzero(((modes[True][1] | modes[False][1]) & ROW_EXACT) != 0)[0]
    frac = ((np.arange(nsub)[:, None] + w) / nsub)[None]  # (1, nsub, points)
    c = np.where(failed < n_low, failed, failed - n_low)
    b, j = (c >> kbits)[:, None, None], (c & ((1 << kbits) - 1))[:, None, None]
    z_sub = np.ldexp(1.0 + (j + frac) / (1 << kbits), -(b + 1))
    z_sub = z_sub.reshape(failed.size * nsub, -1)
    high_sub = np.repeat(failed >= n_low, nsub)[:, None] & np.ones(z_sub.shape[1], bool)
    sub = fit(*_solve_z(div, z_sub, high_sub, delta, refine)) if failed.size else None

    ncell = z.shape[0]
    rows = np.arange(ncell, dtype=np.int64)
    info = np.empty(ncell + 2, dtype=np.int64)
    info[:n_low] = rows[:n_low] << 4
    info[n_low + 1 : ncell + 1] = rows[n_low:] << 4
    info[failed + (failed >= n_low)] = ((ncell + nsub * np.arange(failed.size)) << 4) | SUBBITS
    catch_all = ncell + nsub * failed.size  # one exact row for both catch-all cells
    info[n_low] = info[ncell + 1] = catch_all << 4
    tables = {}
    for log in (True, False):
        coef, code = modes[log]
        if sub is not None:
            coef = np.concatenate((coef, sub[log][0]))
            code = np.concatenate((code, sub[log][1]))
        coef = np.concatenate((coef, np.zeros((1, ROW))))
        code = np.concatenate((code, [ROW_EXACT])).astype(np.int32)
        tables[log] = Table(kbits, np.ascontiguousarray(coef).reshape(-1), code, info)
    return tables


def tables(div, delta: float, layout: str = "float64") -> dict[bool, Table]:
    """The cached tables of ``div`` at ``delta``, built on first use."""
    key = (*_key(div), float(delta), layout)
    with _LOCK:
        found = _TABLES.get(key)
        if found is not None:
            _TABLES.move_to_end(key)
            return found
    built = _stored_or_built(div, delta, layout)
    with _LOCK:
        _TABLES[key] = built
        while len(_TABLES) > MAX_TABLES:
            _TABLES.popitem(last=False)
    return built


def _stored_or_built(div, delta: float, layout: str) -> dict[bool, Table]:
    """The tables from the private cache (:mod:`._table_store`: verified arrays, no pickle)
    when an earlier process built them with the same kernels and code, else built here and
    stored."""
    kbits = LAYOUTS[layout]["kbits"]
    k = _table_store.key(kernels(div).__name__, delta,
                         f"{layout} {sorted(LAYOUTS[layout].items())} {SUBBITS} {NB_LO} {NB_HI}")
    cells = ((NB_LO + NB_HI) << kbits) + 2
    found = _table_store.load(k, kbits, cells, ROW, Table)
    if found is None:
        found = build_tables(div, delta, layout)
        _table_store.store(k, found)
    return found


# ----------------------------------------------------------------------------- backend


def _scalar_delta(delta):
    if isinstance(delta, bool):
        return None
    if isinstance(delta, (int, float, np.floating)):
        return float(delta)
    if isinstance(delta, np.ndarray) and delta.ndim == 0 and delta.dtype.kind in "fi":
        return float(delta)
    return None


def _fast(div, p, delta, *, logp, invalid, check, log):
    """The closed-form pass (ratios of p, where :func:`has_closed_pass`) or the table path;
    None when the input does not qualify (not a float array with one scalar delta)."""
    d = _scalar_delta(delta)
    if (
        d is None
        or not isinstance(p, np.ndarray)
        or p.dtype not in (np.float32, np.float64)
        or p.size == 0
    ):
        return None
    if not (d > 0 and math.isfinite(d)):
        if check and invalid == "raise":
            raise BandError(f"delta must lie in (0, inf); got {d!r}")
        return None  # the general path gives nan everywhere
    mod = kernels(div)
    x = np.ascontiguousarray(p).reshape(-1)
    out_lo = np.empty(x.shape, dtype=p.dtype)
    out_hi = np.empty(x.shape, dtype=p.dtype)
    block_bad = np.empty(-(-x.size // BLOCK), dtype=np.int64)
    closed = LP_CLOSED if logp else math.exp(LP_CLOSED)
    at_one = lower_at_one(div, d, log)
    layout = "float32" if p.dtype == np.float32 else "float64"
    if not (logp or log) and has_closed_pass(div):
        mod.closed_pass(x, d, closed, at_one, LAYOUTS[layout]["small_edge"], out_lo, out_hi,
                        block_bad)
    else:
        tab = tables(div, d, layout)[bool(log)]
        mod.table_pass(x, bool(logp), bool(log), tab.coef, tab.row_code, tab.cells_info,
                       tab.kbits, NB_LO, NB_HI, closed, at_one, out_lo, out_hi, block_bad)
    if block_bad.any():  # a few elements left: the exact path, on those alone
        idx = mod.unfinished(out_lo, block_bad)
        sub = x[idx]
        if check and invalid == "raise":
            with np.errstate(invalid="ignore"):
                bad_p, _ = invalid_masks(sub, np.float64(d), logp, np.isnan, np.isinf)
            if bad_p.any():  # report the first invalid element of the whole array
                with np.errstate(invalid="ignore"):
                    bad_p, bad_d = invalid_masks(p, np.float64(d), logp, np.isnan, np.isinf)
                raise_invalid(bad_p, p, bad_d, np.float64(d), logp)
        out_lo[idx], out_hi[idx] = _exact(div, sub, d, logp=logp, invalid="nan", check=False,
                                          log=log)
    return out_lo.reshape(p.shape), out_hi.reshape(p.shape)


def lower_at_one(div, delta: float, log: bool) -> float:
    """The lower edge at ``p = 1`` (:meth:`fbands.Divergence.lower_limit_at_one`; ``log``:
    its log, solved in log space as the numpy backend does), cached per divergence and
    delta."""
    key = (*_key(div), float(delta), bool(log))
    found = _AT_ONE.get(key)
    if found is None:
        found = _AT_ONE[key] = float(
            numpy_backend.log_edges(div, 1.0, float(delta), logp=False, invalid="raise",
                                    check=False)[0]
            if log else div.lower_limit_at_one(delta)
        )
        if len(_AT_ONE) > 4 * MAX_TABLES:
            _AT_ONE.pop(next(iter(_AT_ONE)))
    return found


def _general(div, p, delta, *, logp, invalid, check, log):
    """Every element by the scalar solver (refined in extended precision where float64
    cannot resolve a lower edge, as the numpy backend does)."""
    x = NumpyInputs(p, delta, logp=logp, invalid=invalid, check=check)
    mod = kernels(div)
    flat = [np.ascontiguousarray(a, dtype=np.float64).reshape(-1)
            for a in (x.lp, x.lq, x.p, x.q, x.delta)]
    lo, hi = np.empty_like(flat[0]), np.empty_like(flat[0])
    mod.solve_arrays(*flat, lo, hi)
    with np.errstate(all="ignore"):
        refine = LAYOUTS["float32" if x.dtype == np.float32 else "float64"]["refine"]
        lo = numpy_backend.refine_near_saturation(div, _solver.Inputs(*flat), lo,
                                                  from_logp=logp, above=refine)
    return x.finish(lo.reshape(x.shape), hi.reshape(x.shape), log=log)


def _special(p, logp: bool):
    """Elements the shared solver treats apart: ``p == 1`` (the limit equation) and
    ``log p < LP_CLOSED`` (closed forms underflow; tails of f)."""
    x = np.asarray(p)
    one, small = (0.0, LP_CLOSED) if logp else (1.0, math.exp(LP_CLOSED))
    return (x == one) | (x < small)


def _exact(div, p, delta, *, logp, invalid, check, log):
    """The general path, with the special elements handed to the numpy solver."""
    out = _general(div, p, delta, logp=logp, invalid=invalid, check=check, log=log)
    special = _special(p, logp)
    if not special.any():
        return out
    solve = numpy_backend.log_edges if log else numpy_backend.edges
    if np.ndim(out[0]) == 0:  # a scalar: the numpy backend answers it whole
        return solve(div, p, delta, logp=logp, invalid=invalid, check=check)
    lo, hi = (np.array(a, copy=True) for a in out)
    shape = lo.shape
    special = np.broadcast_to(special, shape)
    d = np.broadcast_to(np.asarray(delta, dtype=np.float64), shape)[special]
    x = np.broadcast_to(np.asarray(p, dtype=np.float64), shape)[special]
    s_lo, s_hi = solve(div, x, d, logp=logp, invalid="nan", check=False)
    lo[special], hi[special] = s_lo, s_hi
    return lo, hi


def _run(div, p, delta, *, logp, invalid, check, log):
    out = _fast(div, p, delta, logp=logp, invalid=invalid, check=check, log=log)
    if out is None:
        out = _exact(div, p, delta, logp=logp, invalid=invalid, check=check, log=log)
    return out


def log_edges(div, p, delta, *, logp, invalid, check):
    """``(log lower, log upper)`` of the band (see :func:`fbands.log_bounds`)."""
    return _run(div, p, delta, logp=logp, invalid=invalid, check=check, log=True)


def edges(div, p, delta, *, logp, invalid, check):
    """``(lower, upper)`` of the band (see :func:`fbands.bounds`)."""
    return _run(div, p, delta, logp=logp, invalid=invalid, check=check, log=False)
