"""One name per loss (issue 26): the presets of fbands.losses.preset name the same loss in
``fbands train --loss``, in TRL's ``band_method`` and in verl's ``policy_loss.preset``; old
spellings stay; explicit fields win; numbers beyond float range are a clear config error;
TRL's loss types and the options that would bypass the band."""

from __future__ import annotations

import dataclasses
import re
from fractions import Fraction

import pytest

pytest.importorskip("trl")
pytest.importorskip("verl")

import fbands  # noqa: E402
from fbands import losses as fl  # noqa: E402
from fbands.integrations import verl as fv  # noqa: E402
from fbands.integrations.trl import SUPPORTED_LOSS_TYPES, BandGRPOConfig, TRLBandError  # noqa: E402
from fbands.rl.config import TrainConfig  # noqa: E402

from .test_trl import fake_batch, loss_and_grads, make_args, make_trainer  # noqa: E402
from .test_verl import BATCH_OVERRIDES, actor_config  # noqa: E402

PRESETS = ["band-kl", "band-tv", "band-kl&reverse-kl", "band-reverse-kl", "band-alpha(a=0.5)",
           "band-mask-kl", "band-mask-tv", "band-gppo-kl", "clip", "clip-higher", "dual-clip",
           "dcpo", "trgppo", "cispo"]
PL = "actor_rollout_ref.actor.policy_loss."
TARGET = f"{PL}_target_=fbands.integrations.verl.BandPolicyLossConfig"


def trl_config(tmp_path, **options) -> fl.LossConfig:
    return make_args(tmp_path, **options).band_loss_config()


def verl_config(*overrides: str) -> fl.LossConfig:
    """The LossConfig of the actor that Hydra composes from verl's files and ``overrides``."""
    actor = actor_config(*BATCH_OVERRIDES, TARGET, *overrides)
    return fv.loss_config(actor.policy_loss, actor)


def hydra_value(text: str) -> str:
    """A string as a Hydra override writes it (quoted when it has parentheses or '&')."""
    return f"'{text}'" if "(" in text or "&" in text else text


def same_loss(cfg: fl.LossConfig, name: str) -> None:
    """``cfg`` is preset ``name`` (aggregation aside, which each trainer owns)."""
    assert dataclasses.replace(cfg, agg="token-mean") == fl.preset(name), name


# --- 1. one name per loss --------------------------------------------------------------------
@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_means_the_same_loss_in_every_trainer(tmp_path, name):
    same_loss(TrainConfig(loss=name).loss_config(), name)          # fbands train --loss
    # TRL: make_args sets band_div="kl" and band_delta=0.01; unset them for the bare name.
    same_loss(trl_config(tmp_path, band_method=name, band_div=None, band_delta=None), name)
    same_loss(verl_config(f"{PL}loss_mode=fbands", f"+{PL}preset={hydra_value(name)}"), name)


@pytest.mark.parametrize("mode, name", [("band", "band-kl"), ("band_mask", "band-mask-tv"),
                                        ("band_gppo", "band-gppo-kl")])
def test_verl_band_modes_take_a_preset_of_their_method(mode, name):
    same_loss(verl_config(f"{PL}loss_mode={mode}", f"+{PL}preset={name}"), name)


def test_old_spellings_keep_working(tmp_path):
    cfg = trl_config(tmp_path, band_method="band_clip", band_div="tv", band_delta=0.1)
    assert (cfg.method, cfg.div, cfg.delta) == ("band_clip", "tv", 0.1)
    cfg = trl_config(tmp_path, band_method="clip_higher", epsilon_high=0.28)
    assert (cfg.method, cfg.eps_low, cfg.eps_high) == ("clip_higher", 0.2, 0.28)
    assert BandGRPOConfig(output_dir=str(tmp_path), report_to="none",
                          use_cpu=True).band_loss_config() == fl.preset("band-kl", agg="token-sum")
    cfg = verl_config(f"{PL}loss_mode=band", f"+{PL}div=tv", f"+{PL}delta=0.1")
    assert (cfg.method, cfg.div, cfg.delta) == ("band_clip", "tv", 0.1)
    cfg = verl_config(f"{PL}loss_mode=fbands", f"+{PL}method=dcpo")  # the method alone
    assert (cfg.method, cfg.eps_low, cfg.upper_bound_max, cfg.dual_clip_c) == (
        "dcpo", 0.2, None, None)


