"""Tests of fbands.losses: every method against an independent formula, gradients, numerics.

The reference formulas below are written the textbook way (exponentiate, clamp, take the max)
so that they check the log-space implementation rather than repeat it.  A hand-made total
variation band (closed form r = 1 -+ delta / p, clamped to [0, 1/p]) stands in for the core
solver wherever the test is about the loss and not about the band.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch

import fbands
from fbands import _methods, _presets
from fbands.losses import (
    AGG_MODES,
    METHODS,
    METRIC_KEYS,
    Band,
    LossConfig,
    LossError,
    agg_loss,
    dcpo_log_bounds,
    policy_loss,
    precompute_band,
    preset,
)
from fbands.losses import band as loss_band

F64 = torch.float64


# --------------------------------------------------------------------------------------
# helpers


def tv_band(logp_old: torch.Tensor, delta: float) -> Band:
    """Closed-form TV band in log space: [max(p - delta, 0), min(p + delta, 1)] / p."""
    p = logp_old.to(F64).exp()
    log_hi = torch.log(torch.clamp(p + delta, max=1.0)) - logp_old.to(F64)
    log_lo = torch.log(torch.clamp(p - delta, min=0.0)) - logp_old.to(F64)  # -inf if p <= delta
    return Band(log_lo.to(logp_old.dtype), log_hi.to(logp_old.dtype))


def ppo_reference(logp_old, logp, adv, mask, lower, upper, dual_c=None):
    """Textbook PPO / dual-clip token-mean loss with ratio bounds given as tensors or floats."""
    ratio = torch.exp(logp - logp_old)
    lower = torch.as_tensor(lower, dtype=ratio.dtype)
    upper = torch.as_tensor(upper, dtype=ratio.dtype)
    clipped = torch.minimum(torch.maximum(ratio, lower), upper)
    per_token = torch.maximum(-adv * ratio, -adv * clipped)
    if dual_c is not None:
        per_token = torch.where(adv < 0, torch.minimum(per_token, -adv * dual_c), per_token)
    return (per_token * mask).sum() / mask.sum()


def random_batch(seed, shape=(4, 6), *, spread=0.6, dtype=F64):
    """Old log-probs log-uniform in (1e-4, 0.95), moves of the log-ratio, mixed-sign A."""
    gen = torch.Generator().manual_seed(seed)
    logp_old = torch.empty(shape, dtype=dtype)
    logp_old.uniform_(math.log(1e-4), math.log(0.95), generator=gen)
    move = (torch.rand(shape, generator=gen, dtype=dtype) * 2 - 1) * spread
    logp = torch.clamp(logp_old + move, max=-1e-3)
    adv = torch.randn(shape, generator=gen, dtype=dtype)
    mask = (torch.rand(shape, generator=gen) > 0.2).to(dtype)
    mask[:, 0] = 1.0
    return logp_old, logp, adv, mask


def grad_of(fn, logp):
    """Value and gradient of fn(logp) with respect to logp."""
    x = logp.detach().clone().requires_grad_()
    value = fn(x)
    (grad,) = torch.autograd.grad(value, x)
    return value.detach(), grad


def fake_log_bounds(calls):
    """Stand-in for fbands.log_bounds (TV closed form) that records how it was called."""

    def log_bounds(p, delta, div="kl", backend="auto", *, logp=False, **options):
        calls.append({"delta": delta, "div": div, "logp": logp, "dtype": p.dtype, **options})
        return tv_band(p, delta)

    return log_bounds


# --------------------------------------------------------------------------------------
# configuration and presets


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"method": "ppo"}, "'ppo'"),
        ({"agg": "mean"}, "'mean'"),
        ({"delta": 0.0}, "delta"),
        ({"delta": float("nan")}, "nan"),
        ({"eps_low": 1.5}, "1.5"),
        ({"eps_high": -0.1}, "-0.1"),
        ({"dual_clip_c": 1.0}, "dual_clip_c"),
        ({"method": "cispo", "dual_clip_c": 3.0}, "cispo"),
        ({"method": "band_mask", "dual_clip_c": 3.0}, "band_mask"),
        ({"upper_bound_max": 0.5}, "0.5"),
        ({"truncation": 0}, "truncation"),
        ({"gppo_beta": -1.0}, "gppo_beta"),
        ({"div": ""}, "div"),
        ({"relax": True, "delta": True}, "delta"),
        ({"relax": "yes"}, "relax"),
    ],
)
def test_config_rejects_bad_values(fields, fragment):
    with pytest.raises(LossError) as info:
        LossConfig(**fields)
    assert isinstance(info.value, ValueError)
    assert fragment in str(info.value)


def test_presets():
    assert preset("clip") == LossConfig(method="clip", eps_low=0.2, eps_high=0.2)
    assert (preset("clip-higher").eps_low, preset("clip-higher").eps_high) == (0.2, 0.28)
    assert preset("dual-clip").dual_clip_c == 3.0
    assert preset("dcpo").method == "dcpo"
    assert (preset("trgppo").method, preset("trgppo").div) == ("trgppo", "kl")
    assert preset("cispo").eps_low == 1.0  # no lower clip
    for name, method in [("band-", "band_clip"), ("band-mask-", "band_mask"),
                         ("band-gppo-", "band_gppo")]:
        cfg = preset(name + "chi2")
        assert (cfg.method, cfg.div, cfg.delta) == (method, "chi2", 0.05)
    assert preset("band-reverse-kl").div == "reverse_kl"
    assert preset("band-mask-neyman-chi2").div == "neyman_chi2"
    assert preset("band-gppo-alpha(a=-0.5)").div == "alpha(a=-0.5)"
    cfg = preset("band-kl", delta=0.1, agg="seq-mean-token-mean")
    assert (cfg.delta, cfg.agg) == (0.1, "seq-mean-token-mean")
    with pytest.raises(LossError, match="'ppo2'"):
        preset("ppo2")
    with pytest.raises(LossError, match="band-"):
        preset("band-")
    with pytest.raises(LossError, match="epsilon"):
        preset("clip", epsilon=0.3)
    with pytest.raises(LossError, match="eps_high"):
        preset("clip", eps_high=-1.0)


@pytest.mark.parametrize("row", _methods.TABLE, ids=lambda m: m.name)
def test_every_row_of_the_table_of_methods_is_what_the_losses_do(row):
    """Walk the table of methods (fbands._methods): each column is what the package does."""
    cfg = LossConfig(method=row.name, delta=0.05)
    assert cfg.row is row and cfg.uses_radius == (row.band == "divergence")
    if row.soft:
        LossConfig(method=row.name, soft="tanh1")
    else:
        with pytest.raises(LossError, match="soft="):
            LossConfig(method=row.name, soft="tanh1")
    if row.dual_clip:
        LossConfig(method=row.name, dual_clip_c=3.0)
    else:
        with pytest.raises(LossError, match="dual_clip_c"):
            LossConfig(method=row.name, dual_clip_c=3.0)
    if row.preset_prefix:
        assert preset(row.preset_prefix + "tv").method == row.name
    logp_old = torch.log(torch.tensor([[0.6, 0.05, 0.3]], dtype=F64))
    logp = (logp_old + torch.tensor([[0.5, 1.5, -0.7]], dtype=F64)).requires_grad_()
    loss, metrics = policy_loss(logp_old, logp, torch.tensor([[1.0, 1.0, -1.0]], dtype=F64),
                                torch.ones(1, 3), cfg)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    band = precompute_band(logp_old, cfg)
    fixed = precompute_band(logp_old, LossConfig(method="clip"))
    if row.band == "fixed":
        assert torch.allclose(band.log_lower, torch.full_like(band.log_lower, math.log(0.8)))
    elif row.with_fixed:  # united with the fixed clip
        assert (band.log_lower <= fixed.log_lower).all()
        assert (band.log_upper >= fixed.log_upper).all()
    if row.form == "weight":  # every token keeps a gradient
        assert (logp.grad != 0).all()
    from fbands.integrations._names import named_fields

    assert named_fields(row.name, "method", ValueError) in ({"method": row.name},
                                                            _presets.fields(row.name))


def test_verl_modes_come_from_the_table():
    pytest.importorskip("verl")
    from fbands.integrations.verl import LOSS_MODES

    assert {m: n for m, n in LOSS_MODES.items() if n} == {
        r.verl_mode: r.name for r in _methods.TABLE if r.verl_mode}


@pytest.mark.parametrize("name", ["band-kl&reverse-kl", "band-mask-tv&chi2"])
def test_an_intersected_band_keeps_every_trust_region(name):
    """div="a&b": the edges are where the first of the two-point divergences reaches delta,
    checked against 60-digit edges of each divergence alone (tests/reference.py)."""
    from .. import reference

    cfg = preset(name, delta=0.05)
    p = [1e-6, 1e-3, 0.05, 0.3, 0.7, 0.99]
    band = precompute_band(torch.log(torch.tensor(p, dtype=F64)), cfg)
    for i, pi in enumerate(p):
        each = [reference.edges(reference.GENERATORS[d], mpmath.mpf(pi), mpmath.mpf("0.05"))
                for d in cfg.divs]
        lo, hi = max(e[0] for e in each), min(e[1] for e in each)
        assert math.exp(band.log_lower[i]) == pytest.approx(float(lo), rel=1e-10, abs=1e-300)
        assert math.exp(band.log_upper[i]) == pytest.approx(float(hi), rel=1e-10)
    assert preset("band-alpha(a=0.5)&reverse-kl").divs == ("alpha(a=0.5)", "reverse_kl")
    with pytest.raises(LossError, match="empty divergence name"):
        LossConfig(div="kl&")
    with pytest.raises(fbands.DivergenceError):
        LossConfig(div="kl&nonsense")


# --------------------------------------------------------------------------------------
# baselines against the textbook formulas


@pytest.mark.parametrize(("method", "eps_low", "eps_high"),
                         [("clip", 0.2, 0.2), ("clip_higher", 0.2, 0.28), ("clip", 0.1, 0.3)])
def test_ppo_clip_matches_textbook(method, eps_low, eps_high):
    logp_old, logp, adv, mask = random_batch(1)
    cfg = LossConfig(method=method, eps_low=eps_low, eps_high=eps_high)
    value, grad = grad_of(lambda x: policy_loss(logp_old, x, adv, mask, cfg)[0], logp)
    ref_value, ref_grad = grad_of(
        lambda x: ppo_reference(logp_old, x, adv, mask, 1 - eps_low, 1 + eps_high), logp)
    torch.testing.assert_close(value, ref_value, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-12)
    _, metrics = policy_loss(logp_old, logp, adv, mask, cfg)
    assert 0 < metrics["clipfrac"].item() < 1  # the batch does exercise the clip


@pytest.mark.parametrize("method", ["dual_clip", "clip"])
def test_dual_clip_matches_textbook(method):
    logp_old, logp, adv, mask = random_batch(2, spread=1.6)
    cfg = LossConfig(method=method, dual_clip_c=3.0)
    value, grad = grad_of(lambda x: policy_loss(logp_old, x, adv, mask, cfg)[0], logp)
    ref_value, ref_grad = grad_of(
        lambda x: ppo_reference(logp_old, x, adv, mask, 0.8, 1.2, dual_c=3.0), logp)
    torch.testing.assert_close(value, ref_value, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-12)
    dual = policy_loss(logp_old, logp, adv, mask, cfg)[1]["dual_clipfrac"]
    expected = (((adv < 0) & (logp - logp_old > math.log(3.0))).to(F64) * mask).sum() / mask.sum()
    assert dual.item() == pytest.approx(expected.item())
    assert dual.item() > 0
    # "dual_clip" without a constant uses c = 3.
    assert torch.equal(policy_loss(logp_old, logp, adv, mask, LossConfig(method="dual_clip"))[0],
                       value)


def test_band_clip_matches_textbook_with_tv_band():
    logp_old, logp, adv, mask = random_batch(3, spread=2.0)
    band = tv_band(logp_old, 0.05)
    cfg = LossConfig(method="band_clip", div="tv")
    value, grad = grad_of(lambda x: policy_loss(logp_old, x, adv, mask, cfg, band)[0], logp)
    ref_value, ref_grad = grad_of(
        lambda x: ppo_reference(logp_old, x, adv, mask, band.log_lower.exp(), band.log_upper.exp()),
        logp)
    torch.testing.assert_close(value, ref_value, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------------------
# hand-derived gradients on tiny inputs (token-sum, so each gradient is the token's own)


def tiny_case():
    """Four tokens, p = 0.5; ratios 1.1 (inside), 1.5 (above), 0.6 (below), 1.5 (above)."""
    logp_old = torch.full((1, 4), math.log(0.5), dtype=F64)
    ratio = torch.tensor([[1.1, 1.5, 0.6, 1.5]], dtype=F64)
    logp = logp_old + ratio.log()
    adv = torch.tensor([[2.0, 2.0, -1.0, -1.0]], dtype=F64)
    return logp_old, logp, adv, torch.ones(1, 4, dtype=F64), ratio


def test_hand_gradients_clip():
    logp_old, logp, adv, mask, ratio = tiny_case()
    cfg = LossConfig(method="clip", agg="token-sum")
    value, grad = grad_of(lambda x: policy_loss(logp_old, x, adv, mask, cfg)[0], logp)
    # d(-A r)/d logp = -A r inside; the clipped tokens (A > 0 above 1.2, A < 0 below 0.8)
    # have none; A < 0 above the band is not clipped (PPO is pessimistic).
    expected = torch.tensor([[-2.0 * 1.1, 0.0, 0.0, 1.0 * 1.5]], dtype=F64)
    torch.testing.assert_close(grad, expected)
    assert value.item() == pytest.approx(-2 * 1.1 - 2 * 1.2 + 0.8 + 1.5)


def test_hand_gradients_gppo():
    logp_old, logp, adv, mask, ratio = tiny_case()
    band = Band(torch.full_like(logp, math.log(0.8)), torch.full_like(logp, math.log(1.2)))
    clip_cfg = LossConfig(method="band_clip", agg="token-sum")
    gppo_cfg = LossConfig(method="band_gppo", agg="token-sum", gppo_beta=0.5, gppo_beta_low=0.25)
    clip_value = policy_loss(logp_old, logp, adv, mask, clip_cfg, band)[0]
    value, grad = grad_of(lambda x: policy_loss(logp_old, x, adv, mask, gppo_cfg, band)[0], logp)
    assert value.item() == pytest.approx(clip_value.item(), abs=1e-14)  # same forward value
    # Clipped tokens keep -beta * edge * A: 0.5 * 1.2 * 2 above, 0.25 * 0.8 * (-1) below.
    expected = torch.tensor([[-2.0 * 1.1, -0.5 * 1.2 * 2.0, 0.25 * 0.8, 1.0 * 1.5]], dtype=F64)
    torch.testing.assert_close(grad, expected)


def test_hand_gradients_cispo():
    logp_old, logp, adv, mask, ratio = tiny_case()
    cfg = LossConfig(method="cispo", eps_low=0.2, eps_high=0.28, agg="token-sum")
    value, grad = grad_of(lambda x: policy_loss(logp_old, x, adv, mask, cfg)[0], logp)
    weight = torch.tensor([[1.1, 1.28, 0.8, 1.28]], dtype=F64)  # clip(r, 0.8, 1.28), any sign
    torch.testing.assert_close(grad, -adv * weight)  # every token keeps a gradient
    torch.testing.assert_close(value, (-adv * weight * logp).sum())
    no_lower = LossConfig(method="cispo", eps_low=1.0, eps_high=0.28, agg="token-sum")
    _, grad = grad_of(lambda x: policy_loss(logp_old, x, adv, mask, no_lower)[0], logp)
    assert grad[0, 2].item() == pytest.approx(1.0 * 0.6)  # the weight 0.6 is not raised to 0.8


def test_hand_gradients_band_mask():
    logp_old, logp, adv, mask, ratio = tiny_case()
    band = Band(torch.full_like(logp, math.log(0.8)), torch.full_like(logp, math.log(1.2)))
    cfg = LossConfig(method="band_mask", truncation=1.05, agg="token-sum")
    value, grad = grad_of(lambda x: policy_loss(logp_old, x, adv, mask, cfg, band)[0], logp)
    # Tokens 2 and 3 left the band in their advantage's direction: no gradient and no value.
    # Token 1 keeps -A min(r, C) = -2 * 1.05; token 4 (A < 0, above) keeps -A min(1.5, C).
    expected = torch.tensor([[-2.0 * 1.05, 0.0, 0.0, 1.0 * 1.05]], dtype=F64)
    torch.testing.assert_close(grad, expected)
    torch.testing.assert_close(value, (expected * logp).sum())
    metrics = policy_loss(logp_old, logp, adv, mask, cfg, band)[1]
    assert metrics["truncfrac"].item() == pytest.approx(0.5)  # tokens 1 and 4 hit C


# Only where the gradient is the derivative of the value: cispo and band_mask hold their weight
# under stop-gradient and band_gppo is straight-through, by design (their gradients are
# checked by hand above).
@pytest.mark.parametrize("method", ["clip", "clip_higher", "dual_clip", "dcpo", "trgppo",
                                    "band_clip"])
def test_gradcheck(method, monkeypatch):
    monkeypatch.setattr(loss_band, "log_bounds", fake_log_bounds([]), raising=False)
    logp_old = torch.log(torch.tensor([[0.3, 0.05, 0.6, 0.02], [0.5, 0.2, 0.01, 0.9]], dtype=F64))
    # Ratios kept away from every kink (0.8, 1.2, 1.28, 1 +- delta/p, DCPO edges, C, c).
    ratio = torch.tensor([[1.1, 1.9, 0.7, 3.2], [0.85, 1.45, 0.5, 1.03]], dtype=F64)
    logp = (logp_old + ratio.log()).requires_grad_()
    adv = torch.tensor([[1.0, 0.5, -1.5, -0.7], [-0.3, 2.0, 1.0, -1.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=F64)
    cfg = LossConfig(method=method, div="tv", agg="seq-mean-token-mean")
    band = precompute_band(logp_old, cfg)
    assert torch.autograd.gradcheck(
        lambda x: policy_loss(logp_old, x, adv, mask, cfg, band)[0], (logp,))


# --------------------------------------------------------------------------------------
# band mask (DPPO form) with the TV band is exactly binary-TV masking


def binary_tv_keeps(logp_old, logp, adv, delta):
    """DPPO's rule: A > 0 keeps pi - pi_old <= delta, A < 0 keeps pi - pi_old >= -delta."""
    diff = logp.exp() - logp_old.exp()
    return torch.where(adv > 0, diff <= delta, diff >= -delta)


