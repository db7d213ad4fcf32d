r"""The mismatch gate: a trust region between the rollout engine and the trainer.

A rollout engine (vLLM, SGLang, a bf16 kernel) samples token :math:`a` with probability
:math:`\mu = \mu(a)`; the trainer, recomputing it, gives :math:`\pi = \pi_{old}(a)`.  The two
differ (other kernels, other precision, a mixture-of-experts routing that flips), and a
token on which they differ much teaches the wrong update.  The gate asks of each token the
question a band asks of an update: do the two-point distributions
:math:`(\mu, 1 - \mu)` and :math:`(\pi, 1 - \pi)` lie within an f-divergence of radius
:math:`\delta` of each other?  That holds exactly when the ratio :math:`r = \pi / \mu` lies
in the band of :math:`\mu` (:func:`fbands.log_bounds`), so the gate is one band read and
two comparisons.  Known gates are cases of it:

* ``div="tv"``: :math:`|\pi - \mu| \le \delta` (the binary TV gate of DPPO);
* ``div="kl"``: :math:`\mathrm{KL}\big((\mu, 1-\mu) \,\|\, (\pi, 1-\pi)\big) \le \delta`, and
  ``div="reverse_kl"`` the other direction (binary KL gates);
* ``div="kl&reverse_kl"``: both directions, a symmetric gate.

``mode="mask"`` returns 1 for a kept token and 0 for a gated one; ``mode="cap"`` returns the
importance weight :math:`r` clamped into the band instead, a truncated importance-sampling
correction whose truncation follows :math:`\mu` (wide for rare tokens, narrow for likely
ones).  Either multiplies the loss weights (the response mask, or ``weights`` of
:func:`fbands.losses.policy_loss`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fbands import _checks
from fbands._inputs import FILL_LOGP
from fbands.errors import LossError
from fbands.losses.band import intersected_log_bounds
from fbands.losses.checks import (
    as_tensor,
    check_devices,
    compute_dtype,
    logp_checks,
    resolve_check,
    validate,
)
from fbands.losses.config import checked_divs, split_divs

#: What :func:`mismatch_gate` returns: a 0/1 mask, or the importance weight capped by the band.
GATE_MODES = ("mask", "cap")


def mismatch_gate(logp: Tensor, logp_rollout: Tensor, div: str = "kl", delta: float = 0.01,
                  *, mode: str = "mask", mask: Tensor | None = None,
                  check: bool | None = None) -> Tensor:
    r"""Per-token weights that keep the tokens whose trainer and rollout-engine
    probabilities agree within a trust region of radius ``delta`` (module docstring).

    Parameters
    ----------
    logp : Tensor
        The trainer's log-probabilities of the sampled tokens (its :math:`\pi_{old}`).
    logp_rollout : Tensor
        The rollout engine's log-probabilities of the same tokens, same shape and device.
    div : str
        The divergence, or several joined by ``&`` (their gates all apply).
    delta : float
        The radius, ``> 0``.
    mode : {"mask", "cap"}
        ``"mask"``: 1 inside the band, 0 outside.  ``"cap"``: :math:`\pi/\mu` clamped into
        the band.
    mask : Tensor, optional
        Response mask: positions where it is 0 get weight 0 and are never read.
    check : bool or None
        Validate the log-probabilities on the tokens of the mask (as
        :func:`fbands.losses.precompute_band` does): ``None`` checks on the CPU only.

    Returns
    -------
    Tensor
        The weights, shaped like ``logp``, in float32 (float64 when an input is float64),
        without gradient.

    Examples
    --------
    >>> import torch
    >>> mu = torch.tensor([0.5, 0.5, 0.001, 0.001])
    >>> pi = torch.tensor([0.52, 0.7, 0.002, 0.03])
    >>> mismatch_gate(pi.log(), mu.log(), "tv", 0.05)  # |pi - mu| <= 0.05
    tensor([1., 0., 1., 1.])
    >>> mismatch_gate(pi.log(), mu.log(), "kl", 0.01)  # binary KL(mu || pi) <= 0.01
    tensor([1., 0., 1., 0.])
    """
    if mode not in GATE_MODES:
        raise LossError(f"mode must be one of {GATE_MODES}, got {mode!r}")
    if not isinstance(div, str) or not div:
        raise LossError(f"div must be a divergence name, got {div!r}")
    divs = split_divs(div)
    _checks.number("delta", delta, LossError, low=0.0, low_open=True)
    logp, logp_rollout = as_tensor("logp", logp), as_tensor("logp_rollout", logp_rollout)
    check_devices(("logp", logp), ("logp_rollout", logp_rollout),
                   ("mask", None if mask is None else as_tensor("mask", mask)))
    if logp_rollout.shape != logp.shape:
        raise LossError(f"logp_rollout has shape {tuple(logp_rollout.shape)}, expected "
                        f"logp's {tuple(logp.shape)}")
    if mask is not None and mask.shape != logp.shape:
        raise LossError(f"mask has shape {tuple(mask.shape)}, expected logp's "
                        f"{tuple(logp.shape)}")
    dtype = compute_dtype(logp, logp_rollout)
    with torch.no_grad():
        x, y = logp_rollout.detach().to(dtype), logp.detach().to(dtype)
        valid = None if mask is None else mask != 0
        if valid is not None:
            fill = torch.full_like(x, FILL_LOGP)
            x, y = torch.where(valid, x, fill), torch.where(valid, y, fill)
        if resolve_check(check, logp, logp_rollout):
            validate(logp_checks("logp_rollout", x, valid, nan=True, sampled=True)
                      + logp_checks("logp", y, valid, nan=True))
        x, y = x.clamp(max=0.0), y.clamp(max=0.0)
        log_lo, log_hi = intersected_log_bounds(x, delta, divs)
        log_r = y - x
        if mode == "mask":
            out = ((log_r >= log_lo) & (log_r <= log_hi)).to(dtype)
        else:
            out = torch.exp(torch.minimum(torch.maximum(log_r, log_lo), log_hi))
        if valid is not None:
            out = torch.where(valid, out, torch.zeros_like(out))
    return out


def gate_options(div: str | None, delta: float, mode: str, *, prefix: str = "") -> dict | None:
    """The :func:`mismatch_gate` arguments that a trainer's options name, checked; None when
    ``div`` is None or ``""`` (no gate).  Every trainer (``fbands train``, TRL) reads its
    options through this, so that a bad one fails at start-up with the option's name
    (``prefix`` before each: ``"band_"``).

    Examples
    --------
    >>> gate_options("kl&reverse_kl", 0.01, "mask")
    {'div': 'kl&reverse_kl', 'delta': 0.01, 'mode': 'mask'}
    >>> gate_options("", 0.01, "mask") is None
    True
    """
    if div is None or div == "":
        return None
    if not isinstance(div, str):
        raise LossError(f"{prefix}gate_div={div!r}: must be a divergence name")
    try:
        checked_divs(div)
    except (LossError, ValueError) as err:
        raise LossError(f"{prefix}gate_div={div!r}: {err}") from err
    _checks.number(f"{prefix}gate_delta", delta, LossError, low=0.0, low_open=True)
    if mode not in GATE_MODES:
        raise LossError(f"{prefix}gate_mode={mode!r}: must be one of {GATE_MODES}")
    return {"div": div, "delta": delta, "mode": mode}
