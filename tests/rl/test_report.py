"""Run logging besides metrics.jsonl: TensorBoard and wandb (``report_to``; issue 42)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from fbands.errors import ConfigError  # noqa: E402
from fbands.rl import train as rl_train  # noqa: E402
from fbands.rl.config import TrainConfig  # noqa: E402
from fbands.rl.report import parse_report_to  # noqa: E402

from .._tiny_run import TINY_RUN, quiet  # noqa: E402

TINY = {**TINY_RUN, "steps": 4, "checkpoint_every": 2}


def test_report_to_names_known_viewers_only():
    assert parse_report_to("") == ()
    assert parse_report_to(" tensorboard , wandb,tensorboard") == ("tensorboard", "wandb")
    for bad in ("tensorbord", "wandb,mlflow", 3):
        with pytest.raises(ConfigError, match="report_to="):
            TrainConfig(report_to=bad).validate()


def test_tensorboard_holds_each_step_once_across_a_resume(tmp_path):
    """Killed after step 3 (its last checkpoint at step 2), then resumed: the events of the
    steps after the checkpoint are replaced, as metrics.jsonl's rows are."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    cfg = TrainConfig(**TINY, run_dir=str(run), cache_dir=str(tmp_path / "c"),
                      report_to="tensorboard")
    rl_train.train(cfg, stop_after=3, log=quiet)
    rl_train.train(cfg, resume=True, log=quiet)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    for key in ("reward", "entropy", "grad_norm", "band/clipfrac_upper"):
        logged = [(e.step, e.value) for e in events.Scalars(key)]
        assert logged == [(r["step"], pytest.approx(r[key], rel=1e-6)) for r in rows], key


def test_wandb_offline_logs_the_rows(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    cfg = TrainConfig(**{**TINY, "steps": 2}, run_dir=str(run), cache_dir=str(tmp_path / "c"),
                      report_to="wandb")
    rl_train.train(cfg, log=quiet)
    (logged,) = (run / "wandb").glob("offline-run-*/run-*.wandb")
    assert logged.stat().st_size > 0
    assert (run / "metrics.jsonl").read_text().count("\n") == 2
