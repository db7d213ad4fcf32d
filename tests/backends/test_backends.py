"""Every backend against the numpy backend, over the whole registry (table-driven).

The numpy backend is the reference implementation of the shared solver; numba (its scalar
twin and the interpolation tables) and torch (the same solver on tensors, fixed iteration
count) must agree with it to 1e-12 in float64, and give float32 results within a few ulp
of the correctly rounded float64 edge.  A few points are also checked against the
independent 60-digit reference of ``tests/reference.py``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import fbands

from .._speed import registry

torch = pytest.importorskip("torch")
pytest.importorskip("numba")

# Every test also sees a divergence the library does not ship (tests/_user.py).
pytestmark = pytest.mark.usefixtures("user_divergence")


DIVERGENCES = [
    "kl", "reverse_kl", "tv", "chi2", "neyman_chi2", "hellinger", "js",
    "alpha(a=0.5)", "alpha(a=3)", "alpha(a=-1)", "triangular",
]
#: float32 kernels are compiled per divergence: a representative subset keeps CI short.
FLOAT32_DIVERGENCES = ["kl", "reverse_kl", "tv", "hellinger", "triangular"]
DELTAS = [1e-4, 0.05, 1.0]
P = np.concatenate([np.logspace(-12, -0.31, 45), [0.5], 1 - np.logspace(-9, -0.31, 30)])


def rel_err(a, b) -> float:
    """max |a - b| / max(|b|, 1e-6), with equal infinities and equal nans counting as 0."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    with np.errstate(invalid="ignore"):
        err = np.abs(a - b) / np.maximum(np.abs(b), 1e-6)
    return float(np.max(np.where(same, 0.0, err)))


def ulp_err(a32, b64) -> int:
    """max distance in float32 ulps between a32 and b64 rounded to float32.

    Values below 1e-30 in magnitude count as equal when both are (edges that tiny are
    zero for every purpose, and their log-ratio counterparts are covered by rel_err).
    """
    a = np.asarray(a32, dtype=np.float32)
    b = np.asarray(b64, dtype=np.float64).astype(np.float32)
    ai = a.view(np.int32).astype(np.int64)
    bi = b.view(np.int32).astype(np.int64)
    same = (a == b) | (np.isnan(a) & np.isnan(b)) | ((np.abs(a) < 1e-30) & (np.abs(b) < 1e-30))
    return int(np.max(np.where(same, 0, np.abs(ai - bi))))


def _pairs(got, ref):
    return [(np.asarray(g if not isinstance(g, torch.Tensor) else g.cpu()), r)
            for g, r in zip(got, ref, strict=True)]


#: alpha(a=0.5) and alpha(a=-1): the core's generated F cancels near r = 1 for these two
#: (no cancellation-free near form), so the numpy reference itself is only good to ~1e-11.
LOOSE = {"alpha(a=0.5)": 2e-11, "alpha(a=-1)": 2e-11}


@pytest.fixture(params=["torch", "numba"])
def cpu_kernel(request):
    """CPU tensors forced onto the device paths of the torch backend ("torch": what CUDA
    runs), or on the automatic path (handed to numba); see fbands._dispatch.plan."""
    return request.param


def _torch(log: bool, cpu_kernel: str):
    """bounds / log_bounds of tensors on the path ``cpu_kernel`` names."""
    from fbands import _dispatch as bands

    def fn(p, delta, div):
        path = None
        if cpu_kernel == "torch":
            per_token = isinstance(delta, torch.Tensor)
            path = bands.DEVICE_SOLVER if per_token else bands.DEVICE_TABLE
        def edges(*args, log=log, **kw):
            return bands.compute("log_edges" if log else "edges", *args, backend="torch", **kw)
        return edges(fbands.get(div), p, delta, logp=False, invalid="raise", check=True,
                     path=path)

    return fn


@pytest.mark.parametrize("div", registry(DIVERGENCES))
def test_float64_backends_agree_with_numpy(div, cpu_kernel):
    tol = LOOSE.get(div, 1e-12)
    grid_p = np.broadcast_to(P, (len(DELTAS), P.size))
    grid_d = np.broadcast_to(np.array(DELTAS)[:, None], grid_p.shape)
    for log in (False, True):
        fn = fbands.log_bounds if log else fbands.bounds
        ref = fn(grid_p, grid_d, div, backend="numpy")
        outs = {  # per-element delta: the exact solvers; scalar delta: the numba tables
            "torch": _torch(log, cpu_kernel)(
                torch.from_numpy(P), torch.tensor(DELTAS, dtype=torch.float64)[:, None], div),
        }
        if cpu_kernel == "torch":  # numba's own answers do not depend on cpu_kernel: once
            _check(outs, ref, "torch", tol, (div, log))
            continue
        outs["numba-exact"] = fn(grid_p, grid_d, div, backend="numba")
        for i, delta in enumerate(DELTAS):
            outs[f"numba-table-{delta}"] = [
                np.broadcast_to(e, grid_p.shape) for e in fn(P, delta, div, backend="numba")
            ]
            ref_rows = [r[i] for r in ref]
            for g, r in zip(outs[f"numba-table-{delta}"], ref_rows, strict=True):
                assert rel_err(g[i], r) <= tol, ("numba-table", div, delta, log)
        for name in ("numba-exact", "torch"):
            _check(outs, ref, name, tol, (div, log))


def _check(outs, ref, name, tol, case):
    for g, r in _pairs(outs[name], ref):
        assert g.dtype == np.float64
        err = rel_err(g, r)
        assert err <= tol, (name, *case, err)