def test_explicit_fields_win_over_the_preset(tmp_path):
    cfg = trl_config(tmp_path, band_method="band-tv", band_div="kl", band_delta=0.1)
    assert (cfg.method, cfg.div, cfg.delta) == ("band_clip", "kl", 0.1)
    cfg = trl_config(tmp_path, band_method="dcpo", band_dual_clip_c=5.0, band_delta=None)
    assert (cfg.eps_low, cfg.eps_high, cfg.upper_bound_max, cfg.dual_clip_c) == (
        0.16, 0.2, 10.0, 5.0)
    # TRL's clip widths win once either is set (epsilon_high unset follows epsilon).
    cfg = trl_config(tmp_path, band_method="clip-higher", epsilon=0.1)
    assert (cfg.eps_low, cfg.eps_high) == (0.1, 0.1)
    cfg = trl_config(tmp_path, band_method="cispo", epsilon_high=5.0)
    assert (cfg.eps_low, cfg.eps_high) == (0.2, 5.0)

    cfg = verl_config(f"{PL}loss_mode=fbands", f"+{PL}preset=band-mask-tv", f"+{PL}div=kl",
                      f"+{PL}delta=0.2", f"+{PL}upper_bound_max=10")
    assert (cfg.method, cfg.div, cfg.delta, cfg.upper_bound_max) == ("band_mask", "kl", 0.2, 10)
    cfg = verl_config(f"{PL}loss_mode=fbands", f"+{PL}preset=clip-higher",
                      "actor_rollout_ref.actor.clip_ratio_high=0.3")
    assert (cfg.method, cfg.eps_low, cfg.eps_high) == ("clip_higher", 0.2, 0.3)
    cfg = verl_config(f"{PL}loss_mode=fbands", f"+{PL}preset=clip-higher")
    assert (cfg.eps_low, cfg.eps_high) == (0.2, 0.28)


def test_trl_schedule_starts_from_the_preset_radius(tmp_path):
    args = make_args(tmp_path, band_method="band-kl", band_delta=None,
                     band_delta_schedule="linear:0.05:0.01:10")
    assert args.band_schedule()(0) == pytest.approx(0.05)


def test_names_that_are_no_loss_or_contradict_are_refused(tmp_path):
    with pytest.raises(fbands.DivergenceError, match="unknown divergence 'nope'"):
        make_args(tmp_path, band_method="band-nope", band_div=None)
    with pytest.raises(TRLBandError, match="names no loss.*band-<div>.*band_clip"):
        make_args(tmp_path, band_method="bandkl")
    with pytest.raises(fv.VerlBandError, match="use loss_mode=fbands"):
        fv.loss_config({"loss_mode": "band", "preset": "clip-higher"})
    with pytest.raises(fv.VerlBandError, match="contradicts policy_loss.preset"):
        fv.loss_config({"loss_mode": "fbands", "preset": "band-kl", "method": "clip"})
    with pytest.raises(fv.VerlBandError, match="not a preset"):
        fv.loss_config({"loss_mode": "fbands", "preset": "band_clip"})
    with pytest.raises(Exception, match="not a preset"):  # Hydra wraps it
        verl_config(f"{PL}loss_mode=fbands", f"+{PL}preset=ppo")


