"""Aggregation of per-token values over a response mask: verl's five modes.

:func:`agg_loss` is the public entry (with its checks); :func:`aggregate_unchecked` holds
the formulas, shared with :func:`fbands.losses.policy_loss`, which has checked its inputs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fbands.errors import LossError
from fbands.losses.checks import (
    any_bad,
    as_tensor,
    check_devices,
    denominator_checks,
    mask_checks,
    poison,
    resolve_check,
    validate,
)
from fbands.losses.config import AGG_MODES


def agg_loss(
    values: Tensor,
    mask: Tensor,
    mode: str = "token-mean",
    *,
    num_tokens=None,
    num_seqs=None,
    loss_scale_factor=None,
    check: bool | None = None,
) -> Tensor:
    r"""Aggregate per-token values over a response mask into a 0-dim tensor (verl's modes).

    With :math:`v_{it}` the values, :math:`m_{it}` the mask, :math:`s_i = \sum_t m_{it}
    v_{it}`, :math:`n_i = \sum_t m_{it}` and :math:`B` sequences:

    .. math::

        \text{token-mean} = \frac{\sum_i s_i}{\sum_i n_i},\quad
        \text{token-sum} = \sum_i s_i,\quad
        \text{seq-mean-token-mean} = \frac1B \sum_i \frac{s_i}{n_i},

    .. math::

        \text{seq-mean-token-sum} = \frac1B \sum_i s_i,\quad
        \text{seq-mean-token-sum-norm} = \frac1B \sum_i \frac{s_i}{L}
        \ (L = T \text{ by default; Dr. GRPO}).

    :math:`B` counts the rows with at least one token (fully masked rows are left out, as in
    verl 0.9.1's ``agg_loss``); a batch with no tokens gives 0 instead of NaN.  Masked-out
    values never leak in, even if they are ``inf`` or ``nan``.

    Parameters
    ----------
    values : Tensor
        Per-token values ``(B, T)`` (any shape ``(..., T)`` for the token modes); integer
        or bool values are aggregated in float32.
    mask : Tensor
        Same shape; 0/1, bool, or finite non-negative weights.
    mode : str
        One of :data:`AGG_MODES`.
    num_tokens : float or Tensor, optional
        Denominator of ``token-mean`` in place of :math:`\sum n_i`, e.g. the token count of
        the whole mini-batch when it is split into micro-batches.  Finite and > 0.
    num_seqs : float or Tensor, optional
        :math:`B` of the ``seq-mean-*`` modes, in place of the local row count.  Finite
        and > 0.
    loss_scale_factor : float, optional
        :math:`L` of ``seq-mean-token-sum-norm`` (default: ``T``, the padded length).
        Finite and > 0.
    check : bool or None
        Validate the tensor inputs (a negative or non-finite mask entry, a denominator
        tensor that is not finite and > 0) at the cost of one host synchronisation on a
        GPU.  ``None`` (default) checks when the tensors are on the CPU, where that costs
        nothing; unchecked, such an input makes the result nan.  Python-number
        denominators are always checked.

    Returns
    -------
    Tensor
        0-dim, in ``values``' dtype (float32 for integer values).

    Raises
    ------
    LossError
        For a bad mode, shape, mask or denominator; the message names the argument.

    Examples
    --------
    >>> import torch
    >>> v = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    >>> m = torch.tensor([[1, 1, 1], [1, 0, 0]])
    >>> [round(agg_loss(v, m, mode).item(), 4) for mode in AGG_MODES]
    [2.5, 10.0, 3.0, 5.0, 1.6667]
    """
    values, mask = _agg_inputs(values, mask, mode)
    checks = mask_checks(mask) + denominator_checks(num_tokens, num_seqs, loss_scale_factor)
    if resolve_check(check, values, mask):
        validate(checks)
        checks = []
    out = aggregate_unchecked(values, mask, mode, num_tokens, num_seqs, loss_scale_factor)
    return poison(out, any_bad(checks))


def _agg_inputs(values, mask, mode: str) -> tuple[Tensor, Tensor]:
    """Type and shape checks of :func:`agg_loss`'s tensors; integer values become float32."""
    values = as_tensor("values", values)
    mask = as_tensor("mask", mask)
    check_devices(("values", values), ("mask", mask))
    if mode not in AGG_MODES:
        raise LossError(f"unknown agg mode {mode!r}; expected one of {', '.join(AGG_MODES)}")
    if values.shape != mask.shape:
        raise LossError(
            f"values of shape {tuple(values.shape)} and mask of shape {tuple(mask.shape)} differ"
        )
    if values.dim() < 1:
        raise LossError("values must have a token dimension")
    if not values.is_floating_point():  # integer or bool values: averaged in float32
        values = values.to(torch.float32)
    return values, mask


def aggregate_unchecked(values, mask, mode, num_tokens, num_seqs, loss_scale_factor) -> Tensor:
    """The formulas of :func:`agg_loss`, on checked inputs."""
    weight = mask.to(values.dtype)
    # where(), not a product, so that inf/nan at masked positions cannot leak in.
    masked = torch.where(mask != 0, values * weight, torch.zeros_like(values))
    tiny = torch.finfo(values.dtype).tiny
    if mode == "token-sum":
        return masked.sum()
    if mode == "token-mean":
        denom = weight.sum().clamp(min=tiny) if num_tokens is None else num_tokens
        return masked.sum() / denom
    seq_sum = masked.sum(dim=-1)  # (B,)
    if mode == "seq-mean-token-mean":
        per_seq = seq_sum / weight.sum(dim=-1).clamp(min=tiny)
    elif mode == "seq-mean-token-sum":
        per_seq = seq_sum
    else:  # seq-mean-token-sum-norm
        scale = max(values.shape[-1], 1) if loss_scale_factor is None else loss_scale_factor
        per_seq = seq_sum / scale
    if num_seqs is None:  # rows with no token at all are left out, as verl 0.9.1 does
        num_seqs = (weight.sum(dim=-1) > 0).sum().clamp(min=1)
    return per_seq.sum() / num_seqs
