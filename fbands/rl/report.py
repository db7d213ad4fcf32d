"""Where a run's metrics go besides ``metrics.jsonl``: TensorBoard and Weights & Biases.

``metrics.jsonl`` is always written (it is what ``--resume``, ``fbands compare`` and the
tests read).  ``TrainConfig.report_to`` adds viewers a trainer user expects, each optional
and imported only when asked for:

- ``tensorboard``: event files in ``<run_dir>/tensorboard`` (``torch.utils.tensorboard``,
  which needs the ``tensorboard`` package); a resumed run drops the events after its
  checkpoint's step, as ``metrics.jsonl`` drops those rows;
- ``wandb``: a run of the ``wandb`` package named after the run folder, its files in
  ``<run_dir>/wandb``, resumed under the same id.  Whether it syncs to a server is wandb's
  own setting (``WANDB_MODE=offline`` keeps everything local).

Every scalar of a metrics row is logged under its own name at the row's step (lists, such
as the per-update statistics, are left to ``metrics.jsonl``).
"""

from __future__ import annotations

import math
from pathlib import Path

from fbands.errors import ConfigError

__all__ = ["REPORTERS", "parse_report_to", "Reporter"]

#: the viewers ``report_to`` may name, and the package each needs
REPORTERS = {"tensorboard": "tensorboard", "wandb": "wandb"}


def parse_report_to(text: str) -> tuple[str, ...]:
    """The viewers named in ``text`` (comma-separated; ``""``: none), or a ConfigError."""
    if not isinstance(text, str):
        raise ConfigError(f"report_to={text!r}: must be text, e.g. 'tensorboard' or "
                          "'tensorboard,wandb' ('' : metrics.jsonl only)")
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in REPORTERS]
    if unknown:
        raise ConfigError(f"report_to={text!r}: {', '.join(map(repr, unknown))} is not one "
                          f"of {', '.join(REPORTERS)}")
    return names


def _scalars(row: dict) -> dict[str, float]:
    return {k: float(v) for k, v in row.items()
            if k != "step" and isinstance(v, int | float) and not isinstance(v, bool)
            and math.isfinite(v)}


class Reporter:
    """The viewers of one run (none when ``report_to`` is empty): :meth:`log` each row;
    used as a context manager, it closes them at the end."""

    def __init__(self, report_to: str, run_dir: Path, *, start_step: int, config: dict):
        self._tb = self._wandb = None
        names = parse_report_to(report_to)
        if "tensorboard" in names:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:
                raise ConfigError("report_to=tensorboard needs the tensorboard package: pip "
                                  "install tensorboard") from err
            self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"),
                                     purge_step=start_step + 1 if start_step else None)
        if "wandb" in names:
            try:
                import wandb
            except ImportError as err:
                raise ConfigError("report_to=wandb needs the wandb package: pip install "
                                  "wandb") from err
            self._wandb = wandb.init(dir=str(run_dir), name=run_dir.resolve().name,
                                     id=_wandb_id(run_dir), resume="allow", config=config)

    def log(self, row: dict) -> None:
        scalars, step = _scalars(row), row["step"]
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish(exit_code=1 if exc[0] is not None else 0)


def _wandb_id(run_dir: Path) -> str:
    """A wandb run id that names this run folder (the same after a resume)."""
    import hashlib

    return hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]
