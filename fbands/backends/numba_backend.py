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
  ``(divergence, delta)`` a table of both log-edges is built once with the exact solver
  and cached.  It is cut into cells in ``log p`` for ``p <= 1/2`` and in ``log(1 - p)``
  above (both edges are smooth functions of these; near ``p = 1`` the lower edge has a
  ``q log q`` term that a variable like ``sqrt(-log p)`` would not resolve), and on each cell
  both log-edges are interpolated at Chebyshev nodes by polynomials (:data:`LAYOUTS`:
  narrower cells and a lower degree for float32 outputs).  Every cell is validated
  against the exact solver at points between the nodes; a cell that misses the tolerance,
  or that contains a saturation threshold (the edge switching to ``r = 0`` or ``r = 1/p``),
  is marked to be solved exactly element by element.  The pass over the data is
  branch-free and calls no libm function (``log`` and ``exp`` are inlined polynomial
  versions), so that it vectorises: per element, two logarithms, two table reads, two
  polynomials and, for ratios rather than log-ratios, two exponentials.

Environment: ``FBANDS_CACHE_DIR`` (default ``~/.cache/fbands``) holds the generated modules
and numba's cache next to them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import sys
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

import numba  # noqa: F401  (the import error tells bands.py that this backend is unusable)
import numpy as np

from fbands import symbolic
from fbands._solver import LP_CLOSED
from fbands.backends import _numba_template as template
from fbands.backends import numpy_backend
from fbands.bands import NumpyInputs, invalid_masks, raise_invalid
from fbands.errors import BandError

__all__ = ["LAYOUTS", "kernels", "table", "log_edges", "edges"]

#: Table layout per output precision: cell width (in log p below p = 1/2, in log(1 - p)
#: above), polynomial degree, and the accuracy a cell must reach at its validation points
#: (the error of a log-edge ``s`` below ``tol * max(|s|, 1e-6)`` and that of the ratio
#: ``exp(s)`` below ``tol * max(exp(s), 1e-6)``).  float32 needs far less than float64, and
#: a low degree means few table reads per element.
LAYOUTS = {
    "float64": {"cell": 0.25, "degree": 11, "tol": 1e-13},
    "float32": {"cell": 1.0 / 16.0, "degree": 5, "tol": 1e-10},
}
#: Subcells per cell for the cells the polynomials do not resolve.
SUBDIV = 16
#: Lowest log(1 - p) of the cells for p > 1/2; closer to 1, the upper edge is 1 / p (the
#: rest of the vocabulary keeps less than e^-60 of the mass) and the lower edge is that of
#: the first cell when f'(inf) is finite (its error is O(q log q), below 1e-24); when
#: f'(inf) is infinite it creeps to 1 like 1 / log(1 / q), and such elements are solved
#: exactly.
Y_MIN = -60.0
#: The log p cells reach down to log p = -T_LOW (below every float32 probability); smaller
#: probabilities are solved exactly.
T_LOW = 110.0
#: How many (divergence, delta) tables are kept.
MAX_TABLES = 64

_LOCK = threading.Lock()
_MODULES: dict[tuple[str, str], object] = {}
_TABLES: OrderedDict = OrderedDict()


# ----------------------------------------------------------------------------- generated code


def cache_dir() -> Path:
    """Where generated modules (and numba's cache files beside them) live."""
    root = os.environ.get("FBANDS_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "fbands"
    )
    path = Path(root) / "numba"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".probe{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError:
        path = Path(tempfile.gettempdir()) / "fbands-numba"
        path.mkdir(parents=True, exist_ok=True)
    return path


