"""The verl plug-in, with the real verl: configuration, registry, loss values and loading."""

from __future__ import annotations

import dataclasses
import functools
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import verl
from hydra import compose, initialize_config_dir
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, get_policy_loss_fn
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import ActorConfig

import fbands
from fbands import losses as fl
from fbands.integrations import verl as fv

ROOT = Path(__file__).resolve().parents[2]
VERL_CONFIG_DIR = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")

# Overrides that select a band other than the defaults (kl, 0.05), as the guide explains.
BAND_OVERRIDES = (
    "actor_rollout_ref.actor.policy_loss._target_=fbands.integrations.verl.BandPolicyLossConfig",
    "actor_rollout_ref.actor.policy_loss.loss_mode=band",
    "+actor_rollout_ref.actor.policy_loss.div=tv",
    "+actor_rollout_ref.actor.policy_loss.delta=0.1",
)
# Needed by verl's ActorConfig checks, not by the band.
BATCH_OVERRIDES = ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",)


@functools.cache
def actor_config(*overrides: str) -> ActorConfig:
    """The actor config exactly as verl's workers build it: Hydra compose, then instantiate."""
    with initialize_config_dir(config_dir=VERL_CONFIG_DIR, version_base=None):
        cfg = compose("ppo_trainer", overrides=list(overrides))
    return omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)


def verl_actor(*extra: str) -> ActorConfig:
    return actor_config(*BATCH_OVERRIDES, *extra)


def band_actor(*extra: str) -> ActorConfig:
    return verl_actor(*BAND_OVERRIDES, *extra)


def batch(seed=0, rows=4, cols=6, dtype=torch.float32):
    """old/new log-probs (ratios spread around 1; new ones stay <= 0), advantages, a ragged mask."""
    g = torch.Generator().manual_seed(seed)
    old = torch.log(torch.rand(rows, cols, generator=g, dtype=torch.float64) * 0.9 + 0.02)
    new = (old + 0.5 * torch.randn(rows, cols, generator=g, dtype=torch.float64)).clamp(max=0)
    adv = torch.randn(rows, 1, generator=g, dtype=torch.float64).expand(rows, cols)
    mask = torch.ones(rows, cols, dtype=torch.bool)
    mask[1, 4:] = False
    mask[2, 1:] = False
    return old.to(dtype), new.to(dtype).requires_grad_(), adv.to(dtype), mask


def call(name, old, new, adv, mask, config, agg="token-mean", weights=None):
    new.grad = None
    loss, metrics = get_policy_loss_fn(name)(
        old_log_prob=old,
        log_prob=new,
        advantages=adv,
        response_mask=mask,
        loss_agg_mode=agg,
        config=config,
        rollout_is_weights=weights,
    )
    loss.backward()
    return loss.detach(), new.grad.clone(), metrics


def reference(old, new, adv, mask, cfg, **agg_kwargs):
    """fbands.losses.policy_loss on its own, with its own aggregation."""
    new.grad = None
    loss, metrics = fl.policy_loss(old, new, adv, mask, cfg, **agg_kwargs)
    loss.backward()
    return loss.detach(), new.grad.clone(), metrics


def test_hydra_overrides_select_the_band_loss():
    """A verl config built only from the documented overrides runs band clip, tv, 0.1."""
    actor = band_actor()
    assert isinstance(actor.policy_loss, fv.BandPolicyLossConfig)
    assert (actor.policy_loss.loss_mode, actor.policy_loss.div) == ("band", "tv")
    assert actor.policy_loss.delta == 0.1
    assert get_policy_loss_fn(actor.policy_loss.loss_mode) is POLICY_LOSS_REGISTRY["band"]

    old, new, adv, mask = batch()
    loss, grad, metrics = call("band", old, new, adv, mask, actor, agg=actor.loss_agg_mode)
    cfg = fl.LossConfig(method="band_clip", div="tv", delta=0.1, agg=actor.loss_agg_mode)
    ref_loss, ref_grad, ref_metrics = reference(old, new, adv, mask, cfg)
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(grad, ref_grad)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(ref_metrics["clipfrac"].item())
    assert metrics["actor/pg_clipfrac"] > 0  # the band did clip on this batch
    # A different divergence or radius would give another loss on the same batch.
    other = fl.LossConfig(method="band_clip", div="kl", delta=0.1, agg=actor.loss_agg_mode)
    assert not torch.allclose(reference(old, new, adv, mask, other)[0], loss)