def check_tv_mask_selection(band_for, seed, delta=0.05):
    gen = torch.Generator().manual_seed(seed)
    shape = (64, 64)
    logp_old = torch.empty(shape, dtype=F64)
    logp_old.uniform_(math.log(1e-4), math.log(0.999), generator=gen)
    # new probabilities anywhere in (0, 1]: half near the old one, half far away
    near = logp_old.exp() + (torch.rand(shape, generator=gen, dtype=F64) * 2 - 1) * 0.12
    far = torch.rand(shape, generator=gen, dtype=F64)
    pi = torch.where(torch.rand(shape, generator=gen) < 0.5, near, far).clamp(1e-6, 1.0)
    logp = pi.log()
    adv = torch.where(torch.rand(shape, generator=gen) < 0.5, 1.0, -1.0).to(F64)
    mask = torch.ones(shape, dtype=F64)
    diff = pi - logp_old.exp()
    clear = ((diff - delta).abs() > 1e-9) & ((diff + delta).abs() > 1e-9)  # no exact ties
    cfg = LossConfig(method="band_mask", div="tv", delta=delta, agg="token-sum")
    _, grad = grad_of(lambda x: policy_loss(logp_old, x, adv, mask, cfg, band_for(logp_old))[0],
                      logp)
    kept = grad != 0
    expected = binary_tv_keeps(logp_old, logp, adv, delta)
    assert torch.equal(kept[clear], expected[clear])
    assert 0.2 < expected.to(F64).mean().item() < 0.95  # both outcomes are well represented
    assert clear.to(F64).mean().item() > 0.99


