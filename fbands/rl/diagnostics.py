"""Per-step diagnostics of the trainer that :mod:`fbands.losses` does not report.

The loss reports what its edges did to each minibatch (its metrics, among them
``tail_clipfrac_upper``, the clipped share of tail tokens with a positive advantage, which
the trainer logs as ``band/tail_clipfrac_upper``); these functions report what the updates
did to the ratios (:func:`update_stats`) and what the whole step did to the tokens it
sampled (:func:`logp_change_by_bin`, :func:`tail_change_per_prompt`).

:func:`update_stats` returns a tensor and makes the host wait for nothing: a trainer stacks
it on the device and reads it once per step.  Those that return Python numbers read their
result on the host in one transfer, which waits for the device; call them once per step,
not per minibatch.
"""

from __future__ import annotations

import math

import torch

from fbands._constants import device_constant
from fbands.losses import TAIL_PROB

# --- what one update did, per minibatch -----------------------------------------------------
#: the ratio interval whose leavers :func:`update_stats` counts (PPO's usual 0.2 clip)
RATIO_WINDOW = (0.8, 1.2)
_QUANTILES = (0.05, 0.5, 0.95)
#: names of the entries of :func:`update_stats`, in order
UPDATE_STATS = ("ratio_q05", "ratio_q50", "ratio_q95", "ratio_min", "ratio_max", "outside",
                "clipped")


@torch.no_grad()
def update_stats(logp_old, logp, mask, clipped_share) -> torch.Tensor:
    """The ratio distribution of one minibatch update, as a float tensor on the inputs'
    device (no host synchronisation: the quantiles are found on the device).

    Entries, named by :data:`UPDATE_STATS`: the 5 %, 50 % and 95 % quantiles, the minimum
    and maximum of :math:`r = \\pi / \\pi_{old}` over the tokens of ``mask``, the share of
    them outside :data:`RATIO_WINDOW`, and ``clipped_share`` (the loss's ``clipfrac``)
    as given.  The first update of a step is on-policy (every ratio 1), which is why the
    trainer logs these per update rather than averaged.

    Example
    -------
    >>> import math, torch
    >>> old = torch.log(torch.tensor([[0.5, 0.5, 0.5]]))
    >>> new = old + torch.log(torch.tensor([[1.0, 1.5, 0.5]]))
    >>> [round(v, 4) for v in update_stats(old, new, torch.ones(1, 3), torch.tensor(0.0)).tolist()]
    [0.55, 1.0, 1.45, 0.5, 1.5, 0.6667, 0.0]
    """
    valid = mask > 0
    ratio = torch.exp((logp.detach() - logp_old).float())
    kept = torch.where(valid, ratio, torch.nan).reshape(-1)
    quantiles = torch.nanquantile(kept, device_constant(_QUANTILES, kept.dtype, kept.device))
    low, high = RATIO_WINDOW
    n = valid.sum().clamp(min=1)
    outside = (valid & ((ratio < low) | (ratio > high))).sum() / n
    extremes = torch.stack([torch.where(valid, ratio, torch.inf).min(),
                            torch.where(valid, ratio, -torch.inf).max()])
    return torch.cat([quantiles, extremes, outside[None],
                      clipped_share.detach().float().reshape(1)])


# --- what the whole step did to the sampled tokens ------------------------------------------
#: edges of the old-probability bins of :func:`logp_change_by_bin`
P_OLD_EDGES = (0.01, 0.1, 0.5)
P_OLD_BINS = ("p<0.01", "p0.01-0.1", "p0.1-0.5", "p>=0.5")
_LOG_P_OLD_EDGES = tuple(math.log(e) for e in P_OLD_EDGES)