def guide_command() -> list[str]:
    """The Hydra overrides of the complete run in docs/guides/verl.md."""
    guide = (ROOT / "docs" / "guides" / "verl.md").read_text()
    start = guide.index("python3 -m verl.trainer.main_ppo")
    block = guide[start : guide.index("```", start)].replace("\\\n", " ")
    words = shlex.split(block)
    assert words[:3] == ["python3", "-m", "verl.trainer.main_ppo"]
    return words[3:]


def test_guide_command_selects_the_band_loss():
    """The guide's complete command, composed with verl's own config files."""
    overrides = guide_command()
    assert "actor_rollout_ref.actor.policy_loss.loss_mode=band" in overrides
    actor = actor_config(*overrides)
    assert isinstance(actor.policy_loss, fv.BandPolicyLossConfig)
    cfg = fv.loss_config(actor.policy_loss, actor)
    assert (cfg.method, cfg.div, cfg.delta) == ("band_clip", "kl", 0.05)
    old, new, adv, mask = batch()
    loss, _, _ = call(actor.policy_loss.loss_mode, old, new, adv, mask, actor)
    ref_loss, _, _ = reference(old, new, adv, mask, fl.LossConfig(method="band_clip"))
    torch.testing.assert_close(loss, ref_loss)


def test_plain_verl_config_gets_the_defaults():
    """With the plug-in loaded, verl's own PolicyLossConfig may name a band loss too."""
    actor = verl_actor("actor_rollout_ref.actor.policy_loss.loss_mode=band_mask")
    assert type(actor.policy_loss).__name__ == "PolicyLossConfig"
    old, new, adv, mask = batch(seed=2)
    loss, grad, _ = call("band_mask", old, new, adv, mask, actor)
    ref_loss, ref_grad, _ = reference(old, new, adv, mask, fl.LossConfig(method="band_mask"))
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(grad, ref_grad)


def test_every_band_field_reaches_the_loss_config():
    actor = band_actor(
        "actor_rollout_ref.actor.policy_loss.loss_mode=fbands",
        "+actor_rollout_ref.actor.policy_loss.method=band_mask",
        "+actor_rollout_ref.actor.policy_loss.relax=true",
        "+actor_rollout_ref.actor.policy_loss.upper_bound_max=10",
        "+actor_rollout_ref.actor.policy_loss.truncation=5",
        "actor_rollout_ref.actor.clip_ratio_high=0.28",
    )
    cfg = fv.loss_config(actor.policy_loss, actor)
    assert (cfg.method, cfg.div, cfg.delta) == ("band_mask", "tv", 0.1)
    assert (cfg.relax, cfg.upper_bound_max, cfg.truncation) == (True, 10.0, 5.0)
    assert (cfg.eps_low, cfg.eps_high, cfg.dual_clip_c) == (0.2, 0.28, None)
    dual = band_actor(
        "+actor_rollout_ref.actor.policy_loss.dual_clip_c=${actor_rollout_ref.actor.clip_ratio_c}"
    )
    assert fv.loss_config(dual.policy_loss, dual).dual_clip_c == 3.0


CASES = [
    ("band", {}, fl.LossConfig(method="band_clip", div="tv", delta=0.1)),
    ("band_mask", {}, fl.LossConfig(method="band_mask", div="tv", delta=0.1)),
    ("band_gppo", {}, fl.LossConfig(method="band_gppo", div="tv", delta=0.1)),
    (
        "fbands",
        {"method": "dcpo", "dual_clip_c": 3.0},
        fl.LossConfig(method="dcpo", div="tv", delta=0.1, dual_clip_c=3.0),
    ),
]


@pytest.mark.parametrize("agg", fl.AGG_MODES)
@pytest.mark.parametrize("name, fields, cfg", CASES, ids=[c[0] for c in CASES])
def test_value_and_gradient_match_fbands(name, fields, cfg, agg):
    extra = [f"+actor_rollout_ref.actor.policy_loss.{k}={v}" for k, v in fields.items()]
    actor = band_actor(f"actor_rollout_ref.actor.policy_loss.loss_mode={name}", *extra)
    old, new, adv, mask = batch(seed=3)
    loss, grad, metrics = call(name, old, new, adv, mask, actor, agg=agg)
    ref_loss, ref_grad, ref_metrics = reference(
        old, new, adv, mask, fl.LossConfig(**{**cfg.__dict__, "agg": agg})
    )
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(grad, ref_grad)
    assert grad.abs().sum() > 0
    for key, value in ref_metrics.items():
        assert metrics[f"actor/band/{key}"] == pytest.approx(value.item(), rel=1e-6, abs=1e-7)


