"""The mismatch gate (fbands.losses.mismatch_gate) against binary divergences by hand."""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
import torch

from fbands.errors import LossError
from fbands.losses import mismatch_gate

from .. import reference

mp.mp.dps = 40


def binary(name, mu, pi):
    """The divergence of the two-point distributions (mu, 1 - mu) -> (pi, 1 - pi), written
    out: TV |pi - mu|; kl KL(mu || pi); reverse_kl KL(pi || mu)."""
    mu, pi = mp.mpf(mu), mp.mpf(pi)

    def kl(a, b):
        return sum(x * mp.log(x / y) for x, y in ((a, b), (1 - a, 1 - b)) if x > 0)

    return {"tv": abs(pi - mu), "kl": kl(mu, pi), "reverse_kl": kl(pi, mu)}[name]


def pairs(seed=0, n=400):
    rng = np.random.default_rng(seed)
    mu = np.exp(rng.uniform(-12, -1e-3, n))
    pi = np.clip(mu * np.exp(rng.normal(0, 1.5, n)), 1e-300, 1 - 1e-9)
    return mu, pi


@pytest.mark.parametrize("div, delta", [("tv", 0.02), ("kl", 0.01), ("reverse_kl", 0.01),
                                        ("kl&reverse_kl", 0.005), ("tv&kl", 0.03)])
def test_the_gate_is_the_binary_divergence_within_delta(div, delta):
    mu, pi = pairs()
    got = mismatch_gate(torch.tensor(np.log(pi)), torch.tensor(np.log(mu)), div, delta)
    assert got.dtype == torch.float64
    decided = 0
    for i in range(len(mu)):
        d = max(binary(name, mu[i], pi[i]) for name in div.split("&"))
        if abs(d - delta) < 1e-9 * delta:  # on the boundary: rounding may go either way
            continue
        assert got[i].item() == float(d <= delta), (mu[i], pi[i], float(d))
        decided += 1
    assert decided > 350 and 0 < got.sum() < len(mu)  # both outcomes were tested


def test_cap_mode_clamps_the_importance_weight_into_the_band():
    mu = np.array([0.3, 0.3, 0.3, 1e-4, 1e-4])
    pi = np.array([0.3, 0.9, 0.01, 0.5, 1e-6])
    got = mismatch_gate(torch.tensor(np.log(pi)), torch.tensor(np.log(mu)), "kl", 0.02,
                        mode="cap")
    for i in range(len(mu)):
        lo, hi = reference.edges(reference.GENERATORS["kl"], mu[i], 0.02)
        want = min(max(pi[i] / mu[i], float(lo)), float(hi))
        assert got[i].item() == pytest.approx(want, rel=1e-10)
    assert got[0].item() == 1.0


def test_padding_gets_weight_zero_and_is_never_read():
    mu = torch.log(torch.tensor([[0.5, 0.2, 0.0], [0.1, 0.0, 0.0]]))  # -inf on padding
    pi = torch.log(torch.tensor([[0.5, 0.9, 7.0], [0.1, 0.0, 0.0]]))  # garbage on padding
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    for mode in ("mask", "cap"):
        got = mismatch_gate(pi, mu, "tv", 0.1, mode=mode, mask=mask)
        assert got.dtype == torch.float32 and torch.isfinite(got).all()
        assert got[0, 2] == got[1, 1] == got[1, 2] == 0
    assert mismatch_gate(pi, mu, "tv", 0.1, mask=mask).tolist() == [[1, 0, 0], [1, 0, 0]]


def test_bad_inputs_are_named():
    x = torch.log(torch.tensor([0.5, 0.2]))
    with pytest.raises(LossError, match="mode"):
        mismatch_gate(x, x, mode="clip")
    with pytest.raises(LossError, match="delta"):
        mismatch_gate(x, x, delta=0.0)
    with pytest.raises(LossError, match="logp_rollout has shape"):
        mismatch_gate(x, x[:1])
    with pytest.raises(LossError, match="logp_rollout must be > -inf"):
        mismatch_gate(x, torch.tensor([-math.inf, -1.0]))
    with pytest.raises(LossError, match="logp must hold log-probabilities"):
        mismatch_gate(torch.tensor([0.5, -1.0]), x)
    with pytest.raises(LossError, match="empty divergence"):
        mismatch_gate(x, x, "kl&")
