"""Soft clipping (LossConfig.soft): values and slopes against formulas written out here."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from fbands.errors import LossError  # noqa: E402
from fbands.losses import LossConfig, policy_loss, precompute_band, soft_clip  # noqa: E402

# Two bands: symmetric about 1 (PPO's), and a tail token's lopsided one.
BANDS = [(0.8, 1.2), (0.5, 3.0)]


def expected(r, lo, hi, form, k=1.0, width=0.25):
    """(s(r), ds/dr) from the definitions in the docs, in plain floats."""
    if form == "tanh1":
        m, h = (lo + hi) / 2, (hi - lo) / 2
        t = math.tanh((r - m) / h)
        return m + h * t, 1 - t * t
    if form == "tanh2":
        e = hi - 1 if r >= 1 else 1 - lo
        t = math.tanh(k * (r - 1) / e)
        return 1 + e * t, k * (1 - t * t)
    if r > hi or r < lo:
        b = hi if r > hi else lo
        w = width * abs(b - 1)
        t = math.tanh((r - b) / w)
        return b + w * t, 1 - t * t
    return r, 1.0


def points(lo, hi):
    """Inside, at and outside both edges, and r = 1."""
    return [lo * 0.5, lo * 0.999, lo, lo * 1.001, 1.0, (1 + hi) / 2, hi * 0.999, hi,
            hi * 1.001, hi * 2, hi * 50]


@pytest.mark.parametrize("form", ["tanh1", "tanh2", "smooth3"])
@pytest.mark.parametrize("lo, hi", BANDS)
def test_value_and_slope(form, lo, hi):
    rs = points(lo, hi)
    lr = torch.tensor([math.log(r) for r in rs], dtype=torch.float64, requires_grad=True)
    log_lo = torch.full_like(lr, math.log(lo)).detach()
    log_hi = torch.full_like(lr, math.log(hi)).detach()
    s = soft_clip(lr, log_lo, log_hi, form, k=1.5 if form == "tanh2" else 1.0)
    (ds_dlr,) = torch.autograd.grad(s.sum(), lr)
    for i, r in enumerate(rs):
        r = math.exp(lr[i].item())  # the ratio the tensor holds
        want, slope = expected(r, lo, hi, form, k=1.5)
        assert s[i].item() == pytest.approx(want, rel=1e-13, abs=1e-15), (form, r)
        # d s / d log r = r s'(r); at an edge smooth3's two sides agree (slope 1).
        assert ds_dlr[i].item() == pytest.approx(r * slope, rel=1e-10, abs=1e-14), (form, r)


@pytest.mark.parametrize("lo, hi", BANDS)
def test_smooth3_is_the_identity_inside(lo, hi):
    lr = torch.linspace(math.log(lo), math.log(hi), 101, dtype=torch.float64)
    s = soft_clip(lr, torch.full_like(lr, math.log(lo)), torch.full_like(lr, math.log(hi)),
                  "smooth3")
    assert torch.equal(s, torch.exp(lr))


def test_saturation_limits():
    lr = torch.tensor([math.log(1e6), math.log(1e-9)], dtype=torch.float64)
    lo, hi = torch.full_like(lr, math.log(0.8)), torch.full_like(lr, math.log(1.2))
    # Upwards each form reaches its ceiling; downwards r stops at 0, short of the floor:
    # s(0) = 1 - e tanh(1 / e) with e = 0.2 (tanh1 is tanh2 for a band symmetric about 1).
    at_zero = 1 - 0.2 * math.tanh(5.0)
    assert soft_clip(lr, lo, hi, "tanh2").tolist() == pytest.approx([1.2, at_zero], abs=1e-12)
    assert soft_clip(lr, lo, hi, "tanh1").tolist() == pytest.approx([1.2, at_zero], abs=1e-12)
    # smooth3 saturates at b +- width |b - 1| (w = 0.1 here): 1.3, and 0.8 - 0.1 tanh(8).
    assert soft_clip(lr, lo, hi, "smooth3", width=0.5).tolist() == pytest.approx(
        [1.3, 0.8 - 0.1 * math.tanh(8.0)], abs=1e-12)


def _batch(dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(3, 8, generator=g, dtype=dtype) * 0.98 + 0.01
    logp_old = torch.log(p)
    shift = torch.randn(3, 8, generator=g, dtype=dtype) * 0.4
    adv = torch.randn(3, 8, generator=g, dtype=dtype)
    mask = torch.ones(3, 8)
    mask[2, 5:] = 0
    return logp_old, (logp_old + shift).clamp(max=-0.01), adv, mask


@pytest.mark.parametrize("form", ["tanh1", "tanh2", "smooth3"])
@pytest.mark.parametrize("method", ["band_clip", "clip", "dual_clip"])
def test_gradcheck(form, method):
    logp_old, logp, adv, mask = _batch()
    cfg = LossConfig(method=method, soft=form, soft_k=1.3)
    band = precompute_band(logp_old, cfg, mask=mask)
    logp = logp.clone().requires_grad_()

    def f(x):
        return policy_loss(logp_old, x, adv, mask, cfg, band)[0]

    assert torch.autograd.gradcheck(f, (logp,), eps=1e-7, atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("method", ["band_clip", "clip"])
def test_loss_value_by_hand(method):
    """The per-token term is max(-A r, -A s(r)), summed."""
    p = [0.5, 0.05, 0.3, 0.7]
    lr = [0.4, 1.5, -0.6, 0.05]
    adv = [1.0, 2.0, -1.0, -0.5]
    logp_old = torch.log(torch.tensor([p], dtype=torch.float64))
    logp = logp_old + torch.tensor([lr], dtype=torch.float64)
    cfg = LossConfig(method=method, soft="tanh2", agg="token-sum")
    band = precompute_band(logp_old, cfg)
    loss, m = policy_loss(logp_old, logp, torch.tensor([adv], dtype=torch.float64),
                          torch.ones(1, 4), cfg, band)
    want = 0.0
    for i in range(4):
        lo, hi = math.exp(band.log_lower[0, i].item()), math.exp(band.log_upper[0, i].item())
        r = math.exp(lr[i])
        s, _ = expected(r, lo, hi, "tanh2")
        want += max(-adv[i] * r, -adv[i] * s)
    assert loss.item() == pytest.approx(want, rel=1e-12)
    hard = policy_loss(logp_old, logp, torch.tensor([adv], dtype=torch.float64),
                       torch.ones(1, 4), LossConfig(method=method, agg="token-sum"), band)
    # Same tokens counted as beyond their edge.
    assert m["clipfrac"].item() == hard[1]["clipfrac"].item()


def test_unclipped_side_is_untouched():
    # A > 0 with r < 1 (and A < 0 with r > 1): PPO's max keeps -A r, soft or not.
    logp_old = torch.log(torch.tensor([[0.4, 0.4]], dtype=torch.float64))
    logp = (logp_old + torch.tensor([[-0.7, 0.9]], dtype=torch.float64)).requires_grad_()
    adv = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    for form in ("tanh1", "tanh2", "smooth3"):
        cfg = LossConfig(method="clip", soft=form, agg="token-sum")
        loss, _ = policy_loss(logp_old, logp, adv, torch.ones(1, 2), cfg)
        r = math.exp(-0.7), math.exp(0.9)
        assert loss.item() == pytest.approx(-r[0] + r[1], rel=1e-13), form


def test_smooth3_narrow_width_approaches_hard_clip():
    logp_old, logp, adv, mask = _batch()
    hard, _ = policy_loss(logp_old, logp, adv, mask, LossConfig())
    soft, _ = policy_loss(logp_old, logp, adv, mask, LossConfig(soft="smooth3", soft_width=1e-9))
    assert soft.item() == pytest.approx(hard.item(), rel=1e-8)


@pytest.mark.parametrize("form", ["tanh1", "tanh2", "smooth3"])
def test_tiny_probability_float32(form):
    # p = 1e-40 (subnormal in float32): the KL edge is ~1e38 and beyond; a ratio of e^85.
    logp_old = torch.tensor([[-40 * math.log(10), math.log(0.5)]], dtype=torch.float32)
    logp = (logp_old + torch.tensor([[85.0, 0.3]])).requires_grad_()
    cfg = LossConfig(soft=form)
    loss, _ = policy_loss(logp_old, logp, torch.tensor([[1.0, 1.0]]), torch.ones(1, 2), cfg)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"soft": "tanh"}, "unknown soft 'tanh'"),
        ({"soft": "tanh2", "method": "cispo"}, "applies to the clip-form methods"),
        ({"soft": "tanh2", "method": "band_gppo"}, "not 'band_gppo'"),
        ({"soft": "tanh2", "soft_k": 0.0}, "soft_k must be"),
        ({"soft": "smooth3", "soft_width": -1.0}, "soft_width must be"),
    ],
)
def test_bad_config(kwargs, match):
    with pytest.raises(LossError, match=match):
        LossConfig(**kwargs)


def test_soft_clip_unknown_form():
    x = torch.zeros(2)
    with pytest.raises(LossError, match="unknown soft form"):
        soft_clip(x, x - 1, x + 1, "cubic")


def test_plot_soft_clip_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from fbands.plotting import plot_soft_clip

    out = plot_soft_clip(tmp_path / "soft.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
