"""verl's trainer with the global step for the band losses: ``trainer_mode=fbands_sync``.

verl 0.9 calls a policy loss without the training step, so a delta schedule
(``policy_loss.delta_schedule``) cannot follow training from inside the loss alone.
Importing this module registers :class:`StepTrainer`, verl's synchronous v1 trainer
(``trainer.v1.trainer_mode=sync``) with two additions, both through public hooks of verl:

* before each actor update it adds ``global_steps`` to the batch's ``extra_info``, which
  verl hands to the actor workers as a field of their data;
* after ``init`` it gives the actor workers ``StepPPOLoss`` (verl's ``ppo_loss``, which makes
  the step of each micro-batch visible to the band losses) through their ``set_loss_fn``
  method, as verl's own trainer does for the critic.

``fbands_sync`` is only the name verl looks the trainer up by: the trainer itself runs with
``trainer_mode`` set back to ``sync`` (:func:`as_sync`), since verl's trainer compares the
mode with the literal ``"sync"`` to choose its replay buffer, its dataloader's batch size
(``data.gen_batch_size``), its checkpoint contents and the re-issue of in-flight prompts;
any other name would get the asynchronous path in each of those places.

The radius of a step is ``schedule(global_steps - 1)``, the number of steps completed (verl
counts from 1): the convention of ``fbands train`` and the TRL plug-in, and a run resumed from
``global_step_N`` goes on at ``schedule(N)``.  verl's trainer process must import this module
before it looks the trainer up: list it in ``VERL_USE_EXTERNAL_MODULES`` (the verl guide,
"A delta schedule").  It imports verl's v1 trainer, which needs verl's ``TransferQueue``,
``fastapi``, ``uvicorn`` and ``cachetools`` (the ``verl`` extra installs them).
"""

from __future__ import annotations

import copy

from omegaconf import open_dict
from verl.trainer.distillation import is_distillation_enabled
from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY, register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.config import omega_conf_to_dataclass

from fbands.errors import ConfigError
from fbands.integrations._verl_step import TRAINER_MODE, StepPPOLoss

__all__ = ["TRAINER_MODE", "StepTrainer", "as_sync"]


class StepTrainer(PPOTrainerSync):
    """verl's synchronous v1 trainer that gives the band losses the global step (see the
    module docstring); selected by ``trainer.v1.trainer_mode=fbands_sync``."""

    def __init__(self, config):
        super().__init__(as_sync(config))

    def init(self):
        super().init()
        if is_distillation_enabled(self.config.get("distillation")):
            raise ConfigError(f"trainer_mode={TRAINER_MODE} does not support distillation "
                              "(its actor loss is not verl's ppo_loss)")
        self.actor_rollout_wg.set_loss_fn(step_loss(self.config))

    def _update_actor(self, batch, metrics):
        batch.extra_info["global_steps"] = self.global_steps
        return super()._update_actor(batch, metrics)


def as_sync(config):
    """A copy of verl's ``config`` with ``trainer.v1.trainer_mode="sync"``: what verl's own
    synchronous trainer is built from."""
    config = copy.deepcopy(config)
    with open_dict(config):
        config.trainer.v1.trainer_mode = "sync"
    return config


def step_loss(config) -> StepPPOLoss:
    """The actor loss that :class:`StepTrainer` sends to the workers, for the whole config."""
    return StepPPOLoss(omega_conf_to_dataclass(config.actor_rollout_ref.actor))


if TRAINER_REGISTRY.get(TRAINER_MODE) is not StepTrainer:
    register_trainer(TRAINER_MODE)(StepTrainer)
