"""BandPO's soft-clip forms (fbands.losses.soft): against their equations in mpmath, against
numbers worked out from BandPO's formulas, gradcheck, and continuity at the joins."""

from __future__ import annotations

import math

import mpmath as mp
import pytest
import torch

from fbands.losses import Band, LossConfig, LossError, policy_loss, soft_clip, soft_options

BANDPO_FORMS = ("3seg", "3seg_control_converge", "3seg_control_reach", "rollback",
                "rollback_activate", "rollback_plus", "rollback_activate_plus")
SMOOTH = ("3seg", "3seg_control_converge", "3seg_control_reach")  # C1 at their joins
PARAMS = {"rho": 0.1, "g": 1.0, "alpha": 0.05, "gamma": 0.2, "alpha_in": 2.0}


def _reference(form, r, lo, hi, **params):
    """``s(r)`` from the equations as BandPO writes them (a tanh(b (r - c)) + d), in mpmath
    at 40 digits (mpmath's global precision is left as it was)."""
    with mp.workdps(40):
        return _reference_40(form, r, lo, hi, **params)


def _reference_40(form, r, lo, hi, rho=0.1, g=1.0, alpha=0.05, gamma=0.2, alpha_in=2.0):
    r, a_, b_ = mp.mpf(r), mp.mpf(lo), mp.mpf(hi)
    eps_h, eps_l = b_ - 1, 1 - a_
    e_h, e_l = rho + (1 - rho) * b_, rho + (1 - rho) * a_
    if form == "3seg":
        dh, dl = e_h - 1, 1 - e_l
        kh = eps_h / (eps_h**2 - dh**2)
        kl = eps_l / (eps_l**2 - dl**2)
        if r >= e_h:
            return 1 + eps_h * mp.tanh(kh * (r - 1) + mp.atanh(dh / eps_h) - kh * dh)
        if r <= e_l:
            return 1 + eps_l * mp.tanh(kl * (r - 1) - mp.atanh(dl / eps_l) + kl * dl)
        return r
    if form.startswith("3seg_control"):
        big_e = mp.e ** (2 * g)
        if r >= e_h:
            a = (b_ - e_h) * (1 + big_e) / 2
            b = (1 + mp.e ** (-2 * g)) / (2 * (b_ - e_h))
            c = e_h - 2 * g * (b_ - e_h) * big_e / (1 + big_e)
            return a * mp.tanh(b * (r - c)) + b_ - a
        if r <= e_l and form.endswith("converge"):
            a = (e_l - a_) * (1 + big_e) / (2 * big_e)
            b = (1 + big_e) / (2 * (e_l - a_))
            c = e_l - 2 * g * (e_l - a_) / (1 + big_e)
            return max(a * mp.tanh(b * (r - c)) + a_ + a, 0)
        if r <= e_l:
            gg, s = mp.mpf(g), e_l / (e_l - a_)
            while mp.coth(gg) - s / gg <= -1 + mp.mpf("1e-7"):
                gg *= mp.mpf("1.5")
            t = mp.coth(gg) - s / gg
            a, b = e_l / (gg * (1 - t * t)), gg / e_l
            return max(a * mp.tanh(b * (r - e_l + mp.atanh(t) / b)) + e_l - a * t, 0)
        return r
    plus = form.endswith("plus")
    if plus:
        a_hi = alpha * eps_h / eps_l
        if r >= b_:
            return b_ - a_hi * mp.tanh(gamma * (r - b_))
        if r <= a_:
            return a_ - alpha * mp.tanh(gamma * (r - a_))
    else:
        a_hi = alpha * (b_ / a_) ** 2
        if r >= b_:
            return -a_hi * mp.tanh(r - 1) + b_ + a_hi * mp.tanh(eps_h)
        if r <= a_:
            return -alpha * mp.tanh(r - 1) + a_ - alpha * mp.tanh(eps_l)
    if "activate" not in form:
        return r
    eps = eps_l if r <= 1 else eps_h
    return 1 + eps / mp.tanh(alpha_in) * mp.tanh(alpha_in / eps * (r - 1))


def _s(form, ratios, lo, hi, dtype=torch.float64, **params):
    lr = torch.log(torch.tensor(ratios, dtype=torch.float64)).to(dtype)
    return soft_clip(lr, torch.full_like(lr, math.log(lo)), torch.full_like(lr, math.log(hi)),
                     form, **params)


RATIOS = [0.02, 0.3, 0.55, 0.79, 0.83, 0.97, 1.0, 1.03, 1.17, 1.21, 1.6, 3.0, 7.5]
BANDS = [(0.8, 1.2), (0.3, 4.0), (0.95, 1.02), (1e-6, 50.0)]


