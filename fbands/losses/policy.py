"""The policy loss of any method: :func:`policy_loss`, which ties the package together.

It checks its inputs (:mod:`fbands.losses.checks`), takes or computes the band
(:mod:`fbands.losses.band`), replaces the padding, evaluates the method's per-token term
(:mod:`fbands.losses.terms`), aggregates it (:mod:`fbands.losses.aggregate`) and reports
the diagnostics (:mod:`fbands.losses.metrics`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fbands.errors import LossError
from fbands.losses.aggregate import aggregate_unchecked
from fbands.losses.band import Band, precompute_band
from fbands.losses.checks import (
    any_bad,
    as_tensor,
    band_checks,
    check_broadcast,
    check_devices,
    check_inputs,
    compute_dtype,
    denominator_checks,
    logp_checks,
    mask_checks,
    poison,
    resolve_check,
    validate,
)
from fbands.losses.config import LossConfig
from fbands.losses.metrics import loss_metrics
from fbands.losses.terms import TERMS


def policy_loss(
    logp_old: Tensor,
    logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: LossConfig | None = None,
    band: Band | None = None,
    *,
    weights: Tensor | None = None,
    num_tokens=None,
    num_seqs=None,
    loss_scale_factor=None,
    check: bool | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    r"""Policy loss of any method in :data:`METHODS`, aggregated over the response mask.

    With :math:`\log r = \text{logp} - \text{logp\_old}` and the band
    :math:`[r_{lo}, r_{hi}]` of :func:`precompute_band`, the clip-form methods (``clip``,
    ``clip_higher``, ``dual_clip``, ``dcpo``, ``trgppo``, ``band_clip``) use

    .. math::

        \ell_t = \max\bigl(-A r,\; -A\,\mathrm{clip}(r, r_{lo}, r_{hi})\bigr),
        \qquad\text{and for } A < 0 \text{ with dual clip: } \min(\ell_t, -cA),

    computed as :math:`-A e^{u}` with :math:`u = \min(\log r, \log r_{hi})` for
    :math:`A \ge 0` and :math:`u = \max(\log r, \log r_{lo})` (then :math:`\min(u, \log c)`)
    for :math:`A < 0`: the same value, and no ratio beyond the edge is ever exponentiated.
    ``band_gppo`` has the same value, but a token clipped at edge :math:`b` keeps the
    gradient :math:`-\beta\, b\, A\, \nabla \log\pi` (straight-through:
    :math:`u = \mathrm{sg}(\log b) + \beta(\log r - \mathrm{sg}(\log r))`) instead of none.
    ``band_mask`` and ``cispo`` use an importance weight under stop-gradient,

    .. math::

        \ell_t^{\text{mask}} = -A\,\mathrm{sg}(\min(r, C))\log\pi \cdot
        [\text{not } (A > 0,\ r > r_{hi}) \text{ and not } (A < 0,\ r < r_{lo})],
        \qquad
        \ell_t^{\text{cispo}} = -A\,\mathrm{sg}(\mathrm{clip}(r, r_{lo}, r_{hi}))\log\pi .

    Parameters
    ----------
    logp_old : Tensor
        ``(B, T)`` behaviour-policy log-probabilities of the sampled tokens.
    logp : Tensor
        ``(B, T)`` current-policy log-probabilities (with gradient); bf16/fp16 are computed
        in float32, and the gradient flows back in ``logp``'s dtype.
    advantages : Tensor
        ``(B, T)``, ``(B,)`` or ``(B, 1)``; treated as constants.
    mask : Tensor
        ``(B, T)`` response mask (bool or 0/1).  Masked positions may hold anything.
    cfg : LossConfig, optional
        Method and constants (default ``LossConfig()``).
    band : Band, optional
        From :func:`precompute_band` for this ``logp_old`` and ``cfg``; computed here when
        None.
    weights : Tensor, optional
        Per-token multipliers of the loss terms, broadcasting against ``(B, T)`` and treated
        as constants, e.g. verl's rollout importance-sampling weights.
    num_tokens, num_seqs, loss_scale_factor : optional
        Passed to :func:`agg_loss` (global denominators for micro-batching).
    check : bool or None
        Validate the values on the tokens of the mask: ``logp_old`` and ``logp`` are
        log-probabilities (nothing above :data:`LOGP_TOLERANCE`; ``logp_old`` not
        ``-inf``, since the policy that sampled a token gave it a probability > 0), the
        band's edges are not nan and not crossed, the mask is finite and non-negative, a denominator
        tensor is finite and > 0; a failure raises :class:`fbands.LossError`.  This costs
        one host synchronisation on a GPU (two when ``band`` is None: the band's own
        check).  ``None`` (default): check when the tensors are on the CPU, where it is
        free, and skip on an accelerator, keeping the hot path free of syncs; unchecked,
        an invalid input makes the loss nan (never a plausible value).  A nan in
        ``logp``, ``advantages`` or ``weights`` on a token of the mask is not an error: it
        gives a nan loss, which a trainer's non-finite check catches (a nan in
        ``logp_old`` too when ``band`` is given; :func:`precompute_band` rejects it).

    Returns
    -------
    loss : Tensor
        0-dim, float32 (float64 for float64 input), with gradient.  An empty batch,
        ``(0, T)`` or ``(B, 0)``, gives 0 (with a zero gradient) and zero metrics.
    metrics : dict of str to Tensor
        0-dim detached tensors (no host sync), keys :data:`METRIC_KEYS`, all over the mask:
        ``clipfrac_upper`` / ``clipfrac_lower``: fraction of tokens whose gradient the upper
        / lower edge changed (for ``cispo``: whose weight was clipped); ``clipfrac`` their
        sum; ``tail_clipfrac_upper``: ``clipfrac_upper`` among the tokens with
        :math:`p < 0.1` and :math:`A > 0`; ``dual_clipfrac``: tokens capped by dual clip;
        ``truncfrac``: ``band_mask`` tokens whose weight hit :math:`C`; ``band_width``: mean
        :math:`r_{hi} - r_{lo}`; ``approx_kl_k1`` / ``approx_kl_k3``: mean of
        :math:`-\log r` / :math:`r - 1 - \log r` (estimates of
        :math:`\mathrm{KL}(\pi_{old} \| \pi)`); ``ratio_mean`` / ``ratio_max`` /
        ``ratio_min``.

    Raises
    ------
    LossError
        For a bad configuration, shape, type or (checked) value; the message names the
        argument, and for values the first bad index and value.

    Examples
    --------
    >>> import torch
    >>> logp_old = torch.log(torch.tensor([[0.5, 0.1]]))
    >>> logp = (logp_old + torch.tensor([[0.4, -0.4]])).requires_grad_()
    >>> cfg = LossConfig(method="dual_clip", agg="token-sum")
    >>> loss, m = policy_loss(logp_old, logp, torch.tensor([[1.0, -1.0]]), torch.ones(1, 2), cfg)
    >>> loss.backward()
    >>> round(loss.item(), 4), logp.grad
    (-0.4, tensor([[0., 0.]]))
    >>> m["clipfrac_upper"].item(), m["clipfrac_lower"].item()
    (0.5, 0.5)
    """
    cfg = LossConfig() if cfg is None else cfg
    if not isinstance(cfg, LossConfig):
        raise LossError(f"cfg must be a LossConfig, got {type(cfg).__name__}")
    logp_old, logp, advantages, mask = check_inputs(logp_old, logp, advantages, mask)
    check = resolve_check(check, logp_old, logp, mask)
    dtype = compute_dtype(logp_old, logp)
    valid = mask != 0
    if band is None:
        band = precompute_band(logp_old, cfg, mask=mask, check=check)
    elif not isinstance(band, tuple) or len(band) != 2:
        raise LossError(f"band must be a Band (log_lower, log_upper), got {type(band).__name__}")
    log_lo, log_hi = (as_tensor(f"band.{name}", edge).detach()
                      for name, edge in zip(Band._fields, band, strict=True))
    check_devices(("logp_old", logp_old), ("band.log_lower", log_lo),
                   ("band.log_upper", log_hi))
    log_lo, log_hi = log_lo.to(dtype), log_hi.to(dtype)
    if log_lo.shape != logp_old.shape or log_hi.shape != logp_old.shape:
        raise LossError(
            f"band edges of shape {tuple(log_lo.shape)} / {tuple(log_hi.shape)} do not match "
            f"logp_old's {tuple(logp_old.shape)}"
        )
    checks = [
        *logp_checks("logp_old", logp_old, valid, nan=False, sampled=True),
        *logp_checks("logp", logp, valid, nan=False),
        *band_checks(log_lo, log_hi, valid),
        *mask_checks(mask),
        *denominator_checks(num_tokens, num_seqs, loss_scale_factor),
    ]
    if check:
        validate(checks)
        checks = []

    # Masked positions are replaced before any arithmetic: padding may hold -inf or nan,
    # and a nan anywhere in the graph would poison the gradient even where it is masked.
    zero = torch.zeros((), dtype=dtype, device=logp.device)
    logp_c = torch.where(valid, logp.to(dtype), zero)  # (B, T), gradient flows to logp
    logp_old_c = torch.where(valid, logp_old.detach().to(dtype), zero)
    adv = torch.where(valid, advantages.detach().to(dtype), zero)  # broadcasts to (B, T)
    log_lo = torch.where(valid, log_lo, torch.full_like(log_lo, -math.inf))
    log_hi = torch.where(valid, log_hi, torch.full_like(log_hi, math.inf))
    logratio = logp_c - logp_old_c  # (B, T)

    term = TERMS[cfg.row.form]
    # (B, T) loss and four (B, T) bool masks
    per_token, upper, lower, dual, trunc = term(logratio, logp_c, adv, log_lo, log_hi, cfg)
    if weights is not None:
        weights = as_tensor("weights", weights)
        check_devices(("logp_old", logp_old), ("weights", weights))
        check_broadcast("weights", tuple(weights.shape), weights.shape, per_token.shape)
        per_token = per_token * torch.where(valid, weights.detach().to(dtype), zero)
    loss = aggregate_unchecked(per_token, mask, cfg.agg, num_tokens, num_seqs, loss_scale_factor)
    loss = poison(loss, any_bad(checks))  # unchecked invalid input: nan, never plausible
    metrics = loss_metrics(logratio, logp_old_c, adv, valid, log_lo, log_hi, upper, lower, dual,
                           trunc)
    return loss, metrics