@torch.no_grad()
def logp_change_by_bin(logp_old, logp_new, advantages, mask) -> dict[str, float]:
    """Mean change of :math:`\\log \\pi` over one step, by old probability and sign of A.

    For every sampled token of ``mask``, :math:`\\Delta = \\log \\pi_{new} - \\log \\pi_{old}`
    (the policy after all the step's updates against the one that sampled), averaged in
    the bins :data:`P_OLD_BINS` of :math:`\\pi_{old}` for tokens with :math:`A > 0` and
    with :math:`A < 0` (tokens with :math:`A = 0` get no gradient and are left out).
    Keys ``dlogp/A+/<bin>``, ``dlogp/A-/<bin>`` (None for an empty bin) and
    ``tokens/A+/<bin>``, ``tokens/A-/<bin>`` (the counts).  The paper's mechanism: a band
    lets rare tokens with :math:`A > 0` gain more than a fixed clip does.  The sums are
    read on the host in one transfer, which waits for the device (once per step).

    Example
    -------
    >>> import math, torch
    >>> old = torch.log(torch.tensor([[0.05, 0.6]]))
    >>> new = old + torch.tensor([[0.3, 0.1]])
    >>> out = logp_change_by_bin(old, new, torch.tensor([1.0]), torch.ones(1, 2))
    >>> round(out["dlogp/A+/p0.01-0.1"], 6), out["tokens/A+/p>=0.5"], out["dlogp/A-/p<0.01"]
    (0.3, 1, None)
    """
    delta = (logp_new - logp_old).double()
    index = torch.bucketize(logp_old.double(),
                            device_constant(_LOG_P_OLD_EDGES, torch.float64, logp_old.device))
    sign = torch.sign(advantages)[:, None].expand_as(delta)
    valid = mask > 0
    rows = []
    for s in (1.0, -1.0):
        for b in range(len(P_OLD_BINS)):
            sel = (valid & (sign == s) & (index == b)).double()
            rows.append(torch.stack([(delta * sel).sum(), sel.sum()]))
    sums = torch.stack(rows).tolist()  # one host sync
    out: dict[str, float] = {}
    for k, (total, count) in enumerate(sums):
        side = "A+" if k < len(P_OLD_BINS) else "A-"
        name = P_OLD_BINS[k % len(P_OLD_BINS)]
        out[f"dlogp/{side}/{name}"] = total / count if count else None
        out[f"tokens/{side}/{name}"] = int(count)
    return out


@torch.no_grad()
def tail_change_per_prompt(logp_old, logp_new, advantages, mask,
                           group_size: int) -> dict[str, list]:
    """Per prompt, the mean :math:`\\Delta \\log \\pi` of its tail tokens, by sign of A.

    Rows are prompt-major (``group_size`` samples per prompt); a tail token has
    :math:`\\pi_{old} <` :data:`~fbands.losses.TAIL_PROB`.  Keys
    ``dlogp/tail_A+_per_prompt`` (tokens with :math:`A > 0`) and
    ``dlogp/tail_A-_per_prompt`` (:math:`A < 0`), each a list with one entry per prompt,
    None for a prompt without such a token.  Two runs that share a step's rollout and
    weights (same seed, first step) differ only by their loss, so the per-prompt
    difference is an exactly paired measure: of the upper edge's work (A > 0) and of the
    lower edge's (A < 0).  The sums are read on the host in one transfer, which waits for
    the device.

    Example
    -------
    >>> import math, torch
    >>> old = torch.log(torch.tensor([[0.05, 0.6], [0.02, 0.5]]))
    >>> new = old + torch.tensor([[0.3, 0.1], [-0.2, 0.0]])
    >>> out = tail_change_per_prompt(old, new, torch.tensor([1.0, -1.0]), torch.ones(2, 2), 1)
    >>> [round(v, 6) if v is not None else v for v in out["dlogp/tail_A+_per_prompt"]]
    [0.3, None]
    >>> [round(v, 6) if v is not None else v for v in out["dlogp/tail_A-_per_prompt"]]
    [None, -0.2]
    """
    tail = (mask > 0) & (logp_old < math.log(TAIL_PROB))
    delta = (logp_new - logp_old).double()
    rows = []
    for side in (advantages > 0, advantages < 0):
        sel = (tail & side[:, None]).double()
        rows += [delta * sel, sel]
    # each row summed over its prompt's samples and tokens
    sums = torch.stack(rows).view(len(rows), -1, group_size * delta.shape[1]).sum(-1)
    up, n_up, down, n_down = sums.tolist()  # one host read
    return {f"dlogp/tail_{name}_per_prompt": [s / c if c else None
                                              for s, c in zip(sums, counts, strict=True)]
            for name, sums, counts in (("A+", up, n_up), ("A-", down, n_down))}