@pytest.mark.parametrize("form", BANDPO_FORMS)
@pytest.mark.parametrize("band", BANDS)
def test_matches_the_equations_in_mpmath(form, band):
    got = _s(form, RATIOS, *band).tolist()
    want = [float(_reference(form, r, *band)) for r in RATIOS]
    assert got == pytest.approx(want, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("params", [{"rho": 0.3, "g": 2.5}, {"rho": 1.0, "g": 0.2},
                                    {"alpha": 0.15, "gamma": 1.5, "alpha_in": 0.7}])
@pytest.mark.parametrize("form", BANDPO_FORMS)
def test_parameters_follow_the_equations(form, params):
    got = _s(form, RATIOS, 0.7, 1.6, **params).tolist()
    want = [float(_reference(form, r, 0.7, 1.6, **{**PARAMS, **params})) for r in RATIOS]
    assert got == pytest.approx(want, rel=1e-12, abs=1e-12)


# s(r) worked out by hand (mpmath, 40 digits) from the formulas of BandPO's
# soft_clipbound.py with its apply_soft_clip defaults (rho 0.1, g 1, alpha 0.05, gamma 0.2,
# alpha_in 2), on the bands [0.8, 1.2] and [0.3, 4].
BANDPO_VALUES = {
    "3seg": [0.80000000102064104, 0.81206235971965952, 1.1879376402803405, 1.199999998979359,
             0.30126963678767499, 3.7856066673471188, 3.9999012452849311],
    "3seg_control_converge": [0.8, 0.80227618714719734, 1.1880458489157683, 1.199999999706886,
                              0.30000000000000519, 3.7865038844270214, 3.9999435019488951],
    "3seg_control_reach": [0.80000000005137986, 0.81180196342915932, 1.1880458489157683,
                           1.199999999706886, 0.3005444754612505, 3.7865038844270214,
                           3.9999435019488951],
    "rollback": [0.81323709185175534, 0.81, 1.19, 1.1702165433335506, 0.30559650465409303, 3.8,
                 3.9568493282145362],
    "rollback_activate": [0.81323709185175534, 0.80161616163460083, 1.1983838383653992,
                          1.1702165433335506, 0.30559650465409303, 3.9665882597603898,
                          3.9568493282145362],
    "rollback_plus": [0.80299640517645722, 0.81, 1.19, 1.1970035948235428, 0.30199893401555817,
                      3.8, 3.9185823652310232],
    "rollback_activate_plus": [0.80299640517645722, 0.80161616163460083, 1.1983838383653992,
                               1.1970035948235428, 0.30199893401555817, 3.9665882597603898,
                               3.9185823652310232],
}


@pytest.mark.parametrize("form", BANDPO_FORMS)
def test_bandpo_values(form):
    got = _s(form, [0.5, 0.81, 1.19, 1.5], 0.8, 1.2).tolist() + _s(
        form, [0.1, 3.8, 6.0], 0.3, 4.0).tolist()
    assert got == pytest.approx(BANDPO_VALUES[form], rel=1e-13, abs=1e-15)


def test_aliases_are_fbands_forms():
    lr = torch.log(torch.tensor(RATIOS, dtype=torch.float64))
    lo, hi = torch.full_like(lr, math.log(0.7)), torch.full_like(lr, math.log(1.6))
    assert torch.equal(soft_clip(lr, lo, hi, "1seg"), soft_clip(lr, lo, hi, "tanh1"))
    assert torch.equal(soft_clip(lr, lo, hi, "2seg", k=1.5), soft_clip(lr, lo, hi, "tanh2", k=1.5))
    assert torch.allclose(soft_clip(lr, lo, hi, "hard"), torch.exp(lr).clamp(0.7, 1.6))
    assert LossConfig(soft="1seg").soft == "tanh1" and LossConfig(soft="hard").soft is None
    # 3seg with rho = 1 (joins at 1) is tanh2 with k = 1.
    assert torch.allclose(soft_clip(lr, lo, hi, "3seg", rho=1.0), soft_clip(lr, lo, hi, "tanh2"),
                          rtol=1e-13, atol=1e-14)


def test_3seg_is_converge_with_g_atanh_above():
    rho = 0.2
    r = [1.5, 1.59, 2.0, 5.0]
    three = _s("3seg", r, 0.7, 1.6, rho=rho)
    conv = _s("3seg_control_converge", r, 0.7, 1.6, rho=rho, g=math.atanh(1 - rho))
    assert torch.allclose(three, conv, rtol=1e-13)


def _joins(form, lo, hi, rho=0.1):
    if form in SMOOTH:
        return [rho + (1 - rho) * lo, rho + (1 - rho) * hi]
    joins = [lo, hi]
    return joins + [1.0] if "activate" in form else joins


@pytest.mark.parametrize("form", BANDPO_FORMS)
@pytest.mark.parametrize("band", [(0.8, 1.2), (0.3, 4.0)])
def test_continuous_at_the_joins(form, band):
    h = 1e-7
    for x in _joins(form, *band):
        left, mid, right = _s(form, [x * (1 - h), x, x * (1 + h)], *band).tolist()
        assert abs(right - left) < 10 * h * max(1.0, x * 200), (x, left, right)
        assert abs(mid - left) < 10 * h * max(1.0, x * 200)


@pytest.mark.parametrize("form", SMOOTH + ("rollback_activate", "rollback_activate_plus"))
def test_slope_continuous_at_the_smooth_joins(form):
    lo, hi = 0.7, 1.6
    joins = _joins(form, lo, hi) if form in SMOOTH else [1.0]
    for x in joins:
        lr = torch.log(torch.tensor([x * (1 - 1e-9), x * (1 + 1e-9)], dtype=torch.float64))
        lr.requires_grad_()
        s = soft_clip(lr, torch.full_like(lr, math.log(lo)), torch.full_like(lr, math.log(hi)),
                      form)
        (d,) = torch.autograd.grad(s.sum(), lr)
        slope = (d / torch.exp(lr)).tolist()  # ds/dr
        assert slope[0] == pytest.approx(slope[1], rel=1e-6), (x, slope)
        if form in SMOOTH:
            assert slope[0] == pytest.approx(1.0, rel=1e-6)


@pytest.mark.parametrize("form", BANDPO_FORMS)
def test_gradcheck(form):
    # Points off the joins (finite differences straddling a slope jump would fail).
    ratios = [0.05, 0.4, 0.75, 0.9, 1.1, 1.25, 1.7, 3.0]
    lr = torch.log(torch.tensor(ratios, dtype=torch.float64)).requires_grad_()
    lo = torch.full_like(lr, math.log(0.8))
    hi = torch.full_like(lr, math.log(1.3))
    assert torch.autograd.gradcheck(lambda x: soft_clip(x, lo, hi, form), (lr,), eps=1e-7,
                                    atol=1e-7)


def test_reach_meets_the_lower_edge_at_zero():
    for lo, hi in [(0.8, 1.2), (0.3, 4.0), (0.999, 1.001), (1e-4, 100.0)]:
        s0 = _s("3seg_control_reach", [1e-300], lo, hi).item()
        assert s0 == pytest.approx(lo, rel=1e-9)


@pytest.mark.parametrize("form", BANDPO_FORMS)
def test_finite_for_an_overflowing_edge_in_float32(form):
    lr = torch.tensor([-3.0, 0.0, 5.0, 60.0, 85.0], requires_grad=True)
    lo = torch.full_like(lr, -200.0)  # r_lo underflows to 0
    hi = torch.full_like(lr, 150.0)   # r_hi overflows float32
    s = soft_clip(lr, lo, hi, form)
    (g,) = torch.autograd.grad(s.sum(), lr)
    assert torch.isfinite(s).all() and torch.isfinite(g).all()


@pytest.mark.parametrize("form", BANDPO_FORMS)
def test_policy_loss_takes_every_form(form):
    logp_old = torch.log(torch.tensor([[0.5, 0.05, 0.9, 0.3]]))
    logp = (logp_old + torch.tensor([[0.4, 1.5, -0.5, 0.0]])).requires_grad_()
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    band = Band(torch.full((1, 4), math.log(0.8)), torch.full((1, 4), math.log(1.3)))
    loss, metrics = policy_loss(logp_old, logp, adv, torch.ones(1, 4),
                                LossConfig(method="clip", soft=form, agg="token-sum"), band=band)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert metrics["clipfrac"].item() > 0


def test_soft_options_for_the_new_parameters():
    assert soft_options("3seg_control_reach", soft_rho=0.2, soft_g=2.0) == {
        "soft": "3seg_control_reach", "soft_rho": 0.2, "soft_g": 2.0}
    assert soft_options("2seg", 3.0) == {"soft": "tanh2", "soft_k": 3.0}
    assert soft_options("hard") == {"soft": None}
    with pytest.raises(LossError, match=r"soft_gamma=0.5 applies to soft=one of rollback_plus"):
        soft_options("rollback", soft_gamma=0.5)
    with pytest.raises(LossError, match=r"soft_g=2.0 applies to"):
        soft_options("3seg", soft_g=2.0)
    with pytest.raises(LossError, match="soft_rho must be"):
        LossConfig(soft="3seg", soft_rho=0.0)
    with pytest.raises(LossError, match="soft_g must be"):
        LossConfig(soft="3seg_control_converge", soft_g=25.0)


def test_bandpo_forms_by_name_in_trl_and_train(tmp_path):
    from fbands.errors import ConfigError
    from fbands.rl.config import TrainConfig

    cfg = TrainConfig(soft="rollback_activate_plus", soft_gamma=0.3, soft_alpha_in=1.5)
    assert (cfg.loss_config().soft, cfg.loss_config().soft_gamma) == ("rollback_activate_plus", 0.3)
    assert TrainConfig(soft="1seg").loss_config().soft == "tanh1"
    with pytest.raises(ConfigError, match="soft_rho=0.2 applies to"):
        TrainConfig(soft="rollback", soft_rho=0.2).loss_config()
    pytest.importorskip("trl")
    from fbands.integrations.trl import TRLBandError

    from ..integrations.test_trl import make_args

    trl_cfg = make_args(tmp_path, band_soft="3seg_control_converge", band_soft_rho="0.3",
                        band_soft_g=2).band_loss_config()
    assert (trl_cfg.soft, trl_cfg.soft_rho, trl_cfg.soft_g) == ("3seg_control_converge", 0.3, 2.0)
    with pytest.raises(TRLBandError, match="band_soft_alpha=0.1 applies to band_soft="):
        make_args(tmp_path, band_soft="3seg", band_soft_alpha=0.1)