def module_source(div) -> str:
    """The complete numba module of one divergence (see :mod:`._numba_template`)."""
    src = div.sources
    curv = div.curvature
    curv = curv if math.isfinite(curv) and curv > 0 else 1.0
    parts = [template.HEADER.format(name=div.name, f0=div.f0, curv=curv, near=symbolic.NEAR,
                                    slow_at_one=math.isinf(div.fprime_inf))]

    def fn(key: str, name: str) -> str:
        return "@njit(**OPTS)\n" + src[key].replace("def _fn(", f"def {name}(", 1) + "\n"

    parts.append(fn("F_far", "F_far"))
    near_differs = src["F_near"] != src["F_far"]
    parts.append(fn("F_near", "F_near") if near_differs else "F_near = F_far\n")
    parts.append(fn("dF", "dF"))
    d = div.derivation
    for edge, cf in (("upper", d.upper), ("lower", d.lower)):
        if cf is not None:
            for i in (2, 1, 0):
                parts.append(fn(f"{edge}_a{i}", f"{edge}_a{i}"))
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
    return "".join(parts)


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
        digest = hashlib.sha1(source.encode()).hexdigest()[:16]
        safe = "".join(c if c.isalnum() else "_" for c in div.name)
        path = cache_dir() / f"fbands_{safe}_{digest}.py"
        if not path.exists():  # never rewrite: numba's cache is keyed by the file's stamp
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


# ----------------------------------------------------------------------------- tables


class Table:
    """Interpolation table of both log-edges of one divergence at one delta.

    ``coef[k, j, e]``: coefficient of ``u**(degree - j)`` on cell ``k`` for edge ``e``
    (0 lower, 1 upper), interleaved so that one cell is one contiguous read.
    ``code[k, e]``: 0 polynomial, 1 saturated, 2 solve exactly, 3 see the subcells
    ``sub[k] ... sub[k] + SUBDIV - 1`` (rows appended after the main cells).
    """

    def __init__(self, t0, n_low, inv_h, coef, code, sub):
        self.t0, self.n_low, self.inv_h = t0, n_low, inv_h
        self.coef, self.code, self.sub = coef, code, sub

    @property
    def exact_fraction(self) -> float:
        """Share of the p-range (in cells) solved element by element."""
        n = self.sub.size
        bad = (self.code[:n] == 2).any(axis=1).astype(float)
        refined = self.sub >= 0
        if refined.any():
            parts = (self.code[n:] == 2).any(axis=1).reshape(-1, SUBDIV).mean(axis=1)
            bad[refined] = parts
        return float(bad.mean())


def _solve_exact(mod, lp, delta):
    with np.errstate(all="ignore"):
        q = np.maximum(-np.expm1(lp), 1e-300)
        lq, p = np.log(q), np.exp(lp)
    lo, hi = np.empty_like(lp), np.empty_like(lp)
    mod.solve_arrays(lp, lq, p, q, np.full_like(lp, delta), lo, hi)
    return lo, hi


def _horner(coef: np.ndarray, u: np.ndarray) -> np.ndarray:
    out = np.repeat(coef[:, :1], u.shape[1], axis=1)
    for j in range(1, coef.shape[1]):
        out = out * u + coef[:, j : j + 1]
    return out


def _allowed(s: np.ndarray, tol: float) -> np.ndarray:
    """Largest error of a log-edge that keeps it and its ratio within ``tol``."""
    with np.errstate(over="ignore"):
        ratio = np.maximum(1.0, 1e-6 * np.exp(-s))  # r >= 1e-6: relative; below: absolute
    # No table can beat the rounding of the solver that fills it: allow 16 ulp of s.
    floor = 16 * np.finfo(np.float64).eps * np.abs(s)
    return np.maximum(tol * np.minimum(np.maximum(np.abs(s), 1e-6), ratio), floor)


