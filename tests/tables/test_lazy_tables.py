"""Tables built cell by cell (fbands.tables.build.TableSet): a new radius builds only what its data
reaches, and the result is the same as from a complete table and from the exact solver."""

from __future__ import annotations

import numpy as np
import pytest

import fbands

nb = pytest.importorskip("fbands._jit.backend")
from fbands._jit import table_kernels as kernels  # noqa: E402
from fbands.tables import layout as _table_layout  # noqa: E402
from fbands.tables.build import TableSet  # noqa: E402
from fbands.tables.cache import TABLES  # noqa: E402


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    monkeypatch.setenv("FBANDS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(TABLES, "_sets", type(TABLES._sets)())
    monkeypatch.setattr(TABLES, "_derived", {})


def _exact(p, delta, div, log=False, logp=False):
    fn = fbands.log_bounds if log else fbands.bounds
    return fn(p, np.full(p.shape, delta), div, backend="numba", logp=logp)


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    with np.errstate(all="ignore"):
        return float(np.max(np.where(same, 0.0, np.abs(a - b) / np.abs(b)), initial=0.0))


@pytest.mark.parametrize("div", ["kl", "triangular"])
def test_a_new_radius_builds_the_cells_its_data_reaches(fresh, div, user_divergence):
    d = fbands.get(div)
    delta = 0.0437
    rng = np.random.default_rng(1)
    p = np.exp(rng.uniform(np.log(1e-3), np.log(0.2), 5000))  # a few binades only
    got = fbands.log_bounds(p, delta, div, backend="numba")
    ts = TABLES.table_set(d, delta, "float64", nb.NUMBA_FILLER)
    n_built = int(ts.built.sum())
    assert 2 < n_built < ts.built.size // 10
    for g, w in zip(got, _exact(p, delta, div, log=True), strict=True):
        assert _rel(g, w) <= 1e-12
    # Data in other cells: those are built too, and read correctly at once.
    q = 1.0 - np.exp(rng.uniform(np.log(1e-9), np.log(1e-2), 5000))
    got = fbands.log_bounds(q, delta, div, backend="numba")
    assert ts.built.sum() > n_built
    for g, w in zip(got, _exact(q, delta, div, log=True), strict=True):
        assert _rel(g, w) <= 1e-12
    # float32 log-probabilities: the float32 layout, its own cells.
    lp = np.log(p).astype(np.float32)
    got = fbands.log_bounds(lp, delta, div, backend="numba", logp=True)
    for g, w in zip(got, _exact(lp.astype(np.float64), delta, div, log=True, logp=True),
                    strict=True):
        w32 = w.astype(np.float32)
        with np.errstate(invalid="ignore"):
            one_ulp = np.abs(g - w32) <= np.spacing(np.abs(w32))
        assert np.all((g == w32) | one_ulp)


def test_a_cell_built_alone_equals_the_complete_tables(fresh):
    d = fbands.get("kl")
    ts = TABLES.table_set(d, 0.05, "float32", nb.NUMBA_FILLER)
    p = np.linspace(0.3, 0.31, 100).astype(np.float32)
    touched = np.zeros(ts.built.size, dtype=np.uint8)
    kernels.touched_cells(p, False, ts.kbits, 0.0, touched)
    ts.cover(touched.view(bool))
    partial = ts.modes
    full = TableSet(d, 0.05, "float32", nb.NUMBA_FILLER).complete()
    out = {}
    for name, tabs in (("partial", partial), ("full", full)):
        tab = tabs[True]
        lo, hi = np.empty_like(p), np.empty_like(p)
        left = nb._read(tab, p, False, True, 0.0, 0.0, lo, hi)
        assert left.size == 0
        out[name] = (lo, hi)
    np.testing.assert_array_equal(out["partial"][0], out["full"][0])
    np.testing.assert_array_equal(out["partial"][1], out["full"][1])


def test_a_radius_that_comes_back_gets_every_cell(fresh):
    """A radius met once builds only the cells its data reaches; its next call completes
    the tables and stores them, so that no later call, nor a later process, builds
    anything.  Every table is exact to the float64 tolerance, the rows that give KL's
    tiny lower edge as an exp included."""
    d, delta = fbands.get("kl"), 0.0437
    rng = np.random.default_rng(3)
    p = np.exp(rng.uniform(np.log(1e-6), np.log(1e-3), 20000))  # KL's r_lo ~ exp(-delta/p)
    want = _exact(p, delta, "kl")
    got = fbands.bounds(p, delta, "kl", backend="numba")
    ts = TABLES.table_set(d, delta, "float64", nb.NUMBA_FILLER)
    assert not ts.is_complete
    code = ts.modes[False].row_code
    assert np.any(code & _table_layout.ROW_EXP_LO)
    for g, w in zip(got, want, strict=True):  # (an ulp of a subnormal edge is more)
        assert np.all(np.abs(g - w) <= np.maximum(1e-12 * w, np.spacing(w)))
    other = 1.0 - np.exp(rng.uniform(np.log(1e-9), np.log(1e-2), 2000))  # cells not built
    got = fbands.bounds(other, delta, "kl", backend="numba")
    ts = TABLES.table_set(d, delta, "float64", nb.NUMBA_FILLER)
    assert ts.is_complete
    for g, w in zip(got, _exact(other, delta, "kl"), strict=True):
        assert np.all(np.abs(g - w) <= np.maximum(1e-12 * w, np.spacing(w)))
    for g, w in zip(fbands.bounds(p, delta, "kl", backend="numba"), want, strict=True):
        assert np.all(np.abs(g - w) <= np.maximum(1e-12 * w, np.spacing(w)))
    # A fresh process reads the stored tables: every cell, nothing built.
    TABLES.clear()
    fbands.bounds(p[:10], delta, "kl", backend="numba")  # (the first call: cells it reaches)
    built = TableSet._add
    try:
        TableSet._add = None  # building now would fail
        fbands.bounds(p[:10], delta, "kl", backend="numba")
    finally:
        TableSet._add = built
    assert TABLES.table_set(d, delta, "float64", nb.NUMBA_FILLER).is_complete


@pytest.mark.parametrize("logp", [False, True])
@pytest.mark.parametrize("kbits", [4, 6])
def test_cell_mask_marks_the_cells_of_the_numba_scan(logp, kbits):
    """The array form of the cell scan (torch operations: what a torch call's first use of a
    radius builds) and its scalar twin in the numba kernels mark the same cells, invalid
    input, p = 0, p = 1 and the tails included."""
    import math

    torch = pytest.importorskip("torch")
    from fbands._solver import LP_CLOSED
    from fbands.tables import torch_reader

    gen = np.random.default_rng(kbits)
    lp = np.concatenate((-np.exp(gen.uniform(-40, 6, 5000)), [0.0, -np.inf, np.nan, 1.0,
                                                              -160.0, -1e-300]))
    x = lp if logp else np.exp(lp)
    closed = LP_CLOSED if logp else math.exp(LP_CLOSED)
    touched = np.zeros(_table_layout.cell_count(kbits), dtype=np.uint8)
    kernels.touched_cells(x, logp, kbits, closed, touched)
    got = torch_reader.cells_reached(torch.from_numpy(x), logp, kbits)
    np.testing.assert_array_equal(got, touched.view(bool))
