"""The TRL plug-in's error, and the callback that carries an adaptive radius through
checkpoints (both re-exported by :mod:`fbands.integrations.trl`)."""

from __future__ import annotations

import logging

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

import fbands
from fbands.errors import ConfigError

logger = logging.getLogger("fbands.integrations.trl")


class TRLBandError(ConfigError):
    """A TRL configuration the band trainer cannot honour (a :class:`fbands.ConfigError`)."""


class BandRadiusCallback(TrainerCallback, ExportableState):
    """An adaptive radius (``band_delta_schedule="adaptive:..."``) and the KL measured since
    it last moved, kept through checkpoints by transformers' protocol for stateful callbacks.

    :class:`BandGRPOTrainer` adds one when its schedule is adaptive.  transformers saves
    :meth:`state` in each checkpoint's ``trainer_state.json``; when
    ``train(resume_from_checkpoint=...)`` starts, :meth:`on_train_begin` reads it back (and
    with ``restore_callback_states_from_checkpoint=True`` transformers rebuilds the callback
    from the same entry: either way the run goes on with the saved radius).

    Parameters
    ----------
    schedule : str
        The adaptive schedule in full (``str`` of a :class:`fbands.AdaptiveDelta`).
    """

    def __init__(self, schedule: str):
        self.schedule = fbands.parse_schedule(schedule)
        if not self.schedule.adaptive:
            raise TRLBandError(f"BandRadiusCallback keeps an adaptive radius, not {schedule!r}")
        self.pending_kl: list[float] = []  # k3 of the last pass over the latest batch

    @property
    def radius(self) -> dict:
        """The schedule's state (:meth:`fbands.AdaptiveDelta.state_dict`)."""
        return self.schedule.state_dict()

    @radius.setter
    def radius(self, state: dict) -> None:
        self.schedule.load_state_dict(state)

    def state(self) -> dict:
        return {"args": {"schedule": str(self.schedule)},
                "attributes": {"radius": self.radius, "pending_kl": list(self.pending_kl)}}

    def on_train_begin(self, args, state, control, **kwargs):
        saved = (state.stateful_callbacks or {}).get(type(self).__name__)
        if saved is None:
            if state.global_step:
                logger.warning("resumed at step %d from a checkpoint that holds no adaptive "
                               "radius: it starts again from %s", state.global_step,
                               self.schedule.delta)
            return
        try:
            attributes = saved["attributes"]
            pending = [float(x) for x in attributes["pending_kl"]]
            self.radius = attributes["radius"]
        except (ValueError, KeyError, TypeError) as err:
            raise TRLBandError(f"trainer_state.json's {type(self).__name__} entry is not a "
                               f"saved adaptive radius ({err}); delete the entry to restart "
                               "from band_delta") from err
        self.pending_kl = pending
        if state.global_step:
            logger.info("fbands adaptive radius restored at step %d: delta=%s",
                        state.global_step, self.schedule.delta)
