r"""What the trainer measures of the policy's answers, besides the loss.

:func:`evaluate` is the held-out evaluation of :func:`fbands.rl.train.train` (every
``eval_every`` steps and after the last): the greedy accuracy
(:func:`fbands.rl.rollout.greedy_accuracy`), the teacher-forced scores of the rewarded text
(:func:`held_out_scores`) and, with ``eval_samples``, pass@1 and pass@k at the sampling
temperature (:func:`held_out_samples`).  :func:`answer_metrics` describes the answers
sampled at each step: which named solution each is, and the old probability
:math:`\pi_{old}` of the token where each rewarded answer starts.
"""

from __future__ import annotations

import numpy as np
import torch

from fbands.losses import TAIL_PROB
from fbands.rl.model import pad_batch, token_logprobs
from fbands.rl.rollout import answer_start_columns, greedy_accuracy, sample


@torch.no_grad()
def held_out_scores(model, codec, task, prompts, cfg, device, autocast) -> dict[str, float]:
    """Teacher-forced scores of the held-out prompts, at the sampling temperature.

    ``p_correct`` and ``logp_correct``: the mean probability and mean log-probability that
    the policy writes the task's rewarded text, in any of its spellings
    (:meth:`~fbands.rl.tasks.Task.rewarded_texts`, their probabilities summed; followed by
    the end token when the reward is an exact match); ``entropy/first``: the mean entropy
    of the first answer token's distribution, which unlike the sampled answers' token-mean
    does not move with the answers' length or content.
    """
    texts = [task.rewarded_texts(p) for p in prompts]
    owner = [i for i, spellings in enumerate(texts) for _ in spellings]  # prompt of each row
    answers = [codec.answer_ids(t) for spellings in texts for t in spellings]
    if not task.exact_match:  # the reward reads a prefix: no end token after it
        answers = [a[:-1] for a in answers]
    ids, mask, width_p = pad_batch([codec.prompt_ids(prompts[i].text) for i in owner], answers,
                                   codec.pad_id, device)
    with autocast():
        logp, entropy = token_logprobs(model, ids, mask, width_p, temperature=cfg.temperature,
                                       chunk=cfg.logprob_chunk)
    seq = (logp * mask[:, width_p:]).sum(-1).double()  # (rows,) log P(one spelling)
    rows = torch.tensor(owner, device=seq.device)
    per_prompt = torch.stack([torch.logsumexp(seq[rows == i], 0) for i in range(len(prompts))])
    first = torch.tensor([owner.index(i) for i in range(len(prompts))], device=seq.device)
    return {"p_correct": float(per_prompt.exp().mean()), "logp_correct": float(per_prompt.mean()),
            "entropy/first": float(entropy[first, 0].mean())}


@torch.no_grad()
def held_out_samples(model, codec, task, prompts, cfg, step, device, autocast) -> dict:
    """``eval/pass@1`` and ``eval/pass@k``: ``k = cfg.eval_samples`` answers per held-out
    prompt at the sampling temperature, drawn from a generator of their own."""
    k = cfg.eval_samples
    generator = torch.Generator(device=device).manual_seed(
        int(np.random.default_rng([cfg.seed, step, 2]).integers(2**62)))
    batch = sample(model, codec, [p.text for p in prompts], k, cfg.max_new_tokens,
                   cfg.temperature, generator, device, autocast)
    rewards = np.array([task.reward(prompts[i // k], c)
                        for i, c in enumerate(batch.completions)]).reshape(-1, k)
    return {"eval/pass@1": float(rewards.mean()),
            f"eval/pass@{k}": float((rewards.max(axis=1) > 0).mean())}


def evaluate(model, codec, task, prompts, cfg, step, device, autocast) -> dict:
    """The held-out evaluation after step ``step`` (0-based), with the model in eval mode.

    Keys ``accuracy`` (greedy decoding), those of :func:`held_out_scores` and, when
    ``cfg.eval_samples`` is set, those of :func:`held_out_samples`.
    """
    model.eval()
    row = {"accuracy": greedy_accuracy(model, codec, task, prompts, cfg.max_new_tokens,
                                       device, autocast)}
    row |= held_out_scores(model, codec, task, prompts, cfg, device, autocast)
    if cfg.eval_samples:
        row |= held_out_samples(model, codec, task, prompts, cfg, step, device, autocast)
    return row


def answer_metrics(codec, task, prompts, batch, rewards, logp_old, group_size) -> dict:
    """What the answers sampled at one step were, as metrics of that step.

    ``prompts`` are the step's prompts, each sampled ``group_size`` times (prompt-major
    rows of ``batch``); ``rewards`` the rows' rewards and ``logp_old`` their ``(B, T)``
    log-probabilities under the policy that sampled them.  Keys ``solution/<name>``, the
    share of the batch of each of the task's named solutions (when it has any), and, when
    some answer was rewarded, ``answer/start_p`` (the mean :math:`\\pi_{old}` of the token
    where each rewarded answer starts), ``answer/start_tail_share`` (the share of those
    tokens with :math:`\\pi_{old} <` :data:`~fbands.losses.TAIL_PROB`),
    ``answer/rewarded`` (their count) and ``answer/start_p/<label>`` per label of the
    task's prompts.
    """
    G = group_size
    row: dict = {}
    rows, cols = answer_start_columns(codec, task, [prompts[i // G] for i in range(len(
        batch.completions))], batch, rewards.tolist())
    if task.solutions:  # which named solution each sample is, as shares of the batch
        kinds = [task.solution(prompts[i // G], c) for i, c in enumerate(batch.completions)]
        row |= {f"solution/{name}": kinds.count(name) / len(kinds)
                for name in task.solutions}
    if rows:  # old probability of the token where each rewarded answer starts
        p_start = logp_old[rows, cols].exp()
        row["answer/start_p"] = float(p_start.mean())
        row["answer/start_tail_share"] = float((p_start < TAIL_PROB).float().mean())
        row["answer/rewarded"] = len(rows)
        labels = [task.label(prompts[i // G]) for i in rows]
        for label in sorted(set(labels) - {None}):  # verify: "Yes" on true, "No" on false
            row[f"answer/start_p/{label}"] = float(p_start[[lb == label for lb in labels]]
                                                   .mean())
    return row
