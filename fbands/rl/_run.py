"""A training run's set-up (phase 1 of :func:`fbands.rl.train.train`): the device, the task,
the policy (warm-started), the frozen reference and the optimizer, and, when resuming, the
checkpoint's state, each checked before any of it is used."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fbands import _checks
from fbands.losses import LossConfig
from fbands.rl.checkpoint import load_checkpoint, rng_state_problem
from fbands.rl.checkpoint import rng_state as _rng_state
from fbands.rl.checkpoint import save_atomic as _save_atomic
from fbands.rl.checkpoint import set_rng_state as _set_rng_state
from fbands.rl.config import ConfigError, TrainConfig
from fbands.rl.model import load_policy, max_positions, token_logprobs, warm_start
from fbands.rl.run_folder import keep_metrics, regular_or_absent
from fbands.rl.tasks import make_task
from fbands.schedules import AdaptiveDelta, DeltaSchedule

CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"
CONFIG = "config.json"


def _device(cfg: TrainConfig) -> torch.device:
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' but torch.cuda.is_available() is False")
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.device)


def _autocast(cfg: TrainConfig, device: torch.device):
    """A factory of the autocast context: bf16 on CUDA when ``cfg.bf16``, else nothing."""
    if device.type == "cuda" and cfg.bf16:
        return lambda: torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext


#: fields that may differ between a run and its resumption
#: (run_dir too: the checkpoint was found there, so ./r3, r3/ and /abs/r3 all name the run)
_RESUMABLE_CHANGES = {"steps", "progress", "checkpoint_every", "threads", "device", "cache_dir",
                      "run_dir", "report_to"}


def _saved_config(cfg: TrainConfig, path: Path) -> dict:
    """``config.json`` of a run to resume that has no checkpoint (a ConfigError if none)."""
    if not path.is_file():
        raise ConfigError(f"run_dir={cfg.run_dir!r}: --resume given but neither {CHECKPOINT} "
                          f"nor {CONFIG} is there: nothing to resume; start the run without "
                          "--resume")
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:
        raise ConfigError(f"{str(path)!r} cannot be read as JSON ({err})") from err
    if not isinstance(saved, dict):
        raise ConfigError(f"{str(path)!r} holds no table of options")
    return saved


def _check_unchanged(cfg: TrainConfig, saved: dict) -> None:
    """Refuse options of a resumed run that differ from the saved ones (but the resumable)."""
    changed = sorted(k for k, v in saved.items()
                     if k not in _RESUMABLE_CHANGES and getattr(cfg, k, v) != v)
    if changed:
        raise ConfigError(f"resume: options {changed} differ from the saved run "
                          f"{[saved[k] for k in changed]}")


def _check_positions(cfg: TrainConfig, model, codec, prompts) -> None:
    """Refuse a ``max_new_tokens`` that, after the longest prompt, passes the model's last
    position (GPT-2's position table would fail with an IndexError mid-step)."""
    limit = max_positions(model)
    longest = max((len(codec.prompt_ids(p.text)) for p in prompts), default=0)
    if limit is not None and longest + cfg.max_new_tokens > limit:
        raise ConfigError(f"max_new_tokens={cfg.max_new_tokens}: a prompt of {longest} tokens "
                          f"and its answer must fit the model's {limit} positions, so at most "
                          f"{max(limit - longest, 0)}")


@dataclasses.dataclass
class Run:
    """What every step of a run uses: the set-up of phase 1 and the running KL sum."""

    cfg: TrainConfig
    loss_cfg: LossConfig
    schedule: DeltaSchedule | AdaptiveDelta | None  # None: the radius stays loss_cfg.delta
    device: torch.device
    autocast: Callable
    task: Any
    model: torch.nn.Module
    codec: Any
    reference: torch.nn.Module | None
    optimizer: torch.optim.Optimizer
    eval_prompts: list
    start_step: int = 0
    kl_total: float = 0.0  # KL(old || new) summed over the steps (kl/cumulative)

    def logprobs(self, model, ids, attn, width):
        """Per-token log-probabilities and entropies of the answers (``token_logprobs``)."""
        return token_logprobs(model, ids, attn, width, temperature=self.cfg.temperature,
                              chunk=self.cfg.logprob_chunk)

    def save_checkpoint(self, step: int, path: Path) -> None:
        adaptive = self.schedule is not None and self.schedule.adaptive
        _save_atomic({"model": self.model.state_dict(),
                      "optimizer": self.optimizer.state_dict(),
                      "rng": _rng_state(self.device), "step": step,
                      "kl_cumulative": self.kl_total,
                      "data_position": step * self.cfg.prompts_per_step,
                      "config": self.cfg.to_dict(),
                      **({"delta_schedule": self.schedule.state_dict()} if adaptive else {})},
                     path)


def open_run(cfg: TrainConfig, resume: bool, log, ckpt_path: Path,
              metrics_path: Path) -> Run:
    """Phase 1: the task, the policy (warm-started), the frozen reference and the optimizer,
    restored from the checkpoint when resuming; a new run writes its ``config.json``."""
    run_dir = ckpt_path.parent
    # (a folder or a dangling link in their place is an error, never "no checkpoint yet")
    has_checkpoint = regular_or_absent(ckpt_path, "checkpoint")
    if not resume and (has_checkpoint or regular_or_absent(metrics_path, "metrics file")):
        how = ("pass --resume to continue it" if has_checkpoint else
               f"it stopped before its first {CHECKPOINT}: pass --resume to start it again "
               "from step 0")
        raise ConfigError(f"run_dir={cfg.run_dir!r} already holds a run: {how}, or choose "
                          "another run_dir")
    saved = None
    # --resume of a run stopped before its first checkpoint: start it again from step 0
    restart = resume and not has_checkpoint
    if restart:
        _check_unchanged(cfg, _saved_config(cfg, run_dir / CONFIG))
    elif resume:  # read and check the checkpoint before the expensive set-up
        saved = load_checkpoint(ckpt_path)
        _check_unchanged(cfg, saved["config"])
    loss_cfg, schedule = cfg.loss_config(), cfg.schedule()
    device = _device(cfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    task = make_task(cfg)
    model, codec = load_policy(cfg, task, log=log)
    eval_prompts = task.prompts(np.random.default_rng([cfg.warm_start_seed, 99]),
                                cfg.eval_prompts, split="eval")
    _check_positions(cfg, model, codec, [*eval_prompts, *task.prompts(
        np.random.default_rng([cfg.seed, 0]), cfg.prompts_per_step)])
    model.to(device)
    log(warm_start(model, codec, task, cfg, device, log=log))
    if loss_cfg.soft is not None:
        log(f"soft clip: {loss_cfg.soft} (soft_k={loss_cfg.soft_k}, "
            f"soft_width={loss_cfg.soft_width}) in place of the hard clip of {loss_cfg.method}")
    reference = copy.deepcopy(model).eval().requires_grad_(False) if cfg.kl_coef > 0 else None
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)
    run = Run(cfg, loss_cfg, schedule, device, _autocast(cfg, device), task, model, codec,
               reference, optimizer, eval_prompts)
    if saved is not None:
        try:
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            if schedule is not None and schedule.adaptive:
                schedule.load_state_dict(saved["delta_schedule"])
        except (RuntimeError, ValueError, KeyError, TypeError) as err:
            reason = _checks.reason(err)
            raise ConfigError(f"checkpoint {str(ckpt_path)!r} does not fit this run's model "
                              f"and optimizer ({reason})") from err
        broken = rng_state_problem(saved["rng"])
        if broken is not None:  # checked whole before any of it is set
            raise ConfigError(f"checkpoint {str(ckpt_path)!r} has a damaged 'rng' entry: "
                              f"{broken}; restore a good copy, or start a new run in another "
                              "run_dir")
        _set_rng_state(saved["rng"], device)
        run.start_step = saved["step"]
        run.kl_total = float(saved.get("kl_cumulative", 0.0))
        keep_metrics(metrics_path, run.start_step)  # drop the steps after the checkpoint
        log(f"resumed {cfg.run_dir} at step {run.start_step}")
    else:
        torch.manual_seed(cfg.seed)
        if restart:
            keep_metrics(metrics_path, 0)
            log(f"{cfg.run_dir} has no {CHECKPOINT} (the run stopped before its first one): "
                "starting it again from step 0")
        (run_dir / CONFIG).write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
    return run