@pytest.mark.parametrize(
    "fields, soft",
    [
        ({"soft": "tanh2", "soft_k": 2}, {"soft": "tanh2", "soft_k": 2.0}),
        ({"soft": "smooth3", "soft_width": "5e-1"}, {"soft": "smooth3", "soft_width": 0.5}),
        ({"soft": "tanh1"}, {"soft": "tanh1"}),
    ],
)
def test_soft_clip_through_hydra_overrides(fields, soft):
    """``+policy_loss.soft=...`` composed by Hydra reaches the loss verl calls: value and
    gradient are fbands.losses' soft loss, and not the hard clip's."""
    extra = [f"+actor_rollout_ref.actor.policy_loss.{k}={v}" for k, v in fields.items()]
    actor = band_actor(*extra)
    old, new, adv, mask = batch(seed=5)
    loss, grad, _ = call("band", old, new, adv, mask, actor, agg=actor.loss_agg_mode)
    cfg = fl.LossConfig(method="band_clip", div="tv", delta=0.1, agg=actor.loss_agg_mode, **soft)
    ref_loss, ref_grad, _ = reference(old, new, adv, mask, cfg)
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(grad, ref_grad)
    _, hard_grad, _ = reference(old, new, adv, mask, dataclasses.replace(cfg, soft=None))
    assert not torch.allclose(grad, hard_grad)


def test_verl_worker_loss_path_runs_the_band():
    """verl's own ppo_loss (what the actor worker calls) with a config from the overrides."""
    from verl.utils import tensordict_utils as tu
    from verl.utils.metric import Metric
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import no_padding_2_padding

    actor = band_actor("actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean")
    g = torch.Generator().manual_seed(17)
    rows, prompt_len, response_len = 3, 2, 4
    response_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])
    attention_mask = torch.cat([torch.ones(rows, prompt_len, dtype=torch.long), response_mask], 1)
    flat_log_probs = torch.log(torch.rand(int(attention_mask.sum()), generator=g) * 0.9 + 0.05)
    flat_log_probs.requires_grad_()
    data = tu.get_tensordict(
        {
            "prompts": torch.randint(5, 30, (rows, prompt_len), generator=g),
            "responses": torch.randint(5, 30, (rows, response_len), generator=g),
            "attention_mask": attention_mask,
            "response_mask": response_mask,
            "old_log_probs": torch.log(torch.rand(rows, response_len, generator=g) * 0.9 + 0.05),
            "advantages": torch.randn(rows, 1, generator=g).expand(rows, response_len),
        },
        non_tensor_dict={"dp_size": 1, "batch_num_tokens": None, "global_batch_size": None},
    )
    try:
        loss, metrics = ppo_loss(actor, {"log_probs": flat_log_probs}, data)
    finally:
        actor.global_batch_info.clear()
    (grad,) = torch.autograd.grad(loss, flat_log_probs)
    assert isinstance(metrics["actor/band/clipfrac"], Metric)
    assert metrics["actor/pg_clipfrac"].aggregate() > 0

    log_prob = no_padding_2_padding(flat_log_probs, data)  # (rows, response_len)
    cfg = fl.LossConfig(method="band_clip", div="tv", delta=0.1, agg="seq-mean-token-mean")
    ref_loss, _ = fl.policy_loss(
        data["old_log_probs"], log_prob, data["advantages"], response_mask, cfg
    )
    (ref_grad,) = torch.autograd.grad(ref_loss, flat_log_probs)
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(grad, ref_grad)


def test_metrics_use_verl_names_and_definitions():
    old, new, adv, mask = batch(seed=5)
    _, _, metrics = call("band", old, new, adv, mask, band_actor())
    assert all(isinstance(v, float) for v in metrics.values())
    logratio = (new - old).detach()[mask]
    assert metrics["actor/ppo_kl"] == pytest.approx((-logratio).mean().item(), rel=1e-5)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(
        metrics["actor/band/clipfrac_upper"] + metrics["actor/band/clipfrac_lower"]
    )
    assert metrics["actor/pg_clipfrac_lower"] == metrics["actor/band/clipfrac_lower"]


