"""Sampling: G answers per prompt with a KV cache, and the batch layout the update uses."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fbands.rl.model import Codec, body_forward, pad_batch


@dataclass
class Rollout:
    """One batch of sampled answers, ``B = prompts x G`` rows, prompt-major.

    ``input_ids`` / ``attention_mask`` are ``(B, P + R)``: left-padded prompts, then the
    answers; ``response_mask`` is ``(B, R)`` and marks answer tokens up to and including the
    end token; ``logp`` is ``(B, R)``, each sampled token's log-probability under the
    distribution it was drawn from (the rollout engine's, which the trainer's recomputation
    can differ from: :func:`fbands.losses.mismatch_gate`).
    """

    input_ids: torch.Tensor  # (B, P + R)
    attention_mask: torch.Tensor  # (B, P + R)
    response_mask: torch.Tensor  # (B, R)
    prompt_width: int  # P
    completions: list[str]  # B decoded answers
    logp: torch.Tensor  # (B, R)


@torch.no_grad()
def sample(model, codec: Codec, prompt_texts: list[str], group_size: int, max_new_tokens: int,
           temperature: float, generator: torch.Generator, device, autocast) -> Rollout:
    """Draw ``group_size`` answers per prompt at ``temperature``.

    The loop is written out (rather than ``model.generate``) so that every random number comes
    from ``generator``: a step's samples depend only on the weights and the step's seed.
    Logits are evaluated for the last position only.
    """
    prompts = [codec.prompt_ids(t) for t in prompt_texts for _ in range(group_size)]
    ids, mask, width_p = pad_batch(prompts, None, codec.pad_id, device)  # (B, P)
    head = model.get_output_embeddings()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, P)
    past = None
    step_ids, step_pos = ids, positions
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=device)  # (B,)
    stop = torch.tensor(codec.stop_ids, device=device)
    tokens, valid, logps = [], [], []
    for _ in range(max_new_tokens):
        with autocast():
            hidden, past = body_forward(model, step_ids, mask, step_pos, past)  # (B, t, D)
            logits = head(hidden[:, -1]).float() / temperature  # (B, V)
        probs = torch.softmax(logits, -1)  # (B, V)
        token = torch.multinomial(probs, 1, generator=generator)  # (B, 1)
        logps.append(probs.gather(1, token).log())  # (B, 1): a drawn token's p is > 0
        token = torch.where(done[:, None], codec.pad_id, token)
        valid.append(~done)
        tokens.append(token)
        done = done | torch.isin(token[:, 0], stop)
        if bool(done.all()):  # one host sync per generated token
            break
        step_ids, step_pos = token, step_pos[:, -1:] + 1
        mask = torch.cat([mask, torch.ones_like(token)], dim=1)
    response = torch.cat(tokens, dim=1)  # (B, R)
    response_mask = torch.stack(valid, dim=1).long()  # (B, R)
    prompt_mask = mask[:, :width_p]
    input_ids = torch.cat([ids, response], dim=1)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    completions = [codec.decode_answer(row) for row in response.tolist()]
    return Rollout(input_ids, attention_mask, response_mask.float(), width_p, completions,
                   torch.cat(logps, dim=1))


@torch.no_grad()
def greedy_accuracy(model, codec: Codec, task, prompts, max_new_tokens: int, device,
                    autocast) -> float:
    """Share of ``prompts`` whose greedy (temperature -> 0) answer earns reward 1."""
    texts = [p.text for p in prompts]
    ids, mask, width_p = pad_batch([codec.prompt_ids(t) for t in texts], None, codec.pad_id,
                                   device)
    head = model.get_output_embeddings()
    step_ids, step_pos, past = ids, (mask.cumsum(-1) - 1).clamp(min=0), None
    stop = torch.tensor(codec.stop_ids, device=device)
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=device)  # (B,)
    tokens = []
    for _ in range(max_new_tokens):
        with autocast():
            hidden, past = body_forward(model, step_ids, mask, step_pos, past)  # (B, t, D)
            token = head(hidden[:, -1]).argmax(-1, keepdim=True)  # (B, 1)
        tokens.append(token)
        done = done | torch.isin(token[:, 0], stop)
        if bool(done.all()):
            break
        step_ids, step_pos = token, step_pos[:, -1:] + 1
        mask = torch.cat([mask, torch.ones_like(token)], dim=1)
    answers = [codec.decode_answer(row) for row in torch.cat(tokens, 1).tolist()]
    return sum(task.reward(p, a) for p, a in zip(prompts, answers, strict=True)) / len(prompts)


def answer_start_columns(codec: Codec, task, prompts, batch: Rollout,
                         rewards: list[float]) -> tuple[list[int], list[int]]:
    """``(rows, columns)`` of the token where each rewarded answer starts.

    ``prompts[i]`` is the prompt of row ``i``; the task's :meth:`~fbands.rl.tasks.Task.
    answer_start` gives a character offset in the decoded answer, and the column is the
    first response token whose decoded prefix reaches past it.
    """
    rows, cols = [], []
    responses = batch.input_ids[:, batch.prompt_width:].tolist()
    for i, (prompt, completion, r) in enumerate(zip(prompts, batch.completions, rewards,
                                                    strict=True)):
        offset = task.answer_start(prompt, completion) if r > 0 else None
        if offset is None:
            continue
        ids = codec.cut(responses[i])
        for k in range(len(ids)):
            if len(codec.tokenizer.decode(ids[: k + 1], skip_special_tokens=True)) > offset:
                rows.append(i)
                cols.append(k)
                break
    return rows, cols
