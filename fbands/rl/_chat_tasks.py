"""The tasks of :mod:`fbands.rl.tasks` for a pretrained chat model (``sum``, ``larger``,
``word``, ``verify``) and the parsers their rewards use.

The prompt is a question in English, the answer free text, and the reward parses it
(:class:`ChatTask`).  See the module doc of :mod:`fbands.rl.tasks`, which re-exports every
name of this module; import them from there.
"""

from __future__ import annotations

import re

import numpy as np

from fbands.rl._task_base import Prompt, Task

_INTEGER = re.compile(r"(?<![\d.])-?\d[\d,]*(?:\.0+)?(?!\.?\d)")


def last_integer(text: str) -> tuple[int, int] | None:
    """``(value, offset)`` of the last integer written in digits in ``text`` (thousands
    commas and a ``.0`` tail allowed), or None.

    Example
    -------
    >>> last_integer("7 + 5 = 12."), last_integer("It costs 1,200 dollars"), last_integer("no")
    ((12, 8), (1200, 9), None)
    """
    found = None
    for m in _INTEGER.finditer(text):
        found = m
    if found is None:
        return None
    digits = found.group().replace(",", "").split(".")[0]
    return int(digits), found.start()


class ChatTask(Task):
    """A question in English whose answer is an integer that :meth:`parse` reads.

    Reward 1 when the parsed value equals the prompt's answer (its text is the decimal
    integer), else 0.  :meth:`held_out` puts a fifth of all prompts (by a hash of the text)
    in the evaluation split.  The rewarded text is the sentence the warm start shows,
    ``"The answer is N."``; the reward parses free text, so it is not exact match.

    Example
    -------
    >>> task = SumTask()
    >>> p = Prompt("What is 7 + 5?", "12")
    >>> task.rewarded_text(p), task.reward(p, task.rewarded_text(p)), task.exact_match
    ('The answer is 12.', 1.0, False)
    """

    held_out_share = 0.2
    exact_match = False

    def _held_out_pool(self, prompts) -> list[Prompt]:
        """The prompts of ``prompts`` that belong to the evaluation split."""
        return [p for p in prompts if self.held_out(p)]

    @staticmethod
    def parse(completion: str) -> tuple[int, int] | None:
        """``(value, offset)`` of the answer in ``completion``; the last integer by default."""
        return last_integer(completion)

    def reward(self, prompt, completion):
        parsed = self.parse(completion)
        return 1.0 if parsed is not None and str(parsed[0]) == prompt.answer else 0.0

    def answer_start(self, prompt, completion):
        parsed = self.parse(completion)
        return parsed[1] if parsed is not None and str(parsed[0]) == prompt.answer else None

    def rewarded_text(self, prompt):
        return f"The answer is {prompt.answer}."

    def sft_answer(self, prompt, rng):
        return self.rewarded_text(prompt)


class SumTask(ChatTask):
    """``What is a + b?`` with one-digit operands."""

    name = "sum"

    def prompt(self, rng):
        a, b = (int(x) for x in rng.integers(1, 10, size=2))
        return Prompt(f"What is {a} + {b}?", str(a + b))

    def eval_pool(self):
        return self._held_out_pool(Prompt(f"What is {a} + {b}?", str(a + b))
                                   for a in range(1, 10) for b in range(1, 10))


class LargerTask(ChatTask):
    """``Which number is larger, a or b?`` with distinct two-digit numbers."""

    name = "larger"

    def prompt(self, rng):
        a, b = (int(x) for x in rng.choice(np.arange(10, 100), size=2, replace=False))
        return Prompt(f"Which number is larger, {a} or {b}?", str(max(a, b)))

    def eval_pool(self):
        return self._held_out_pool(
            Prompt(f"Which number is larger, {a} or {b}?", str(max(a, b)))
            for a in range(10, 100) for b in range(10, 100) if a != b)


#: the start of an answer: leading space and markup (quotes, asterisks, underscores,
#: backticks), then the word yes or no, not followed by more of a word
_FIRST_YES_NO = re.compile(r"[\s\"'`*_\u201c\u201d\u2018\u2019]*(yes|no)(?![^\W_]|-)",
                           re.IGNORECASE)


def first_yes_no(text: str) -> tuple[int, int] | None:
    """``(1, offset)`` when ``text`` begins with the word ``yes``, ``(0, offset)`` when it
    begins with ``no``, else None; ``offset`` is where that word starts.

    Leading white space and markup (quotes, ``*``, ``_``, backticks) are skipped, case is
    ignored, and the word must end there: ``"Yes."``, ``"no,"`` and ``"**No**"`` count,
    ``"Nobody"``, ``"Well, no"`` and ``"The answer is yes"`` do not.

    Example
    -------
    >>> first_yes_no("No, it is 12. Yes."), first_yes_no(' **"Yes"**'), first_yes_no("Maybe")
    ((0, 0), (1, 4), None)
    >>> first_yes_no("Well, no."), first_yes_no("Nobody knows")
    (None, None)
    """
    m = _FIRST_YES_NO.match(text)
    if m is None:
        return None
    return int(m.group(1).lower() == "yes"), m.start(1)


