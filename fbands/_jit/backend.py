r"""numba backend: the band on numpy arrays by JIT-compiled, parallel kernels.

Three paths, which :func:`fbands._dispatch.plan` chooses between
(:data:`fbands._paths.PATHS`), and :func:`run` carries out:

* **exact** (per-element ``delta``, any dtype, scalars): the inputs are prepared by
  :class:`fbands._inputs.NumpyInputs` and each element is solved by the scalar form of the
  solver (:mod:`fbands._jit.scalar`: closed form, or safeguarded Newton stopping per
  element), in parallel over the cores.
* **table** (a float32 or float64 array with one scalar ``delta``, the usual case): the
  interpolation tables of the ``(divergence, delta)`` pair (:mod:`fbands.tables`), built
  cell by cell as the data reaches them, their points solved by the same scalar form
  (:data:`NUMBA_FILLER`), and cached, read by one pass
  (:func:`fbands._jit.table_kernels.table_pass`).
* **closed-pass** (ratios of ``p`` with one scalar ``delta``, for divergences whose closed
  forms needed no squaring): the roots of the sympy polynomials, chosen and clamped
  without a branch (:mod:`fbands._jit.closed_pass`); no table to build.

Both passes write a nan lower edge for what they leave to the exact solver and keep a
tally per block of :data:`~fbands._jit.prims.BLOCK` elements, so that finding those few
elements afterwards reads only the blocks that hold one.  Nothing is compiled at
``import fbands``; the first call for a divergence and dtype pays for it (a few seconds,
once per machine: :mod:`fbands._jit.loader` keeps numba's cache on disk).
"""

from __future__ import annotations

from dataclasses import replace

import numba  # (the import error tells fbands that this backend is unusable)
import numpy as np

from fbands import _solver
from fbands._band_function import P_CLOSED
from fbands._inputs import NumpyInputs, Request, check_values, invalid_masks
from fbands._jit import loader, table_kernels, threads
from fbands._jit.loader import is_ready
from fbands._jit.prims import BLOCK, unfinished
from fbands._paths import CLOSED_PASS, EXACT, TABLE, Plan
from fbands._refine import refine_near_saturation, solve_huge_radius
from fbands._solver import LP_CLOSED, Inputs
from fbands.tables.build import LAYOUTS, Filler, Table
from fbands.tables.cache import TABLES
from fbands.tables.layout import ROW_EXP_LO, cell_count, locate_array, prepare_z_array

__all__ = ["closed_pass", "exact", "is_ready", "precompile", "run", "table"]


def _layout(dtype) -> str:
    return "float32" if dtype == np.float32 else "float64"


