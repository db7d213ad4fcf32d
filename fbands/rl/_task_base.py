"""The shared part of the tasks of :mod:`fbands.rl.tasks`: :class:`Prompt` and :class:`Task`.

:class:`Task` holds everything a task does without knowing its prompts: the training and
evaluation draws of :meth:`Task.prompts` (with replacement, or distinct and balanced between
classes), the warm-start examples and the exact-match reward.  The tasks themselves live in
:mod:`fbands.rl.tasks` (the two of the tiny model) and ``fbands.rl._chat_tasks`` (the four of
a pretrained chat model); import every name from :mod:`fbands.rl.tasks`.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Prompt:
    """A prompt and its reference answer (one answer that earns reward 1)."""

    text: str
    answer: str


class Task:
    """Base class: subclasses define ``alphabet``, :meth:`prompt` and :meth:`sft_answer`.

    A subclass whose prompts fall into classes (true and false statements, say) also
    defines :meth:`label`, and one whose prompts can be listed defines :meth:`eval_pool`;
    the evaluation draw of :meth:`prompts` uses both.
    """

    name: str = ""
    alphabet: str = ""  # every character a prompt or an answer may use
    #: whether the reward needs the end token right after :meth:`rewarded_text` (exact
    #: match); False for a task whose reward reads a prefix or parses free text
    exact_match: bool = True
    #: share of the prompts (by a hash of the text) that :meth:`held_out` keeps for
    #: evaluation; 0 (the default): no split, evaluation draws from the training prompts
    held_out_share: float = 0.0

    @property
    def has_split(self) -> bool:
        """Whether :meth:`held_out` splits the prompts."""
        return self.held_out_share > 0

    def prompt(self, rng: np.random.Generator) -> Prompt:
        """Draw one prompt."""
        raise NotImplementedError

    def sft_answer(self, prompt: Prompt, rng: np.random.Generator) -> str:
        """Draw the answer a warm-start example shows for ``prompt``."""
        raise NotImplementedError

    def held_out(self, prompt: Prompt) -> bool:
        """Whether ``prompt`` belongs to the evaluation split: the first byte of the SHA-256
        of its text falls below ``held_out_share * 256`` (never, by default).  A held-out
        prompt is drawn neither for RL training nor for the warm start."""
        if not self.has_split:
            return False
        digest = hashlib.sha256(prompt.text.encode()).digest()
        return digest[0] < self.held_out_share * 256

    def label(self, prompt: Prompt) -> str | None:
        """The class of ``prompt`` that the evaluation draw balances, or None for a task
        without classes (the default)."""
        return None

    def rewarded_text(self, prompt: Prompt) -> str:
        """The text the policy is rewarded for writing in answer to ``prompt``.

        The trainer reports its probability as "P(correct)".  By default the reference
        answer; with :attr:`exact_match` the end token must follow it.

        Example
        -------
        >>> AdditionTask().rewarded_text(Prompt("12+3=", "15"))
        '15'
        """
        return prompt.answer

    def rewarded_texts(self, prompt: Prompt) -> tuple[str, ...]:
        """Spellings of :meth:`rewarded_text` that earn the same reward; no two begin with
        the same token, so their probabilities add up (P(correct) is that sum).

        Just :meth:`rewarded_text` by default.  A policy can move its probability from one
        spelling to another (``Yes`` to ``yes``) without changing its reward; a measure of
        one spelling alone would then read as forgetting.
        """
        return (self.rewarded_text(prompt),)

    #: the names :meth:`solution` can return (the trainer logs each one's share)
    solutions: tuple[str, ...] = ()

    def solution(self, prompt: Prompt, completion: str) -> str | None:
        """Which of the task's named solutions ``completion`` is, or None (no names by
        default; see :meth:`TailTask.solution`)."""
        return None

    def eval_pool(self) -> list[Prompt] | None:
        """Every prompt of the evaluation split in a fixed order, or None when the task
        does not list them (too many, or not uniform; None by default).

        A listed pool holds each prompt that :meth:`prompt` can draw once; within a class
        of :meth:`label` the draw must be uniform over it, so that sampling the pool
        without replacement keeps the task's distribution.  Without a listed pool the
        evaluation draw takes distinct prompts as :meth:`prompt` draws them, in the task's
        own mix of classes; a task with classes should therefore list its pool.
        """
        return None

    def prompts(self, rng: np.random.Generator, n: int, split: str = "train") -> list[Prompt]:
        """Draw ``n`` prompts of ``split``.

        Parameters
        ----------
        rng : numpy.random.Generator
            The source of randomness; the same state gives the same prompts.
        n : int
            How many prompts to draw.
        split : {"train", "eval"}
            ``"train"`` draws with replacement from the training split, with the task's own
            mix of classes.  ``"eval"`` draws distinct prompts of the held-out split (all
            prompts for a task without a split); for a task with classes (:meth:`label`),
            the classes take turns, so they are balanced as far as the pool allows (a class
            that runs out leaves its turns to the others).

        Returns
        -------
        list of Prompt
            ``n`` prompts; for ``split="eval"`` possibly fewer: when the held-out pool holds
            fewer than ``n`` prompts it is returned whole, each prompt once, in an order
            given by ``rng``.
        """
        if split == "eval":
            return self._eval_prompts(rng, n)
        out = []
        while len(out) < n:
            prompt = self.prompt(rng)
            if self.held_out(prompt) == (split == "eval") or not self.has_split:
                out.append(prompt)
        return out

    def _eval_prompts(self, rng: np.random.Generator, n: int) -> list[Prompt]:
        """Distinct evaluation prompts, the classes taking turns (see :meth:`prompts`)."""
        pool = self.eval_pool()
        if pool is None:  # not listed: distinct draws of the task's own distribution
            pool = self._distinct_draws(rng, n)
        by_class: dict = {}
        for prompt in pool:
            by_class.setdefault(self.label(prompt), []).append(prompt)
        classes = sorted(by_class, key=str)
        queues = [[by_class[c][i] for i in rng.permutation(len(by_class[c]))]
                  for c in (classes[i] for i in rng.permutation(len(classes)))]
        chosen: list[Prompt] = []
        for turn in itertools.zip_longest(*queues):  # one of each class per turn
            if len(chosen) >= n:
                break
            for prompt in turn:
                if prompt is not None and len(chosen) < n:
                    chosen.append(prompt)
        return [chosen[i] for i in rng.permutation(len(chosen))]

    def _distinct_draws(self, rng: np.random.Generator, n: int) -> list[Prompt]:
        """Up to ``n`` distinct held-out prompts drawn by :meth:`prompt`; stops early after
        ``max(1000, 20 n)`` draws in a row without a new one (the pool looks used up)."""
        seen: dict[str, Prompt] = {}
        misses, patience = 0, max(1000, 20 * n)
        while len(seen) < n and misses < patience:
            prompt = self.prompt(rng)
            if prompt.text in seen or (self.has_split and not self.held_out(prompt)):
                misses += 1
                continue
            seen[prompt.text] = prompt
            misses = 0
        return list(seen.values())

    def answer_start(self, prompt: Prompt, completion: str) -> int | None:
        """Character offset where the rewarded answer starts in ``completion`` (None when
        it earns no reward); the trainer measures the old probability of that token."""
        return 0 if self.reward(prompt, completion) > 0 else None

    def sft_examples(self, rng: np.random.Generator, n: int) -> list[tuple[str, str]]:
        """Draw ``n`` (prompt text, answer text) pairs for the supervised warm start."""
        out = []
        while len(out) < n:  # a prompt, then its answer: the draws of the original order
            prompt = self.prompt(rng)
            if not self.held_out(prompt):
                out.append((prompt.text, self.sft_answer(prompt, rng)))
        return out

    @staticmethod
    def reward(prompt: Prompt, completion: str) -> float:
        """1.0 when ``completion`` (end token already removed) equals the answer, else 0.0.

        Example
        -------
        >>> Task.reward(Prompt("12+3=", "15"), "15"), Task.reward(Prompt("12+3=", "15"), "16")
        (1.0, 0.0)
        """
        return 1.0 if completion.strip() == prompt.answer else 0.0
