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


# --- the soft clip on the trainers' surfaces: fbands train, TRL, verl -----------------------
@pytest.mark.parametrize(
    "args, want",
    [
        ((None, None, None), {"soft": None}),
        (("", None, None), {"soft": None}),
        (("tanh1", None, None), {"soft": "tanh1"}),
        (("tanh2", 2.0, None), {"soft": "tanh2", "soft_k": 2.0}),
        (("smooth3", None, 0.5), {"soft": "smooth3", "soft_width": 0.5}),
    ],
)
def test_soft_options(args, want):
    from fbands.losses import soft_options

    assert soft_options(*args) == want


@pytest.mark.parametrize(
    "args, match",
    [
        (("tanh3", None, None), r"soft='tanh3': expected one of tanh1, tanh2, smooth3"),
        ((None, 2.0, None), r"soft_k=2.0 applies to soft='tanh2' only, not soft=None"),
        (("smooth3", 2.0, None), r"soft_k=2.0 applies to soft='tanh2' only"),
        (("tanh2", None, 0.5), r"soft_width=0.5 applies to soft='smooth3' only"),
    ],
)
def test_soft_options_errors(args, match):
    from fbands.losses import soft_options

    with pytest.raises(LossError, match=match):
        soft_options(*args)


def _record(monkeypatch, module):
    """Wrap ``module.policy_loss`` so that every call's inputs and loss are kept."""
    calls, real = [], module.policy_loss

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        detached = tuple(x.detach() if torch.is_tensor(x) else x for x in args)
        calls.append((detached, kwargs, out[0].detach()))
        return out

    monkeypatch.setattr(module, "policy_loss", spy)
    return calls


def _recompute(calls, cfg):
    """For each recorded call, fbands.losses' loss of ``cfg`` on the same tensors."""
    return [policy_loss(*args[:4], cfg, *args[5:], **kwargs)[0] for args, kwargs, _ in calls]


def test_trainer_config_and_cli_soft(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("tqdm")
    from fbands.errors import ConfigError
    from fbands.losses import preset
    from fbands.rl.cli import _config_from_args, register
    from fbands.rl.config import TrainConfig

    assert TrainConfig(soft="smooth3", soft_width=0.5).validate().loss_config() == preset(
        "band-kl", soft="smooth3", soft_width=0.5)
    assert TrainConfig().loss_config().soft is None
    assert TrainConfig(soft="").loss_config() == TrainConfig().loss_config()
    assert TrainConfig.from_dict({"soft": "tanh2", "soft_k": 3}).loss_config().soft_k == 3
    for kwargs, match in [
        ({"soft": "tanh9"}, r"^soft='tanh9': expected one of"),
        ({"soft_k": 2.0}, r"^soft_k=2.0 applies to soft='tanh2' only"),
        ({"soft": "tanh1", "soft_width": 0.5}, r"^soft_width=0.5 applies to soft='smooth3'"),
        ({"soft": "tanh2", "soft_k": 0.0}, r"^soft_k=0.0: must be a finite number"),
        ({"soft": "tanh2", "soft_k": True}, r"^soft_k=True: must be a finite number"),
        ({"soft": 1}, r"^soft=1: must be a string"),
        ({"soft": "tanh1", "loss": "band-mask-kl"}, r"applies to the clip-form methods"),
    ]:
        with pytest.raises(ConfigError, match=match):
            TrainConfig(**kwargs).validate()
    import argparse

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="cmd"))
    args = parser.parse_args(["train", "--run-dir", str(tmp_path / "r"), "--soft", "tanh2",
                              "--soft-k", "2.5"])
    cfg = _config_from_args(args)
    assert (cfg.soft, cfg.soft_k, cfg.soft_width) == ("tanh2", 2.5, None)


