"""GRPO with any policy loss of :mod:`fbands.losses`: the reference training loop.

Read its phases in order (:func:`fbands.rl._run.open_run`, then ``_rollout``, ``_update`` and
``_summary`` for every step); together they are the whole algorithm:

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
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from fbands.losses import (
    METRIC_KEYS,
    Band,
    LossConfig,
    agg_loss,
    mismatch_gate,
    policy_loss,
    precompute_band,
)
from fbands.rl._run import CHECKPOINT, METRICS, Run, open_run
from fbands.rl.checkpoint import saved_step as _saved_step
from fbands.rl.config import TrainConfig
from fbands.rl.diagnostics import (
    UPDATE_STATS,
    logp_change_by_bin,
    tail_change_per_prompt,
    update_stats,
)
from fbands.rl.evaluate import answer_metrics, evaluate
from fbands.rl.report import Reporter
from fbands.rl.rollout import sample
from fbands.rl.run_folder import claim

__all__ = ["CHECKPOINT", "METRICS", "NonFiniteLossError", "train"]


class NonFiniteLossError(RuntimeError):
    """The loss or the gradient norm became NaN or infinite; the run stopped."""


# --- small helpers -------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _step_seed(seed: int, step: int) -> int:
    """A 62-bit seed for step ``step``'s sampling and shuffling (counter-based)."""
    return int(np.random.default_rng([seed, step, 1]).integers(2**62))


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
        (:func:`fbands.rl.checkpoint.load_checkpoint`), or a folder or dangling link in place of
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


class _Rollout(NamedTuple):
    """Phases 2-4 of one step: its prompts, answers, rewards, advantages, log-probabilities
    and band."""

    prompts: list
    batch: Any
    rewards: torch.Tensor
    advantages: torch.Tensor
    logp_old: torch.Tensor
    entropy: torch.Tensor
    logp_ref: torch.Tensor | None
    band: Band
    gate: torch.Tensor | None  # the mismatch gate's weights (B, R), or None
    step_cfg: LossConfig
    generator: torch.Generator
    t_rollout: float  # (the end of sampling and scoring)
    t_band: float  # (the seconds in precompute_band)


class _Updates(NamedTuple):
    """Phase 5 of one step: each update's metrics and ratio statistics."""

    per_update: list[dict[str, torch.Tensor]]
    ratio_stats: list[torch.Tensor]
    last_epoch: int  # index of the last epoch's first update


def _train(cfg: TrainConfig, resume: bool, stop_after: int | None, log,
           done: contextlib.ExitStack) -> dict:
    """:func:`train` in the run folder it holds (``done`` closes what it opens)."""
    run_dir = Path(cfg.run_dir)
    ckpt_path, metrics_path = run_dir / CHECKPOINT, run_dir / METRICS
    run = open_run(cfg, resume, log, ckpt_path, metrics_path)
    reporter = done.enter_context(Reporter(cfg.report_to, run_dir, start_step=run.start_step,
                                           config=cfg.to_dict()))
    from tqdm.auto import tqdm

    bar = done.enter_context(tqdm(total=cfg.steps, initial=run.start_step, file=sys.stderr,
                                  disable=not cfg.progress, desc=f"{cfg.loss} {cfg.task}",
                                  dynamic_ncols=True))
    last: dict = {}
    for step in range(run.start_step, cfg.steps):
        t_start = time.perf_counter()
        roll = _rollout(run, step)
        updates = _update(run, roll)
        row = _summary(run, step, roll, updates, t_start, ckpt_path)
        if cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps):
            row |= evaluate(run.model, run.codec, run.task, run.eval_prompts, cfg, step,
                            run.device, run.autocast)
        with metrics_path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        reporter.log(row)
        if (cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0) \
                or step + 1 == cfg.steps:
            run.save_checkpoint(step + 1, ckpt_path)
        bar.update(1)
        bar.set_postfix(reward=f"{row['reward']:.2f}", acc=row.get("accuracy", float("nan")),
                        ent=f"{row['entropy']:.2f}", refresh=False)
        last = row
        if stop_after is not None and step + 1 - run.start_step >= stop_after:
            break
    return last


