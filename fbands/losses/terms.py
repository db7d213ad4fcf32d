r"""The per-token loss terms of every method (the soft clip is in :mod:`fbands.losses.soft`).

Each term function (:data:`TERMS`, one per form of the table of methods) takes the
log-ratio :math:`\log r` and :math:`\log \pi` (with gradient), the advantage, the band's
log-edges, all ``(B, T)`` and already cleaned of padding by
:func:`fbands.losses.policy_loss`, and the configuration, and returns the per-token loss
with four bool masks: the tokens clipped at the upper and at the lower edge
(:func:`side_masks`), those capped by the dual clip, and those whose ``band_mask`` weight hit
its truncation.  Comparisons are made
in log space, and no log-ratio above ``MAX_LOG_RATIO`` (80) is ever exponentiated.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fbands.losses.config import dual_clip_bound
from fbands.losses.soft import MAX_LOG_RATIO, soft_clip


def side_masks(logratio: Tensor, adv: Tensor, log_lo: Tensor,
               log_hi: Tensor) -> tuple[Tensor, Tensor]:
    r"""The tokens whose ratio left the band on the side where the PPO form stops their
    gradient: ``(upper, lower)``.

    .. math::

        \text{upper} = [A > 0 \text{ and } \log r > \log r_{hi}],\qquad
        \text{lower} = [A < 0 \text{ and } \log r < \log r_{lo}],

    bool tensors of the arguments' broadcast shape (no gradient, no host sync).  They are
    the clip fractions of :func:`fbands.losses.policy_loss`, the tokens ``band_mask`` drops,
    TRL's ``clip_ratio/*`` and the trainer's clipped counts.

    Examples
    --------
    >>> import math, torch
    >>> logratio = torch.tensor([[0.5, 0.5, -0.5, -0.5]])
    >>> adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    >>> lo, hi = torch.full((1, 4), math.log(0.8)), torch.full((1, 4), math.log(1.2))
    >>> [m.tolist() for m in side_masks(logratio, adv, lo, hi)]
    [[[True, False, False, False]], [[False, False, False, True]]]
    """
    upper = (adv > 0) & (logratio > log_hi)
    lower = (adv < 0) & (logratio < log_lo)
    return upper, lower


def _clip_form(logratio, logp, adv, log_lo, log_hi, cfg):
    """PPO-form term -A exp(eff), with eff the log-ratio clipped on the advantage's side.

    For A >= 0, max(-A r, -A clip(r, lo, hi)) = -A min(r, hi); for A < 0 it is
    -A max(r, lo), and dual clip also caps that at -A c: in log space eff is log r clamped
    from one side, and a clamped token has no gradient (band_gppo gives it one back).
    """
    upper, lower = side_masks(logratio, adv, log_lo, log_hi)
    c = dual_clip_bound(cfg)
    if c is not None:
        log_c = math.log(c)
        dual = (adv < 0) & (logratio > log_c)
    else:
        log_c = math.inf
        dual = torch.zeros_like(upper)
    if cfg.row.edge_gradient:
        # Straight-through: the value is the clipped one, exp(edge); the gradient is
        # beta * edge * A * grad(log pi), the surrogate's own gradient at the edge.
        moving = logratio - logratio.detach()  # 0 in value, d log r in gradient
        beta_low = cfg.gppo_beta if cfg.gppo_beta_low is None else cfg.gppo_beta_low
        hi_val = log_hi + cfg.gppo_beta * moving
        lo_val = log_lo + beta_low * moving
    else:
        hi_val, lo_val = log_hi, log_lo
    eff = torch.where(upper, hi_val, logratio)
    eff = torch.where(lower, lo_val, eff)
    eff = torch.where(dual, torch.full_like(logratio, log_c), eff)
    per_token = -adv * torch.exp(eff.clamp(max=MAX_LOG_RATIO))
    return per_token, upper, lower, dual, torch.zeros_like(upper)


def _soft_clip_form(logratio, logp, adv, log_lo, log_hi, cfg):
    """PPO form with ``clip`` replaced by :func:`soft_clip`: ``max(-A r, -A s(r))``, i.e.
    ``-A min(r, s)`` for A >= 0 and ``-A max(r, s)`` (then capped by dual clip) for A < 0.
    The clip fractions count the tokens beyond the edge on the advantage's side."""
    upper, lower = side_masks(logratio, adv, log_lo, log_hi)
    r = torch.exp(logratio.clamp(max=MAX_LOG_RATIO))
    s = soft_clip(logratio, log_lo, log_hi, cfg.soft, k=cfg.soft_k, width=cfg.soft_width,
                  rho=cfg.soft_rho, g=cfg.soft_g, alpha=cfg.soft_alpha, gamma=cfg.soft_gamma,
                  alpha_in=cfg.soft_alpha_in)
    v = torch.where(adv >= 0, torch.minimum(r, s), torch.maximum(r, s))
    c = dual_clip_bound(cfg)
    if c is not None:
        dual = (adv < 0) & (v > c)
        v = torch.where(dual, torch.full_like(v, c), v)
    else:
        dual = torch.zeros_like(upper)
    return -adv * v, upper, lower, dual, torch.zeros_like(upper)


def _band_mask(logratio, logp, adv, log_lo, log_hi, cfg):
    """DPPO form: -A sg(min(r, C)) log pi, dropped where the token left its band."""
    upper, lower = side_masks(logratio, adv, log_lo, log_hi)
    keep = ~(upper | lower)
    log_c = math.log(cfg.truncation)
    weight = torch.exp(logratio.detach().clamp(max=min(log_c, MAX_LOG_RATIO)))
    per_token = torch.where(keep, -adv * weight * logp, torch.zeros_like(logp))
    trunc = keep & (logratio > log_c)
    return per_token, upper, lower, torch.zeros_like(upper), trunc


def _cispo(logratio, logp, adv, log_lo, log_hi, cfg):
    """CISPO: -sg(clip(r, lo, hi)) A log pi; every token keeps its gradient."""
    upper = logratio > log_hi
    lower = logratio < log_lo
    clipped = torch.minimum(torch.maximum(logratio.detach(), log_lo), log_hi)
    weight = torch.exp(clipped.clamp(max=MAX_LOG_RATIO))
    per_token = -adv * weight * logp
    none = torch.zeros_like(upper)
    return per_token, upper, lower, none, none


def _clip_or_soft(logratio, logp, adv, log_lo, log_hi, cfg):
    """The clip form, or its soft version when ``cfg.soft`` names one."""
    form = _clip_form if cfg.soft is None else _soft_clip_form
    return form(logratio, logp, adv, log_lo, log_hi, cfg)


#: The term function of each form of :data:`fbands._methods.FORMS`; each takes
#: ``(logratio, logp, adv, log_lo, log_hi, cfg)`` and returns the per-token loss and the
#: four masks (module docstring).
TERMS = {"clip": _clip_or_soft, "mask": _band_mask, "weight": _cispo}
