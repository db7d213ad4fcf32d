"""GRPO with any policy loss of :mod:`fbands.losses`: the reference training loop.

Read :func:`train` top to bottom; it is the whole algorithm:

1. validate the config, build the task and the policy, warm-start it (cached), restore a
   checkpoint when resuming;
2. every step: draw prompts (seeded by ``(seed, step)``: the data position *is* the step),
   sample ``G`` answers per prompt, score them;
3. group-normalised advantages
   :math:`A_i = (R_i - \\operatorname{mean}_g R) / (\\operatorname{std}_g R + 10^{-6})`
   (without the division for Dr. GRPO);
4. old log-probabilities once per batch and the band once per batch
   (:func:`fbands.losses.precompute_band`), of the radius that ``delta_schedule`` gives
   this step (:mod:`fbands.schedules`; an adaptive radius is updated after the step from
   the k3 KL of its updates, step 6);
5. ``ppo_epochs`` passes over ``minibatches`` shuffled minibatches: the policy loss, plus
   optionally a k3 KL to the reference and an entropy bonus; Adam with gradient clipping;
6. with ``mechanism_metrics`` or an adaptive radius, one more forward pass: the policy
   after all the updates against the one that sampled, as the step's KL (the k3 estimate
   ``r - 1 - log r`` averaged over the batch's tokens, and its running sum) and the change
   of log p of the sampled tokens by old probability and sign of the advantage
   (:mod:`fbands.rl.diagnostics`);
7. one line of metrics to ``metrics.jsonl`` (the loss's diagnostics over the off-policy
   updates, and per update in order; the sampled answers and, every ``eval_every`` steps,
   the held-out evaluation: :mod:`fbands.rl.evaluate`); a non-finite loss stops the run
   (the last good checkpoint stays); an atomic checkpoint every ``checkpoint_every`` steps.

``response_len`` is the mean answer length in tokens; ``response_width`` the width of the
step's padded batch (the longest answer), which sets what the forward and backward passes
cost: a loss that trains a policy with longer answers has dearer steps for that reason alone.

Timing metrics: ``time/rollout_s`` (sampling and scoring), ``time/update_s`` (old
log-probabilities, the band and the PPO epochs), ``tokens_per_s`` (response tokens over
both), ``time/band_s`` (the seconds inside :func:`~fbands.losses.precompute_band`, with the
device synchronised before and after) and ``time/band_share`` (that over the step).  They
time the band's own work only; whether it slows the operations around it is what
``benchmarks/bench_step.py`` measures, as the step time against clip's.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

from fbands import _checks
from fbands.losses import METRIC_KEYS, Band, agg_loss, policy_loss, precompute_band
from fbands.rl.checkpoint import load_checkpoint, rng_state_problem
from fbands.rl.checkpoint import rng_state as _rng_state
from fbands.rl.checkpoint import save_atomic as _save_atomic
from fbands.rl.checkpoint import saved_step as _saved_step
from fbands.rl.checkpoint import set_rng_state as _set_rng_state
from fbands.rl.config import ConfigError, TrainConfig
from fbands.rl.diagnostics import (
    UPDATE_STATS,
    clip_split_metrics,
    logp_change_by_bin,
    tail_clip_counts,
    tail_gain_per_prompt,
    update_stats,
)
from fbands.rl.evaluate import answer_metrics, evaluate
from fbands.rl.model import load_policy, max_positions, token_logprobs, warm_start
from fbands.rl.report import Reporter
from fbands.rl.rollout import sample
from fbands.rl.run_folder import claim, keep_metrics, regular_or_absent
from fbands.rl.tasks import make_task

CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"
CONFIG = "config.json"


class NonFiniteLossError(RuntimeError):
    """The loss or the gradient norm became NaN or infinite; the run stopped."""


# --- small helpers -------------------------------------------------------------------------
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


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _step_seed(seed: int, step: int) -> int:
    """A 62-bit seed for step ``step``'s sampling and shuffling (counter-based)."""
    return int(np.random.default_rng([seed, step, 1]).integers(2**62))


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


