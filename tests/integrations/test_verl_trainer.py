"""verl's global step for a delta schedule: the real verl on CPU, as far as it goes without a
cluster (verl's ppo_loss on a batch built as its workers hold it, the trainer's two hooks, the
registry lookup that ``trainer.v1.trainer_mode`` performs)."""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys

import pytest
import torch

pytest.importorskip("verl")
from tensordict import TensorDict  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402

import fbands  # noqa: E402
from fbands.integrations import _verl_step  # noqa: E402
from fbands.integrations import verl as fv  # noqa: E402

from .test_verl import BAND_OVERRIDES, batch, verl_actor  # noqa: E402

SCHEDULE = "cosine:0.1:0.02:10"
SCHEDULED = (*BAND_OVERRIDES[:2], "+actor_rollout_ref.actor.policy_loss.div=kl",
             "+actor_rollout_ref.actor.policy_loss.delta=0.1",
             f"+actor_rollout_ref.actor.policy_loss.delta_schedule={SCHEDULE}")


def scheduled_actor():
    return copy.deepcopy(verl_actor(*SCHEDULED))  # verl's ppo_loss writes into its config


def worker_data(old, new, adv, mask, **fields) -> tuple[dict, TensorDict]:
    """``(model_output, data)`` as verl's actor worker hands them to its loss: the model's
    log-probs unpadded (prompt of 2 tokens, then the response), the rest padded."""
    rows, cols = old.shape
    prompt = 2
    values = torch.zeros(rows, prompt + cols, dtype=new.dtype)
    values[:, prompt - 1: prompt - 1 + cols] = new.detach()  # shifted by one: verl's layout
    data = TensorDict({
        "prompts": torch.ones(rows, prompt, dtype=torch.long),
        "responses": torch.ones(rows, cols, dtype=torch.long),
        "attention_mask": torch.ones(rows, prompt + cols, dtype=torch.long),
        "response_mask": mask.long(), "old_log_probs": old, "advantages": adv,
    }, batch_size=[rows])
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=None, global_batch_size=None,
                         **fields)
    return {"log_probs": values.reshape(-1).requires_grad_()}, data


def delta_of(metrics) -> float:
    value = metrics["actor/band/delta"]  # a verl Metric out of ppo_loss
    return float(value.aggregate() if hasattr(value, "aggregate") else value)


@pytest.mark.parametrize("global_steps", [1, 4, 11])
def test_step_loss_gives_the_band_the_step_of_the_batch(global_steps):
    """verl's own ppo_loss, called as its worker calls the loss function: the band's radius is
    the schedule at the steps completed (verl counts from 1)."""
    loss_fn = _verl_step.StepPPOLoss(scheduled_actor())
    output, data = worker_data(*batch(), global_steps=global_steps)
    loss, metrics = loss_fn(output, data)
    assert torch.isfinite(loss)
    want = fbands.parse_schedule(SCHEDULE, start=0.1)(global_steps - 1)
    assert delta_of(metrics) == pytest.approx(want, rel=1e-12)


def test_scheduled_loss_equals_the_fixed_loss_at_that_radius():
    old, new, adv, mask = batch()
    for step in (0, 3, 9):
        with _verl_step.global_step(step):
            got, _, m1 = call_band(old, new, adv, mask, scheduled_actor())
        delta = fbands.parse_schedule(SCHEDULE, start=0.1)(step)
        fixed = verl_actor(*SCHEDULED[:3], f"+actor_rollout_ref.actor.policy_loss.delta={delta!r}")
        want, _, m2 = call_band(old, new, adv, mask, fixed)
        assert torch.equal(got, want) and m1["actor/band/delta"] == m2["actor/band/delta"]


def call_band(old, new, adv, mask, config):
    from .test_verl import call

    return call("band", old, new, adv, mask, config)


def test_a_schedule_without_the_step_names_the_trainer():
    with pytest.raises(fv.VerlBandError, match="trainer_mode=fbands_sync"):
        call_band(*batch(), scheduled_actor())


@pytest.mark.parametrize("text, fragment", [("adaptive:0.02", "adaptive radius needs"),
                                            ("cosine:0.1", "cosine"), ("nope:1:2:3", "nope")])
def test_bad_schedules_are_refused_when_the_config_is_built(text, fragment):
    with pytest.raises(fv.VerlBandError, match=fragment):
        fv.BandPolicyLossConfig(loss_mode="band", delta_schedule=text)


def test_a_schedule_needs_a_radius():
    with pytest.raises(fv.VerlBandError, match="no radius"):
        fv.BandPolicyLossConfig(loss_mode="fbands", preset="clip", delta_schedule=SCHEDULE)


def test_step_loss_travels_to_the_workers():
    """set_loss_fn sends the loss function to the Ray workers: it pickles, config and all."""
    loss_fn = pickle.loads(pickle.dumps(_verl_step.StepPPOLoss(scheduled_actor())))
    output, data = worker_data(*batch(), global_steps=3)
    assert delta_of(loss_fn(output, data)[1]) == pytest.approx(
        fbands.parse_schedule(SCHEDULE, start=0.1)(2), rel=1e-12)


# --- the trainer (verl's v1 trainer needs TransferQueue & co., the verl extra has them) -----
@pytest.fixture
def trainer_sync():
    return pytest.importorskip("verl.trainer.ppo.v1.trainer_sync")