def test_band_metrics_are_the_shared_vocabulary_behind_verl_prefix():
    from fbands.losses import METRIC_KEYS

    from .._vocabulary import vocabulary

    old, new, adv, mask = batch(seed=5)
    _, _, metrics = call("band", old, new, adv, mask, band_actor())
    names = {k.removeprefix("actor/") for k in metrics
             if k.startswith("actor/band/") and not k.endswith("_count")}
    assert names <= vocabulary() and {f"band/{k}" for k in METRIC_KEYS} | {"band/delta"} <= names


def test_global_batch_info_gives_verl_data_parallel_scaling():
    """verl fills global_batch_info per micro-batch; the loss must follow it."""
    actor = band_actor()
    old, new, adv, mask = batch(seed=7)
    cfg = fl.LossConfig(method="band_clip", div="tv", delta=0.1, agg="token-sum")
    token_sum, token_sum_grad, _ = reference(old, new, adv, mask, cfg)
    info = {"dp_size": 2, "batch_num_tokens": 40, "global_batch_size": 16}
    actor.global_batch_info.update(info)
    try:
        loss, grad, _ = call("band", old, new, adv, mask, actor, agg="token-mean")
        torch.testing.assert_close(loss, token_sum * 2 / 40)
        torch.testing.assert_close(grad, token_sum_grad * 2 / 40)
        loss, _, _ = call("band", old, new, adv, mask, actor, agg="seq-mean-token-sum")
        torch.testing.assert_close(loss, token_sum * 2 / 16)
    finally:
        actor.global_batch_info.clear()


def test_rollout_is_weights_multiply_each_token():
    actor = band_actor()
    old, new, adv, mask = batch(seed=11)
    loss, grad, _ = call("band", old, new, adv, mask, actor)
    twice, twice_grad, _ = call("band", old, new, adv, mask, actor, weights=torch.full_like(old, 2))
    torch.testing.assert_close(twice, 2 * loss)
    torch.testing.assert_close(twice_grad, 2 * grad)
    # Zero weight on the first sequence drops its tokens but keeps verl's token count.
    weights = torch.ones_like(old)
    weights[0] = 0
    dropped, dropped_grad, _ = call("band", old, new, adv, mask, actor, weights=weights)
    keep = mask.clone()
    keep[0] = False
    rest, rest_grad, _ = call("band", old, new, adv, keep, actor)
    scale = keep.sum() / mask.sum()
    torch.testing.assert_close(dropped, rest * scale)
    torch.testing.assert_close(dropped_grad, rest_grad * scale)
    assert dropped_grad[0].abs().sum() == 0


def test_low_precision_log_probs():
    old, new, adv, mask = batch(seed=13, dtype=torch.bfloat16)
    loss, grad, metrics = call("band", old, new, adv, mask, band_actor())
    assert torch.isfinite(loss) and grad.dtype == torch.bfloat16
    assert torch.isfinite(grad.float()).all()
    assert all(v == v for v in metrics.values())  # no NaN


def test_aggregation_weights_reproduce_verl_agg_loss():
    from verl.trainer.ppo.core_algos import agg_loss

    _, _, _, mask = batch()
    mask[3] = False  # a fully masked sequence: verl leaves it out of the sequence count
    values = torch.randn(mask.shape, dtype=torch.float64)
    for mode in fl.AGG_MODES:
        for info in ({}, {"dp_size": 4, "batch_num_tokens": 50, "global_batch_size": 12}):
            w = fv.aggregation_weights(mask, mode, torch.float64, **info)
            expected = agg_loss(values, mask, mode, **info)
            torch.testing.assert_close((w * values).sum(), expected.to(torch.float64))


def test_bad_configuration_is_rejected():
    with pytest.raises(fv.VerlBandError, match="vanilla"):
        fv.BandPolicyLossConfig(loss_mode="vanilla")
    with pytest.raises(ValueError, match="delta"):
        fv.BandPolicyLossConfig(delta=-0.1)
    with pytest.raises(ValueError, match="nope"):
        fv.BandPolicyLossConfig(div="nope")
    with pytest.raises(ValueError, match="method"):
        fv.BandPolicyLossConfig(loss_mode="fbands", method="ppo")
    old, new, adv, mask = batch()
    with pytest.raises(fv.VerlBandError, match="config"):
        call("band", old, new, adv, mask, None)


