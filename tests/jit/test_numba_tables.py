"""The numba fast paths against the numba exact solver, densely, over the whole registry.

Ratios of p for divergences with (unsquared) closed forms take the closed-form pass; every
other call with one scalar delta takes the tables.

The table path (a float array with one scalar delta) reads each element's cell off the bits
of ``min(p, 1 - p)`` and evaluates two polynomials; the exact path (per-element delta)
solves every element.  Both share the scalar solver, so they must agree to the table's own
tolerance everywhere: at cell boundaries, in refined cells next to saturation thresholds,
in the catch-all cells (tiny p, p within 2^-90 of 1), for p and log p input, ratios and
log-ratios.  The exact path itself is checked against numpy and a 60-digit reference in
tests/backends/test_backends.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fbands
from fbands.errors import BandError

from .. import _user as user
from .. import reference as ref
from .._speed import registry

pytest.importorskip("numba")
from fbands._jit import backend as numba_backend  # noqa: E402
from fbands._jit import table_kernels as _table_kernels  # noqa: E402
from fbands._solver import LP_CLOSED  # noqa: E402
from fbands.tables import layout as _table_layout  # noqa: E402
from fbands.tables.build import LAYOUTS  # noqa: E402
from fbands.tables.cache import TABLES  # noqa: E402

DIVS = list(ref.TABLE)
pytestmark = pytest.mark.usefixtures("user_divergence")  # tests/_user.py


#: Two steps of float64's subnormal grid: an edge below the smallest normal number has
#: only that absolute resolution, in the exact path as in the tables.
SUBNORMAL_STEP = 2.0 * 2.0**-1074


def rel_err(a, b) -> float:
    """Largest |a - b| / |b|, with equal values (infinities, zeros) and both-nan counting
    as 0, and differences of at most two subnormal steps too."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        same = (a == b) | (np.isnan(a) & np.isnan(b)) | (np.abs(a - b) <= SUBNORMAL_STEP)
        err = np.abs(a - b) / np.abs(b)
    return float(np.max(np.where(same, 0.0, err), initial=0.0))


def ulps32(got, ref64) -> int:
    """Largest distance in float32 ulps between ``got`` and ``ref64`` rounded to float32."""
    assert got.dtype == np.float32
    with np.errstate(over="ignore"):  # edges beyond float32 range are inf in both
        r32 = ref64.astype(np.float32)
    ulps = np.abs(got.view(np.int32).astype(np.int64) - r32.view(np.int32))
    same = (got == r32) | (np.isnan(got) & np.isnan(r32))
    return int(np.max(np.where(same, 0, ulps), initial=0))


def sample_p(seed: int, n: int = 4000) -> np.ndarray:
    """p over the whole table: log-uniform below 1/2 (down past 2^-200), 1 - p log-uniform
    above (down past float64's 2^-53), cell boundaries and a few exact powers of two."""
    rng = np.random.default_rng(seed)
    low = np.exp(rng.uniform(-150.0, math.log(0.5), n))
    high = -np.expm1(-np.exp(rng.uniform(-40.0, math.log(0.5), n)))
    edges = np.ldexp(1.0 + np.arange(64) / 64.0, -rng.integers(1, 12, 64))
    return np.concatenate((low, high, edges, 1.0 - edges, [0.5, 1.0, 2.0 ** -1074]))


def exact(div, x, delta, log, logp=False):
    """The exact path on the same elements: a per-element delta skips the tables."""
    fn = fbands.log_bounds if log else fbands.bounds
    return fn(x, np.full(x.shape, delta), div, backend="numba", logp=logp)


@pytest.mark.parametrize("div", registry(DIVS))
@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), delta=st.sampled_from([1e-4, 0.05, 0.7]))
def test_float64_table_matches_the_exact_solver(div, seed, delta):
    p = sample_p(seed)
    for log in (False, True):
        fn = fbands.log_bounds if log else fbands.bounds
        got = fn(p, delta, div, backend="numba")
        for g, r in zip(got, exact(div, p, delta, log), strict=True):
            assert rel_err(g, r) <= 1e-12, (div, delta, log)


@pytest.mark.parametrize("div", registry(["kl", "js", "alpha(a=3)", "triangular"]))
@settings(max_examples=2, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), delta=st.sampled_from([1e-3, 0.05, 0.7]))
def test_log_probability_input_matches(div, seed, delta):
    rng = np.random.default_rng(seed)
    lp = np.concatenate((-np.exp(rng.uniform(-80.0, 5.5, 3000)), [0.0, -math.inf, -1e-300]))
    for log in (False, True):
        fn = fbands.log_bounds if log else fbands.bounds
        got = fn(lp, delta, div, backend="numba", logp=True)
        for g, r in zip(got, exact(div, lp, delta, log, logp=True), strict=True):
            assert rel_err(g, r) <= 1e-12, (div, delta, log)


