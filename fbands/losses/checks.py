"""The checks every loss function makes of its inputs: types, shapes, dtypes and values.

Types and shapes are checked at once (free).  Value checks are built as ``(bad, values,
rule)`` triples: :func:`validate` reduces them together (one host synchronisation) and
raises naming the first bad element, while unchecked calls on an accelerator keep them on
the device and :func:`poison` the result instead, so that an invalid input gives nan,
never a plausible value.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fbands import _checks
from fbands.errors import LossError

# Largest log-probability accepted (and read as 0): a float32 log-softmax can round a
# near-certain token to +1e-7, while anything above this is not a log-probability at all
# (negative log-likelihoods passed by mistake are the usual cause).
LOGP_TOLERANCE = 1e-3


def compute_dtype(*tensors: Tensor) -> torch.dtype:
    """float32, or float64 when an input is float64: half precision is never computed in."""
    if any(t.dtype == torch.float64 for t in tensors):
        return torch.float64
    return torch.float32


def as_tensor(name: str, x) -> Tensor:
    if not isinstance(x, Tensor):
        raise LossError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.layout != torch.strided:
        raise LossError(f"{name} must be a dense tensor, got layout {x.layout}")
    if x.is_complex():
        raise LossError(f"{name} must hold real numbers, got dtype {x.dtype}")
    return x


def resolve_check(check, *tensors: Tensor) -> bool:
    """``check`` as a bool: ``None`` means "when every tensor is on the CPU" (free there)."""
    if check is None:
        return all(t.device.type == "cpu" for t in tensors)
    if not isinstance(check, bool):
        raise LossError(f"check must be True, False or None, got {check!r}")
    if check and any(t.device.type == "meta" for t in tensors):
        raise LossError("check=True reads the values, which meta tensors do not have; "
                        "pass check=False")
    return check


# A value check: (mask of bad elements, the values to quote, what the values must be).
_Check = tuple[Tensor, Tensor, str]


def validate(checks: list[_Check]) -> None:
    """Raise :class:`LossError` naming the first bad element of the first failing check.

    All checks are reduced together, so that inputs that pass cost one host
    synchronisation; only the error path reads more.
    """
    if not checks:
        return
    if not bool(torch.stack([bad.any() for bad, _, _ in checks]).any()):
        return
    for bad, values, rule in checks:
        if not bool(bad.any()):
            continue
        index = tuple(int(i) for i in torch.nonzero(bad)[0])
        value = values[index].item() if values.dim() else values.item()
        if values.is_floating_point() and values.dtype != torch.float64:
            value = float(f"{value:.8g}")  # 2.3, not float32's 2.299999952316284
        raise _checks.first_bad(LossError, rule, value, index, int(bad.sum()))


def any_bad(checks: list[_Check]) -> Tensor | None:
    """0-dim bool tensor: does any check fail?  No host synchronisation."""
    if not checks:
        return None
    return torch.stack([bad.any() for bad, _, _ in checks]).any()


def logp_checks(name: str, x: Tensor, valid: Tensor | None, *, nan: bool,
                 sampled: bool = False) -> list[_Check]:
    """Elements (where ``valid``) above :data:`LOGP_TOLERANCE`, NaN ones when ``nan``, and
    ``-inf`` ones when ``sampled`` (the policy that sampled a token gave it probability > 0:
    a ratio over 0 is infinite)."""
    x = x.detach()
    found = [(x > LOGP_TOLERANCE, f"{name} must hold log-probabilities (<= 0), not positive "
                                  "values (were negative log-likelihoods passed?)")]
    if nan:
        found.append((torch.isnan(x), f"{name} must not be nan on the tokens of the mask"))
    if sampled:
        found.append((x == -math.inf, f"{name} must be > -inf on the tokens of the mask (the "
                                      "policy that sampled a token cannot have given it "
                                      "probability 0; is the mask or the sampler's top-k "
                                      "right?)"))
    return [(bad if valid is None else bad & valid, x, rule) for bad, rule in found]


def band_checks(log_lo: Tensor, log_hi: Tensor, valid: Tensor) -> list[_Check]:
    """Band edges (where ``valid``) must not be nan, nor crossed."""
    return [
        (valid & torch.isnan(log_lo), log_lo, "band.log_lower must not be nan"),
        (valid & torch.isnan(log_hi), log_hi, "band.log_upper must not be nan"),
        (valid & (log_lo > log_hi), log_lo, "band.log_lower must not exceed band.log_upper"),
    ]


def mask_checks(mask: Tensor) -> list[_Check]:
    """A mask is bool, or numbers that are finite and >= 0 (0/1 or weights)."""
    if mask.dtype == torch.bool:
        return []
    bad = mask < 0
    if mask.is_floating_point():
        bad = bad | ~torch.isfinite(mask)
    return [(bad, mask, "mask must be 0/1, bool or finite non-negative weights")]


def check_devices(first: tuple[str, Tensor], *others: tuple[str, Tensor | None]) -> None:
    """Every tensor of ``others`` must be on the device of ``first`` (torch's own error for
    a mix names no argument)."""
    name0, t0 = first
    for name, t in others:
        if t is not None and t.device != t0.device:
            raise LossError(f"{name} is on {t.device}, but {name0} is on {t0.device}: put "
                            "every tensor input of the loss on one device")


def check_inputs(logp_old, logp, advantages, mask):
    logp_old = as_tensor("logp_old", logp_old)
    logp = as_tensor("logp", logp)
    advantages = as_tensor("advantages", advantages)
    mask = as_tensor("mask", mask)
    check_devices(("logp_old", logp_old), ("logp", logp), ("advantages", advantages),
                   ("mask", mask))
    if logp_old.dim() < 1:
        raise LossError("logp_old must have at least one dimension (tokens)")
    for name, t in (("logp", logp), ("mask", mask)):
        if t.shape != logp_old.shape:
            raise LossError(
                f"{name} has shape {tuple(t.shape)}, expected logp_old's {tuple(logp_old.shape)}"
            )
    if not logp_old.is_floating_point() or not logp.is_floating_point():
        raise LossError(f"log-probabilities must be floating point, got {logp.dtype}")
    given = tuple(advantages.shape)
    if advantages.dim() == logp_old.dim() - 1:
        advantages = advantages.unsqueeze(-1)  # one advantage per sequence
    check_broadcast("advantages", given, advantages.shape, logp_old.shape)
    return logp_old, logp, advantages, mask


def check_broadcast(name: str, given: tuple, shape, target) -> None:
    """Raise unless ``shape`` broadcasts to exactly ``target`` (``given``: as passed in)."""
    try:
        result = torch.broadcast_shapes(shape, target)
    except RuntimeError:
        result = None
    if result != target:
        raise LossError(f"{name} of shape {given} do not broadcast against {tuple(target)}")


def denominator_checks(num_tokens, num_seqs, loss_scale_factor) -> list[_Check]:
    """Each given denominator must be a finite number > 0.

    Python numbers are checked here (free); tensors give a check for :func:`validate`.
    """
    checks = []
    for name, value in (("num_tokens", num_tokens), ("num_seqs", num_seqs),
                        ("loss_scale_factor", loss_scale_factor)):
        if value is None:
            continue
        rule = f"{name} must be a finite number > 0"
        if isinstance(value, Tensor):
            value = as_tensor(name, value)
            if value.numel() != 1 or value.dtype == torch.bool:
                raise LossError(f"{rule}, got a tensor of shape {tuple(value.shape)} and "
                                f"dtype {value.dtype}")
            bad = value <= 0
            if value.is_floating_point():
                bad = bad | ~torch.isfinite(value)
            checks.append((bad.reshape(()), value.reshape(()), rule))
        else:
            _checks.number(name, value, LossError, low=0.0, low_open=True)
    return checks


def poison(out: Tensor, bad: Tensor | None) -> Tensor:
    """``out``, or nan where ``bad`` (an unchecked invalid input): never a plausible value."""
    if bad is None:
        return out
    return torch.where(bad, torch.full_like(out, math.nan), out)