def build_table(div, delta: float, layout: str = "float64") -> Table:
    """Build and validate the table of ``div`` at ``delta`` (see the module docstring)."""
    mod = kernels(div)
    cell, degree, tol = (LAYOUTS[layout][k] for k in ("cell", "degree", "tol"))
    n_low = int(round(T_LOW / cell))
    n_high = int(math.ceil((-math.log(2.0) - Y_MIN) / cell))  # the last cell passes p = 1/2
    t0 = -math.log(2.0) - n_low * cell
    ncell = n_low + n_high
    m = degree + 1
    # Chebyshev nodes of the first kind in u, and validation points between and around them.
    u_nodes = np.cos(np.pi * (np.arange(m) + 0.5) / m)[::-1]
    u_check = np.concatenate(([-1.0], 0.5 * (u_nodes[1:] + u_nodes[:-1]), [1.0]))
    w = (np.concatenate((u_nodes, u_check))[None, :] + 1.0) / 2.0
    lp_low = t0 + cell * (np.arange(n_low)[:, None] + w)
    lq_high = Y_MIN + cell * (np.arange(n_high)[:, None] + w)
    lp = np.concatenate((lp_low, np.log1p(-np.exp(lq_high))))
    fit = _Fitter(mod, float(delta), m, tol, u_check)
    coef, code = fit(lp)

    # Cells the polynomials do not resolve (a saturation threshold, an edge that closes in on
    # 1 / p faster than any polynomial follows): cut each into SUBDIV subcells, appended to
    # the table; subcells that still fail are solved exactly.
    bad = np.nonzero((code == 2).any(axis=1))[0]
    sub = np.full(ncell, -1, dtype=np.int32)
    if bad.size:
        frac = (np.arange(SUBDIV)[:, None] + w) / SUBDIV  # (SUBDIV, points) in [0, 1]
        pos = bad[:, None, None] + frac[None]  # in cells
        low = bad < n_low
        lp_sub = np.where(
            low[:, None, None],
            t0 + cell * pos,
            np.log1p(-np.exp(Y_MIN + cell * (pos - n_low))),
        ).reshape(bad.size * SUBDIV, -1)
        coef_s, code_s = fit(lp_sub)
        sub[bad] = ncell + SUBDIV * np.arange(bad.size, dtype=np.int32)
        code[bad] = 3
        coef = np.ascontiguousarray(np.concatenate((coef, coef_s)))
        code = np.ascontiguousarray(np.concatenate((code, code_s)))
    return Table(t0, n_low, 1.0 / cell, coef, code, sub)


class _Fitter:
    """Chebyshev interpolation and validation of both log-edges on rows of abscissae."""

    def __init__(self, mod, delta, m, tol, u_check):
        self.mod, self.delta, self.m, self.tol, self.u_check = mod, delta, m, tol, u_check
        theta = np.pi * (np.arange(m) + 0.5) / m
        self.basis = np.cos(np.outer(np.arange(m), theta))[:, ::-1]  # T_j at the nodes
        self.to_mono = np.zeros((m, m))  # row j: ascending monomial coefficients of T_j
        for j in range(m):
            c = np.polynomial.chebyshev.cheb2poly(np.eye(m)[j])
            self.to_mono[j, : c.size] = c

    def __call__(self, lp: np.ndarray):
        """lp: (cells, m nodes + m + 1 checks) -> coef (cells, m, 2), code (cells, 2)."""
        m, tol = self.m, self.tol
        lo, hi = _solve_exact(self.mod, lp.ravel(), self.delta)
        lo, hi = lo.reshape(lp.shape), hi.reshape(lp.shape)
        coefs, codes = [], []
        for vals, saturated in ((lo, lo == -math.inf), (hi, hi == -lp)):
            node_vals = np.where(saturated[:, :m] | ~np.isfinite(vals[:, :m]), 0.0, vals[:, :m])
            cheb = node_vals @ self.basis.T * (2.0 / m)
            cheb[:, 0] /= 2.0
            mono = np.ascontiguousarray((cheb @ self.to_mono)[:, ::-1])  # highest power first
            approx = _horner(mono, np.broadcast_to(self.u_check, (lp.shape[0], m + 1)))
            exact = vals[:, m:]
            with np.errstate(invalid="ignore"):
                ok = np.abs(approx - exact) <= _allowed(exact, tol)
                if vals is hi:  # an upper edge within rounding of 1 / p is read as 1 / p
                    saturated = saturated | (np.abs(vals + lp) <= _allowed(vals, tol))
            all_sat = saturated.all(axis=1)
            any_sat = saturated.any(axis=1)
            good = np.isfinite(vals).all(axis=1) & ~any_sat & ok.all(axis=1)
            codes.append(np.where(all_sat, 1, np.where(good, 0, 2)).astype(np.int8))
            coefs.append(mono)
        return np.stack(coefs, axis=2), np.stack(codes, axis=1)


