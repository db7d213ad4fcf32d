r"""The diagnostics of :func:`fbands.losses.policy_loss`: :data:`METRIC_KEYS`, over the mask.

Every metric is a 0-dim detached tensor, computed without a host synchronisation: the
clipped shares (from the term's masks), the tail tokens' clipped share (:data:`TAIL_PROB`),
the band's mean width, two estimates of :math:`\mathrm{KL}(\pi_{old} \| \pi)` and the ratio's
mean, maximum and minimum.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fbands.losses.terms import MAX_LOG_RATIO

METRIC_KEYS = (
    "clipfrac",
    "clipfrac_upper",
    "clipfrac_lower",
    "tail_clipfrac_upper",
    "dual_clipfrac",
    "truncfrac",
    "band_width",
    "approx_kl_k1",
    "approx_kl_k3",
    "ratio_mean",
    "ratio_max",
    "ratio_min",
)
# Old probability below which a token counts as a tail token in "tail_clipfrac_upper".
TAIL_PROB = 0.1


def _masked_mean(x: Tensor, weight: Tensor) -> Tensor:
    return (x * weight).sum() / weight.sum().clamp(min=1.0)


def loss_metrics(logratio, logp_old, adv, valid, log_lo, log_hi, upper, lower, dual, trunc):
    """Per-batch diagnostics, all 0-dim detached tensors; no host sync."""
    with torch.no_grad():
        w = valid.to(logratio.dtype)
        lr = logratio.detach().clamp(max=MAX_LOG_RATIO)
        ratio = torch.exp(lr)
        f = logratio.dtype
        clip_up = _masked_mean(upper.to(f), w)
        clip_lo = _masked_mean(lower.to(f), w)
        tail = w * ((logp_old < math.log(TAIL_PROB)) & (adv > 0)).to(f)
        width = torch.exp(log_hi.clamp(max=MAX_LOG_RATIO)) - torch.exp(log_lo)
        width = torch.where(valid, width, torch.zeros_like(width))
        any_valid = valid.any()
        zero = torch.zeros((), dtype=f, device=logratio.device)
        big = torch.finfo(f).max
        if ratio.numel():
            ratio_max = torch.where(valid, ratio, torch.full_like(ratio, -big)).amax()
            ratio_min = torch.where(valid, ratio, torch.full_like(ratio, big)).amin()
        else:  # an empty batch, (0, T) or (B, 0)
            ratio_max = ratio_min = zero
        return {
            "clipfrac": clip_up + clip_lo,
            "clipfrac_upper": clip_up,
            "clipfrac_lower": clip_lo,
            "tail_clipfrac_upper": _masked_mean(upper.to(f), tail),
            "dual_clipfrac": _masked_mean(dual.to(f), w),
            "truncfrac": _masked_mean(trunc.to(f), w),
            "band_width": _masked_mean(width, w),
            "approx_kl_k1": _masked_mean(-lr, w),
            "approx_kl_k3": _masked_mean(torch.expm1(lr) - lr, w),
            "ratio_mean": _masked_mean(ratio, w),
            "ratio_max": torch.where(any_valid, ratio_max, zero),
            "ratio_min": torch.where(any_valid, ratio_min, zero),
        }
