"""The torch backend: agreement with numpy, dtype/shape/device rules, no grad, no host sync.

Every torch path runs here on CPU tensors: the automatic choice (``numba`` for CPU tensors),
and, forced through the ``path`` keyword of the backend, the two device paths that CUDA
takes (``device-table`` for one scalar radius, ``device-solver`` for a radius per token).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fbands  # noqa: E402
from fbands import _dispatch as bands  # noqa: E402
from fbands.backends import torch_backend  # noqa: E402


@pytest.fixture(params=[None, "device"])
def cpu_kernel(request):
    """CPU tensors on the automatic path (numba), or forced onto the device paths."""
    return request.param


def _call(log, p, delta, div="kl", *, path, logp=False, invalid="raise", check=True, **kw):
    """The torch backend's edges, on ``path``; ``"device"``: the device path a CUDA tensor
    would take (tables for one scalar radius, the solver for a radius per element)."""
    if path == "device":
        path = bands.DEVICE_SOLVER if isinstance(delta, torch.Tensor) else bands.DEVICE_TABLE
    return bands.compute("log_edges" if log else "edges", fbands.get(div), p, delta, "torch",
                         logp=logp, invalid=invalid, check=check, path=path, **kw)


def _bounds(path):
    def fn(p, delta, div="kl", **kw):
        return _call(False, p, delta, div, path=path, **kw)
    return fn


def _log_bounds(path):
    def fn(p, delta, div="kl", **kw):
        return _call(True, p, delta, div, path=path, **kw)
    return fn


P = np.concatenate([np.logspace(-12, -0.31, 40), 1 - np.logspace(-9, -0.31, 25)])
DELTAS = (1e-4, 0.05, 1.0)


def _rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    both_inf = np.isinf(a) & np.isinf(b) & (np.sign(a) == np.sign(b))
    with np.errstate(invalid="ignore"):
        err = np.abs(a - b) / np.maximum(np.abs(b), 1e-6)
    return float(np.max(np.where(both_inf, 0.0, err)))


@pytest.mark.parametrize("div", ["kl", "tv", "hellinger", "js", "alpha(a=3)"])
@pytest.mark.parametrize("log", [False, True])
def test_agrees_with_numpy_float64(div, log, cpu_kernel):
    fn = _log_bounds(cpu_kernel) if log else _bounds(cpu_kernel)
    p = np.broadcast_to(P, (len(DELTAS), P.size))
    d = np.array(DELTAS)[:, None]
    ref = (fbands.log_bounds if log else fbands.bounds)(p, d, div, backend="numpy")
    got = fn(torch.from_numpy(p.copy()), torch.from_numpy(d), div)
    for g, r in zip(got, ref, strict=True):
        assert isinstance(g, torch.Tensor) and g.dtype == torch.float64
        assert _rel(g.numpy(), r) <= 1e-12


def test_logp_input_matches_p_input(cpu_kernel):
    lp = torch.log(torch.from_numpy(P))
    a = _log_bounds(cpu_kernel)(lp, 0.05, "kl", logp=True)
    b = _log_bounds(cpu_kernel)(torch.from_numpy(P), 0.05, "kl")
    for x, y in zip(a, b, strict=True):
        assert _rel(x.numpy(), y.numpy()) <= 1e-12


def test_logp_minus_inf_is_the_p_to_zero_limit(cpu_kernel):
    lo, hi = _log_bounds(cpu_kernel)(torch.tensor([-math.inf, -1.0]), 0.05, "kl", logp=True)
    assert lo[0] == -math.inf and hi[0] == math.inf
    assert torch.isfinite(lo[1]) and torch.isfinite(hi[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_low_precision_is_computed_in_float64_and_rounded_once(dtype, cpu_kernel):
    p = torch.tensor([0.001, 0.02, 0.3, 0.9], dtype=dtype)
    lo, hi = _bounds(cpu_kernel)(p, 0.05, "kl")
    assert lo.dtype == hi.dtype == dtype and lo.shape == p.shape
    ref_lo, ref_hi = fbands.bounds(p.double().numpy(), 0.05, "kl", backend="numpy")
    assert torch.equal(lo, torch.from_numpy(ref_lo).to(dtype))
    assert torch.equal(hi, torch.from_numpy(ref_hi).to(dtype))


def test_shape_and_per_token_delta_broadcast(cpu_kernel):
    p = torch.full((2, 3, 4), 0.1)
    delta = torch.tensor([0.01, 0.05, 0.2, 1.0])  # one radius per position
    lo, hi = _bounds(cpu_kernel)(p, delta, "chi2")
    assert lo.shape == hi.shape == (2, 3, 4)
    assert torch.all(hi[..., 1:] > hi[..., :-1])  # the band widens with delta
    assert torch.all(lo[..., 1:] <= lo[..., :-1])
    expected = 1 + torch.sqrt(delta.double() * 0.9 / 0.1)
    assert torch.allclose(hi[0, 0].double(), expected, rtol=1e-6)


def test_zero_dim_and_non_tensor_inputs_keep_their_kind(cpu_kernel):
    lo, hi = _bounds(cpu_kernel)(torch.tensor(0.2), 0.05, "tv")
    assert lo.shape == () and abs(float(hi) - 1.25) < 1e-6
    flo, fhi = fbands.bounds(0.2, 0.05, "tv", backend="torch")
    assert isinstance(flo, float) and abs(fhi - 1.25) < 1e-15
    alo, ahi = fbands.bounds(np.array([0.2, 0.5]), 0.05, "tv", backend="torch")
    assert isinstance(alo, np.ndarray) and np.allclose(ahi, [1.25, 1.1])


def test_no_autograd_graph_unless_asked(cpu_kernel):
    lp = torch.log(torch.tensor([0.1, 0.5], dtype=torch.float64))
    lo, hi = _log_bounds(cpu_kernel)(lp, 0.05, "kl", logp=True)
    assert not lo.requires_grad and not hi.requires_grad and lo.grad_fn is None
    with torch.no_grad():
        lo, hi = _log_bounds(cpu_kernel)(lp.requires_grad_(), 0.05, "kl", logp=True)
    assert lo.grad_fn is None and hi.grad_fn is None
    lo, hi = _log_bounds(cpu_kernel)(lp, 0.05, "kl", logp=True)
    assert lo.grad_fn is not None and hi.grad_fn is not None


#: (divergence, p, delta): interior edges on both sides, and a saturated lower edge (tv,
#: p < delta) and upper edge (kl, p close to 1).
GRAD_POINTS = [("kl", 0.3, 0.05), ("js", 0.02, 0.3), ("tv", 0.6, 0.05), ("tv", 0.01, 0.05),
               ("kl", 0.99, 0.05), ("chi2", 0.2, 0.7), ("hellinger", 1e-3, 0.01)]


@pytest.mark.parametrize("div, p, delta", GRAD_POINTS)
def test_implicit_gradients_against_60_digit_derivatives(cpu_kernel, div, p, delta):
    """d edge / dp and d edge / d delta (of ratios, and of log-ratios from log p) against
    numerical derivatives of the independent 60-digit bisection of tests/reference.py."""
    import mpmath as mp

    from ..reference import GENERATORS, edges

    f = GENERATORS[div]
    with mp.workdps(60):
        def edge(i, pp, dd):
            return edges(f, pp, dd)[i]

        want = {(i, wrt): mp.diff(lambda t, i=i, wrt=wrt: edge(i, t, delta) if wrt == 0
                                  else edge(i, p, t), p if wrt == 0 else delta, h=mp.mpf(10) ** -20)
                for i in (0, 1) for wrt in (0, 1)}
        r = [edge(i, p, delta) for i in (0, 1)]
    for i in (0, 1):
        pt = torch.tensor(p, dtype=torch.float64, requires_grad=True)
        dt = torch.tensor(delta, dtype=torch.float64, requires_grad=True)
        gp, gd = torch.autograd.grad(_bounds(cpu_kernel)(pt, dt, div)[i], (pt, dt))
        for got, key in ((gp, (i, 0)), (gd, (i, 1))):
            assert float(got) == pytest.approx(float(want[key]), rel=1e-9, abs=1e-12), key
        if r[i] == 0:
            continue
        # log-edges from log p: d log r / d log p = (p / r) dr/dp; d log r / d delta = dr/dd / r
        lt = torch.tensor(math.log(p), dtype=torch.float64, requires_grad=True)
        gl, gd = torch.autograd.grad(_log_bounds(cpu_kernel)(lt, dt, div, logp=True)[i], (lt, dt))
        assert float(gl) == pytest.approx(float(want[(i, 0)] * p / r[i]), rel=1e-9, abs=1e-12)
        assert float(gd) == pytest.approx(float(want[(i, 1)] / r[i]), rel=1e-9, abs=1e-12)


def test_gradients_broadcast_and_keep_dtypes(cpu_kernel):
    p = torch.tensor([[0.1, 0.5, 0.9]], dtype=torch.float32, requires_grad=True)
    delta = torch.tensor([[0.05], [0.2]], dtype=torch.float32, requires_grad=True)
    lo, hi = _bounds(cpu_kernel)(p, delta, "kl")
    assert lo.shape == (2, 3) and lo.dtype == torch.float32
    (lo.sum() + hi.sum()).backward()
    assert p.grad.shape == p.shape and p.grad.dtype == torch.float32
    assert delta.grad.shape == delta.shape and torch.all(delta.grad > 0)  # a wider band
    # a float radius is used as given, not rounded to float32
    p1 = torch.linspace(0.01, 0.99, 2000, dtype=torch.float32).requires_grad_()
    band = _bounds(cpu_kernel)
    assert torch.equal(band(p1, 0.05, "kl")[1], band(p1.detach(), 0.05, "kl")[1])
    with pytest.raises(fbands.BandError, match="gradients need p as a tensor"):
        fbands.bounds(0.5, torch.tensor(0.1, requires_grad=True), "kl", backend="torch")


def test_invalid_input(cpu_kernel):
    with pytest.raises(fbands.BandError, match=r"p must lie in \(0, 1\]; got 1.5 at index \(1,\)"):
        _bounds(cpu_kernel)(torch.tensor([0.5, 1.5]), 0.05)
    with pytest.raises(fbands.BandError, match=r"got 2.0 at index \(1, 0\)"):
        _bounds(cpu_kernel)(torch.tensor([[0.5, 0.2], [2.0, 0.3]]), 0.05)
    with pytest.raises(fbands.BandError, match="delta"):
        _bounds(cpu_kernel)(torch.tensor([0.5]), torch.tensor([-1.0]))
    with pytest.raises(fbands.BandError, match="broadcast"):
        _bounds(cpu_kernel)(torch.full((3,), 0.5), torch.full((2,), 0.1))
    lo, hi = _bounds(cpu_kernel)(torch.tensor([0.5, float("nan"), 0.2]), 0.05, invalid="nan")
    assert torch.isnan(lo[1]) and torch.isnan(hi[1]) and torch.isfinite(lo[[0, 2]]).all()


# ----------------------------------------------------------------------------- device paths


def _sample_p(seed: int, n: int) -> np.ndarray:
    """p across the tables (log-uniform below 1/2 down to e^-150, 1 - p log-uniform above,
    where the rows marked exact are), and p == 1, a subnormal p, the tiny-p regime."""
    rng = np.random.default_rng(seed)
    low = np.exp(rng.uniform(-150.0, math.log(0.5), n))
    high = -np.expm1(-np.exp(rng.uniform(-36.0, math.log(0.5), n)))
    tiny = np.exp(rng.uniform(-700.0, -150.0, 20))  # below e^-150: the exact solver's
    return np.concatenate((low, high, tiny, [0.5, 1.0, 2.0 ** -1074, 1e-300]))


def _ulp(a32, b32) -> int:
    a, b = np.asarray(a32, dtype=np.float32), np.asarray(b32, dtype=np.float32)
    d = np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32).astype(np.int64))
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    return int(np.max(np.where(same, 0, d)))


def _same_as_numba(got, want, dtype, case):
    for g, w in zip(got, want, strict=True):
        g = g.numpy()
        assert g.dtype == w.dtype == dtype, case
        if dtype == np.float64:
            assert _rel(g, w) <= 1e-12, case
        else:
            assert _ulp(g, w) <= 1, case


@pytest.mark.parametrize("div", ["kl", "js", "tv", "hellinger", "chi2", "alpha(a=3)"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_device_table_path_equals_numba(div, dtype):
    """The CUDA path (tables read by torch, the fixed-count solver for what they leave), run
    on CPU tensors: the numba backend's values, float64 to 1e-12, float32 to one ulp, for
    ratios and log-ratios of p and of log p, validated or not."""
    p = _sample_p(1, 300)
    lp = np.concatenate((np.log(p), [-np.inf, 0.0, -1e4, -745.5]))  # the limits, log p only
    for x, logp in ((p, False), (lp, True)):
        x = x.astype(dtype)
        x = x if logp else x[x > 0]  # (float32 flushes the smallest p to 0)
        for log in (False, True):
            want = (fbands.log_bounds if log else fbands.bounds)(
                x, 0.05, div, backend="numba", logp=logp)
            for check in (True, False):
                for sync_free in (False, True):  # leftovers on the host, or on the device
                    got = _call(log, torch.from_numpy(x), 0.05, div, path=bands.DEVICE_TABLE,
                                logp=logp, check=check, sync_free=sync_free)
                    _same_as_numba(got, want, dtype, (logp, log, check, sync_free))


def test_beyond_the_capacity_nan_never_a_wrong_edge():
    """More elements for the solver than the sync-free buffer holds: the first ``capacity``
    are solved, the rest are nan (never the table's unchecked value), checked or not; when
    the call may synchronise (not sync-free) every one is solved."""
    rng = np.random.default_rng(3)
    tiny = rng.uniform(-900.0, -151.0, 40)  # log p below LP_CLOSED: all for the solver
    # p == 1 and p -> 0 are limits that need no solver: the only leftovers are the tiny p
    x = np.concatenate((np.zeros(32), tiny, np.full(8, -np.inf)))
    t = torch.from_numpy(x)
    for log in (False, True):
        want = (fbands.log_bounds if log else fbands.bounds)(x, 0.05, "kl", backend="numba",
                                                              logp=True)
        for check in (True, False):
            got = _call(log, t, 0.05, "kl", path=bands.DEVICE_TABLE, logp=True, check=check,
                        capacity=8, sync_free=False)
            _same_as_numba(got, want, np.float64, log)
            got = _call(log, t, 0.05, "kl", path=bands.DEVICE_TABLE, logp=True, check=check,
                        capacity=8, sync_free=True)
            solved = np.ones(x.size, dtype=bool)
            solved[32 + 8: 32 + 40] = False  # the tiny ones past the first 8
            for g, w in zip(got, want, strict=True):
                g = g.numpy()
                assert np.isnan(g[~solved]).all() and not np.isnan(g[solved]).any()
                assert _rel(g[solved], w[solved]) <= 1e-12


def test_capacity_is_documented_and_bounded():
    assert torch_backend.capacity(10) == 10  # small inputs: every element fits
    assert torch_backend.capacity(torch_backend.MIN_CAPACITY * 4) == torch_backend.MIN_CAPACITY
    n = torch_backend.MIN_CAPACITY * torch_backend.CAPACITY_SHARE * 8
    assert torch_backend.capacity(n) == n // torch_backend.CAPACITY_SHARE


@pytest.mark.parametrize("path", [None, bands.DEVICE_TABLE, bands.DEVICE_SOLVER])
@pytest.mark.parametrize("div", ["js", "tv"])
def test_check_false_gives_the_values_of_check_true(path, div):
    """check=True may skip the solver's branches that no element needs (it has looked);
    the values are the same to the bit."""
    for p in (_sample_p(5, 200), np.linspace(0.01, 0.99, 50)):  # with and without tiny p
        p = torch.from_numpy(p)
        for log in (False, True):
            a = _call(log, p, 0.05, div, path=path, check=True)
            b = _call(log, p, 0.05, div, path=path, check=False)
            for x, y in zip(a, b, strict=True):
                assert torch.equal(x, y)


def test_check_does_not_choose_the_path(monkeypatch):
    """check=False skips validation and nothing more: the same path runs."""
    seen = []
    original = bands.plan

    def spy(*args, **kwargs):  # the paths of each plan: torch's, and numba's under it
        got = original(*args, **kwargs)
        seen.append(got.path)
        return got

    monkeypatch.setattr(bands, "plan", spy)
    p = torch.rand(100, dtype=torch.float64) * 0.9 + 0.05
    runs = {}
    for check in (True, False):
        seen.clear()
        fbands.bounds(p, 0.05, "tv", check=check)  # a CPU tensor: the closed forms
        fbands.bounds(p, torch.full((100,), 0.05), "kl", check=check)  # per-token: on the host
        _call(False, p, 0.05, "kl", path="device", check=check)  # CUDA's path
        runs[check] = list(seen)
    assert runs[True] == runs[False] == [
        "device-closed", "host", "device-table"]


def test_forced_paths_say_why_they_do_not_apply():
    p = torch.tensor([0.2, 0.5], dtype=torch.float64)
    with pytest.raises(fbands.BandError, match="path 'device-table' does not apply: delta"):
        _call(False, p, torch.tensor([0.1, 0.2]), path=bands.DEVICE_TABLE)
    with pytest.raises(fbands.BandError, match="unknown path 'gpu'"):
        _call(False, p, 0.1, path="gpu")
    with pytest.raises(fbands.BandError, match="path 'host' does not apply"):
        _call(False, p.to("meta"), 0.1, path=bands.HOST, check=False)


class _Syncs:
    """Counts calls of the tensor methods that read values on the host (each one a device
    synchronisation on a GPU)."""

    NAMES = ("item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__")

    def __init__(self, monkeypatch):
        self.calls = []
        for name in self.NAMES:
            original = getattr(torch.Tensor, name)

            def counted(t, *args, _name=name, _original=original, **kwargs):
                self.calls.append(_name)
                return _original(t, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counted)


def _sample_lp():
    lp = torch.log(torch.from_numpy(_sample_p(7, 100)))
    return torch.cat((lp, torch.tensor([-math.inf, -400.0], dtype=torch.float64)))


@pytest.mark.parametrize("path", [bands.DEVICE_TABLE, bands.DEVICE_SOLVER])
def test_device_paths_read_nothing_on_the_host_when_compiled(path, monkeypatch):
    """While torch.compile traces (or a CUDA graph is captured), check=False reads no
    tensor's values on the host on either device path: no .item(), .tolist(),
    bool(tensor) ... (on a GPU, each would wait for the device)."""
    lp = _sample_lp()
    delta = 0.05 if path == bands.DEVICE_TABLE else torch.full_like(lp, 0.05)
    for log in (False, True):
        _call(log, lp, delta, "kl", path=path, logp=True, check=False)  # warm: tables, kernels
    want = {log: _call(log, lp, delta, "kl", path=path, logp=True) for log in (False, True)}
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert bands.must_not_sync(lp.device)
    syncs = _Syncs(monkeypatch)
    got = {}
    for log in (False, True):
        got[log] = _call(log, lp, delta, "kl", path=path, logp=True, check=False)
        _call(log, lp, delta, "kl", path=path, logp=True, check=False, invalid="nan")
    assert syncs.calls == []
    _call(False, lp, delta, "kl", path=path, logp=True, check=True)
    assert syncs.calls  # (the counter works: validation synchronises once)
    monkeypatch.undo()
    for log in (False, True):  # the device solver's values, to 1e-12
        for g, w in zip(got[log], want[log], strict=True):
            assert _rel(g.numpy(), w.numpy()) <= 1e-12


def test_eager_device_table_solves_the_leftovers_on_the_host(monkeypatch):
    """Called eagerly, the device-table path waits for the device once, to count what the
    tables leave, and solves those few elements on the host: a handful of operations,
    where the fixed-count solver on the device takes tens of thousands."""
    lp = _sample_lp()
    _call(True, lp, 0.05, "kl", path=bands.DEVICE_TABLE, logp=True, check=False)
    assert not bands.must_not_sync(lp.device)
    syncs = _Syncs(monkeypatch)
    _call(True, lp, 0.05, "kl", path=bands.DEVICE_TABLE, logp=True, check=False)
    assert syncs.calls == ["tolist", "numpy"]  # the count, and the leftovers' copy
    monkeypatch.undo()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        _call(True, lp, 0.05, "kl", path=bands.DEVICE_TABLE, logp=True, check=False)
    eager = sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        _call(True, lp, 0.05, "kl", path=bands.DEVICE_TABLE, logp=True, check=False,
              sync_free=True)
    device = sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))
    assert eager < 500 < 10_000 < device


@pytest.mark.slow  # tracing 60 Newton steps: about a minute a path
@pytest.mark.parametrize("path", [bands.DEVICE_TABLE, bands.DEVICE_SOLVER])
def test_device_paths_compile_with_fullgraph(path):
    """With check=False each device path is one graph: torch.compile(fullgraph=True) raises
    on any graph break, which a host synchronisation in the Python code would cause.  (The
    complete tables and the kernels are built by a radius's second eager call: sympy and
    the build do not trace.)  Eager calls solve the tables' leftovers on the host, the
    compiled one on the device: the same edges to 1e-12."""
    torch._dynamo.reset()
    kl = fbands.get("kl")  # the registry lookup stays outside the graph

    def band(lp, delta):
        return bands.compute("log_edges", kl, lp, delta, "torch", logp=True, invalid="raise",
                             check=False, path=path)

    lp = torch.log(torch.tensor([0.01, 0.3, 0.9, 1.0], dtype=torch.float64))
    lp = torch.cat((lp, torch.tensor([-200.0, -math.inf], dtype=torch.float64)))
    delta = 0.0537 if path == bands.DEVICE_TABLE else torch.full_like(lp, 0.0537)
    band(lp, delta)  # a radius new to the process: the cells it reaches
    ref = band(lp, delta)  # used again: its complete tables
    got = torch.compile(band, backend="eager", fullgraph=True)(lp, delta)
    for g, r in zip(got, ref, strict=True):
        assert _rel(g.numpy(), r.numpy()) <= 1e-12


def test_a_new_radius_on_the_device_path_builds_only_what_its_data_reaches(monkeypatch,
                                                                         tmp_path):
    """An eager device-table call with a radius new to the process reads the cells built so
    far (none), solves the rest on the host and builds their cells there; the radius's
    second call builds its complete tables (what a traced call reads).  Both agree with
    the numba backend.  (An empty cache directory: a run before this one stored the
    complete tables of the radius on disk.)"""
    from fbands.tables.cache import TABLES

    monkeypatch.setenv("FBANDS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(TABLES, "_sets", type(TABLES._sets)())
    monkeypatch.setattr(TABLES, "_derived", {})
    kl, d = fbands.get("kl"), 0.0611
    lp = torch.log(torch.from_numpy(_sample_p(9, 300)))
    want = fbands.log_bounds(lp.numpy(), np.full(lp.shape, d), "kl", backend="numba",
                             logp=True)
    ts = TABLES.table_set(kl, d, "float64")
    assert ts.is_empty
    for complete in (False, True):
        got = _call(True, lp, d, "kl", path=bands.DEVICE_TABLE, logp=True, check=False)
        assert ts.is_complete == complete and not ts.is_empty
        for g, w in zip(got, want, strict=True):
            assert _rel(g.numpy(), w) <= 1e-12