def _rollout(run: Run, step: int) -> _Rollout:
    """Phases 2-4: prompts (seeded by ``(seed, step)``), ``G`` answers each and their
    rewards, group-normalised advantages, the old (and reference) log-probabilities and the
    band, once per batch."""
    cfg, device, G = run.cfg, run.device, run.cfg.group_size
    rng = np.random.default_rng([cfg.seed, step])
    generator = torch.Generator(device=device).manual_seed(_step_seed(cfg.seed, step))
    prompts = run.task.prompts(rng, cfg.prompts_per_step)
    run.model.eval()
    batch = sample(run.model, run.codec, [p.text for p in prompts], G, cfg.max_new_tokens,
                   cfg.temperature, generator, device, run.autocast)
    rewards = torch.tensor([run.task.reward(prompts[i // G], c)
                            for i, c in enumerate(batch.completions)], device=device)
    t_rollout = time.perf_counter()
    grouped = rewards.view(-1, G)  # (prompts, G)
    advantages = grouped - grouped.mean(dim=1, keepdim=True)
    if cfg.adv_std_norm:
        advantages = advantages / (grouped.std(dim=1, keepdim=True) + 1e-6)
    advantages = advantages.reshape(-1)  # (B,): one per sequence
    ids, attn, width = batch.input_ids, batch.attention_mask, batch.prompt_width
    with torch.no_grad(), run.autocast():
        logp_old, entropy = run.logprobs(run.model, ids, attn, width)
        logp_ref = None
        if run.reference is not None:
            logp_ref, _ = run.logprobs(run.reference, ids, attn, width)
    _sync(device)  # two syncs per step so that the band's share of time is measured
    t_band = time.perf_counter()
    step_cfg = run.loss_cfg if run.schedule is None else dataclasses.replace(
        run.loss_cfg, delta=run.schedule(step))
    band = precompute_band(logp_old, step_cfg, mask=batch.response_mask,
                           check=device.type == "cpu")
    _sync(device)
    t_band = time.perf_counter() - t_band
    gate = run.cfg.gate()
    if gate is not None:  # the trainer's log-probs against the sampler's
        gate = mismatch_gate(logp_old, batch.logp, gate["div"], gate["delta"],
                             mode=gate["mode"], mask=batch.response_mask)
    return _Rollout(prompts, batch, rewards, advantages, logp_old, entropy, logp_ref, band,
                    gate, step_cfg, generator, t_rollout, t_band)


def _update(run: Run, r: _Rollout) -> _Updates:
    """Phase 5: ``ppo_epochs`` passes over ``minibatches`` shuffled minibatches: the policy
    loss, optionally a k3 KL to the reference and an entropy bonus; Adam, clipped."""
    cfg, device, batch = run.cfg, run.device, r.batch
    ids, attn, width, mask = (batch.input_ids, batch.attention_mask, batch.prompt_width,
                              batch.response_mask)
    run.model.train()
    per_update: list[dict[str, torch.Tensor]] = []
    ratio_stats: list[torch.Tensor] = []  # update_stats of each update, in order
    last_epoch = 0
    for _epoch in range(cfg.ppo_epochs):
        last_epoch = len(per_update)
        order = torch.randperm(ids.shape[0], generator=r.generator, device=device)
        for mb in order.chunk(cfg.minibatches):
            with run.autocast():
                logp, ent = run.logprobs(run.model, ids[mb], attn[mb], width)
            logp_old, adv, m = r.logp_old[mb], r.advantages[mb], mask[mb]
            mb_band = Band(r.band.log_lower[mb], r.band.log_upper[mb])
            weights = m if r.gate is None else m * r.gate[mb]
            pg_loss, loss_metrics = policy_loss(logp_old, logp, adv, weights, r.step_cfg,
                                                mb_band)
            ratio_stats.append(update_stats(logp_old, logp, m, loss_metrics["clipfrac"]))
            loss = pg_loss
            if cfg.ent_coef > 0:
                loss = loss - cfg.ent_coef * agg_loss(ent, m, run.loss_cfg.agg)
            kl_ref = torch.zeros((), device=device)
            if r.logp_ref is not None:
                log_r = r.logp_ref[mb] - logp
                kl_ref = agg_loss(log_r.exp() - log_r - 1, m, run.loss_cfg.agg)  # k3
                loss = loss + cfg.kl_coef * kl_ref
            run.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(run.model.parameters(),
                                                       cfg.max_grad_norm)
            run.optimizer.step()
            per_update.append({"loss/total": loss.detach(), "loss/pg": pg_loss.detach(),
                               "loss/kl_ref": kl_ref.detach(), "grad_norm": grad_norm,
                               **{f"band/{k}": v for k, v in loss_metrics.items()}})
    return _Updates(per_update, ratio_stats, last_epoch)


def _summary(run: Run, step: int, r: _Rollout, u: _Updates, t_start: float,
             ckpt_path: Path) -> dict:
    """Phases 6-7: the step's KL and mechanism metrics (one more forward pass), then its
    metrics row (the one host sync of the update); a non-finite loss stops the run."""
    cfg, batch, mask = run.cfg, r.batch, r.batch.response_mask
    t_end = time.perf_counter()
    # the policy after all the step's updates against the one that sampled: the step's KL
    # for an adaptive radius, and what the step did to the sampled tokens
    adaptive = run.schedule is not None and run.schedule.adaptive
    kl_update = logp_new = None
    if cfg.mechanism_metrics or adaptive:
        run.model.eval()
        with torch.no_grad(), run.autocast():
            logp_new, _ = run.logprobs(run.model, batch.input_ids, batch.attention_mask,
                                       batch.prompt_width)
        log_r = (logp_new - r.logp_old).float().clamp(max=80.0)
        kl_update = ((log_r.exp() - 1 - log_r) * mask).sum() / mask.sum().clamp(min=1)
        _sync(run.device)
    t_kl = time.perf_counter() - t_end

    keys = list(u.per_update[0])
    stacked = torch.stack([torch.stack([v[k].float() for k in keys]) for v in u.per_update])
    # the loss's diagnostics (ratios, clipped shares, KL estimates) over the off-policy
    # updates only: the step's first update sees the weights that sampled (ratio 1)
    off = stacked[1:] if len(u.per_update) > 1 else stacked  # (updates, keys)
    summary = torch.stack([stacked.mean(0), off.mean(0), off.max(0).values,
                           off.min(0).values]).tolist()
    means = {}
    for j, key in enumerate(keys):
        name = key.removeprefix("band/")
        pick = 0 if name not in METRIC_KEYS else {"ratio_max": 2, "ratio_min": 3}.get(name, 1)
        means[key] = summary[pick][j]
    means["kl/last_epoch"] = float(stacked[u.last_epoch:, keys.index("band/approx_kl_k3")]
                                   .mean())
    per_stat = torch.stack(u.ratio_stats).T.tolist()  # (stats, updates)
    means |= {f"update/{name}": values
              for name, values in zip(UPDATE_STATS, per_stat, strict=True)}
    if kl_update is not None:
        means["kl/update"] = float(kl_update)
        run.kl_total += means["kl/update"]
        means["kl/cumulative"] = run.kl_total
        means["time/after_update_s"] = t_kl
    if logp_new is not None and cfg.mechanism_metrics:
        means |= logp_change_by_bin(r.logp_old, logp_new, r.advantages, mask)
        means |= tail_change_per_prompt(r.logp_old, logp_new, r.advantages, mask,
                                        cfg.group_size)
    if not all(math.isfinite(means[k]) for k in ("loss/total", "grad_norm")):
        good = _saved_step(ckpt_path)
        raise NonFiniteLossError(
            f"step {step + 1}: non-finite loss {means['loss/total']} or gradient norm "
            f"{means['grad_norm']}; stopping. The last good checkpoint "
            + (f"is {ckpt_path} (step {good})" if good is not None else "does not exist")
            + "; try a lower lr and resume with --resume")
    n_tokens = float(mask.sum())
    row = {"step": step + 1,
           "reward": float(r.rewards.mean()),
           "entropy": float((r.entropy * mask).sum() / mask.sum()),
           "response_len": n_tokens / mask.shape[0],
           "response_width": mask.shape[1],
           **means,
           "tokens_per_s": n_tokens / (t_end - t_start),
           "time/rollout_s": r.t_rollout - t_start,
           "time/update_s": t_end - r.t_rollout,
           # the band's own seconds (precompute_band, synchronised before and after);
           # what it costs the rest of the step, benchmarks/bench_step.py measures
           "time/band_s": r.t_band,
           "time/band_share": r.t_band / (t_end - t_start)}
    if r.gate is not None:  # the mean gate weight of the response tokens (kept share)
        row["band/gate_weight"] = float((r.gate * mask).sum() / mask.sum().clamp(min=1))
    if r.step_cfg.uses_radius:  # the radius this step's band used
        row["band/delta"] = r.step_cfg.delta
        if adaptive:  # the rule's input and output
            row["band/measured_kl"] = row["kl/update"]
            row["band/delta_next"] = run.schedule.update(row["band/measured_kl"])
    row |= answer_metrics(run.codec, run.task, r.prompts, batch, r.rewards, r.logp_old,
                          cfg.group_size)
    return row