def test_register_is_idempotent():
    names = fv.register()
    assert names == list(fv.LOSS_MODES)
    assert fv.register() == names
    for name in names:
        assert get_policy_loss_fn(name).__module__ == "fbands.integrations.verl"


def _fbands_path() -> str:
    return str(Path(fbands.__file__).resolve().parents[1])


def _registered_in_fresh_process(env_extra: dict[str, str], extra_path: str = "") -> str:
    code = (
        "import sys, verl\n"
        "from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY as R\n"
        "print('band' in R, 'band_mask' in R)\n"
    )
    env = dict(os.environ, **env_extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (extra_path, _fbands_path()) if p)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()[-2:]


@pytest.mark.slow  # a fresh interpreter imports verl
def test_entry_point_registers_on_import_verl(tmp_path):
    """verl loads every ``verl.plugins`` entry point on import; ours names the module.

    fbands is not installed here, so a minimal distribution declaring the same entry point
    stands in for it on the path of a fresh interpreter.
    """
    dist = tmp_path / "fbands_entry_point_probe-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: fbands-entry-point-probe\nVersion: 0\n"
    )
    group, name, value = fv.ENTRY_POINT
    (dist / "entry_points.txt").write_text(f"[{group}]\n{name} = {value}\n")
    env = {"VERL_USE_EXTERNAL_PLUGINS": name, "VERL_USE_EXTERNAL_MODULES": ""}
    assert _registered_in_fresh_process(env, str(tmp_path)) == ["True", "True"]


@pytest.mark.slow  # a fresh interpreter imports verl
def test_environment_variable_registers_on_import_verl():
    env = {
        "VERL_USE_EXTERNAL_PLUGINS": "none",
        "VERL_USE_EXTERNAL_MODULES": "fbands.integrations.verl",
    }
    assert _registered_in_fresh_process(env) == ["True", "True"]


def test_pyproject_declares_the_entry_point():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    group, name, value = fv.ENTRY_POINT
    assert project.get("entry-points", {}).get(group, {}).get(name) == value


# --- strict input coercion and divergence strings (issue 19) -------------------------------
PAYLOADS = (
    "alpha(a=(__import__('os').system('touch {marker}') or 2))",
    "__import__('os').system('touch {marker}')",
    "kl; __import__('os').system('touch {marker}')",
    "alpha(a=__import__('os').system('touch {marker}'))",
)


def test_relax_and_numbers_are_read_strictly():
    def cfg(**fields):
        return fv.loss_config({"loss_mode": "band", **fields})

    assert cfg(relax="false").relax is False  # bool("false") would be True
    assert cfg(relax="False").relax is False and cfg(relax="true").relax is True
    assert cfg(relax=False).relax is False and cfg(relax=True).relax is True
    assert cfg(delta="5e-2").delta == 0.05  # YAML 1.1 leaves "5e-2" a string
    for fields, name in (({"relax": "maybe"}, "relax"), ({"relax": 1.0}, "relax"),
                         ({"delta": True}, "delta"), ({"delta": False}, "delta"),
                         ({"delta": "a lot"}, "delta"), ({"truncation": True}, "truncation"),
                         ({"upper_bound_max": True}, "upper_bound_max"),
                         ({"div": 3}, "div"), ({"div": ["kl"]}, "div")):
        with pytest.raises(fbands.ConfigError, match=f"policy_loss.{name}"):
            cfg(**fields)
    with pytest.raises(fbands.ConfigError, match="clip_ratio_low"):
        fv.loss_config({"loss_mode": "band"}, {"clip_ratio_low": True})
    with pytest.raises(fbands.ConfigError, match="delta must be a number, got True"):
        fv.BandPolicyLossConfig(delta=True)
    assert issubclass(fv.VerlBandError, fbands.ConfigError)


def test_relax_text_through_hydra_is_false():
    actor = band_actor("+actor_rollout_ref.actor.policy_loss.relax='false'")
    assert actor.policy_loss.relax == "false"  # Hydra hands the text over as it is
    assert fv.loss_config(actor.policy_loss, actor).relax is False
    with pytest.raises(Exception, match="policy_loss.relax must be true or false"):
        band_actor("+actor_rollout_ref.actor.policy_loss.relax='maybe'")