class VerifyTask(ChatTask):
    """``Is it true that a + b = c? Answer yes or no.``, true with probability ``true_share``.

    The answer must begin with the word ``yes`` or ``no`` (:func:`first_yes_no`) and be
    right; the prompt's answer text is ``"1"`` for a true statement, ``"0"`` for a false
    one, and :meth:`label` names the two classes ``"true"`` and ``"false"``.  The rewarded
    text is ``"Yes"`` or ``"No"``, capitalised as SmolLM2-135M-Instruct writes it.  That
    model tends to start with ``No``, so the rewarded ``Yes`` of a true statement starts
    as a rare token; ``true_share=1`` makes every statement true.

    Parameters
    ----------
    true_share : float
        Probability that a drawn statement is true, in [0, 1].

    Example
    -------
    >>> task = VerifyTask(true_share=0.5)
    >>> p = Prompt("Is it true that 2 + 2 = 5? Answer yes or no.", "0")
    >>> task.label(p), task.rewarded_text(p), task.reward(p, "No, it is 4."), task.reward(p, "Nope")
    ('false', 'No', 1.0, 0.0)
    """

    name = "verify"
    parse = staticmethod(first_yes_no)

    def __init__(self, true_share: float = 0.75):
        if not 0.0 <= true_share <= 1.0:
            raise ValueError(f"true_share={true_share!r}: must be in [0, 1]")
        self.true_share = true_share

    @staticmethod
    def _statement(a: int, b: int, c: int) -> Prompt:
        return Prompt(f"Is it true that {a} + {b} = {c}? Answer yes or no.", str(int(a + b == c)))

    def prompt(self, rng):
        a, b = (int(x) for x in rng.integers(2, 10, size=2))
        true = rng.random() < self.true_share
        c = a + b if true else a + b + int(rng.choice([-3, -2, -1, 1, 2, 3]))
        return self._statement(a, b, c)

    def eval_pool(self):
        offsets = ([0] if self.true_share > 0 else []) + (
            [-3, -2, -1, 1, 2, 3] if self.true_share < 1 else [])
        return self._held_out_pool(self._statement(a, b, a + b + d) for a in range(2, 10)
                                   for b in range(2, 10) for d in offsets)

    def label(self, prompt):
        return "true" if prompt.answer == "1" else "false"

    def rewarded_text(self, prompt):
        return "Yes" if prompt.answer == "1" else "No"

    def rewarded_texts(self, prompt):
        """``Yes``, ``yes``, ``YES`` (or the same of ``No``): the grading ignores case.

        Example
        -------
        >>> VerifyTask().rewarded_texts(Prompt("Is it true that 2 + 2 = 4?", "1"))
        ('Yes', 'yes', 'YES')
        """
        word = self.rewarded_text(prompt)
        return (word, word.lower(), word.upper())

    def sft_answer(self, prompt, rng):
        return "Yes." if prompt.answer == "1" else "No."


_NAMES = (("Tom", "He"), ("Anna", "She"), ("Ben", "He"), ("Lucy", "She"), ("Sam", "He"),
          ("Mia", "She"), ("Jack", "He"), ("Emma", "She"))
_THINGS = ("apples", "stickers", "marbles", "cookies", "pencils", "cards")


def _word_problem(rng) -> Prompt:
    """One multi-step word problem from four templates."""
    (name, he), (friend, _) = (_NAMES[i] for i in rng.choice(len(_NAMES), 2, replace=False))
    thing = _THINGS[int(rng.integers(len(_THINGS)))]
    kind = int(rng.integers(4))
    if kind == 0:
        a, b = int(rng.integers(3, 10)), int(rng.integers(2, 10))
        c = int(rng.integers(1, a + b))
        return Prompt(f"{name} has {a} {thing}. {he} buys {b} more and then gives {c} to "
                      f"{friend}. How many {thing} does {name} have now?", str(a + b - c))
    if kind == 1:
        a, b = int(rng.integers(2, 6)), int(rng.integers(2, 5))
        c = int(rng.integers(1, a * b))
        return Prompt(f"A bag holds {a} {thing}. {name} buys {b} bags and then gives {c} "
                      f"{thing} to {friend}. How many {thing} does {name} have left?",
                      str(a * b - c))
    if kind == 2:
        a = int(rng.integers(2, 10))
        return Prompt(f"{name} reads {a} pages on Monday and twice as many pages on Tuesday. "
                      f"How many pages does {name} read on the two days together?", str(3 * a))
    a = int(rng.integers(10, 30))
    b, c = int(rng.integers(1, 8)), int(rng.integers(1, 8))
    return Prompt(f"{name} has {a} dollars. {he} spends {b} dollars on lunch and {c} dollars "
                  f"on a book. How many dollars does {name} have left?", str(a - b - c))


class WordProblemTask(ChatTask):
    """Multi-step arithmetic word problems from templates (GSM8K-like, small numbers)."""

    name = "word"

    def prompt(self, rng):
        return _word_problem(rng)

