"""The worker side of verl's global step (the trainer's: :mod:`fbands.integrations.verl_trainer`).

:class:`StepPPOLoss` is verl's ``ppo_loss`` with the step read from each micro-batch's data
(the ``global_steps`` field that :class:`~fbands.integrations.verl_trainer.StepTrainer` adds)
and made visible to the band losses (:func:`current_step`) while verl's loss runs; the band
losses then evaluate ``policy_loss.delta_schedule`` there (:func:`scheduled`).  Nothing here
imports verl's trainer: the module is loaded by the plug-in in every worker.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Any

from fbands import losses as fl
from fbands._state import STATE
from fbands.errors import ConfigError
from fbands.integrations._options import radius_schedule

#: The ``trainer.v1.trainer_mode`` of :class:`StepTrainer`.
TRAINER_MODE = "fbands_sync"

_STEP: contextvars.ContextVar[int | None] = contextvars.ContextVar("fbands_verl_step",
                                                                    default=None)


def current_step() -> int | None:
    """The number of training steps completed, while :class:`StepPPOLoss` runs (else None)."""
    return _STEP.get()


@contextlib.contextmanager
def global_step(step: int | None):
    """Make ``step`` (steps completed) the :func:`current_step` inside the block."""
    token = _STEP.set(step)
    try:
        yield
    finally:
        _STEP.reset(token)


def schedule_for(cfg: fl.LossConfig, text: str, error: type[ConfigError]):
    """The step schedule ``text`` of the radius of ``cfg`` (parsed once per text and start)."""
    return _schedule_of(text, cfg, error)


def _schedule_of(text: str, cfg: fl.LossConfig, error: type[ConfigError]):
    return _SCHEDULES.get_or_make((text, cfg, error), lambda: radius_schedule(
        "policy_loss.delta_schedule", text, cfg, error, method=f"method {cfg.method!r}",
        adaptive=False))


_SCHEDULES = STATE.memo("verl schedules", "verl's radius schedules, parsed, by (text, loss "
                        "config, error class)", max_entries=64)


def scheduled(cfg: fl.LossConfig, text: str | None, error: type[ConfigError]) -> fl.LossConfig:
    """``cfg`` with the radius of the schedule ``text`` at :func:`current_step` (``cfg`` as it
    is without a schedule)."""
    if not text:
        return cfg
    schedule = schedule_for(cfg, text, error)
    step = current_step()
    if step is None:
        raise error(f"policy_loss.delta_schedule={text!r} needs the global step, which verl "
                    "gives a policy loss only through fbands' trainer: set "
                    f"trainer.v1.trainer_mode={TRAINER_MODE} with verl's v1 trainer "
                    "(trainer.use_v1=true) and load fbands.integrations.verl_trainer (the verl "
                    "guide, 'A delta schedule')")
    return dataclasses.replace(cfg, delta=schedule(step))


class StepPPOLoss:
    """verl's ``ppo_loss`` with the step of each micro-batch visible to the band losses.

    ``config`` is the actor's :class:`verl.workers.config.ActorConfig`; the object is what a
    ``set_loss_fn`` call sends to the actor workers (it pickles with its config).
    """

    def __init__(self, config: Any):
        self.config = config

    def __call__(self, model_output, data, dp_group=None):
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.losses import ppo_loss

        steps = tu.get(data, "global_steps", default=None)
        with global_step(None if steps is None else int(steps) - 1):
            return ppo_loss(self.config, model_output, data, dp_group)
