"""The band grids and the ``device-grid`` path (issue 40): what a GPU tensor's loss reads.

Every check runs the path a CUDA tensor takes on CPU tensors (``path="device-grid"``) or on
``meta`` tensors (no values: any host read fails), against the 60-digit reference of
:mod:`tests.reference`, never against fbands' own solver.
"""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fbands
from fbands._dispatch import DEVICE_GRID, compute, plan
from fbands.divergences import get
from fbands.tables import grid as G
from fbands.tables import store
from fbands.tables.cache import TABLES

from .. import reference as ref
from .._sync import SyncDetector

#: Divergences of the accuracy tests: every built-in and four members of the alpha family.
NAMES = ["kl", "reverse_kl", "tv", "chi2", "neyman_chi2", "hellinger", "js", "alpha(a=3)",
         "alpha(a=0.5)", "alpha(a=-1)", "alpha(a=3/2)"]
F32 = np.float32
EPS = float(np.finfo(F32).eps)


def _grid_edges(name, x, delta):
    TABLES.grid(get(name), delta, "float32")  # (else a radius's first eager call defers it)
    t = torch.as_tensor(np.asarray(x, F32))
    lo, hi = compute("log_edges", name, t, delta, "torch", logp=True, check=False,
                     path=DEVICE_GRID)
    return lo.numpy().astype(np.float64), hi.numpy().astype(np.float64)


def _reference_log_edges(name, x, delta):
    """60-digit ``(log lower, log upper)`` at ``log p = x`` (a float32 value, exactly)."""
    f = ref.TABLE[name]
    with mp.workdps(ref.DPS):
        if x == 0.0:
            return float(mp.log(ref.lower_at_one(name, delta))), 0.0
        lower, upper = ref.edges(f, mp.exp(mp.mpf(float(x))), delta)
        return (float(mp.log(lower)) if lower > 0 else -math.inf), float(mp.log(upper))


def _error(got, want, floor):
    """Error in float32 epsilons of the edge (of ``floor`` below it in magnitude); 0 where
    the edge is beyond float32's range and the grid says so."""
    if got == want:
        return 0.0
    if abs(want) > float(np.finfo(F32).max) * G.OVERFLOW and got == math.copysign(math.inf, want):
        return 0.0
    return abs(got - want) / (EPS * max(abs(want), floor))


def _points(name, delta):
    """log p values where the grid must hold: LLM-like values, the far tail, both
    saturation thresholds and the floats beside them, and p next to 1."""
    div = get(name)
    x_lo, x_hi = G._thresholds(div, delta, F32)
    pts = [-1e30, -1e6, -745.0, -103.0, -30.0, -9.2, -2.3, -0.7, -0.1, -1e-4, -1e-7,
           -1e-20, -1e-38, -1e-44]
    for t in (x_lo, x_hi):
        if t is not None and -1e4 < t < 0:
            pts += [t, float(np.nextafter(F32(t), F32(-np.inf))),
                    float(np.nextafter(F32(t), F32(0)))]
    return sorted(set(float(F32(p)) for p in pts if p < 0))


@pytest.mark.parametrize("name", NAMES)
def test_grid_matches_the_60_digit_reference(name):
    delta = 0.05
    floor = G.GRIDS["float32"]["floor"]
    xs = _points(name, delta)
    lo, hi = _grid_edges(name, xs, delta)
    for x, g_lo, g_hi in zip(xs, lo, hi, strict=True):
        w_lo, w_hi = _reference_log_edges(name, x, delta)
        assert _error(g_lo, w_lo, floor) <= G.FLOAT32_BOUND, (name, x, g_lo, w_lo)
        assert _error(g_hi, w_hi, floor) <= G.FLOAT32_BOUND, (name, x, g_hi, w_hi)


@pytest.mark.parametrize("name", ["kl", "tv", "chi2", "reverse_kl"])
def test_grid_limits_are_exact(name):
    """p = 0: [0, inf) exactly; p = 1: the lower limit and an upper log-edge of +0.0;
    invalid log-probabilities: nan."""
    delta = 0.05
    lo, hi = _grid_edges(name, [-np.inf, 0.0, -0.0, np.nan, 1e-45, 0.5, np.inf], delta)
    assert lo[0] == -math.inf and hi[0] == math.inf
    at_one = float(F32(mp.log(ref.lower_at_one(name, delta))))
    assert lo[1] == lo[2] and abs(lo[1] - at_one) <= EPS * abs(at_one)
    assert hi[1] == 0.0 and hi[2] == 0.0 and math.copysign(1.0, hi[1]) == 1.0
    assert np.isnan(lo[3:]).all() and np.isnan(hi[3:]).all()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(NAMES),
       x=st.floats(-200.0, 0.0, width=32, allow_subnormal=True))
