r"""The band of every token, :math:`[r_{lo}(p), r_{hi}(p)]` in log space, once per batch.

:func:`precompute_band` assembles it from the configuration: constant edges for the fixed
clips, DCPO's closed form (:func:`dcpo_log_bounds`), or the f-divergence band of
:func:`fbands.log_bounds` for the methods with a radius, then ``relax`` and
``upper_bound_max``.  The edges are computed in float64 (float32 on devices without it,
MPS) and returned in the loss's compute dtype.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from fbands._inputs import FILL_LOGP, work_dtype
from fbands.bands import log_bounds
from fbands.errors import LossError
from fbands.losses.checks import (
    as_tensor,
    check_devices,
    compute_dtype,
    logp_checks,
    resolve_check,
    validate,
)
from fbands.losses.config import LossConfig


class Band(NamedTuple):
    """Log-edges of the allowed ratio interval of each token, shaped like ``logp_old``.

    ``log_lower`` may be ``-inf`` (the lower edge saturates at ratio 0); ``log_upper`` is
    finite for a finite ``logp_old``.  Neither carries a gradient.
    """

    log_lower: Tensor
    log_upper: Tensor


def _fixed_log_edges(cfg: LossConfig) -> tuple[float, float]:
    """log(1 - eps_low) (``-inf`` at eps_low = 1) and log(1 + eps_high)."""
    log_lo = -math.inf if cfg.eps_low >= 1.0 else math.log1p(-cfg.eps_low)
    return log_lo, math.log1p(cfg.eps_high)


def dcpo_log_bounds(logp_old: Tensor, eps_low: float, eps_high: float) -> Band:
    r"""Log-edges of DCPO's probability-dependent clip.

    With :math:`p = e^{\text{logp\_old}}`, DCPO (arXiv 2509.02333) clips the ratio to

    .. math::

        \tfrac12 + \tfrac12 \sqrt{\max(0,\, 1 - 4\epsilon_l / p)}
        \;\le\; r \;\le\;
        \tfrac12 + \tfrac12 \sqrt{1 + 4\epsilon_h / p},

    so the lower edge never drops below 1/2 (where the root is imaginary the radicand is
    clamped at 0, as in the reference code).  Both edges are evaluated without cancellation:
    with :math:`t = 4\epsilon/p`,

    .. math::

        \log r_{lo} = \log1p\!\left(-\frac{t/2}{1 + \sqrt{1 - t}}\right),\qquad
        \log r_{hi} = \log1p\!\left(\frac{t/2}{1 + \sqrt{1 + t}}\right)\ (t < 1),

    and for :math:`t \ge 1` the upper edge is :math:`\mathrm{softplus}(s) - \log 2` with
    :math:`s = \tfrac12\,\mathrm{softplus}(\log t)`, exact even when :math:`t` overflows.

    Parameters
    ----------
    logp_old : Tensor
        Old log-probabilities (no gradient is taken).
    eps_low, eps_high : float
        DCPO's :math:`\epsilon_l, \epsilon_h \ge 0`.

    Returns
    -------
    Band
        Log-edges in float64 (float32 on devices without float64), shaped like ``logp_old``.

    Examples
    --------
    >>> import torch
    >>> band = dcpo_log_bounds(torch.log(torch.tensor([0.8, 0.1])), 0.16, 0.2)
    >>> [round(r, 6) for r in band.log_lower.exp().tolist()]  # 1/2 + sqrt(0.2)/2, 1/2
    [0.723607, 0.5]
    >>> [round(r, 6) for r in band.log_upper.exp().tolist()]  # 1/2 + sqrt(2)/2, 1/2 + 3/2
    [1.207107, 2.0]
    """
    x = logp_old.detach().to(work_dtype(logp_old.device))
    log2 = math.log(2.0)
    if eps_low > 0:
        log_t = math.log(4.0 * eps_low) - x
        t = torch.exp(torch.clamp(log_t, max=0.0))  # t >= 1 means the root is imaginary
        log_lo = torch.log1p(-0.5 * t / (1.0 + torch.sqrt(1.0 - t)))
    else:
        log_lo = torch.zeros_like(x)
    if eps_high > 0:
        log_t = math.log(4.0 * eps_high) - x
        t = torch.exp(torch.clamp(log_t, max=0.0))
        small = torch.log1p(0.5 * t / (1.0 + torch.sqrt(1.0 + t)))
        large = torch.nn.functional.softplus(0.5 * torch.nn.functional.softplus(log_t)) - log2
        log_hi = torch.where(log_t < 0, small, large)
    else:
        log_hi = torch.zeros_like(x)
    return Band(log_lo, log_hi)


def precompute_band(
    logp_old: Tensor, cfg: LossConfig | None = None, *, mask=None, check: bool | None = None
) -> Band:
    r"""The band of every token, from the old log-probabilities; compute once per batch.

    The band depends only on :math:`p = \pi_{old}(a)` and the configuration, so a trainer
    computes it once after the rollout and passes it to :func:`policy_loss` in every PPO
    epoch.  Every method has one: fixed clips give constant edges, ``dcpo`` its closed form
    (:func:`dcpo_log_bounds`), the ``band_*`` methods and ``trgppo`` the f-divergence band of
    :func:`fbands.log_bounds`.  Then, for any method, ``relax`` widens the band to contain
    :math:`[1 - \epsilon_l, 1 + \epsilon_h]` (``trgppo`` always does) and ``upper_bound_max``
    caps the upper edge.

    Parameters
    ----------
    logp_old : Tensor
        Old log-probabilities of the sampled tokens, any shape (no gradient is taken).
    cfg : LossConfig, optional
        The loss configuration (default ``LossConfig()``: band clip, KL, delta 0.05).
    mask : Tensor, optional
        Response mask; positions where it is 0 get a harmless stand-in probability, so that
        padding holding ``-inf`` or garbage never reaches the band solver.
    check : bool or None
        Validate ``logp_old`` on the tokens of the mask: a value above
        :data:`LOGP_TOLERANCE` (not a log-probability; values in ``(0, 1e-3]`` count as 0)
        or a nan raises :class:`fbands.LossError`.  ``None`` (default): check when
        ``logp_old`` is on the CPU, where it costs nothing, and skip on an accelerator,
        where it would cost one host synchronisation, as :func:`policy_loss` does;
        ``True`` checks on any device, ``False`` nowhere.  Unchecked, such a token gets
        nan edges, which make :func:`policy_loss` nan (never a plausible value).

    Returns
    -------
    Band
        ``(log_lower, log_upper)``, shaped like ``logp_old``, in float32 (float64 when
        ``logp_old`` is float64), on its device.

    Examples
    --------
    >>> import torch
    >>> band = precompute_band(torch.log(torch.tensor([0.5, 0.01])), LossConfig(method="clip"))
    >>> band.log_lower.exp(), band.log_upper.exp()
    (tensor([0.8000, 0.8000]), tensor([1.2000, 1.2000]))
    """
    cfg = LossConfig() if cfg is None else cfg
    if not isinstance(cfg, LossConfig):
        raise LossError(f"cfg must be a LossConfig, got {type(cfg).__name__}")
    logp_old = as_tensor("logp_old", logp_old)
    check = resolve_check(check, logp_old)
    out_dtype = compute_dtype(logp_old)
    with torch.no_grad():
        x = logp_old.detach().to(out_dtype)
        valid = None
        if mask is not None:
            mask = as_tensor("mask", mask)
            check_devices(("logp_old", logp_old), ("mask", mask))
            if mask.shape != x.shape:
                raise LossError(
                    f"mask has shape {tuple(mask.shape)}, expected logp_old's {tuple(x.shape)}"
                )
            valid = mask != 0
            x = torch.where(valid, x, torch.full_like(x, FILL_LOGP))
        checks = logp_checks("logp_old", x, valid, nan=True)
        bad = None
        if check:
            validate(checks)
        else:  # bad tokens get nan edges; the solver sees a harmless stand-in
            bad = checks[0][0] | checks[1][0]
            x = torch.where(bad, torch.full_like(x, FILL_LOGP), x)
        x = x.clamp(max=0.0)  # a log-softmax may round a near-certain token to +1e-7
        fixed_lo, fixed_hi = _fixed_log_edges(cfg)
        kind = cfg.row.band
        if kind == "divergence":
            log_lo, log_hi = _divergence_band(x, valid, cfg)
        elif kind == "dcpo":
            log_lo, log_hi = dcpo_log_bounds(x, cfg.eps_low, cfg.eps_high)
        else:  # a fixed clip: [1 - eps_low, 1 + eps_high]
            log_lo = torch.full_like(x, fixed_lo)
            log_hi = torch.full_like(x, fixed_hi)
        log_lo, log_hi = log_lo.to(out_dtype), log_hi.to(out_dtype)
        if cfg.relax or cfg.row.with_fixed:
            log_lo = torch.clamp(log_lo, max=fixed_lo)
            log_hi = torch.clamp(log_hi, min=fixed_hi)
        if cfg.upper_bound_max is not None:
            log_hi = torch.clamp(log_hi, max=math.log(cfg.upper_bound_max))
        if bad is not None:
            nan = torch.full_like(log_lo, math.nan)
            log_lo, log_hi = torch.where(bad, nan, log_lo), torch.where(bad, nan, log_hi)
    return Band(log_lo, log_hi)


def _on_host(x: Tensor) -> bool:
    """Whether ``x`` lies in host memory, where picking the mask's tokens waits for no
    device."""
    return x.device.type == "cpu"


def _divergence_band(x: Tensor, valid: Tensor | None, cfg: LossConfig) -> tuple[Tensor, Tensor]:
    """:func:`fbands.log_bounds` of the valid log-probabilities ``x`` (padding already
    replaced by :data:`fbands._inputs.FILL_LOGP`).

    On the CPU only the tokens of the mask are solved (trainers hand over padded
    ``(batch, length)`` tensors, often several times more padding than tokens); padding
    takes the band of the stand-in, solved once with them.  On an accelerator the whole
    tensor goes through: picking the tokens would cost a host synchronisation (their
    count), more than the device table pass spends on the padding.
    """
    # x is valid now (checked, or bad tokens replaced): no second check, no sync.
    if valid is None or not _on_host(x):
        return intersected_log_bounds(x, cfg.delta, cfg.divs)
    flat = x.reshape(-1)
    idx = valid.reshape(-1).nonzero().reshape(-1)  # (on the host: no device to wait for)
    kept = torch.cat((flat[idx], flat.new_full((1,), FILL_LOGP)))  # (tokens + 1,)
    lo, hi = intersected_log_bounds(kept, cfg.delta, cfg.divs)
    log_lo, log_hi = lo[-1:].expand_as(flat).clone(), hi[-1:].expand_as(flat).clone()
    log_lo[idx], log_hi[idx] = lo[:-1], hi[:-1]
    return log_lo.view(x.shape), log_hi.view(x.shape)


def intersected_log_bounds(x: Tensor, delta, divs: tuple[str, ...]) -> tuple[Tensor, Tensor]:
    """The log-edges of the band where each divergence of ``divs`` stays within ``delta``
    for the valid log-probabilities ``x``: the largest lower and the smallest upper edge.
    Every band contains ratio 1, so the intersection is never empty."""
    log_lo, log_hi = log_bounds(x, delta, divs[0], logp=True, check=False)
    for div in divs[1:]:
        lo, hi = log_bounds(x, delta, div, logp=True, check=False)
        log_lo, log_hi = torch.maximum(log_lo, lo), torch.minimum(log_hi, hi)
    return log_lo, log_hi