# --- the loop ------------------------------------------------------------------------------
def train(cfg: TrainConfig, *, resume: bool = False, stop_after: int | None = None,
          log=None) -> dict:
    """Run (or resume) GRPO training as configured; return the last step's metrics.

    Parameters
    ----------
    cfg : TrainConfig
        The run's options (validated here, before any work).
    resume : bool
        Continue from ``run_dir/checkpoint.pt``; the steps after that checkpoint are run
        again exactly as the uninterrupted run would have run them.
    stop_after : int, optional
        Stop after this many steps of this call (simulates a kill; for tests).
    log : callable, optional
        Receives human-readable messages (default: print to stderr).

    Returns
    -------
    dict
        The metrics row of the last step run (empty if none was left to run).

    Raises
    ------
    ConfigError
        a bad option, a run folder that already holds a run (without ``resume``) or that
        another process is training in now, a resumed run whose options differ from the
        saved ones, a checkpoint that cannot be read safely or is damaged
        (:func:`load_checkpoint`), or a folder or dangling link in place of
        ``checkpoint.pt`` or ``metrics.jsonl``
    OSError
        a checkpoint could not be written (a full disk); the previous one is kept
    NonFiniteLossError
        the loss or the gradient norm was NaN or infinite; ``checkpoint.pt`` still holds the
        last good step
    """
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    cfg.validate()
    # one process at a time in a run folder (a second is refused while this one runs)
    with claim(Path(cfg.run_dir), create=not resume, log=log), contextlib.ExitStack() as done:
        return _train(cfg, resume, stop_after, log, done)


