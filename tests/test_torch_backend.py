"""The torch backend: agreement with numpy, dtype/shape/device rules, no grad, no host sync."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fbands  # noqa: E402
from fbands.backends import torch_backend  # noqa: E402

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
def test_agrees_with_numpy_float64(div, log):
    fn = fbands.log_bounds if log else fbands.bounds
    p = np.broadcast_to(P, (len(DELTAS), P.size))
    d = np.array(DELTAS)[:, None]
    ref = fn(p, d, div, backend="numpy")
    got = fn(torch.from_numpy(p.copy()), torch.from_numpy(d), div)
    for g, r in zip(got, ref, strict=True):
        assert isinstance(g, torch.Tensor) and g.dtype == torch.float64
        assert _rel(g.numpy(), r) <= 1e-12


def test_logp_input_matches_p_input():
    lp = torch.log(torch.from_numpy(P))
    a = fbands.log_bounds(lp, 0.05, "kl", logp=True)
    b = fbands.log_bounds(torch.from_numpy(P), 0.05, "kl")
    for x, y in zip(a, b, strict=True):
        assert _rel(x.numpy(), y.numpy()) <= 1e-12


def test_logp_minus_inf_is_the_p_to_zero_limit():
    lo, hi = fbands.log_bounds(torch.tensor([-math.inf, -1.0]), 0.05, "kl", logp=True)
    assert lo[0] == -math.inf and hi[0] == math.inf
    assert torch.isfinite(lo[1]) and torch.isfinite(hi[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_low_precision_is_computed_in_float64_and_rounded_once(dtype):
    p = torch.tensor([0.001, 0.02, 0.3, 0.9], dtype=dtype)
    lo, hi = fbands.bounds(p, 0.05, "kl")
    assert lo.dtype == hi.dtype == dtype and lo.shape == p.shape
    ref_lo, ref_hi = fbands.bounds(p.double().numpy(), 0.05, "kl", backend="numpy")
    assert torch.equal(lo, torch.from_numpy(ref_lo).to(dtype))
    assert torch.equal(hi, torch.from_numpy(ref_hi).to(dtype))


def test_shape_and_per_token_delta_broadcast():
    p = torch.full((2, 3, 4), 0.1)
    delta = torch.tensor([0.01, 0.05, 0.2, 1.0])  # one radius per position
    lo, hi = fbands.bounds(p, delta, "chi2")
    assert lo.shape == hi.shape == (2, 3, 4)
    assert torch.all(hi[..., 1:] > hi[..., :-1])  # the band widens with delta
    assert torch.all(lo[..., 1:] <= lo[..., :-1])
    expected = 1 + torch.sqrt(delta.double() * 0.9 / 0.1)
    assert torch.allclose(hi[0, 0].double(), expected, rtol=1e-6)


def test_zero_dim_and_non_tensor_inputs_keep_their_kind():
    lo, hi = fbands.bounds(torch.tensor(0.2), 0.05, "tv")
    assert lo.shape == () and abs(float(hi) - 1.25) < 1e-6
    flo, fhi = fbands.bounds(0.2, 0.05, "tv", backend="torch")
    assert isinstance(flo, float) and abs(fhi - 1.25) < 1e-15
    alo, ahi = fbands.bounds(np.array([0.2, 0.5]), 0.05, "tv", backend="torch")
    assert isinstance(alo, np.ndarray) and np.allclose(ahi, [1.25, 1.1])


def test_no_autograd_graph():
    lp = torch.log(torch.tensor([0.1, 0.5], dtype=torch.float64)).requires_grad_()
    lo, hi = fbands.log_bounds(lp, 0.05, "kl", logp=True)
    assert not lo.requires_grad and not hi.requires_grad and lo.grad_fn is None


def test_invalid_input():
    with pytest.raises(fbands.BandError, match=r"p must lie in \(0, 1\]; got 1.5 at index \(1,\)"):
        fbands.bounds(torch.tensor([0.5, 1.5]), 0.05)
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