@pytest.mark.parametrize("div", registry(FLOAT32_DIVERGENCES))
def test_float32_within_a_few_ulp(div, cpu_kernel):
    p32 = P.astype(np.float32)
    # p rounding to exactly 1 in float32 is the p -> 1 limit, which the numpy reference
    # does not resolve for every closed form; it is covered in float64 above.
    p32 = p32[p32 < 1]
    for delta in DELTAS:
        for log in (False, True):
            fn = fbands.log_bounds if log else fbands.bounds
            ref = fn(p32.astype(np.float64), delta, div, backend="numpy")
            got_torch = _torch(log, cpu_kernel)(torch.from_numpy(p32), delta, div)
            # numba's answer does not depend on cpu_kernel: checked once
            got_numba = fn(p32, delta, div, backend="numba") if cpu_kernel == "numba" else None
            for got in filter(None, (got_torch, got_numba)):
                for g, r in _pairs(got, ref):
                    assert g.dtype == np.float32
                    assert ulp_err(g, r) <= 4, (div, delta, log)


@pytest.mark.parametrize("div", registry(["kl", "reverse_kl", "chi2", "js"]))
def test_p_at_one(div):
    """p = 1 (log p = 0) and p within 1e-30 of it, where the band tends to [r*, 1]."""
    lp = np.array([0.0, -1e-30, -1e-20])
    for log in (False, True):
        fn = fbands.log_bounds if log else fbands.bounds
        ref = fn(lp, 0.05, div, backend="numpy", logp=True)
        for dtype in (np.float64, np.float32):
            got = fn(lp.astype(dtype), 0.05, div, backend="numba", logp=True)
            for g, r in zip(got, ref, strict=True):
                assert rel_err(g, r) <= (1e-12 if dtype == np.float64 else 1e-7), (div, dtype)


def test_logp_input_on_every_backend():
    lp = np.log(P)
    ref = fbands.log_bounds(lp, 0.05, "kl", backend="numpy", logp=True)
    for got in (fbands.log_bounds(lp, 0.05, "kl", backend="numba", logp=True),
                fbands.log_bounds(torch.from_numpy(lp), 0.05, "kl", logp=True)):
        for g, r in _pairs(got, ref):
            assert rel_err(g, r) <= 1e-12
    # log p = -inf is the p -> 0 limit everywhere
    for backend in ("numpy", "numba"):
        lo, hi = fbands.bounds(np.array([-math.inf, -1.0]), 0.05, "kl", backend=backend,
                               logp=True)
        assert lo[0] == 0.0 and hi[0] == math.inf and 0 < lo[1] < 1 < hi[1]


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_shape_dtype_and_kind_kept(backend):
    p = np.full((2, 3), 0.25, dtype=np.float32)
    lo, hi = fbands.bounds(p, 0.05, "kl", backend=backend)
    assert lo.shape == hi.shape == (2, 3) and lo.dtype == hi.dtype == np.float32
    lo, hi = fbands.bounds(p[:, ::2], 0.05, "kl", backend=backend)  # non-contiguous input
    assert lo.shape == (2, 2)
    flo, fhi = fbands.bounds(0.25, 0.05, "kl", backend=backend)
    assert isinstance(flo, float) and isinstance(fhi, float)


def test_invalid_input_on_numba():
    with pytest.raises(fbands.BandError, match=r"p must lie in \(0, 1\]; got 2.0 at index \(1,\)"):
        fbands.bounds(np.array([0.5, 2.0, 0.1]), 0.05, backend="numba")
    with pytest.raises(fbands.BandError, match="delta"):
        fbands.bounds(np.array([0.5]), -0.1, backend="numba")
    lo, hi = fbands.bounds(np.array([0.5, np.nan, 0.1]), 0.05, backend="numba", invalid="nan")
    assert np.isnan(lo[1]) and np.isnan(hi[1]) and np.all(np.isfinite(lo[[0, 2]]))


def test_user_registered_divergence_runs_on_numba_and_torch():
    # (u-1)^2/(u+1) is twice the triangular discrimination; its edges must satisfy g = delta.
    p, delta = 0.2, 0.05
    lo, hi = fbands.bounds(np.array([p]), delta, "triangular", backend="numba")

    def g(r):
        f = lambda u: (u - 1) ** 2 / (u + 1)  # noqa: E731
        return p * f(r) + (1 - p) * f((1 - r * p) / (1 - p))

    assert abs(g(float(hi[0])) - delta) < 1e-12 and abs(g(float(lo[0])) - delta) < 1e-12


@pytest.mark.parametrize("div", registry(["kl", "js", "hellinger"]))
def test_against_the_high_precision_reference(div):
    import mpmath as mp

    from ..reference import GENERATORS, edges

    ps = [1e-9, 3e-4, 0.05, 0.6, 1 - 1e-7]
    for delta in (1e-3, 0.3):
        true = [edges(GENERATORS[div], p, delta) for p in ps]
        t_lo = np.array([float(t[0]) for t in true])
        t_hi = np.array([float(t[1]) for t in true])
        for backend, arr in (("numba", np.array(ps)), ("torch", torch.tensor(ps,
                                                                          dtype=torch.float64))):
        # (torch: CPU tensors go to numba by default; the torch solver is checked against
        # numpy in test_float64_backends_agree_with_numpy)
            lo, hi = fbands.bounds(arr, delta, div, backend=backend)
            lo, hi = np.asarray(lo), np.asarray(hi)
            assert rel_err(lo, t_lo) <= 1e-12 and rel_err(hi, t_hi) <= 1e-12, backend
            llo, lhi = fbands.log_bounds(arr, delta, div, backend=backend)
            s_lo = np.array([float(mp.log(t[0])) if t[0] > 0 else -math.inf for t in true])
            s_hi = np.array([float(mp.log(t[1])) for t in true])
            assert rel_err(np.asarray(llo), s_lo) <= 1e-12
            assert rel_err(np.asarray(lhi), s_hi) <= 1e-12