@pytest.mark.parametrize("div", registry(DIVS))
def test_float32_fast_paths_are_within_one_ulp_of_the_rounded_exact_edge(div):
    """The tables and, for ratios of p, the closed-form pass (which computes in float64 but
    skips the polish that only a float64 output needs)."""
    p = sample_p(7).astype(np.float32)
    p = p[(p > 0) & (p < 1)]
    for delta in (1e-3, 0.05, 0.7):
        for log in (False, True):
            fn = fbands.log_bounds if log else fbands.bounds
            got = fn(p, delta, div, backend="numba")
            ref64 = exact(div, p.astype(np.float64), delta, log)
            for g, r in zip(got, ref64, strict=True):
                assert ulps32(g, r) <= 1, (div, delta, log)


def _left_to_the_exact_solver(x, delta, div, *, logp, log):
    """Share of ``x`` the table pass and the finishing of exp rows leave to the exact
    solver."""
    d = user.get(div)
    tab = TABLES.complete(d, delta, x.dtype.name)[log]
    lo, hi = np.empty_like(x), np.empty_like(x)
    bad = np.empty(-(-x.size // _table_kernels.BLOCK), np.int64)
    closed = LP_CLOSED if logp else math.exp(LP_CLOSED)
    _table_kernels.table_pass(x, logp, log, False, tab.coef, tab.row_code, tab.cells_info,
                              tab.kbits, closed, 0.5, lo, hi, bad)
    idx = _table_kernels.unfinished(lo, bad)
    left = _table_kernels.finish_exp_rows(x, idx, logp, tab.coef, tab.row_code,
                                          tab.cells_info, tab.kbits, closed, 0.5, lo,
                                          hi)
    return left.sum() / x.size


@pytest.mark.parametrize("div", registry(["kl", "js", "reverse_kl", "hellinger", "triangular"]))
def test_tiny_lower_edges_stay_in_the_table_and_accurate(div):
    """p in [1e-6, 1e-3): KL's lower ratio ~ exp(-delta / p) spans hundreds of orders of
    magnitude over a cell, and underflows float32 (then float64) inside it.  Ratio rows
    there give the edge as exp of a fitted log-edge, or 0 where it rounds to 0 in the
    output: the pass solves them (no more than 0.1% left to the exact solver), within
    1e-12 (float64) and one float32 ulp of the exact path."""
    rng = np.random.default_rng(11)
    p = np.exp(rng.uniform(math.log(1e-6), math.log(1e-3), 20000))
    for delta in (1e-3, 0.05, 0.7):
        for log in (False, True):
            fn = fbands.log_bounds if log else fbands.bounds
            want = exact(div, p, delta, log)
            for g, w in zip(fn(p, delta, div, backend="numba"), want, strict=True):
                assert rel_err(g, w) <= 1e-12, (div, delta, log)
            p32 = p.astype(np.float32)
            want32 = exact(div, p32.astype(np.float64), delta, log)
            for g, w in zip(fn(p32, delta, div, backend="numba"), want32, strict=True):
                assert ulps32(g, w) <= 1, (div, delta, log)
            for x in (p, p32):
                assert _left_to_the_exact_solver(x, delta, div, logp=False, log=log) < 1e-3


def test_the_layout_decodes_what_it_encodes():
    """locate (compiled into the kernels) and locate_array (numpy here, torch on devices)
    read back the cell, row and coordinate of points placed with cell_z, on both sides,
    in refined cells, and in the catch-all cells."""
    L = _table_layout
    kbits = L.KBITS["float32"]
    rng = np.random.default_rng(2)
    info = np.empty(L.cell_count(kbits), np.int64)
    first = rng.permutation(info.size) * 100  # any distinct rows
    extra = rng.choice(L.SUBBITS, info.size)
    catch = np.array([L.high_offset(kbits) - 1, L.cell_count(kbits) - 1])
    extra[catch] = 0  # (as the build makes them: one row each)
    info[:] = L.pack_info(first, extra)
    assert np.array_equal(L.unpack_info(info)[0], first)
    assert np.array_equal(L.unpack_info(info)[1], extra)
    n = 3000
    b = rng.integers(0, max(L.NB_LO, L.NB_HI), n)
    high = rng.random(n) < 0.5
    b = np.where(high, b % L.NB_HI, b)
    j = rng.integers(0, 1 << kbits, n)
    frac = rng.random(n)
    z = L.cell_z(kbits, b, j, frac)
    cell = b * (1 << kbits) + j + np.where(high, L.high_offset(kbits), 0)
    sub = np.floor(frac * (1 << extra[cell])).astype(np.int64)
    want_row = first[cell] + sub
    want_u = 2.0 * (frac * (1 << extra[cell]) - sub) - 1.0
    row, u = L.locate_array(z.view(np.int64), high, info, kbits, np.where, np.float64)
    assert np.array_equal(row, want_row)
    assert np.allclose(u, want_u, rtol=0, atol=1e-9) and np.all((u >= -1) & (u < 1))
    for k in range(0, n, 37):
        r1, u1 = _table_kernels.locate(z[k], bool(high[k]), info, kbits)
        assert (r1, u1) == (row[k], u[k])
    # below the cells: the catch-all cell of each side
    tiny = np.array([2.0**-L.NB_LO / 3, 2.0**-L.NB_HI / 3, 5e-324, 0.0])
    side = np.array([False, True, False, True])
    row, _ = L.locate_array(tiny.view(np.int64), side, info, kbits, np.where, np.float64)
    assert np.array_equal(row, first[catch[[0, 1, 0, 1]]])



def _saturating_closed(name: str) -> bool:
    d = user.get(name)
    return d.closed_form_edges and math.isfinite(d.f0)


SATURATING_CLOSED = [d for d in DIVS if _saturating_closed(d)]


@pytest.mark.parametrize("div", SATURATING_CLOSED)
def test_closed_pass_next_to_the_lower_edges_saturation(div):
    """Where the lower edge leaves 0 (delta = g(p, 0), reached when f(0) is finite) it is
    small and ill-conditioned: the closed-form pass keeps it only from a size its float64
    root resolves for the output's precision (1e-3 for float64, 1e-6 for float32), and the
    exact solver takes the rest."""
    assert {"tv", "chi2", "triangular"} <= set(SATURATING_CLOSED)
    delta = 0.05
    grid = np.linspace(1e-4, 0.999, 20001)
    lo = exact(div, grid, delta, False)[0]
    k = int(np.argmax(lo > 0))  # the first p (on the grid) whose lower edge is not 0
    assert k > 0 and np.all(lo[:k] == 0) and np.all(lo[k:] > 0)
    t = np.geomspace(1e-9, 3e-2, 400)
    p = grid[k] * np.concatenate((1 - t, [1.0], 1 + t))
    for dtype in (np.float64, np.float32):
        x = np.unique(p.astype(dtype))
        want = exact(div, x.astype(np.float64), delta, False)
        got = fbands.bounds(x, delta, div, backend="numba")
        for g, w in zip(got, want, strict=True):
            if dtype == np.float64:
                assert rel_err(g, w) <= 1e-12, div
            else:
                w32 = w.astype(np.float32)
                ulps = np.abs(g.view(np.int32).astype(np.int64) - w32.view(np.int32))
                assert int(np.max(np.where(g == w32, 0, ulps))) <= 1, div

@pytest.mark.slow  # six table pairs
def test_every_row_code_is_valid_and_the_exact_share_is_small():
    for div in ("kl", "tv", "js"):
        for layout in LAYOUTS:
            for log, tab in TABLES.complete(fbands.get(div), 0.05, layout).items():
                assert tab.exact_fraction < 0.01, (div, layout, log)
                rows = tab.coef.size // _table_layout.ROW
                assert tab.row_code.size == rows
                first, extra = _table_layout.unpack_info(tab.cells_info)
                assert np.all(first + (1 << extra) <= rows)
                assert np.isin(extra, _table_layout.SUBBITS).all()
                flags = _table_layout.ROW_TOP | _table_layout.ROW_EXACT
                if not log:
                    flags |= _table_layout.ROW_EXP_LO
                assert np.all((tab.row_code & ~flags) == 0)


def test_invalid_elements_of_a_large_array():
    p = np.full(10_000, 0.3)
    p[[17, 9001]] = [np.nan, 1.5]
    with pytest.raises(BandError, match=r"index \(17,\).*2 invalid"):
        fbands.bounds(p, 0.05, "kl", backend="numba")
    lo, hi = fbands.bounds(p, 0.05, "kl", backend="numba", invalid="nan")
    assert np.isnan(lo[[17, 9001]]).all() and np.isnan(hi[[17, 9001]]).all()
    ok = np.ones(p.size, bool)
    ok[[17, 9001]] = False
    assert np.all(lo[ok] == lo[0]) and np.all(hi[ok] == hi[0])


def test_tables_are_cached_per_divergence_delta_and_layout():
    d = fbands.get("kl")
    a = TABLES.complete(d, 0.05, "float32")
    assert TABLES.complete(d, 0.05, "float32") is a
    assert TABLES.complete(d, 0.05, "float64") is not a
    assert TABLES.complete(d, 0.06, "float32") is not a
    # the numba passes read tables filled by their own exact solver
    from fbands._jit.backend import NUMBA_FILLER

    b = TABLES.complete(d, 0.05, "float32", NUMBA_FILLER)
    assert b is not a and TABLES.complete(d, 0.05, "float32", NUMBA_FILLER) is b


# slow: 20-170 s a divergence (torch solving 1500 points four ways); the quick loop reads
# tables with torch in test_backends
@pytest.mark.slow
@pytest.mark.parametrize("div", ["kl", "js", "triangular"])
def test_torch_reads_the_same_tables(div):
    """torch's evaluation of a table (the device path, here on CPU tensors) against numba's
    pass and against torch's own fixed-count solver.  (The few elements the table leaves
    are solved by each backend's own exact solver.)  p reaches down to 1e-150, through
    the rows of exponentiated log-edges."""
    torch = pytest.importorskip("torch")
    from fbands._dispatch import compute

    d = user.get(div)
    p = sample_p(3, 1500)
    p = p[p > 1e-150]  # the fixed-count solver's range (its tiny-p path is tested apart)
    lp = np.log(p)
    for x, logp in ((p, False), (lp, True)):
        for log in (False, True):
            fn = fbands.log_bounds if log else fbands.bounds
            def solve(d, t, delta, log=log, **kw):
                return compute("log_edges" if log else "edges", d, t, delta, "torch", **kw)
            want = fn(x, 0.05, div, backend="numba", logp=logp)
            t = torch.from_numpy(x)
            opts = dict(logp=logp, invalid="raise", check=True)
            got = solve(d, t, 0.05, path="device-table", **opts)
            newton = solve(d, t, 0.05, path="device-solver", **opts)
            for g, w, n in zip(got, want, newton, strict=True):
                assert rel_err(g.numpy(), w) <= 1e-12, (logp, log)
                assert rel_err(g.numpy(), n.numpy()) <= 1e-12, (logp, log)


def test_probability_one_takes_its_limit_in_the_fast_passes(monkeypatch):
    """p == 1 (log p == 0) is common in float32 log-softmax output: the passes answer it with
    the limit (r*, 1) themselves, identical to the numpy solver's, and log 1 is +0.0."""

    def no_exact_path(*args, **kwargs):
        raise AssertionError("p == 1 went to the exact path")

    monkeypatch.setattr(numba_backend, "exact", no_exact_path)
    for div in ("kl", "reverse_kl", "tv", "chi2"):
        for log in (False, True):
            fn = fbands.log_bounds if log else fbands.bounds
            want = fn(1.0, 0.05, div, backend="numpy")
            for x, logp in ((np.ones(5000), False), (np.zeros(5000, np.float32), True)):
                got = fn(x, 0.05, div, backend="numba", logp=logp)
                for g, w in zip(got, want, strict=True):
                    assert np.all(g == np.asarray(w, dtype=g.dtype)), (div, log, logp)
                if log:
                    assert not np.signbit(got[1]).any()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_rows_of_exponentials_give_the_same_bits_in_either_pass(dtype):
    """KL's lower edge on p in [3e-4, 3e-2) reads rows that give it as an exponential; in a
    large array where many elements do, the pass takes their exp itself, in a small one a
    second pass takes them: each element gets the same bits either way, and the 60-digit
    edge."""
    rng = np.random.default_rng(5)
    p = (10.0 ** rng.uniform(-3.5, -1.5, 1 << 15)).astype(dtype)
    d = fbands.get("kl")
    fbands.bounds(p[:10], 0.05, "kl", backend="numba")  # (builds and completes the tables)
    fbands.bounds(p[:10], 0.05, "kl", backend="numba")
    tab = TABLES.complete(d, 0.05, p.dtype.name, numba_backend.NUMBA_FILLER)[False]
    closed = math.exp(LP_CLOSED)
    assert numba_backend._exp_share(tab, p, False, closed) > numba_backend.EXP_PASS_FROM
    whole = fbands.bounds(p, 0.05, "kl", backend="numba")
    step = 16 * numba_backend.EXP_SAMPLE - 1  # (too small to look: the second pass)
    parts = [fbands.bounds(p[i:i + step], 0.05, "kl", backend="numba")
             for i in range(0, p.size, step)]
    for k in (0, 1):
        np.testing.assert_array_equal(whole[k], np.concatenate([q[k] for q in parts]))
    for i in rng.choice(p.size, 4, replace=False):
        for got, want in zip((whole[0][i], whole[1][i]),
                             ref.edges(ref.GENERATORS["kl"], float(p[i]), 0.05), strict=True):
            want = dtype(float(want))  # (float32: the lower edge may round to 0)
            assert abs(float(got) - float(want)) <= 1e-12 * float(want) + np.spacing(want)
