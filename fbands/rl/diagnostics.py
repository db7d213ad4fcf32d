"""Per-step diagnostics of the trainer that :mod:`fbands.losses` does not report.

:func:`tail_clip_counts` splits the clipped tokens by their old probability: a token is
*clipped* when its ratio has left the band on the side where the PPO form stops its
gradient (above the upper edge with a positive advantage, below the lower edge with a
negative one), and a *tail* token when :math:`\\pi_{old} < 0.1`.  The paper's claim is that
a fixed clip mostly stops tail tokens with positive advantage, and a band far less.
"""

from __future__ import annotations

import math

import torch

from fbands.losses import TAIL_PROB


@torch.no_grad()
def tail_clip_counts(logp_old, logp, advantages, mask, band) -> torch.Tensor:
    """``[clipped tail, tail, clipped rest, rest]`` token counts of one minibatch (no sync).

    ``logp_old``, ``logp``, ``mask`` are ``(B, T)``, ``advantages`` ``(B,)`` and ``band`` a
    :class:`fbands.losses.Band` of ``(B, T)`` log edges.

    Example
    -------
    >>> import math, torch
    >>> from fbands.losses import Band
    >>> old = torch.log(torch.tensor([[0.05, 0.5]]))
    >>> new = old + torch.tensor([[0.5, 0.0]])  # the tail token's ratio is e^0.5 = 1.65
    >>> band = Band(torch.full((1, 2), math.log(0.8)), torch.full((1, 2), math.log(1.2)))
    >>> tail_clip_counts(old, new, torch.tensor([1.0]), torch.ones(1, 2), band).tolist()
    [1.0, 1.0, 0.0, 1.0]
    """
    logr = logp.detach() - logp_old
    adv = advantages[:, None]
    clipped = ((adv > 0) & (logr > band.log_upper)) | ((adv < 0) & (logr < band.log_lower))
    valid = mask > 0
    tail = valid & (logp_old < math.log(TAIL_PROB))
    rest = valid & ~tail
    f = logr.dtype
    return torch.stack([(clipped & tail).sum().to(f), tail.sum().to(f),
                        (clipped & rest).sum().to(f), rest.sum().to(f)])


def clip_split_metrics(counts: torch.Tensor) -> dict[str, float]:
    """``clip/tail``, ``clip/rest`` (clipped shares) and ``clip/tail_tokens`` (the tail's
    share of all tokens) from summed :func:`tail_clip_counts`."""
    c = counts.tolist()
    return {"clip/tail": c[0] / max(c[1], 1.0), "clip/rest": c[2] / max(c[3], 1.0),
            "clip/tail_tokens": c[1] / max(c[1] + c[3], 1.0)}