def test_grid_holds_anywhere_in_the_llm_range(name, x):
    delta = 0.05
    (g_lo,), (g_hi,) = _grid_edges(name, [x], delta)
    w_lo, w_hi = _reference_log_edges(name, x, delta)
    floor = G.GRIDS["float32"]["floor"]
    assert _error(g_lo, w_lo, floor) <= G.FLOAT32_BOUND
    assert _error(g_hi, w_hi, floor) <= G.FLOAT32_BOUND


@pytest.mark.parametrize("delta", [0.05, pytest.param(1e-3, marks=pytest.mark.slow),
                                   pytest.param(0.5, marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", NAMES)
def test_grid_build_meets_its_bound(name, delta):
    grid = TABLES.grid(get(name), delta, "float32")
    assert grid.worst <= G.FLOAT32_BOUND
    assert np.all(np.diff(grid.bounds) > 0) and grid.rows.shape == (len(grid.bounds) + 1,
                                                                      *G.ROW_SHAPE)


def test_bf16_and_fp16_read_the_float32_grid_rounded_once():
    x = torch.log(torch.tensor([0.9, 0.3, 1e-3, 1e-5]))
    want_lo, want_hi = _grid_edges("kl", x.numpy(), 0.05)
    for dtype in (torch.bfloat16, torch.float16):
        xd = x.to(dtype)
        lo, hi = compute("log_edges", "kl", xd, 0.05, "torch", logp=True, check=False,
                         path=DEVICE_GRID)
        assert lo.dtype == dtype
        ref_lo, ref_hi = _grid_edges("kl", xd.float().numpy(), 0.05)
        assert torch.equal(lo, torch.from_numpy(ref_lo).to(dtype))
        assert torch.equal(hi, torch.from_numpy(ref_hi).to(dtype))


def test_a_gpu_tensor_plans_the_grid_and_other_calls_do_not():
    div, x = get("kl"), torch.zeros(3, device="meta")
    assert plan(div, x, 0.05, logp=True, log=True).path == DEVICE_GRID
    assert plan(div, x.float(), 0.05, logp=False, log=True).path != DEVICE_GRID  # ratios
    assert plan(div, x.double(), 0.05, logp=True, log=True).path != DEVICE_GRID
    assert plan(div, torch.zeros(3), 0.05, logp=True, log=True).path != DEVICE_GRID  # CPU
    assert plan(div, x, 1e-9, logp=True, log=True).path != DEVICE_GRID  # below the tables'


def test_a_radius_builds_its_grid_on_its_second_eager_call(tmp_path, monkeypatch):
    """A radius met once (a delta schedule's) reads the tables, which build only the
    cells its tokens reach; its second call builds the grid and reads it from then on."""
    monkeypatch.setenv("FBANDS_CACHE_DIR", str(tmp_path))  # (no grid stored)
    x = torch.log(torch.rand(4, 64, generator=torch.Generator().manual_seed(1)))
    d = 0.0421
    calls = []
    for _ in range(3):
        with SyncDetector() as det:
            calls.append(compute("log_edges", "js", x, d, "torch", logp=True, check=False,
                                 path=DEVICE_GRID))
        calls[-1] = (*calls[-1], len(det.syncs))
    tables = compute("log_edges", "js", x, d, "torch", logp=True, check=False,
                     path="device-table")
    assert torch.equal(calls[0][0], tables[0]) and torch.equal(calls[0][1], tables[1])
    assert calls[0][2] >= 1 and calls[1][2] == 0 and calls[2][2] == 0  # (the tables wait)
    assert torch.equal(calls[1][0], calls[2][0])
    torch.testing.assert_close(calls[1][0], tables[0], rtol=G.FLOAT32_BOUND * EPS, atol=0)
    assert not TABLES.grid_deferred(get("js"), d, "float32")


def test_grid_read_is_a_small_sync_free_graph_even_on_meta():
    """The goal of issue 40: the warm band of a float32 tensor is a fixed graph of at most
    twenty aten ops and no host read; on a meta tensor (no values at all) as well."""
    x = torch.log(torch.rand(8, 64) * 0.9 + 0.02)
    for t in (x, torch.empty(8, 64, device="meta")):
        compute("log_edges", "kl", t, 0.05, "torch", logp=True, check=False, path=DEVICE_GRID)
        with SyncDetector() as det:
            lo, hi = compute("log_edges", "kl", t, 0.05, "torch", logp=True, check=False,
                             path=DEVICE_GRID)
        assert det.syncs == [] and det.uploads == [] and det.op_count <= 20, det.report()
        assert lo.shape == t.shape and lo.device == t.device


def test_grid_checks_when_asked():
    with pytest.raises(fbands.BandError, match="log p"):
        compute("log_edges", "kl", torch.tensor([-1.0, 0.5]), 0.05, "torch", logp=True,
                check=True, path=DEVICE_GRID)


def test_stored_grid_round_trips_and_a_damaged_one_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("FBANDS_CACHE_DIR", str(tmp_path))
    grid = TABLES.grid(get("tv"), 0.05, "float32")
    assert store.store_grid("k" * 64, grid)
    back = store.load_grid("k" * 64, "float32")
    assert np.array_equal(back.bounds, grid.bounds)
    assert np.array_equal(back.rows, grid.rows, equal_nan=True)
    assert store.load_grid("k" * 64, "float64") is None  # another dtype: refused
    archive = next(tmp_path.rglob("k" * 64 + ".npz"))
    archive.write_bytes(archive.read_bytes()[:-7] + b"garbage")
    assert store.load_grid("k" * 64, "float32") is None


def test_a_grid_read_while_a_cuda_graph_is_captured_outlives_eviction(monkeypatch):
    """A captured graph replays reads of the grid's memory: the grid must not be freed when
    later radii push it out of the cache (the capture is simulated: no GPU here)."""
    from fbands.tables import torch_reader

    div = get("tv")
    monkeypatch.setattr(torch_reader, "_capturing", lambda device: True)
    captured = torch_reader.device_grid(div, 0.05, "float32", torch.device("cpu"))
    monkeypatch.setattr(torch_reader, "_capturing", lambda device: False)
    try:
        for i in range(10**3):  # later radii push the grid out of the cache
            torch_reader._GRIDS.put(("x", i), None)
        key = (div.key, 0.05, "float32", torch.device("cpu"))
        assert key not in torch_reader._GRIDS
        assert len(torch_reader._GRIDS) == torch_reader._GRIDS.max_entries
        assert torch_reader._CAPTURED.get(key) is captured
    finally:
        torch_reader._GRIDS.clear()
    assert not torch_reader._capturing(torch.device("cpu"))


@pytest.mark.parametrize("preset", ["band-kl", "band-tv", "band-mask-tv"])
def test_precompute_band_of_a_divergence_on_a_device_reads_nothing_back(preset):
    """The whole band of a batch as a GPU trainer computes it (a meta tensor stands in for
    the GPU: any host read fails there): no sync, no upload, a few dozen ops."""
    from fbands import losses as fl

    logp, mask = torch.empty(8, 64, device="meta"), torch.ones(8, 64, device="meta")
    cfg = fl.preset(preset)
    fl.precompute_band(logp, cfg, mask=mask)  # the radius's grid reaches the device
    with SyncDetector() as det:
        band = fl.precompute_band(logp, cfg, mask=mask)
    assert det.syncs == [] and det.uploads == [] and det.op_count <= 40, det.report()
    assert band.log_lower.is_meta and band.log_upper.shape == (8, 64)


@pytest.mark.slow
def test_the_grid_compiles_fullgraph_in_seconds_and_takes_a_new_radius():
    """torch.compile(fullgraph=True) of the band a GPU's loss reads traces a graph of a few
    nodes (it was 31,000, two minutes on this machine); a radius whose grid eager calls
    have built compiles anew and gives the eager call's edges."""
    import time

    x = torch.log(torch.rand(4096, generator=torch.Generator().manual_seed(0)))

    def band(t, d):
        return compute("log_edges", "kl", t, d, "torch", logp=True, check=False,
                       path=DEVICE_GRID)

    for d in (0.05, 0.08):
        band(x, d)  # a radius's first eager call reads the tables,
        band(x, d)  # its second builds the grid
    compiled = torch.compile(band, fullgraph=True)
    start = time.perf_counter()
    compiled(x, 0.05)
    assert time.perf_counter() - start < 120  # (about 3 s on 2 cores)
    for d in (0.08, 0.05):
        got, want = compiled(x, d), band(x, d)
        for g_, w_ in zip(got, want, strict=True):
            torch.testing.assert_close(g_, w_, rtol=G.FLOAT32_BOUND * EPS, atol=0)