@pytest.mark.parametrize("payload", PAYLOADS)
def test_divergence_payloads_are_not_executed(payload, tmp_path):
    marker = tmp_path / "PWNED"
    spec = payload.format(marker=marker)
    with pytest.raises(fbands.DivergenceError):
        fv.BandPolicyLossConfig(div=spec)
    with pytest.raises(fbands.DivergenceError):
        fl.precompute_band(torch.full((1, 2), -1.0), fl.LossConfig(div=spec))
    old, new, adv, mask = batch()
    actor = {"policy_loss": {"loss_mode": "band", "div": spec}}
    with pytest.raises(fbands.DivergenceError):
        call("band", old, new, adv, mask, actor)
    assert not marker.exists()


def test_divergence_payload_through_hydra_is_not_executed(tmp_path):
    marker = tmp_path / "PWNED"
    spec = PAYLOADS[0].format(marker=marker)
    with pytest.raises(Exception) as info:  # Hydra wraps the error in its own exception
        verl_actor(*BAND_OVERRIDES[:2], f'+actor_rollout_ref.actor.policy_loss.div="{spec}"')
    assert "DivergenceError" in repr(info.value) or isinstance(info.value,
                                                               fbands.DivergenceError)
    assert not marker.exists()


@pytest.mark.parametrize("key", ["div", "delta", "preset"])
def test_mandatory_value_left_unset_is_an_error_not_the_default(key):
    # issue 27: a DictConfig's '???' used to read as None, i.e. kl / 0.05, silently
    from omegaconf import OmegaConf

    section = OmegaConf.create({"loss_mode": "fbands", "div": "tv", "delta": 0.1, key: "???"})
    with pytest.raises(fv.VerlBandError, match=rf"{key} is '\?\?\?'"):
        fv.loss_config(section)


def test_distillations_call_with_its_own_config_is_refused_not_defaulted():
    """verl's on-policy distillation (use_policy_gradient) calls the registered policy loss
    with its DistillationLossConfig, which has no policy_loss section: the band ran with its
    defaults (kl, 0.05) whatever the user had set (issue 41)."""
    from verl.workers.config.distillation import DistillationLossConfig

    old, new, adv, mask = batch()
    with pytest.raises(fv.VerlBandError, match="DistillationLossConfig.*distillation"):
        call("band", old, new, adv, mask, DistillationLossConfig())


def test_bypass_mode_refuses_to_replace_a_band_loss():
    """verl's v0 trainer with rollout_correction.bypass_mode=true swaps the configured loss
    for its own; with a band configured the swap raises instead (other losses pass)."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo import rollout_corr_helper

    fv.register()  # idempotent: the guard is installed once
    fv.register()
    for mode in ("band", "band_mask", "band_gppo", "fbands"):
        config = OmegaConf.create({"loss_mode": mode})
        with pytest.raises(fv.VerlBandError, match=f"replaces the policy loss '{mode}'"):
            rollout_corr_helper.apply_bypass_mode(object(), None, config)
        assert config.loss_mode == mode  # untouched
    # verl's own loss goes to verl's function (which wants rollout log-probs in the batch)
    from verl import DataProto

    batch = DataProto.from_dict(tensors={"old_log_probs": torch.zeros(1, 2)})
    vanilla = OmegaConf.create({"loss_mode": "vanilla"})
    with pytest.raises(ValueError, match="rollout_log_probs"):
        rollout_corr_helper.apply_bypass_mode(batch, None, vanilla)


def test_the_documented_clash_of_verl_and_trl_still_holds():
    """docs/install.md and the verl guide say that verl's model builder imports TRL's
    AutoModelForCausalLMWithValueHead whenever TRL is installed, and that TRL 1.16 has none:
    this fails when either side changes, so that the pages follow."""
    trl = pytest.importorskip("trl")
    import importlib.util
    import inspect
    import warnings

    from verl.models.transformers import monkey_patch

    source = inspect.getsource(monkey_patch.apply_monkey_patch)
    assert "is_trl_available()" in source and "AutoModelForCausalLMWithValueHead" in source
    assert not hasattr(trl, "AutoModelForCausalLMWithValueHead")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (TRL warns on any import of trl.experimental)
        assert importlib.util.find_spec("trl.experimental.ppo") is None