def test_band_mask_tv_is_binary_tv_with_closed_form_band():
    check_tv_mask_selection(lambda lp: tv_band(lp, 0.05), seed=4)


def test_band_mask_tv_is_binary_tv_with_core_band():
    """The same with the band from fbands.log_bounds(div="tv") (needs the core)."""
    cfg = LossConfig(method="band_mask", div="tv", delta=0.05)
    check_tv_mask_selection(lambda lp: precompute_band(lp, cfg), seed=5)


# --------------------------------------------------------------------------------------
# DCPO


def dcpo_mp(p, eps, sign):
    """DCPO edge 1/2 + 1/2 sqrt(max(0, 1 + sign 4 eps / p)) in 60-digit arithmetic, logged."""
    with mpmath.workdps(60):
        rad = 1 + sign * 4 * mpmath.mpf(eps) / p
        return mpmath.log(mpmath.mpf(1) / 2 + mpmath.sqrt(max(rad, 0)) / 2)


def test_dcpo_bounds_match_formula():
    logps = [-2000.0, -745.0, -100.0, -30.0, -5.0, -1.0, -0.5, math.log(0.64), -0.1, -1e-3, -1e-9]
    for eps_low, eps_high in [(0.16, 0.2), (0.2, 0.28), (1e-10, 1e-10)]:
        band = dcpo_log_bounds(torch.tensor(logps, dtype=F64), eps_low, eps_high)
        for x, lo, hi in zip(logps, band.log_lower.tolist(), band.log_upper.tolist(), strict=True):
            with mpmath.workdps(60):  # (not the global precision, which other tests may move)
                p = mpmath.exp(mpmath.mpf(x))
                rad = 1 - 4 * mpmath.mpf(eps_low) / p
            want_lo, want_hi = dcpo_mp(p, eps_low, -1), dcpo_mp(p, eps_high, +1)
            # At the radicand's root (p = 4 eps: log 0.64 with eps 0.16) the edge moves by
            # sqrt(|rad|) / 2 for an input one rounding away: held to that, not to 1e-13.
            tol = 2 * float(mpmath.sqrt(abs(rad))) if abs(rad) < 1e-12 else 0.0
            assert lo == pytest.approx(float(want_lo), rel=1e-13, abs=tol), (x, eps_low)
            assert hi == pytest.approx(float(want_hi), rel=1e-13, abs=0), (x, eps_high)
    # the radicand is clamped: where 4 eps / p >= 1 the lower edge is exactly 1/2
    low = dcpo_log_bounds(torch.tensor([math.log(0.1), -50.0], dtype=F64), 0.16, 0.2).log_lower
    torch.testing.assert_close(low, torch.full((2,), math.log(0.5), dtype=F64))
    zero = dcpo_log_bounds(torch.tensor([-1.0], dtype=F64), 0.0, 0.0)
    assert zero.log_lower.item() == 0.0 and zero.log_upper.item() == 0.0