def _blocks(n: int) -> int:
    return -(-n // BLOCK)


def run(plan: Plan, div, p, delta, request: Request):
    """Carry out ``plan``: one of the numba paths (:data:`~fbands._paths.PATHS`)."""
    return _PATHS[plan.path](div, p, delta, request)


def closed_pass(div, p, delta, request: Request):
    """The closed-form pass over a float32 or float64 array ``p`` of ratios, for one valid
    scalar ``delta``."""
    d = float(delta)
    x, out_lo, out_hi = _flat(p)
    block_bad = np.empty(_blocks(x.size), dtype=np.int64)
    layout = _layout(p.dtype)
    at_one = TABLES.at_one(div, d, layout, False, NUMBA_FILLER)
    with threads.sized(x.size, "pass"):
        loader.kernels(div).closed_pass(x, d, P_CLOSED, at_one,
                                        LAYOUTS[layout]["small_edge"], out_lo, out_hi,
                                        block_bad)
        idx = unfinished(out_lo, block_bad) if block_bad.any() else np.arange(0)
    return _finish(div, p, d, x, idx, out_lo, out_hi, request)


def table(div, p, delta, request: Request):
    """The table pass over a float32 or float64 array ``p`` (or log p), for one valid
    scalar ``delta``."""
    d = float(delta)
    logp, log = request.logp, request.log
    x, out_lo, out_hi = _flat(p)
    closed = LP_CLOSED if logp else P_CLOSED
    layout = _layout(p.dtype)
    at_one = TABLES.at_one(div, d, layout, bool(log), NUMBA_FILLER)

    def reached(kbits: int) -> np.ndarray:
        touched = np.zeros(cell_count(kbits), dtype=np.uint8)
        with threads.sized(x.size, "touch"):
            table_kernels.touched_cells(x, bool(logp), kbits, closed, touched)
        return touched.view(bool)

    ts = TABLES.reading_set(div, d, layout, reached, NUMBA_FILLER)
    idx = _read(ts.modes[bool(log)], x, logp, log, closed, at_one, out_lo, out_hi)
    return _finish(div, p, d, x, idx, out_lo, out_hi, request)


def _flat(p):
    x = np.ascontiguousarray(p).reshape(-1)
    return x, np.empty(x.shape, dtype=p.dtype), np.empty(x.shape, dtype=p.dtype)


def _read(tab: Table, x, logp, log, closed, at_one, out_lo, out_hi) -> np.ndarray:
    """The table pass over the flat array ``x`` into ``out_lo``, ``out_hi``, then the rows
    whose lower edge is an exponential; returns the indices of the elements left to the
    exact solver."""
    block_bad = np.empty(_blocks(x.size), dtype=np.int64)
    exp_rows = (tab.exp_lo and x.size >= 16 * EXP_SAMPLE
                and _exp_share(tab, x, logp, closed) > EXP_PASS_FROM)
    with threads.sized(x.size, "pass"):
        table_kernels.table_pass(x, bool(logp), bool(log), exp_rows, tab.coef, tab.row_code,
                                 tab.cells_info, tab.kbits, closed, at_one, out_lo, out_hi,
                                 block_bad)
        idx = unfinished(out_lo, block_bad) if block_bad.any() else np.arange(0)
        if idx.size and tab.exp_lo and not exp_rows:
            idx = idx[table_kernels.finish_exp_rows(x, idx, bool(logp), tab.coef,
                                                    tab.row_code, tab.cells_info, tab.kbits,
                                                    closed, at_one, out_lo, out_hi)]
    return idx


#: The share of elements on rows whose lower edge is an exponential above which the pass
#: takes their exp itself (an exp for every element) rather than leaving them to a second,
#: gathering pass (about three passes' worth per element it takes); both give the same bits.
EXP_PASS_FROM = 0.1
#: How many elements, evenly spaced, :func:`_exp_share` looks at (in arrays of at least 16
#: times as many: in a smaller one the second pass costs less than looking).
EXP_SAMPLE = 512


def _exp_share(tab: Table, x, logp, closed) -> float:
    """The share of ``x``'s elements, estimated on :data:`EXP_SAMPLE` of them, that read a
    row whose lower edge is an exponential."""
    sample = x[:: max(1, x.size // EXP_SAMPLE)].astype(np.float64)
    with np.errstate(all="ignore"):
        _, z, high, _ = prepare_z_array(sample, bool(logp), closed, np.where, np.exp, np.expm1)
    row, _ = locate_array(z.view(np.int64), high, tab.cells_info, tab.kbits, np.where,
                          np.float64)
    return float(np.mean((tab.row_code[row] & ROW_EXP_LO) != 0))


def _finish(div, p, d, x, idx, out_lo, out_hi, request: Request):
    """The elements ``idx`` that a pass left, by the exact path on those alone."""
    if idx.size:
        sub = x[idx]
        if request.raises:
            with np.errstate(invalid="ignore"):
                bad_p, _ = invalid_masks(sub, d, request.logp)
            if bad_p.any():  # report the first invalid element of the whole array
                check_values(p, d, request.logp)
        out_lo[idx], out_hi[idx] = exact(div, sub, d, replace(request, invalid="nan",
                                                              check=False))
    return out_lo.reshape(p.shape), out_hi.reshape(p.shape)


def _solve_arrays(div, x: _solver.Inputs):
    """Log-edges of prepared flat float64 inputs by the compiled scalar solver alone."""
    lo, hi = np.empty_like(x.lp), np.empty_like(x.lp)
    with threads.sized(lo.size, "exact"):
        loader.kernels(div).solve_arrays(x.lp, x.lq, x.p, x.q, x.delta, lo, hi)
    return lo, hi


#: The numba passes' tables are filled by the scalar solver that solves the elements they
#: leave (so a radius's first call here costs a third of what numpy's solver would); the
#: bits depend on the kernels' package (their code and the divergence's) and numba's version.
NUMBA_FILLER = Filler("numba", _solve_arrays,
                      lambda div: f"{loader.kernels(div).name} numba {numba.__version__}")


def _scalar_log_edges(div, x: _solver.Inputs, refine: float, *, from_logp: bool):
    """Exact log-edges of prepared flat float64 inputs (the scalar twin of
    :func:`fbands._refine.exact_log_edges`): the compiled scalar solver
    (:mod:`fbands._jit.scalar`), then the lower edges that float64 cannot resolve redone in
    extended precision (:func:`fbands._refine.refine_near_saturation`,
    above the error ``refine``), and the elements of a huge radius
    (:func:`fbands._refine.solve_huge_radius`)."""
    lo, hi = _solve_arrays(div, x)
    with np.errstate(all="ignore"):
        lo = refine_near_saturation(div, x, lo, from_logp=from_logp, above=refine)
        return solve_huge_radius(div, x, lo, hi, from_logp=from_logp)


def exact(div, p, delta, request: Request):
    """Every element by the scalar form of the solver (refined in extended precision where
    float64 cannot resolve a lower edge, as the numpy backend does)."""
    x = NumpyInputs(p, delta, request)
    flat = Inputs(*(np.ascontiguousarray(a, dtype=np.float64).reshape(-1)
                    for a in (x.lp, x.lq, x.p, x.q, x.delta)))
    lo, hi = _scalar_log_edges(div, flat, LAYOUTS[_layout(x.dtype)]["refine"],
                             from_logp=request.logp)
    return x.finish(lo.reshape(x.shape), hi.reshape(x.shape))


#: The radius whose tables :func:`precompile` reads (any would do: the kernels take a
#: table's arrays, whatever its radius).
AHEAD_DELTA = 0.05


def precompile(div, dtype: str) -> None:
    """Compile, or load from the disk cache, every kernel that a numba call of ``div`` on
    ``dtype`` (``"float32"`` or ``"float64"``) arrays can reach, and record that it is ready
    (:func:`fbands._jit.loader.is_ready`, which ``backend="auto"`` asks).

    Every path runs on ratios and on log-probabilities, with ratio and log outputs, on data
    that leaves an element to the exact solver (a log p below ``LP_CLOSED``); the two table
    kernels that depend on the data (the cells a new radius reaches, the rows of exponential
    lower edges) are called directly on an empty selection."""
    t = np.dtype(dtype).type
    ratios = np.array([0.5, 1.0, 1e-300], dtype=t)
    logs = np.array([-0.7, 0.0, 2.0 * LP_CLOSED], dtype=t)
    for logp, x in ((False, ratios), (True, logs)):
        paths = (table,) if logp or not div.closed_form_edges else (table, closed_pass)
        for path in paths:
            for log in (False, True):
                path(div, x, AHEAD_DELTA, Request(logp=logp, log=log, invalid="nan",
                                                  check=False))
    ts = TABLES.table_set(div, AHEAD_DELTA, _layout(ratios.dtype), NUMBA_FILLER)
    closed = P_CLOSED
    table_kernels.touched_cells(ratios, False, ts.kbits, closed,
                                np.zeros(ts.built.size, dtype=np.uint8))
    tab, out = ts.modes[False], np.empty_like(ratios)
    table_kernels.finish_exp_rows(ratios, np.arange(0, dtype=np.int64), False, tab.coef,
                                  tab.row_code, tab.cells_info, tab.kbits, closed,
                                  TABLES.at_one(div, AHEAD_DELTA, _layout(ratios.dtype), False,
                                                NUMBA_FILLER),
                                  out, out.copy())
    loader.mark_ready(div, dtype)


#: Path name (:data:`fbands._paths.PATHS`) -> its implementation.
_PATHS = {CLOSED_PASS: closed_pass, TABLE: table, EXACT: exact}