def test_trainer_mode_is_found_through_verls_external_modules(trainer_sync):
    code = ("import verl\nfrom verl.trainer.ppo.v1 import get_trainer_cls\n"
            "print(get_trainer_cls('fbands_sync').__qualname__)")
    env = {**os.environ, "VERL_USE_EXTERNAL_MODULES": "fbands.integrations.verl_trainer"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "StepTrainer"


def test_trainer_hooks_send_the_step_and_the_loss(monkeypatch, trainer_sync):
    from fbands.integrations import verl_trainer

    seen = {}
    monkeypatch.setattr(trainer_sync.PPOTrainerSync, "init", lambda self: None)
    monkeypatch.setattr(trainer_sync.PPOTrainerSync, "_update_actor",
                        lambda self, b, m: seen.setdefault("extra", dict(b.extra_info)))

    class WorkerGroup:
        def set_loss_fn(self, fn):
            seen["loss"] = fn

    class Batch:
        extra_info = {"temperature": 1.0}

    from hydra import compose, initialize_config_dir

    from .test_verl import BATCH_OVERRIDES, VERL_CONFIG_DIR

    with initialize_config_dir(config_dir=VERL_CONFIG_DIR, version_base=None):
        cfg = compose("ppo_trainer", overrides=[*BATCH_OVERRIDES, *SCHEDULED])
    trainer = object.__new__(verl_trainer.StepTrainer)
    trainer.config, trainer.actor_rollout_wg, trainer.global_steps = cfg, WorkerGroup(), 7
    trainer.init()
    trainer._update_actor(Batch(), {})
    assert seen["extra"] == {"temperature": 1.0, "global_steps": 7}
    assert isinstance(seen["loss"], _verl_step.StepPPOLoss)
    assert seen["loss"].config.policy_loss.delta_schedule == SCHEDULE
    assert seen["loss"].config == scheduled_actor()


def test_the_guides_schedule_command_composes_through_hydra():
    """The overrides of the verl guide's 'A delta schedule' block, as pasted, give an actor
    whose loss follows the schedule under fbands' trainer mode."""
    import re
    import shlex
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    from .test_verl import BATCH_OVERRIDES, VERL_CONFIG_DIR

    guide = (Path(__file__).resolve().parents[2] / "docs/guides/verl.md").read_text()
    block = re.search(r"## A delta schedule.*?```bash\n(.*?)```", guide, re.S)[1]
    words = shlex.split(block.replace("\\\n", " "), comments=True)
    assert "VERL_USE_EXTERNAL_MODULES=fbands.integrations.verl_trainer" in words
    overrides = [w for w in words[words.index("verl.trainer.main_ppo") + 1:] if w != "..."]
    with initialize_config_dir(config_dir=VERL_CONFIG_DIR, version_base=None):
        cfg = compose("ppo_trainer", overrides=[*BATCH_OVERRIDES, *overrides])
    assert cfg.trainer.v1.trainer_mode == _verl_step.TRAINER_MODE
    from verl.utils.config import omega_conf_to_dataclass

    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    schedule = fbands.parse_schedule(actor.policy_loss.delta_schedule, start=0.1)
    with _verl_step.global_step(500):
        _, _, metrics = call_band(*batch(), actor)
    assert metrics["actor/band/delta"] == pytest.approx(schedule(500), rel=1e-12)


def _trainer_config(mode: str):
    from hydra import compose, initialize_config_dir

    from .test_verl import BATCH_OVERRIDES, VERL_CONFIG_DIR

    with initialize_config_dir(config_dir=VERL_CONFIG_DIR, version_base=None):
        return compose("ppo_trainer", overrides=[*BATCH_OVERRIDES, *SCHEDULED,
                                                 f"trainer.v1.trainer_mode={mode}"])


def test_the_step_trainer_takes_verls_sync_path_everywhere(trainer_sync):
    """verl's trainer compares trainer_mode with "sync" to choose its replay buffer, the
    dataloader's gen_batch_size, the checkpoint's TransferQueue state and the re-issue of
    prompts: under the name fbands_sync every one of them took the async path (issue 41).
    Both trainers are built from one config (verl's constructor runs on a CPU)."""
    from fbands.integrations import verl_trainer

    sync = trainer_sync.PPOTrainerSync(_trainer_config("sync"))
    config = _trainer_config("fbands_sync")
    ours = verl_trainer.StepTrainer(config)
    assert config.trainer.v1.trainer_mode == "fbands_sync"  # (the caller's config untouched)
    assert ours.trainer_mode == sync.trainer_mode == "sync"
    assert type(ours.replay_buffer) is type(sync.replay_buffer)
    assert type(ours.replay_buffer).__name__ == "ReplayBuffer"  # not ReplayBufferAsync
    assert ours.replay_buffer.trainer_mode == "sync"
    assert ours.parameter_sync_step == sync.parameter_sync_step
    assert ours._reissue_inflight_prompts() == sync._reissue_inflight_prompts() == 0
    assert ours.config.data.get("gen_batch_size") == sync.config.data.get("gen_batch_size")
    assert ours.config.trainer.v1.sync == sync.config.trainer.v1.sync


def test_verls_trainer_reads_the_mode_only_where_the_step_trainer_sets_it(trainer_sync):
    """Drift guard: the step trainer fixes the mode in its config before verl's constructor
    reads it into ``self.trainer_mode``; a new place in verl that read the configured mode
    itself (not ``self.trainer_mode``) would see ``fbands_sync`` again."""
    import inspect
    import re

    from verl.trainer.ppo.v1 import trainer_base

    source = inspect.getsource(trainer_base)
    reads = re.findall(r"config\.trainer\.v1\.trainer_mode", source)
    assert len(reads) == 1  # the constructor's own: self.trainer_mode = ...
    compared = re.findall(r"self\.trainer_mode\s*[!=]=\s*\"(\w+)\"", source)
    assert compared and set(compared) == {"sync"}, compared