def test_dcpo_loss_matches_textbook():
    logp_old, logp, adv, mask = random_batch(6, spread=1.2)
    p = logp_old.exp()
    lower = 0.5 + 0.5 * torch.sqrt(torch.clamp(1 - 4 * 0.16 / p, min=0.0))
    upper = torch.clamp(0.5 + 0.5 * torch.sqrt(1 + 4 * 0.2 / p), max=10.0)
    cfg = preset("dcpo")
    value, grad = grad_of(lambda x: policy_loss(logp_old, x, adv, mask, cfg)[0], logp)
    ref_value, ref_grad = grad_of(
        lambda x: ppo_reference(logp_old, x, adv, mask, lower, upper, dual_c=3.0), logp)
    torch.testing.assert_close(value, ref_value, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------------------
# band assembly: union (TRGPPO, relax), cap, reuse


def test_band_assembly_with_stand_in_solver(monkeypatch):
    calls = []
    monkeypatch.setattr(loss_band, "log_bounds", fake_log_bounds(calls), raising=False)
    logp_old = torch.log(torch.tensor([[0.9, 0.3, 0.05, 1e-3]]))
    raw = tv_band(logp_old, 0.05)
    band = precompute_band(logp_old, LossConfig(method="band_clip", div="tv", delta=0.05))
    # precompute_band checks logp_old itself, so the solver is called unchecked (no sync)
    assert calls[-1] == {"delta": 0.05, "div": "tv", "logp": True, "dtype": torch.float32,
                         "check": False}
    torch.testing.assert_close(band.log_upper, raw.log_upper)
    # TRGPPO and relax: the union with [1 - eps_low, 1 + eps_high]
    for cfg in (LossConfig(method="trgppo", div="tv"),
                LossConfig(method="band_clip", div="tv", relax=True)):
        band = precompute_band(logp_old, cfg)
        torch.testing.assert_close(band.log_lower, torch.clamp(raw.log_lower, max=math.log(0.8)))
        torch.testing.assert_close(band.log_upper, torch.clamp(raw.log_upper, min=math.log(1.2)))
    # the near-certain token's band [0.944, 1.11] is widened to [0.8, 1.2]
    assert band.log_upper[0, 0].item() == pytest.approx(math.log(1.2))
    assert band.log_lower[0, 0].item() == pytest.approx(math.log(0.8))
    capped = precompute_band(logp_old, LossConfig(method="band_mask", div="tv", upper_bound_max=10))
    torch.testing.assert_close(capped.log_upper, torch.clamp(raw.log_upper, max=math.log(10.0)))


def test_band_is_reused_and_constant_for_fixed_clips():
    logp_old, logp, adv, mask = random_batch(7)
    for cfg in (preset("clip-higher"), preset("dcpo"), preset("cispo")):
        band = precompute_band(logp_old, cfg)
        assert band.log_lower.shape == logp_old.shape and band.log_upper.dtype == F64
        with_band = policy_loss(logp_old, logp, adv, mask, cfg, band)
        inside = policy_loss(logp_old, logp, adv, mask, cfg)
        assert torch.equal(with_band[0], inside[0])
    band = precompute_band(logp_old, preset("clip-higher"))
    assert torch.all(band.log_upper == math.log1p(0.28))
    assert torch.all(band.log_lower == math.log1p(-0.2))
    assert torch.all(precompute_band(logp_old, preset("cispo")).log_lower == -math.inf)


# --------------------------------------------------------------------------------------
# aggregation


def test_agg_modes_by_hand():
    values = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 5.0, 7.0, 7.0], [6.0, 1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
    # sequence sums 6, 9, 0; token counts 3, 2, 0; 2 rows with tokens; T = 4
    expected = {
        "token-mean": 15 / 5,
        "token-sum": 15.0,
        "seq-mean-token-mean": (2.0 + 4.5) / 2,
        "seq-mean-token-sum": 15 / 2,
        "seq-mean-token-sum-norm": (6 / 4 + 9 / 4) / 2,
    }
    assert set(expected) == set(AGG_MODES)
    for mode, want in expected.items():
        assert agg_loss(values, mask, mode).item() == pytest.approx(want), mode
        assert agg_loss(values, mask.bool(), mode).item() == pytest.approx(want), mode
    assert agg_loss(values, mask, "token-mean", num_tokens=10).item() == pytest.approx(1.5)
    assert agg_loss(values, mask, "seq-mean-token-sum", num_seqs=5).item() == pytest.approx(3.0)
    got = agg_loss(values, mask, "seq-mean-token-sum-norm", loss_scale_factor=2.0)
    assert got.item() == pytest.approx((3.0 + 4.5) / 2)


def test_agg_empty_mask_and_garbage_padding():
    values = torch.tensor([[1.0, float("nan")], [float("inf"), 2.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    for mode in AGG_MODES:
        out = agg_loss(values, mask, mode)
        assert torch.isfinite(out), mode
        (grad,) = torch.autograd.grad(out, values)
        assert torch.isfinite(grad).all() and grad[0, 1] == 0 and grad[1, 0] == 0
        empty = agg_loss(torch.ones(2, 3), torch.zeros(2, 3), mode)
        assert empty.item() == 0.0, mode
    with pytest.raises(LossError, match="'mean'"):
        agg_loss(values, mask, "mean")
    with pytest.raises(LossError, match=r"\(2, 2\)"):
        agg_loss(values, mask[:, :1], "token-mean")


@pytest.mark.parametrize("mode", AGG_MODES)
def test_policy_loss_uses_agg_mode(mode):
    logp_old, logp, adv, mask = random_batch(8)
    cfg = LossConfig(method="clip", agg=mode)
    loss = policy_loss(logp_old, logp, adv, mask, cfg)[0]
    ratio = torch.exp(logp - logp_old)
    per_token = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    torch.testing.assert_close(loss, agg_loss(per_token, mask, mode))


# --------------------------------------------------------------------------------------
# metrics


def test_metrics_by_hand():
    # p_old 0.5, 0.05, 0.05, 0.5 and (masked) 0.3; ratios 1.5, 1.5, 0.9, 0.5, 9
    logp_old = torch.log(torch.tensor([[0.5, 0.05, 0.05, 0.5, 0.3]], dtype=F64))
    ratio = torch.tensor([[1.5, 1.5, 0.9, 0.5, 9.0]], dtype=F64)
    logp = logp_old + ratio.log()
    adv = torch.tensor([[1.0, 1.0, 1.0, -1.0, 1.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 1, 0]], dtype=F64)
    _, m = policy_loss(logp_old, logp, adv, mask, LossConfig(method="clip"))
    assert set(m) == set(METRIC_KEYS)
    r = ratio[0, :4]
    approx = {
        "clipfrac_upper": 2 / 4,
        "clipfrac_lower": 1 / 4,
        "clipfrac": 3 / 4,
        "tail_clipfrac_upper": 1 / 2,  # tail tokens with A > 0: #2 (clipped) and #3
        "dual_clipfrac": 0.0,
        "truncfrac": 0.0,
        "band_width": 0.4,
        "approx_kl_k1": (-r.log()).mean().item(),
        "approx_kl_k3": (r - 1 - r.log()).mean().item(),
        "ratio_mean": r.mean().item(),
        "ratio_max": 1.5,
        "ratio_min": 0.5,
    }
    for key, want in approx.items():
        assert m[key].item() == pytest.approx(want, rel=1e-12, abs=1e-12), key


def forbid_host_sync(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("host sync inside the loss")

    for name in ("item", "tolist", "__bool__", "__float__", "__int__", "numpy", "cpu"):
        monkeypatch.setattr(torch.Tensor, name, refuse)


@pytest.mark.parametrize("method", METHODS)
def test_every_method_returns_metrics_without_host_sync(method, monkeypatch):
    monkeypatch.setattr(loss_band, "log_bounds", fake_log_bounds([]), raising=False)
    logp_old, logp, adv, mask = random_batch(9, dtype=torch.float32)
    logp = logp.requires_grad_()
    cfg = LossConfig(method=method, div="tv")
    band = precompute_band(logp_old, cfg)
    with monkeypatch.context() as patch:
        forbid_host_sync(patch)
        # the CPU tensors stand in for device ones: the band takes the device's route
        patch.setattr(loss_band, "_on_host", lambda x: False)
        # check=False: what the default does on an accelerator (it checks on the CPU only)
        loss, metrics = policy_loss(logp_old, logp, adv, mask, cfg, band, check=False)
        loss_inside, _ = policy_loss(logp_old, logp, adv, mask, cfg, check=False)
    assert loss.dim() == 0 and loss.requires_grad and loss.dtype == torch.float32
    assert torch.equal(loss, loss_inside)
    assert tuple(metrics) == METRIC_KEYS
    for key, value in metrics.items():
        assert isinstance(value, torch.Tensor) and value.dim() == 0, key
        assert not value.requires_grad and torch.isfinite(value), key
    loss.backward()
    assert torch.isfinite(logp.grad).all()


# --------------------------------------------------------------------------------------
# numerics: tiny probabilities, bf16, padding


TINY_LOGPS = [math.log(x) for x in (1e-30, 1e-20, 1e-12, 1e-6, 1e-3, 0.05, 0.5, 0.99)]


def tiny_p_batch(dtype):
    logp_old = torch.tensor([TINY_LOGPS, TINY_LOGPS], dtype=dtype)
    moves = torch.tensor([[60.0, 40.0, 20.0, 5.0, 2.0, 0.5, 0.3, 0.005],
                          [-5.0, 30.0, -2.0, 10.0, -1.0, 1.0, -0.5, -0.2]], dtype=dtype)
    logp = (logp_old + moves).clamp(max=0).requires_grad_()
    adv = torch.tensor([1.0, -1.0])
    return logp_old, logp, adv, torch.ones(2, len(TINY_LOGPS))


def check_finite(logp_old, logp, adv, mask, cfg, band=None):
    loss, metrics = policy_loss(logp_old, logp, adv, mask, cfg, band)
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.isfinite(loss), cfg
    assert torch.isfinite(grad).all() and grad.dtype == logp.dtype, cfg
    for key, value in metrics.items():
        assert torch.isfinite(value), (cfg, key)
    return loss, grad


# (float16 is left out: a gradient of 1e26 / N, which a ratio of 1e26 has, does not fit in it.)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("method", METHODS)
def test_tiny_p_low_precision_with_closed_form_band(method, dtype, monkeypatch):
    monkeypatch.setattr(loss_band, "log_bounds", fake_log_bounds([]), raising=False)
    logp_old, logp, adv, mask = tiny_p_batch(dtype)
    cfg = LossConfig(method=method, div="tv", delta=0.05)
    loss, grad = check_finite(logp_old, logp, adv, mask, cfg)
    assert loss.dtype == torch.float32
    assert (grad != 0).any()


def test_tiny_p_band_edge_is_compared_in_log_space():
    # p = 1e-30: the TV band's upper edge is 1 + 0.05 / p = 5e28; r = e^60 = 1.1e26 is inside,
    # r = e^66 = 4.6e28 inside, e^67 = 1.25e29 outside.  Only log-space comparison gets this.
    logp_old = torch.full((1, 3), math.log(1e-30), dtype=torch.float32)
    logp = (logp_old + torch.tensor([[60.0, 66.0, 67.0]])).requires_grad_()
    band = tv_band(logp_old, 0.05)
    cfg = LossConfig(method="band_clip", div="tv", agg="token-sum")
    _, grad = check_finite(logp_old, logp, torch.ones(1), torch.ones(1, 3), cfg, band)
    assert grad[0, 0] < 0 and grad[0, 1] < 0 and grad[0, 2] == 0


def test_ratio_cap_keeps_absurd_inputs_finite():
    # p_old = e^-200 is below float32's range: the ratio e^150 would overflow; it is capped.
    logp_old = torch.tensor([[-200.0, -1.0]])
    logp = torch.tensor([[-50.0, -1.0]], requires_grad=True)
    for method in ("clip", "cispo", "band_mask", "dcpo"):
        band = Band(torch.zeros(1, 2), torch.full((1, 2), 200.0))
        check_finite(logp_old, logp, torch.tensor([-1.0]), torch.ones(1, 2),
                     LossConfig(method=method), band)


def test_garbage_at_masked_positions_is_ignored(monkeypatch):
    monkeypatch.setattr(loss_band, "log_bounds", fake_log_bounds([]), raising=False)
    logp_old, logp, adv, mask = random_batch(10)
    dirty_old = torch.where(mask > 0, logp_old, torch.full_like(logp_old, -math.inf))
    dirty_new = torch.where(mask > 0, logp, torch.full_like(logp, float("nan"))).requires_grad_()
    dirty_adv = torch.where(mask > 0, adv, torch.full_like(adv, float("nan")))
    for method in METHODS:
        cfg = LossConfig(method=method, div="tv")
        clean = policy_loss(logp_old, logp, adv, mask, cfg)
        dirty = policy_loss(dirty_old, dirty_new, dirty_adv, mask, cfg)
        torch.testing.assert_close(dirty[0], clean[0])
        for key in METRIC_KEYS:
            torch.testing.assert_close(dirty[1][key], clean[1][key], msg=key)
        (grad,) = torch.autograd.grad(dirty[0], dirty_new)
        assert torch.isfinite(grad).all() and torch.all(grad[mask == 0] == 0)


# --------------------------------------------------------------------------------------
# input handling


def test_advantage_shapes_broadcast():
    logp_old, logp, _, mask = random_batch(11)
    per_seq = torch.tensor([1.0, -0.5, 2.0, 0.3], dtype=F64)
    cfg = LossConfig(method="clip")
    full = policy_loss(logp_old, logp, per_seq[:, None].expand_as(logp), mask, cfg)[0]
    assert torch.equal(policy_loss(logp_old, logp, per_seq, mask, cfg)[0], full)
    assert torch.equal(policy_loss(logp_old, logp, per_seq[:, None], mask, cfg)[0], full)


def test_per_token_weights_scale_the_terms():
    logp_old, logp, adv, mask = random_batch(13)
    weights = torch.linspace(0.5, 2.0, 24, dtype=F64).reshape(4, 6)
    cfg = LossConfig(method="clip", agg="token-sum")
    weighted = policy_loss(logp_old, logp, adv, mask, cfg, weights=weights)[0]
    ratio = torch.exp(logp - logp_old)
    per_token = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    torch.testing.assert_close(weighted, (per_token * weights * mask).sum())
    with pytest.raises(LossError, match=r"weights of shape \(3,\)"):
        policy_loss(logp_old, logp, adv, mask, cfg, weights=weights[0, :3])


def test_bad_inputs_raise_clear_errors():
    logp_old, logp, adv, mask = random_batch(12)
    cfg = LossConfig(method="clip")
    with pytest.raises(LossError, match=r"logp has shape \(4, 5\)"):
        policy_loss(logp_old, logp[:, :5], adv, mask, cfg)
    with pytest.raises(LossError, match=r"mask has shape"):
        policy_loss(logp_old, logp, adv, mask[:2], cfg)
    with pytest.raises(LossError, match=r"advantages of shape \(3,\)"):
        policy_loss(logp_old, logp, adv[:3, 0], mask, cfg)
    with pytest.raises(LossError, match=r"advantages of shape \(4, 6, 2\)"):
        policy_loss(logp_old, logp, adv[..., None].expand(4, 6, 2), mask, cfg)
    with pytest.raises(LossError, match="band edges"):
        policy_loss(logp_old, logp, adv, mask, cfg, precompute_band(logp_old[:2], cfg))
    with pytest.raises(LossError, match="list"):
        policy_loss(logp_old.tolist(), logp, adv, mask, cfg)
    with pytest.raises(LossError, match="LossConfig"):
        policy_loss(logp_old, logp, adv, mask, {"method": "clip"})
    with pytest.raises(LossError, match="mask has shape"):
        precompute_band(logp_old, cfg, mask=mask[:, :2])


# --------------------------------------------------------------------------------------
# tests that need the core's band solver (fbands.log_bounds)


def test_precompute_band_uses_core_log_bounds():
    logp_old = torch.log(torch.tensor([[0.9, 0.3, 0.05, 1e-3, 1e-30]]))
    for div in ("kl", "tv", "chi2"):
        band = precompute_band(logp_old, LossConfig(method="band_clip", div=div, delta=0.05))
        want = fbands.log_bounds(logp_old, 0.05, div, logp=True)
        torch.testing.assert_close(band.log_lower, want[0])
        torch.testing.assert_close(band.log_upper, want[1])
    band = precompute_band(logp_old, LossConfig(method="band_clip", div="tv", delta=0.05))
    torch.testing.assert_close(band.log_upper, tv_band(logp_old, 0.05).log_upper)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_precompute_band_solves_only_the_tokens_of_the_mask(monkeypatch, dtype):
    gen = torch.Generator().manual_seed(3)
    logp_old = torch.log(torch.rand(6, 40, generator=gen, dtype=dtype) * 0.999 + 1e-4)
    mask = torch.rand(6, 40, generator=gen) < 0.3  # (most of a padded batch is padding)
    mask[0] = False  # a row with no token at all
    cfg = LossConfig(method="band_clip", div="kl", delta=0.05)
    sizes = []
    real = fbands.log_bounds

    def spy(x, *args, **kwargs):
        sizes.append(x.numel() if hasattr(x, "numel") else np.size(x))
        return real(x, *args, **kwargs)

    monkeypatch.setattr(loss_band, "log_bounds", spy)
    band = precompute_band(logp_old, cfg, mask=mask.to(dtype))
    assert sizes == [int(mask.sum()) + 1]  # the tokens, and one stand-in for the padding
    assert band.log_lower.dtype == dtype and band.log_lower.shape == logp_old.shape
    # the same edges as the whole tensor, bit for bit, on the tokens; padding gets the
    # band of the stand-in p, as an unmasked tensor of it would
    whole_lo, whole_hi = real(logp_old, 0.05, "kl", logp=True)
    assert torch.equal(band.log_lower[mask], whole_lo[mask])
    assert torch.equal(band.log_upper[mask], whole_hi[mask])
    pad_lo, pad_hi = real(torch.full((1,), math.log(0.5), dtype=dtype), 0.05, "kl", logp=True)
    assert torch.all(band.log_lower[~mask] == pad_lo) and torch.all(band.log_upper[~mask] == pad_hi)


@pytest.mark.parametrize("method", ["band_clip", "band_mask", "band_gppo", "trgppo"])
def test_tiny_p_bf16_every_divergence(method):
    logp_old, logp, adv, mask = tiny_p_batch(torch.bfloat16)
    divs = [d for d in fbands.available() if d != "alpha"] + ["alpha(a=0.5)", "alpha(a=2)"]
    for div in divs:
        cfg = LossConfig(method=method, div=div, delta=0.05)
        check_finite(logp_old, logp, adv, mask, cfg)


def train_tail_token(cfg, steps=300, lr=0.02):
    """SGD on a softmax over 5 tokens; the sampled token has p = 0.05 and advantage +1.

    The band is computed once from the old policy and reused in every step, as across
    PPO epochs; returns the final ratio pi / pi_old of the token and the band.
    """
    torch.manual_seed(0)
    p_old = torch.tensor([0.05, 0.45, 0.25, 0.15, 0.10], dtype=F64)
    logits = p_old.log().clone().requires_grad_()
    logp_old = torch.log_softmax(logits, -1)[0].detach().reshape(1, 1)
    band = precompute_band(logp_old, cfg)
    opt = torch.optim.SGD([logits], lr=lr)
    for _ in range(steps):
        logp = torch.log_softmax(logits, -1)[0].reshape(1, 1)
        loss, _ = policy_loss(logp_old, logp, torch.ones(1), torch.ones(1, 1), cfg, band)
        opt.zero_grad()
        loss.backward()
        opt.step()
    ratio = torch.exp(torch.log_softmax(logits, -1)[0] - logp_old[0, 0]).item()
    return ratio, band


def test_mechanism_band_kl_lets_tail_token_grow_past_ppo_clip():
    ppo_ratio, _ = train_tail_token(preset("clip"))
    assert 1.2 <= ppo_ratio < 1.25  # PPO stops at the fixed edge
    band_ratio, band = train_tail_token(preset("band-kl", delta=0.05))
    r_hi = band.log_upper.exp().item()
    assert r_hi > 2.5  # KL band at p = 0.05, delta = 0.05: r_hi is about 3
    assert r_hi <= band_ratio < 1.06 * r_hi  # carried past 1.2, up to the band's edge


# --------------------------------------------------------------------------------------
# invalid values (issue 19): never a plausible loss from an input that is not one


def test_positive_log_probabilities_are_rejected():
    nll = torch.tensor([[2.3, 50.0]])  # negative log-likelihoods, not log-probabilities
    with pytest.raises(LossError, match=r"logp_old must hold log-probabilities.*2\.3.*\(0, 0\)"):
        precompute_band(nll)
    for method in ("band_clip", "clip", "dcpo"):
        with pytest.raises(LossError, match="logp_old"):
            policy_loss(nll, -nll, torch.ones(1), torch.ones(1, 2), LossConfig(method=method))
    # the current policy's log-probabilities too, also when a band is given
    logp_old = torch.log(torch.tensor([[0.5, 0.2]]))
    band = precompute_band(logp_old, LossConfig(method="clip"))
    with pytest.raises(LossError, match=r"logp must hold.*2\.3 at index \(0, 0\) \(2 invalid el"):
        policy_loss(logp_old, nll, torch.ones(1), torch.ones(1, 2), LossConfig(method="clip"),
                    band)
    # masked positions may hold anything; rounding up to LOGP_TOLERANCE counts as p = 1
    assert precompute_band(nll, mask=torch.zeros(1, 2)).log_upper.isfinite().all()
    near_one = precompute_band(torch.tensor([[1e-4, 0.0]]), LossConfig(method="band_clip"))
    assert torch.equal(near_one.log_lower[0, 0], near_one.log_lower[0, 1])
    with pytest.raises(LossError, match="nan"):
        precompute_band(torch.tensor([[-0.5, math.nan]]), LossConfig(method="clip"))


def test_unchecked_invalid_log_probabilities_give_nan_not_a_plausible_loss():
    nll = torch.tensor([[2.3, -0.7]])
    band = precompute_band(nll, LossConfig(method="band_clip"), check=False)
    assert torch.isnan(band.log_lower[0, 0]) and torch.isnan(band.log_upper[0, 0])
    assert torch.isfinite(band.log_upper[0, 1])  # the valid token keeps its band
    logp = torch.tensor([[-0.1, -0.7]], requires_grad=True)
    for method in METHODS:
        loss, _ = policy_loss(nll, logp, torch.ones(1), torch.ones(1, 2),
                              LossConfig(method=method), check=False)
        assert torch.isnan(loss), method
    good_old = torch.tensor([[-1.0, -0.7]])
    loss, _ = policy_loss(good_old, torch.tensor([[3.0, -0.7]]), torch.ones(1),
                          torch.ones(1, 2), LossConfig(method="clip"), check=False)
    assert torch.isnan(loss)


def test_bad_band_is_rejected_not_silently_unclipped():
    # p = 0.1, ratio e^2 = 7.389, A = 1: a NaN band used to switch the clip off (-7.389)
    logp_old = torch.log(torch.tensor([[0.1]], dtype=F64))
    logp = logp_old + 2.0
    cfg = LossConfig(method="band_clip", div="tv", delta=0.05)
    good = policy_loss(logp_old, logp, torch.ones(1), torch.ones(1, 1), cfg)[0]
    assert good.item() == pytest.approx(-1.5)  # TV band at p = 0.1: upper edge 1 + 0.05 / 0.1
    nan = torch.full((1, 1), math.nan, dtype=F64)
    for band, fragment in ((Band(nan, nan), "log_lower must not be nan"),
                           (Band(torch.zeros(1, 1, dtype=F64), nan), "log_upper must not be nan"),
                           (Band(torch.full((1, 1), 0.3, dtype=F64),
                                 torch.full((1, 1), 0.1, dtype=F64)), "must not exceed")):
        with pytest.raises(LossError, match=fragment):
            policy_loss(logp_old, logp, torch.ones(1), torch.ones(1, 1), cfg, band)
        loss, _ = policy_loss(logp_old, logp, torch.ones(1), torch.ones(1, 1), cfg, band,
                              check=False)
        assert torch.isnan(loss)
    # a bad edge at a masked position is padding, not an error
    band = Band(torch.tensor([[0.0, math.nan]], dtype=F64), torch.tensor([[0.1, math.nan]]))
    two_old = torch.cat([logp_old, logp_old], 1)
    loss, _ = policy_loss(two_old, two_old, torch.ones(1), torch.tensor([[1.0, 0.0]]), cfg, band)
    assert loss.item() == -1.0  # ratio 1 inside [1, e^0.1]
    with pytest.raises(LossError, match="band.log_lower must be a torch.Tensor"):
        policy_loss(logp_old, logp, torch.ones(1), torch.ones(1, 1), cfg, ([[0.0]], [[0.1]]))


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"num_tokens": 0}, "num_tokens must be a finite number > 0, got 0"),
        ({"num_tokens": -3.0}, "num_tokens.*-3.0"),
        ({"num_tokens": True}, "num_tokens.*True"),
        ({"num_tokens": "10"}, "num_tokens.*'10'"),
        ({"num_seqs": 0}, "num_seqs"),
        ({"loss_scale_factor": 0}, "loss_scale_factor.*got 0"),
        ({"loss_scale_factor": math.inf}, "loss_scale_factor.*inf"),
        ({"loss_scale_factor": math.nan}, "loss_scale_factor.*nan"),
        ({"num_tokens": torch.tensor(0.0)}, "num_tokens.*0.0"),
        ({"num_seqs": torch.tensor([1.0, 2.0])}, "num_seqs.*shape \\(2,\\)"),
    ],
)
def test_agg_rejects_bad_denominators(options, fragment):
    values, mask = torch.ones(2, 3), torch.ones(2, 3)
    mode = "seq-mean-token-sum-norm" if "loss_scale_factor" in options else (
        "seq-mean-token-mean" if "num_seqs" in options else "token-mean")
    with pytest.raises(LossError, match=fragment):
        agg_loss(values, mask, mode, **options)
    with pytest.raises(LossError, match=fragment):
        policy_loss(torch.full((2, 3), -1.0), torch.full((2, 3), -1.0), torch.ones(2), mask,
                    LossConfig(method="clip", agg=mode), **options)


def test_agg_rejects_bad_masks_and_nan_when_unchecked():
    values = torch.ones(2, 2)
    for bad, shown in ((-1.0, "-1.0"), (math.nan, "nan"), (math.inf, "inf")):
        mask = torch.tensor([[1.0, bad], [1.0, 0.0]])
        with pytest.raises(LossError, match=f"mask must be.*got {shown} at index \\(0, 1\\)"):
            agg_loss(values, mask, "token-mean")
        for mode in AGG_MODES:
            assert torch.isnan(agg_loss(values, mask, mode, check=False)), (mode, bad)
    with pytest.raises(LossError, match="mask"):
        agg_loss(values, torch.tensor([[1, -2], [1, 0]]), "token-sum")
    assert torch.isnan(agg_loss(values, mask, "token-mean", num_tokens=torch.tensor(0.0),
                                check=False))
    # non-negative weights stay valid (verl and TRL pass their normalisation this way)
    weights = torch.tensor([[0.25, 2.0], [0.5, 0.0]])
    assert agg_loss(values, weights, "token-sum").item() == 2.75
    with pytest.raises(LossError, match="check must be"):
        agg_loss(values, weights, "token-sum", check="yes")


def test_agg_integer_values_are_averaged_in_float32():
    values = torch.tensor([[1, 2, 3], [4, 0, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    for mode in AGG_MODES:
        got = agg_loss(values, mask, mode)
        assert got.dtype == torch.float32
        assert got.item() == agg_loss(values.float(), mask, mode).item(), mode
    assert agg_loss(values.bool(), mask, "token-sum").item() == 4.0


@pytest.mark.parametrize("shape", [(0, 5), (3, 0)])
@pytest.mark.parametrize("method", METHODS)
def test_empty_batch_gives_zero_loss_with_gradient(shape, method, monkeypatch):
    monkeypatch.setattr(loss_band, "log_bounds", fake_log_bounds([]), raising=False)
    logp_old = torch.full(shape, -1.0)
    logp = torch.full(shape, -0.9, requires_grad=True)
    for agg in AGG_MODES:
        cfg = LossConfig(method=method, div="tv", agg=agg)
        loss, metrics = policy_loss(logp_old, logp, torch.ones(shape[0]), torch.ones(shape), cfg)
        (grad,) = torch.autograd.grad(loss, logp)
        assert loss.item() == 0.0 and grad.shape == shape, agg
        assert all(v.item() == 0.0 for v in metrics.values()), agg


def test_checked_and_unchecked_values_are_identical():
    logp_old, logp, adv, mask = random_batch(21)
    for method in METHODS:
        cfg = LossConfig(method=method, div="tv")
        band = precompute_band(logp_old, cfg, mask=mask)
        a = policy_loss(logp_old, logp, adv, mask, cfg, band, check=True)
        b = policy_loss(logp_old, logp, adv, mask, cfg, band, check=False)
        assert torch.equal(a[0], b[0]), method
        assert all(torch.equal(a[1][k], b[1][k]) for k in METRIC_KEYS), method


def test_meta_and_sparse_tensors_give_loss_errors():
    meta = torch.full((2, 3), -1.0, device="meta")
    cfg = LossConfig(method="clip")
    with pytest.raises(LossError, match="meta"):
        policy_loss(meta, meta, torch.ones(2, device="meta"), torch.ones(2, 3, device="meta"),
                    cfg, check=True)
    with pytest.raises(LossError, match="meta"):
        precompute_band(meta, cfg, check=True)
    assert precompute_band(meta, cfg).log_lower.is_meta  # by default checked on the CPU only
    sparse = torch.full((2, 3), -1.0).to_sparse()
    with pytest.raises(LossError, match="dense"):
        policy_loss(sparse, sparse, torch.ones(2), torch.ones(2, 3), cfg)
    with pytest.raises(LossError, match="check must be"):
        policy_loss(torch.full((2, 3), -1.0), torch.full((2, 3), -1.0), torch.ones(2),
                    torch.ones(2, 3), cfg, check=1)


# --- issue 42, P14 and P15: a ratio over probability 0, and tensors on two devices ----------
@pytest.mark.parametrize("name", ["clip", "band-kl", "band-mask-tv", "cispo", "dcpo"])
def test_an_old_log_probability_of_minus_inf_in_the_mask_is_refused(name):
    """A sampled token with probability 0 under the policy that sampled it gives an
    infinite ratio; the loss was a plausible-looking 1.8e34 that no non-finite check
    caught.  Checked: a LossError naming it; unchecked: nan; outside the mask: nothing."""
    cfg = preset(name)
    logp_old = torch.log(torch.tensor([[0.5, 0.2, 0.3]]))
    logp = logp_old.clone()
    logp_old[0, 1] = -math.inf
    adv, mask = torch.tensor([1.0]), torch.ones(1, 3)
    with pytest.raises(LossError, match=r"logp_old must be > -inf .* at index \(0, 1\)"):
        policy_loss(logp_old, logp, adv, mask, cfg)
    loss, _ = policy_loss(logp_old, logp, adv, mask, cfg, check=False)
    assert math.isnan(loss.item())
    mask[0, 1] = 0  # a padded position may hold anything
    loss, _ = policy_loss(logp_old, logp, adv, mask, cfg)
    assert math.isfinite(loss.item())


def test_inputs_on_two_devices_are_a_loss_error_naming_the_argument():
    """(``meta`` stands in for a second device: the check happens before any value is
    read.)"""
    cfg = preset("band-kl")
    logp_old = torch.log(torch.tensor([[0.5, 0.2]]))
    args = dict(logp_old=logp_old, logp=logp_old.clone(), advantages=torch.tensor([1.0]),
                mask=torch.ones(1, 2))
    band = precompute_band(logp_old, cfg)
    for name in args:
        moved = {**args, name: args[name].to("meta")}
        with pytest.raises(LossError, match=rf"^({name} is on meta|logp is on cpu), but"):
            policy_loss(cfg=cfg, check=False, **moved)
    for edge in (0, 1):
        moved = tuple(e.to("meta") if i == edge else e for i, e in enumerate(band))
        with pytest.raises(LossError, match="band.log_(lower|upper) is on meta, but logp_old"):
            policy_loss(**args, cfg=cfg, band=Band(*moved), check=False)
    with pytest.raises(LossError, match="^weights is on meta"):
        policy_loss(**args, cfg=cfg, band=band, weights=torch.ones(1, 2, device="meta"))
    with pytest.raises(LossError, match="^mask is on meta, but logp_old"):
        precompute_band(logp_old, cfg, mask=torch.ones(1, 2, device="meta"), check=False)
    with pytest.raises(LossError, match="^mask is on meta, but values"):
        agg_loss(logp_old, torch.ones(1, 2, device="meta"), "token-mean", check=False)
