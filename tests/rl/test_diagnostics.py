"""The trainer's per-prompt tail diagnostics against a plain loop over the tokens."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fbands.losses import TAIL_PROB
from fbands.rl.diagnostics import tail_change_per_prompt


def _by_loop(logp_old, logp_new, advantages, mask, group_size):
    out = {"A+": [], "A-": []}
    rows, width = logp_old.shape
    for prompt in range(rows // group_size):
        for name, keep in (("A+", lambda a: a > 0), ("A-", lambda a: a < 0)):
            changes = [float(logp_new[i, t]) - float(logp_old[i, t])
                       for i in range(prompt * group_size, (prompt + 1) * group_size)
                       for t in range(width)
                       if mask[i, t] > 0 and keep(float(advantages[i]))
                       and math.exp(float(logp_old[i, t])) < TAIL_PROB]
            out[name].append(sum(changes) / len(changes) if changes else None)
    return out


@settings(max_examples=40, deadline=None)
@given(prompts=st.integers(1, 4), group=st.integers(1, 4), width=st.integers(1, 5),
       seed=st.integers(0, 2**31 - 1))
def test_tail_change_per_prompt_matches_a_loop(prompts, group, width, seed):
    gen = torch.Generator().manual_seed(seed)
    rows = prompts * group
    logp_old = torch.log(torch.rand(rows, width, generator=gen, dtype=torch.float64) * 0.3)
    logp_new = logp_old + torch.randn(rows, width, generator=gen, dtype=torch.float64)
    advantages = torch.randint(-1, 2, (rows,), generator=gen).double()
    mask = (torch.rand(rows, width, generator=gen) > 0.3).double()
    got = tail_change_per_prompt(logp_old, logp_new, advantages, mask, group)
    want = _by_loop(logp_old, logp_new, advantages, mask, group)
    for side in ("A+", "A-"):
        values = got[f"dlogp/tail_{side}_per_prompt"]
        assert len(values) == prompts
        for g, w in zip(values, want[side], strict=True):
            assert (g is None) == (w is None)
            if w is not None:
                assert math.isclose(g, w, rel_tol=1e-12, abs_tol=1e-12)