def _train(cfg: TrainConfig, resume: bool, stop_after: int | None, log,
           done: contextlib.ExitStack) -> dict:
    """:func:`train` in the run folder it holds (``done`` closes what it opens)."""
    loss_cfg = cfg.loss_config()
    schedule = cfg.schedule()  # None: the radius stays loss_cfg.delta
    run_dir = Path(cfg.run_dir)
    ckpt_path, metrics_path = run_dir / CHECKPOINT, run_dir / METRICS
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
    device = _device(cfg)
    autocast = _autocast(cfg, device)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)

    # 1. task, policy (warm-started), frozen reference, optimizer ---------------------------
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
    G, start_step = cfg.group_size, 0
    kl_total = 0.0  # KL(old || new) summed over the steps (kl/cumulative)
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
        start_step = saved["step"]
        kl_total = float(saved.get("kl_cumulative", 0.0))
        keep_metrics(metrics_path, start_step)  # drop the steps after the checkpoint
        log(f"resumed {cfg.run_dir} at step {start_step}")
    else:
        torch.manual_seed(cfg.seed)
        if restart:
            keep_metrics(metrics_path, 0)
            log(f"{cfg.run_dir} has no {CHECKPOINT} (the run stopped before its first one): "
                "starting it again from step 0")
        (run_dir / CONFIG).write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")

    def save_checkpoint(step: int) -> None:
        _save_atomic({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                      "rng": _rng_state(device), "step": step, "kl_cumulative": kl_total,
                      "data_position": step * cfg.prompts_per_step,
                      "config": cfg.to_dict(),
                      **({"delta_schedule": schedule.state_dict()}
                         if schedule is not None and schedule.adaptive else {})}, ckpt_path)

    reporter = done.enter_context(Reporter(cfg.report_to, run_dir, start_step=start_step,
                                           config=cfg.to_dict()))
    from tqdm.auto import tqdm

    bar = tqdm(total=cfg.steps, initial=start_step, file=sys.stderr, disable=not cfg.progress,
               desc=f"{cfg.loss} {cfg.task}", dynamic_ncols=True)
    last: dict = {}
    for step in range(start_step, cfg.steps):
        t_start = time.perf_counter()

        # 2. prompts of this step, G samples each, rewards ---------------------------------
        rng = np.random.default_rng([cfg.seed, step])
        generator = torch.Generator(device=device).manual_seed(_step_seed(cfg.seed, step))
        prompts = task.prompts(rng, cfg.prompts_per_step)
        model.eval()
        batch = sample(model, codec, [p.text for p in prompts], G, cfg.max_new_tokens,
                       cfg.temperature, generator, device, autocast)
        rewards = torch.tensor([task.reward(prompts[i // G], c)
                                for i, c in enumerate(batch.completions)], device=device)
        t_rollout = time.perf_counter()

        # 3. group-normalised advantages (one per sequence) -------------------------------
        grouped = rewards.view(-1, G)  # (prompts, G)
        advantages = grouped - grouped.mean(dim=1, keepdim=True)
        if cfg.adv_std_norm:
            advantages = advantages / (grouped.std(dim=1, keepdim=True) + 1e-6)
        advantages = advantages.reshape(-1)  # (B,)

        # 4. old (and reference) log-probs once per batch; the band once per batch --------
        ids, attn, width_p = batch.input_ids, batch.attention_mask, batch.prompt_width
        mask = batch.response_mask  # (B, R)
        with torch.no_grad(), autocast():
            logp_old, entropy = token_logprobs(model, ids, attn, width_p,
                                               temperature=cfg.temperature,
                                               chunk=cfg.logprob_chunk)
            logp_ref = None
            if reference is not None:
                logp_ref, _ = token_logprobs(reference, ids, attn, width_p,
                                             temperature=cfg.temperature,
                                             chunk=cfg.logprob_chunk)
        _sync(device)  # two syncs per step so that the band's share of time is measured
        t_band = time.perf_counter()
        step_cfg = loss_cfg if schedule is None else dataclasses.replace(
            loss_cfg, delta=schedule(step))
        band = precompute_band(logp_old, step_cfg, mask=mask, check=device.type == "cpu")
        _sync(device)
        t_band = time.perf_counter() - t_band

        # 5. PPO epochs over shuffled minibatches -----------------------------------------
        model.train()
        per_update: list[dict[str, torch.Tensor]] = []
        ratio_stats: list[torch.Tensor] = []  # update_stats of each update, in order
        clip_counts = torch.zeros(4, device=device)  # clipped / all, tail (p < 0.1) / rest
        for _epoch in range(cfg.ppo_epochs):
            last_epoch = len(per_update)  # index of this epoch's first update
            order = torch.randperm(ids.shape[0], generator=generator, device=device)
            for mb in order.chunk(cfg.minibatches):
                with autocast():
                    logp, ent = token_logprobs(model, ids[mb], attn[mb], width_p,
                                               temperature=cfg.temperature,
                                               chunk=cfg.logprob_chunk)
                mb_band = Band(band.log_lower[mb], band.log_upper[mb])
                pg_loss, loss_metrics = policy_loss(logp_old[mb], logp, advantages[mb],
                                                    mask[mb], step_cfg, mb_band)
                clip_counts += tail_clip_counts(logp_old[mb], logp, advantages[mb], mask[mb],
                                                mb_band)
                ratio_stats.append(update_stats(logp_old[mb], logp, mask[mb],
                                                loss_metrics["clipfrac"]))
                loss = pg_loss
                if cfg.ent_coef > 0:
                    loss = loss - cfg.ent_coef * agg_loss(ent, mask[mb], loss_cfg.agg)
                kl_ref = torch.zeros((), device=device)
                if logp_ref is not None:
                    log_r = logp_ref[mb] - logp
                    kl_ref = agg_loss(log_r.exp() - log_r - 1, mask[mb], loss_cfg.agg)  # k3
                    loss = loss + cfg.kl_coef * kl_ref
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                optimizer.step()
                per_update.append({"loss/total": loss.detach(), "loss/pg": pg_loss.detach(),
                                   "loss/kl_ref": kl_ref.detach(), "grad_norm": grad_norm,
                                   **{f"loss/{k}": v for k, v in loss_metrics.items()}})
        t_end = time.perf_counter()

        # 6. the policy after all the step's updates against the one that sampled (one
        # more forward pass): the step's KL for an adaptive radius, and what the step did
        # to the sampled tokens (the mechanism metrics)
        kl_update = logp_new = None
        if cfg.mechanism_metrics or (schedule is not None and schedule.adaptive):
            model.eval()
            with torch.no_grad(), autocast():
                logp_new, _ = token_logprobs(model, ids, attn, width_p,
                                             temperature=cfg.temperature,
                                             chunk=cfg.logprob_chunk)
            log_r = (logp_new - logp_old).float().clamp(max=80.0)
            kl_update = ((log_r.exp() - 1 - log_r) * mask).sum() / mask.sum().clamp(min=1)
            _sync(device)
        t_kl = time.perf_counter() - t_end

        # 7. metrics (the one host sync of the update), NaN check, log, checkpoint --------
        keys = list(per_update[0])
        stacked = torch.stack([torch.stack([u[k].float() for k in keys]) for u in per_update])
        # the loss's diagnostics (ratios, clipped shares, KL estimates) over the off-policy
        # updates only: the step's first update sees the weights that sampled (ratio 1)
        off = stacked[1:] if len(per_update) > 1 else stacked  # (updates, keys)
        summary = torch.stack([stacked.mean(0), off.mean(0), off.max(0).values,
                               off.min(0).values]).tolist()
        means = {}
        for j, key in enumerate(keys):
            name = key.removeprefix("loss/")
            pick = 0 if name not in METRIC_KEYS else {"ratio_max": 2, "ratio_min": 3}.get(name, 1)
            means[key] = summary[pick][j]
        means["kl/last_epoch"] = float(stacked[last_epoch:, keys.index("loss/approx_kl_k3")]
                                       .mean())
        per_stat = torch.stack(ratio_stats).T.tolist()  # (stats, updates)
        means |= {f"update/{name}": values
                  for name, values in zip(UPDATE_STATS, per_stat, strict=True)}
        if kl_update is not None:
            means["kl/update"] = float(kl_update)
            kl_total += means["kl/update"]
            means["kl/cumulative"] = kl_total
            means["time/after_update_s"] = t_kl
        if logp_new is not None and cfg.mechanism_metrics:
            means |= logp_change_by_bin(logp_old, logp_new, advantages, mask)
            means["dlogp/tail_A+_per_prompt"] = tail_gain_per_prompt(logp_old, logp_new,
                                                                     advantages, mask, G)
        if not all(math.isfinite(means[k]) for k in ("loss/total", "grad_norm")):
            bar.close()
            good = _saved_step(ckpt_path)
            raise NonFiniteLossError(
                f"step {step + 1}: non-finite loss {means['loss/total']} or gradient norm "
                f"{means['grad_norm']}; stopping. The last good checkpoint "
                + (f"is {ckpt_path} (step {good})" if good is not None else "does not exist")
                + "; try a lower lr and resume with --resume")
        n_tokens = float(mask.sum())
        row = {"step": step + 1,
               "reward": float(rewards.mean()),
               "entropy": float((entropy * mask).sum() / mask.sum()),
               "response_len": n_tokens / mask.shape[0],
               "response_width": mask.shape[1],
               **means,
               "tokens_per_s": n_tokens / (t_end - t_start),
               "time/rollout_s": t_rollout - t_start,
               "time/update_s": t_end - t_rollout,
               # the band's own seconds (precompute_band, synchronised before and after);
               # what it costs the rest of the step, benchmarks/bench_step.py measures
               "time/band_s": t_band,
               "time/band_share": t_band / (t_end - t_start),
               **clip_split_metrics(clip_counts)}
        if step_cfg.uses_radius:  # the radius this step's band used
            row["delta"] = step_cfg.delta
            if schedule is not None and schedule.adaptive:  # the rule's input and output
                row["delta/measured_kl"] = row["kl/update"]
                row["delta/next"] = schedule.update(row["delta/measured_kl"])
        row |= answer_metrics(codec, task, prompts, batch, rewards, logp_old, G)
        if cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps):
            row |= evaluate(model, codec, task, eval_prompts, cfg, step, device, autocast)
        with metrics_path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        reporter.log(row)
        if (cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0) \
                or step + 1 == cfg.steps:
            save_checkpoint(step + 1)
        bar.update(1)
        bar.set_postfix(reward=f"{row['reward']:.2f}", acc=row.get("accuracy", float("nan")),
                        ent=f"{row['entropy']:.2f}", refresh=False)
        last = row
        if stop_after is not None and step + 1 - start_step >= stop_after:
            break
    bar.close()
    return last
