"""The prompt draw of ``Task.prompts`` as it was before held-out prompts were made distinct.

Kept as a copy so that the tests can check that training draws did not change: the
trainer's runs are seeded through them.
"""


def old_prompts(task, rng, n, split="train"):
    """``n`` prompts of ``split``, drawn with replacement (the former algorithm)."""
    out = []
    while len(out) < n:
        prompt = task.prompt(rng)
        if task.held_out(prompt) == (split == "eval") or not task.has_split:
            out.append(prompt)
    return out
