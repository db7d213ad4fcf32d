"""The torch backend: agreement with numpy, dtype/shape/device rules, no grad, no host sync."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fbands  # noqa: E402
from fbands.backends import torch_backend  # noqa: E402


@pytest.fixture(params=["torch", "numba"])
def cpu_kernel(request, monkeypatch):
    """Run a test with CPU tensors on the torch solver and on the numba hand-off."""
    monkeypatch.setattr(torch_backend, "CPU_KERNEL", request.param)
    return request.param


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
    fn = fbands.log_bounds if log else fbands.bounds
    p = np.broadcast_to(P, (len(DELTAS), P.size))
    d = np.array(DELTAS)[:, None]
    ref = fn(p, d, div, backend="numpy")
    got = fn(torch.from_numpy(p.copy()), torch.from_numpy(d), div)
    for g, r in zip(got, ref, strict=True):
        assert isinstance(g, torch.Tensor) and g.dtype == torch.float64
        assert _rel(g.numpy(), r) <= 1e-12


def test_logp_input_matches_p_input(cpu_kernel):
    lp = torch.log(torch.from_numpy(P))
    a = fbands.log_bounds(lp, 0.05, "kl", logp=True)
    b = fbands.log_bounds(torch.from_numpy(P), 0.05, "kl")
    for x, y in zip(a, b, strict=True):
        assert _rel(x.numpy(), y.numpy()) <= 1e-12


def test_logp_minus_inf_is_the_p_to_zero_limit(cpu_kernel):
    lo, hi = fbands.log_bounds(torch.tensor([-math.inf, -1.0]), 0.05, "kl", logp=True)
    assert lo[0] == -math.inf and hi[0] == math.inf
    assert torch.isfinite(lo[1]) and torch.isfinite(hi[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_low_precision_is_computed_in_float64_and_rounded_once(dtype, cpu_kernel):
    p = torch.tensor([0.001, 0.02, 0.3, 0.9], dtype=dtype)
    lo, hi = fbands.bounds(p, 0.05, "kl")
    assert lo.dtype == hi.dtype == dtype and lo.shape == p.shape
    ref_lo, ref_hi = fbands.bounds(p.double().numpy(), 0.05, "kl", backend="numpy")
    assert torch.equal(lo, torch.from_numpy(ref_lo).to(dtype))
    assert torch.equal(hi, torch.from_numpy(ref_hi).to(dtype))


def test_shape_and_per_token_delta_broadcast(cpu_kernel):
    p = torch.full((2, 3, 4), 0.1)
    delta = torch.tensor([0.01, 0.05, 0.2, 1.0])  # one radius per position
    lo, hi = fbands.bounds(p, delta, "chi2")
    assert lo.shape == hi.shape == (2, 3, 4)
    assert torch.all(hi[..., 1:] > hi[..., :-1])  # the band widens with delta
    assert torch.all(lo[..., 1:] <= lo[..., :-1])
    expected = 1 + torch.sqrt(delta.double() * 0.9 / 0.1)
    assert torch.allclose(hi[0, 0].double(), expected, rtol=1e-6)


def test_zero_dim_and_non_tensor_inputs_keep_their_kind(cpu_kernel):
    lo, hi = fbands.bounds(torch.tensor(0.2), 0.05, "tv")
    assert lo.shape == () and abs(float(hi) - 1.25) < 1e-6
    flo, fhi = fbands.bounds(0.2, 0.05, "tv", backend="torch")
    assert isinstance(flo, float) and abs(fhi - 1.25) < 1e-15
    alo, ahi = fbands.bounds(np.array([0.2, 0.5]), 0.05, "tv", backend="torch")
    assert isinstance(alo, np.ndarray) and np.allclose(ahi, [1.25, 1.1])


def test_no_autograd_graph_unless_asked(cpu_kernel):
    lp = torch.log(torch.tensor([0.1, 0.5], dtype=torch.float64))
    lo, hi = fbands.log_bounds(lp, 0.05, "kl", logp=True)
    assert not lo.requires_grad and not hi.requires_grad and lo.grad_fn is None
    with torch.no_grad():
        lo, hi = fbands.log_bounds(lp.requires_grad_(), 0.05, "kl", logp=True)
    assert lo.grad_fn is None and hi.grad_fn is None
    lo, hi = fbands.log_bounds(lp, 0.05, "kl", logp=True)
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

    from .reference import GENERATORS, edges

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
        gp, gd = torch.autograd.grad(fbands.bounds(pt, dt, div)[i], (pt, dt))
        for got, key in ((gp, (i, 0)), (gd, (i, 1))):
            assert float(got) == pytest.approx(float(want[key]), rel=1e-9, abs=1e-12), key
        if r[i] == 0:
            continue
        # log-edges from log p: d log r / d log p = (p / r) dr/dp; d log r / d delta = dr/dd / r
        lt = torch.tensor(math.log(p), dtype=torch.float64, requires_grad=True)
        gl, gd = torch.autograd.grad(fbands.log_bounds(lt, dt, div, logp=True)[i], (lt, dt))
        assert float(gl) == pytest.approx(float(want[(i, 0)] * p / r[i]), rel=1e-9, abs=1e-12)
        assert float(gd) == pytest.approx(float(want[(i, 1)] / r[i]), rel=1e-9, abs=1e-12)


def test_gradients_broadcast_and_keep_dtypes(cpu_kernel):
    p = torch.tensor([[0.1, 0.5, 0.9]], dtype=torch.float32, requires_grad=True)
    delta = torch.tensor([[0.05], [0.2]], dtype=torch.float32, requires_grad=True)
    lo, hi = fbands.bounds(p, delta, "kl")
    assert lo.shape == (2, 3) and lo.dtype == torch.float32
    (lo.sum() + hi.sum()).backward()
    assert p.grad.shape == p.shape and p.grad.dtype == torch.float32
    assert delta.grad.shape == delta.shape and torch.all(delta.grad > 0)  # a wider band
    # a float radius is used as given, not rounded to float32
    p1 = torch.linspace(0.01, 0.99, 2000, dtype=torch.float32).requires_grad_()
    assert torch.equal(fbands.bounds(p1, 0.05, "kl")[1], fbands.bounds(p1.detach(), 0.05, "kl")[1])
    with pytest.raises(fbands.BandError, match="gradients need p as a tensor"):
        fbands.bounds(0.5, torch.tensor(0.1, requires_grad=True), "kl", backend="torch")


def test_invalid_input(cpu_kernel):
    with pytest.raises(fbands.BandError, match=r"p must lie in \(0, 1\]; got 1.5 at index \(1,\)"):
        fbands.bounds(torch.tensor([0.5, 1.5]), 0.05)
    with pytest.raises(fbands.BandError, match=r"got 2.0 at index \(1, 0\)"):
        fbands.bounds(torch.tensor([[0.5, 0.2], [2.0, 0.3]]), 0.05)
    with pytest.raises(fbands.BandError, match="delta"):
        fbands.bounds(torch.tensor([0.5]), torch.tensor([-1.0]))
    with pytest.raises(fbands.BandError, match="broadcast"):
        fbands.bounds(torch.full((3,), 0.5), torch.full((2,), 0.1))
    lo, hi = fbands.bounds(torch.tensor([0.5, float("nan"), 0.2]), 0.05, invalid="nan")
    assert torch.isnan(lo[1]) and torch.isnan(hi[1]) and torch.isfinite(lo[[0, 2]]).all()


def test_hot_path_traces_without_graph_break(monkeypatch):
    """With ``check=False`` the whole computation is one graph: no .item(), no bool(tensor).

    torch.compile(fullgraph=True) raises on any graph break, which is what a host sync in
    the Python code would cause.  A short fixed iteration count keeps tracing quick; the
    code path is the same as with the default count.
    """
    monkeypatch.setattr(torch_backend, "FIXED_ITER", 2)
    monkeypatch.setattr(torch_backend, "CPU_KERNEL", "torch")
    torch._dynamo.reset()
    kl = fbands.get("kl")  # the registry lookup and backend choice stay outside the graph

    def band(lp, delta):
        return torch_backend.log_edges(kl, lp, delta, logp=True, invalid="raise", check=False)

    lp = torch.log(torch.tensor([0.01, 0.3, 0.9], dtype=torch.float64))
    delta = torch.tensor([0.05, 0.1, 0.2], dtype=torch.float64)
    ref = band(lp, delta)  # the first call derives the kernels with sympy (not traceable)
    compiled = torch.compile(band, backend="eager", fullgraph=True)
    got = compiled(lp, delta)
    for g, r in zip(got, ref, strict=True):
        assert torch.equal(g, r)
