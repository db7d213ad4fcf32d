"""The verl plug-in's BandPO parity: BandPO's option names, BandPO's soft forms through Hydra,
and token counts that verl's mean over micro-batches turns into sums."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("verl")

from verl.utils.metric import AggregationType, Metric  # noqa: E402

import fbands.integrations.verl as fv  # noqa: E402
from fbands import losses as fl  # noqa: E402
from fbands.errors import ConfigError  # noqa: E402
from tests.integrations.test_verl import BAND_OVERRIDES, band_actor, batch, call, verl_actor  # noqa: E402


def test_bandpo_names_are_aliases():
    actor = verl_actor(
        *BAND_OVERRIDES[:2],  # the plug-in's config class and loss_mode=band, no fbands keys
        "+actor_rollout_ref.actor.policy_loss.does_relax_high_p_bound=true",
        "+actor_rollout_ref.actor.policy_loss.band_radius_delta=0.07",
        "+actor_rollout_ref.actor.policy_loss.use_soft_clip=true",
        "+actor_rollout_ref.actor.policy_loss.soft_clip_methods=rollback_plus",
        "+actor_rollout_ref.actor.policy_loss.soft_gamma=0.5",
    )
    cfg = fv.loss_config(actor.policy_loss, actor)
    assert (cfg.relax, cfg.delta, cfg.soft, cfg.soft_gamma) == (True, 0.07, "rollback_plus", 0.5)
    # use_soft_clip alone: BandPO's default form, 3seg
    assert fv.loss_config({"use_soft_clip": True}).soft == "3seg"
    assert fv.loss_config({"use_soft_clip": False}).soft is None
    assert fv.loss_config({"soft": "2seg"}).soft == "tanh2"
    with pytest.raises(fv.VerlBandError, match="ignored by BandPO without"):
        fv.loss_config({"soft_clip_methods": "3seg"})
    with pytest.raises(fv.VerlBandError, match="contradicts policy_loss.delta"):
        fv.loss_config({"delta": 0.1, "band_radius_delta": 0.2})


@pytest.mark.parametrize("form", ["3seg_control_reach", "rollback_activate"])
def test_bandpo_forms_through_hydra(form):
    actor = band_actor(f"+actor_rollout_ref.actor.policy_loss.soft={form}",
                       "+actor_rollout_ref.actor.policy_loss.soft_rho=0.2"
                       if form.startswith("3seg") else
                       "+actor_rollout_ref.actor.policy_loss.soft_alpha_in=1.5")
    cfg = fv.loss_config(actor.policy_loss, actor)
    assert cfg.soft == form
    old, new, adv, mask = batch(seed=3)
    loss, grad, _ = call("band", old, new, adv, mask, actor)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()


def _counts_by_hand(old, new, adv, mask, band):
    lr = (new - old).detach()
    above = mask & (lr > band.log_upper)
    below = mask & (lr < band.log_lower)
    p = torch.exp(old)
    out = {"tokens_count": mask.sum().item(),
           "beyond_upper_count": above.sum().item(), "beyond_lower_count": below.sum().item(),
           "clipped_upper_count": (above & (adv > 0)).sum().item(),
           "clipped_lower_count": (below & (adv < 0)).sum().item()}
    for b, (lo, hi) in enumerate([(0, 0.2), (0.2, 0.4), (0.4, 0.6), (0.6, 0.8), (0.8, 1.01)]):
        inside = (p >= lo) & (p < hi)
        out[f"bin{b}_beyond_upper_count"] = (above & inside).sum().item()
        out[f"bin{b}_beyond_lower_count"] = (below & inside).sum().item()
    return out


def test_counts_are_sums_over_micro_batches():
    actor = band_actor()
    old, new, adv, mask = batch(seed=11, rows=6, cols=8)
    cfg = fv.loss_config(actor.policy_loss, actor)
    band = fl.precompute_band(old, cfg, mask=mask)
    want = _counts_by_hand(old, new, adv, mask, band)
    assert want["beyond_upper_count"] + want["beyond_lower_count"] > 0
    # three micro-batches of two sequences, as verl's engine runs them, then verl's own
    # aggregation: a Metric of kind MEAN over the micro-batches.
    actor.global_batch_info.update({"global_batch_size": 6})
    try:
        per_micro = []
        for rows in (slice(0, 2), slice(2, 4), slice(4, 6)):
            sub = new.detach()[rows].clone().requires_grad_()
            _, _, m = call("band", old[rows], sub, adv[rows], mask[rows], actor)
            per_micro.append(m)
    finally:
        actor.global_batch_info.clear()
    for key, value in want.items():
        metric = Metric(AggregationType.MEAN)
        for m in per_micro:
            metric.append(m[f"actor/band/{key}"])
        assert metric.aggregate() == pytest.approx(value), key
    # fractions stay fractions: the mean of the micro-batches' shares
    assert 0 <= per_micro[0]["actor/band/clipfrac"] <= 1


def test_counts_without_batch_info_are_the_micro_batch_counts():
    old, new, adv, mask = batch(seed=2)
    _, _, m = call("band", old, new, adv, mask, band_actor())
    assert m["actor/band/tokens_count"] == mask.sum().item()
    buckets = sum(m[f"actor/band/bin{b}_beyond_upper_count"] for b in range(5))
    assert buckets == m["actor/band/beyond_upper_count"]
    assert math.isfinite(m["actor/band/beyond_lower_count"])


# --- issue 42, P16: options that were accepted and ignored ----------------------------------
@pytest.mark.parametrize("value", [1, 0, 2, "1.0", [True]])
def test_use_soft_clip_is_read_like_relax(value):
    """``use_soft_clip=1`` was read as true while ``relax=1`` was refused: both now take a
    bool or true/false text only."""
    for option in ("use_soft_clip", "relax"):
        with pytest.raises(ConfigError, match=f"policy_loss.{option} must be true or "
                                                     "false"):
            fv.loss_config({option: value})
    assert fv.loss_config({"use_soft_clip": "false"}).soft is None


@pytest.mark.parametrize("mode, method", [("band", 5), ("band", "clip"),
                                          ("band", "band_mask"), ("band_mask", "cispo"),
                                          ("band_gppo", "band_clip_x"), ("fbands", 5)])
def test_a_method_the_loss_mode_ignores_is_refused(mode, method):
    """With a loss mode that fixes its method, a ``policy_loss.method`` that says another
    was silently ignored; any method that is not text was too."""
    with pytest.raises(ConfigError, match="policy_loss.method"):
        fv.loss_config({"loss_mode": mode, "method": method})


def test_the_methods_a_loss_mode_accepts():
    assert fv.loss_config({"loss_mode": "band_mask", "method": "band_clip"}).method == \
        "band_mask"  # (band_clip: the dataclass's default, always present)
    assert fv.loss_config({"loss_mode": "band_mask", "method": "band_mask"}).method == \
        "band_mask"
    assert fv.loss_config({"loss_mode": "fbands", "method": "dcpo"}).method == "dcpo"