def test_trainer_builds_the_soft_loss(tmp_path, monkeypatch):
    """Every update's loss equals fbands.losses' soft loss on the same tensors, and differs
    from the hard clip's on some update (a tiny radius and a large step put tokens outside)."""
    pytest.importorskip("transformers")
    pytest.importorskip("tqdm")
    from fbands.losses import preset
    from fbands.rl import train as rl_train
    from fbands.rl.config import TrainConfig
    from fbands.rl.tasks import make_task

    cfg = TrainConfig(run_dir=str(tmp_path / "run"), cache_dir=str(tmp_path / "cache"),
                      steps=1, prompts_per_step=4, group_size=4, ppo_epochs=2, minibatches=2,
                      warm_start_steps=5, tiny_d_model=32, eval_every=0, progress=False,
                      delta=1e-3, lr=1e-2, soft="tanh2", soft_k=2.0)
    task = make_task(cfg)  # a reward that differs within groups: some A != 0
    monkeypatch.setattr(task, "reward", lambda _p, text: float(sum(map(ord, text)) % 2))
    monkeypatch.setattr("fbands.rl._run.make_task", lambda _cfg: task)
    calls = _record(monkeypatch, rl_train)
    messages = []
    rl_train.train(cfg, log=messages.append)
    assert any(m.startswith("soft clip: tanh2 (soft_k=2.0") for m in messages)
    assert len(calls) == 4 and all(a[4].soft == "tanh2" for a, _, _ in calls)
    soft = _recompute(calls, preset("band-kl", delta=1e-3, soft="tanh2", soft_k=2.0))
    hard = _recompute(calls, preset("band-kl", delta=1e-3))
    for (_, _, got), want in zip(calls, soft, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert any(abs(float(s) - float(h)) > 1e-6 for s, h in zip(soft, hard, strict=True))


def test_trl_config_and_trainer_soft(tmp_path, monkeypatch):
    pytest.importorskip("trl")
    import warnings

    from fbands import losses as fl
    from fbands.errors import ConfigError
    from fbands.integrations.trl import TRLBandError

    from ..integrations.test_trl import make_args, make_trainer

    cfg = make_args(tmp_path, band_soft="smooth3", band_soft_width="0.5").band_loss_config()
    assert (cfg.soft, cfg.soft_width, cfg.soft_k) == ("smooth3", 0.5, 1.0)
    assert make_args(tmp_path).band_loss_config().soft is None
    for options, match in [
        ({"band_soft": "soft"}, r"band_soft='soft': expected one of tanh1, tanh2, smooth3"),
        ({"band_soft_k": 2.0}, r"band_soft_k=2.0 applies to band_soft='tanh2' only"),
        ({"band_soft": "tanh2", "band_soft_width": 1.0}, r"band_soft_width=1.0 applies to"),
        ({"band_soft": 2}, r"band_soft=2 must be a string"),
    ]:
        with pytest.raises(TRLBandError, match=match):
            make_args(tmp_path, **options)
    with pytest.raises(ConfigError, match=r"band_soft_k must be a number, got True"):
        make_args(tmp_path, band_soft="tanh2", band_soft_k=True)
    with pytest.raises(fl.LossError, match="applies to the clip-form methods"):
        make_args(tmp_path, band_method="band_mask", band_soft="tanh1")

    calls = _record(monkeypatch, fl)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = make_trainer(tmp_path, band_soft="tanh1", band_delta=1e-3)
        trainer.train()
    assert calls and all(a[4].soft == "tanh1" for a, _, _ in calls)
    want_cfg = fl.LossConfig(method="band_clip", div="kl", delta=1e-3, agg="token-sum",
                             soft="tanh1")
    soft = _recompute(calls, want_cfg)
    hard = _recompute(calls, dataclasses_replace(want_cfg, soft=None))
    for (_, _, got), want in zip(calls, soft, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert any(abs(float(s) - float(h)) > 1e-7 for s, h in zip(soft, hard, strict=True))


def dataclasses_replace(obj, **changes):
    import dataclasses

    return dataclasses.replace(obj, **changes)


def test_verl_config_and_loss_soft():
    pytest.importorskip("verl")
    from fbands import losses as fl
    from fbands.integrations.verl import (
        BandPolicyLossConfig,
        VerlBandError,
        aggregation_weights,
        compute_policy_loss,
        loss_config,
    )

    cfg = loss_config(BandPolicyLossConfig(loss_mode="band", soft="tanh2", soft_k="2"))
    assert (cfg.soft, cfg.soft_k) == ("tanh2", 2.0)
    assert loss_config({"loss_mode": "band"}).soft is None
    for section, match in [
        ({"soft": "tanh3"}, r"policy_loss.soft='tanh3': expected one of"),
        ({"soft_width": 0.5}, r"policy_loss.soft_width=0.5 applies to policy_loss.soft="),
        ({"soft": True}, r"policy_loss.soft=True must be a string"),
    ]:
        with pytest.raises(VerlBandError, match=match):
            loss_config({"loss_mode": "band", **section})
    with pytest.raises(VerlBandError, match="soft_k=3.0 applies to"):
        BandPolicyLossConfig(loss_mode="band", soft_k=3.0)

    g = torch.Generator().manual_seed(1)
    old = torch.log(torch.rand(3, 6, generator=g, dtype=torch.float64) * 0.9 + 0.05)
    new = (old + 0.3 * torch.randn(3, 6, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    adv = torch.randn(3, 1, generator=g, dtype=torch.float64).expand(3, 6)
    mask = torch.ones(3, 6)
    mask[2, 4:] = 0
    config = {"policy_loss": {"loss_mode": "band", "div": "kl", "delta": 0.02,
                              "soft": "smooth3", "soft_width": 0.4}}
    got, metrics = compute_policy_loss("band", old, new.clone().requires_grad_(), adv, mask,
                                       loss_agg_mode="seq-mean-token-mean", config=config)
    weights = aggregation_weights(mask, "seq-mean-token-mean", torch.float64)
    want_cfg = fl.LossConfig(div="kl", delta=0.02, agg="token-sum", soft="smooth3",
                             soft_width=0.4)
    want, _ = fl.policy_loss(old, new, adv, weights, want_cfg)
    hard, _ = fl.policy_loss(old, new, adv, weights, dataclasses_replace(want_cfg, soft=None))
    torch.testing.assert_close(got.detach(), want, rtol=1e-15, atol=0)
    assert abs(float(want) - float(hard)) > 1e-4
    assert metrics["actor/band/delta"] == 0.02