def test_trl_command_line_takes_a_preset(tmp_path):
    from transformers import HfArgumentParser

    (args,) = HfArgumentParser(BandGRPOConfig).parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--report_to", "none", "--use_cpu", "true",
         "--band_method", "band-mask-tv", "--band_delta", "0.1"])
    cfg = args.band_loss_config()
    assert (cfg.method, cfg.div, cfg.delta) == ("band_mask", "tv", 0.1)


# --- 2. numbers beyond float range ---------------------------------------------------------
@pytest.mark.parametrize("big", [10**400, -(10**400), Fraction(10**400, 3)],
                         ids=["int", "negative", "fraction"])
def test_huge_numbers_are_a_config_error(tmp_path, big):
    with pytest.raises(fbands.ConfigError, match="band_delta must be a number within float"):
        make_args(tmp_path, band_delta=big)
    with pytest.raises(fbands.ConfigError, match="policy_loss.delta must be a number within"):
        fv.BandPolicyLossConfig(delta=big)
    with pytest.raises(fbands.ConfigError, match="policy_loss.delta must be a number within"):
        fv.loss_config({"loss_mode": "band", "delta": big})
    with pytest.raises(fbands.ConfigError, match="policy_loss.upper_bound_max"):
        fv.loss_config({"loss_mode": "band", "upper_bound_max": big})


def test_big_but_finite_numbers_are_read_exactly(tmp_path):
    assert trl_config(tmp_path, band_delta=Fraction(1, 20)).delta == 0.05
    assert fv.loss_config({"loss_mode": "band", "delta": Fraction(1, 20)}).delta == 0.05
    assert trl_config(tmp_path, band_upper_bound_max=10**300).upper_bound_max == 1e300


# --- 4. TRL's loss types and the options that bypass the band ---------------------------------
TRL_LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")


def test_the_loss_type_list_is_trl_s():
    from trl import GRPOConfig

    text = GRPOConfig.__dataclass_fields__["loss_type"].metadata["help"]
    listed = text.split("Supported values are ")[1].split(". ")[0]
    assert set(TRL_LOSS_TYPES) == set(re.findall(r"'(\w+)'", listed))


@pytest.mark.parametrize("loss_type", [t for t in TRL_LOSS_TYPES if t not in SUPPORTED_LOSS_TYPES])
def test_loss_types_with_their_own_loss_are_refused(tmp_path, loss_type):
    options = {"importance_sampling_level": "sequence"} if loss_type == "luspo" else {}
    with pytest.raises(TRLBandError, match=f"loss_type='{loss_type}' has its own policy loss"):
        make_args(tmp_path, loss_type=loss_type, **options)


@pytest.fixture(scope="module")
def band_trainer(tmp_path_factory):
    # A narrow radius, so that the band clips some tokens of the fake batch.
    return make_trainer(tmp_path_factory.mktemp("names"), band_method="band-kl",
                        band_div=None, band_delta=1e-3)


@pytest.mark.parametrize("loss_type", SUPPORTED_LOSS_TYPES)
def test_the_band_trains_with_every_supported_loss_type(band_trainer, loss_type):
    band_trainer.loss_type = loss_type
    band_trainer.current_gradient_accumulation_steps = 1
    loss, grads = loss_and_grads(band_trainer, fake_batch(band_trainer))
    assert bool(loss.isfinite())
    assert any(bool(g.abs().sum() > 0) for g in grads)
    assert band_trainer._metrics["train"]["band/clipfrac"][-1] > 0  # the band acted


def test_sequence_level_sampling_and_liger_loss_are_refused(tmp_path):
    with pytest.raises(TRLBandError, match="importance_sampling_level='sequence'.*per-token"):
        make_args(tmp_path, importance_sampling_level="sequence")
    args = make_args(tmp_path)
    args.use_liger_loss = True  # a field of older TRL (GRPOConfig of TRL 1.16 has none)
    with pytest.raises(TRLBandError, match="use_liger_loss=True.*bypass the band"):
        args._check_trl_options()