def table(div, delta: float, layout: str = "float64") -> Table:
    """The cached table of ``div`` at ``delta``, built on first use."""
    key = (*_key(div), float(delta), layout)
    with _LOCK:
        found = _TABLES.get(key)
        if found is not None:
            _TABLES.move_to_end(key)
            return found
    built = build_table(div, delta, layout)
    with _LOCK:
        _TABLES[key] = built
        while len(_TABLES) > MAX_TABLES:
            _TABLES.popitem(last=False)
    return built


# ----------------------------------------------------------------------------- backend


def _scalar_delta(delta):
    if isinstance(delta, bool):
        return None
    if isinstance(delta, (int, float)):
        return float(delta)
    if isinstance(delta, np.ndarray) and delta.ndim == 0 and delta.dtype.kind in "fi":
        return float(delta)
    if isinstance(delta, np.floating):
        return float(delta)
    return None


def _fast(div, p, delta, *, logp, invalid, check, log):
    """The table path, or None when the input does not qualify."""
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
    tab = table(div, d, "float32" if p.dtype == np.float32 else "float64")
    mod = kernels(div)
    x = np.ascontiguousarray(p).reshape(-1)
    out_lo = np.empty(x.shape, dtype=p.dtype)
    out_hi = np.empty(x.shape, dtype=p.dtype)
    flag = np.empty(x.shape, dtype=np.uint8)
    mod.table_pass(
        x, bool(logp), tab.t0, tab.inv_h, tab.n_low, Y_MIN, tab.coef, tab.code, tab.sub,
        SUBDIV, bool(log), out_lo, out_hi, flag,
    )
    if flag.any():  # a byte per element: cheap next to the pass itself
        if check and invalid == "raise" and (flag == 2).any():
            with np.errstate(invalid="ignore"):
                bad_p, bad_d = invalid_masks(p, np.float64(d), logp, np.isnan, np.isinf)
            raise_invalid(bad_p, p, bad_d, np.float64(d), logp)
        mod.exact_pass(x, bool(logp), d, bool(log), out_lo, out_hi, flag)
    return out_lo.reshape(p.shape), out_hi.reshape(p.shape)


def _general(div, p, delta, *, logp, invalid, check, log):
    x = NumpyInputs(p, delta, logp=logp, invalid=invalid, check=check)
    mod = kernels(div)
    flat = [np.ascontiguousarray(a, dtype=np.float64).reshape(-1)
            for a in (x.lp, x.lq, x.p, x.q, x.delta)]
    lo, hi = np.empty_like(flat[0]), np.empty_like(flat[0])
    mod.solve_arrays(*flat, lo, hi)
    return x.finish(lo.reshape(x.shape), hi.reshape(x.shape), log=log)


def _special(p, logp: bool):
    """Elements the shared solver treats apart: ``p == 1`` (the limit equation) and
    ``log p < LP_CLOSED`` (closed forms underflow; tails of f)."""
    x = np.asarray(p)
    one, small = (0.0, LP_CLOSED) if logp else (1.0, math.exp(LP_CLOSED))
    return (x == one) | (x < small)


def _run(div, p, delta, *, logp, invalid, check, log):
    out = _fast(div, p, delta, logp=logp, invalid=invalid, check=check, log=log)
    if out is None:
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


def log_edges(div, p, delta, *, logp, invalid, check):
    """``(log lower, log upper)`` of the band (see :func:`fbands.log_bounds`)."""
    return _run(div, p, delta, logp=logp, invalid=invalid, check=check, log=True)


def edges(div, p, delta, *, logp, invalid, check):
    """``(lower, upper)`` of the band (see :func:`fbands.bounds`)."""
    return _run(div, p, delta, logp=logp, invalid=invalid, check=check, log=False)
