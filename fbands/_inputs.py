"""The input contract of every backend: what a valid ``p`` (or ``log p``) and ``delta`` are,
how they broadcast, how an invalid element is reported, and the float64 quantities the
solver reads.

One module for numpy arrays and torch tensors alike: the element tests are written with
operators that both understand (``x != x`` for nan), so the numpy backend, the numba
backend (its general path and its passes), the torch solver and the torch table path all
decide validity, and word their errors, here.

* :func:`check_kind` refuses what no backend can read as real numbers (before dispatch);
* :func:`invalid_masks` marks invalid elements; :func:`raise_invalid` raises a
  :class:`~fbands.errors.BandError` naming the first one (index of the input's own shape)
  and how many there are;
* :class:`Request` is what a call asks besides its data, the one object every path of
  every backend receives;
* :class:`NumpyInputs` and :class:`TensorInputs` are the one prepare / finish pair of the
  arrays and of the tensors: they validate, broadcast and derive ``log p, log(1 - p), p,
  1 - p, delta`` (:class:`fbands._solver.Inputs`), and turn the solver's log-edges back
  into the output the request asks for (:func:`finish_edges`).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from fbands import _checks
from fbands._solver import LP_CLOSED, Q_FLOOR, Inputs
from fbands.errors import BandError

#: :data:`fbands._solver.Q_FLOOR` (the smallest ``q = 1 - p`` in the equations) where the
#: work is done in float32 (devices without float64, such as MPS): the power of ten next to
#: float32's smallest normal number (1.2e-38), the float32 counterpart of 1e-300.
Q_FLOOR_FLOAT32 = 1e-38
#: What an invalid element is replaced with before solving (its edges are then replaced by
#: nan): a harmless interior point, so that no kernel meets nan, 0 or a negative radius.
FILL_P, FILL_DELTA = 0.5, 1.0
#: ``log`` of :data:`FILL_P`, the replacement for log-probability input.
FILL_LOGP = -math.log(2.0)

#: Domains as the error messages state them.
_DOMAIN = {False: ("p", "(0, 1]"), True: ("log p", "[-inf, 0]")}


@dataclass(frozen=True)
class Request:
    """What a band call asks besides its data.

    ``logp``: ``p`` holds log-probabilities; ``log``: the answer is the log-edges;
    ``invalid``: what an invalid element does (``"raise"``, or ``"nan"``: its edges are nan);
    ``check``: whether the values are validated at all (:func:`fbands.bounds`).
    """

    logp: bool = False
    log: bool = False
    invalid: str = "raise"
    check: bool = True

    @property
    def raises(self) -> bool:
        """Whether an invalid element raises: checked, with ``invalid="raise"``."""
        return self.check and self.invalid == "raise"


def is_tensor(x: Any) -> bool:
    """Whether ``x`` is a torch tensor (without importing torch)."""
    torch = sys.modules.get("torch")  # only a loaded torch can have made x
    return torch is not None and isinstance(x, torch.Tensor)


def check_kind(name: str, value: Any, check: bool) -> None:
    """Refuse what no backend can read as real numbers: bools (``True`` is not a radius),
    strings, objects, sparse tensors, and (when values are to be checked) meta tensors,
    which have none."""
    if is_tensor(value):
        torch = sys.modules["torch"]
        if value.dtype == torch.bool or value.is_complex():
            raise BandError(f"{name} must hold real numbers, got dtype {value.dtype}")
        if value.layout != torch.strided:
            raise BandError(f"{name} is a {value.layout} tensor; pass {name}.to_dense()")
        if check and value.is_meta:
            raise BandError(f"{name} is a meta tensor: it has no values to check; pass "
                            "check=False to get edges of its shape on the meta device")
        return
    if isinstance(value, bool):
        raise BandError(f"{name} must be a float or an array of floats, not bool")
    if isinstance(value, (int, float)):
        return
    try:
        kind = np.asarray(value).dtype.kind
    except (TypeError, ValueError) as err:  # ragged nesting, for one
        raise BandError(f"{name} must be a float or an array of floats: {err}") from None
    if kind not in "iuf":
        what = "bool" if kind == "b" else f"{type(value).__name__} {_checks.shown(value, 60)}"
        raise BandError(f"{name} must be a float or an array of floats, not {what}")


def scalar_delta(delta: Any) -> float | None:
    """``delta`` as a Python float when it is one number held on the host (a Python or
    numpy number, a 0-d array), else None.  (A tensor is never read here: that would cost
    a device synchronisation.)"""
    if isinstance(delta, bool):
        return None
    if isinstance(delta, (int, float, np.floating, np.integer)):
        try:
            return float(delta)
        except OverflowError:  # an int of hundreds of digits
            raise BandError(f"delta must lie in (0, inf) and fit a float64 (at most "
                            f"{_checks.FLOAT_MAX:.4g}); got {_checks.shown(delta)}") from None
    if isinstance(delta, np.ndarray) and delta.ndim == 0 and delta.dtype.kind in "fiu":
        return float(delta)
    return None


def invalid_masks(x, d, logp: bool):
    """Element masks ``(bad_p, bad_d)`` of invalid ``p`` (or ``log p``) and ``delta``, for
    numpy arrays and torch tensors alike (no synchronisation: masks stay on the device).

    ``p`` must lie in ``(0, 1]`` (``log p`` in ``[-inf, 0]``) and ``delta`` in ``(0, inf)``;
    nan is invalid everywhere.
    """
    if logp:
        bad_p = (x != x) | (x > 0)
    else:
        bad_p = (x != x) | (x <= 0) | (x > 1)  # (+inf > 1, -inf <= 0)
    return bad_p, ~(d > 0) | (d == math.inf)


def _host(a) -> np.ndarray:
    if is_tensor(a):
        return a.detach().cpu().numpy()
    return np.asarray(a)


def raise_invalid(bad_p, x, bad_d, d, logp: bool) -> None:
    """Raise a :class:`BandError` for the first invalid element, if any (numpy arrays or
    tensors: those are copied to the host, which is a synchronisation)."""
    name, domain = _DOMAIN[bool(logp)]
    raise_first(_host(bad_p), _host(x), name, domain)
    raise_first(_host(bad_d), _host(d), "delta", "(0, inf)")


def check_values(x, d, logp: bool) -> None:
    """Raise for the first invalid element of host arrays ``x`` and ``d``."""
    with np.errstate(invalid="ignore"):
        bad_p, bad_d = invalid_masks(np.asarray(x), np.asarray(d), logp)
    raise_invalid(bad_p, x, bad_d, d, logp)


def raise_first(mask: np.ndarray, values: np.ndarray, name: str, domain: str) -> None:
    """Raise for the first True of ``mask``: ``name must lie in domain; got v at index (i, j)
    (k invalid elements)``.  ``values`` as the caller gave them: a scalar (broadcast to
    ``mask``'s shape for the computation) is reported without an index or a count."""
    if mask.any():
        scalar = np.ndim(values) == 0
        idx = np.unravel_index(int(np.argmax(mask)), mask.shape) if mask.ndim else ()
        value = float(np.broadcast_to(values, mask.shape)[idx])
        index = () if scalar else tuple(int(i) for i in idx)
        raise _checks.first_bad(BandError, f"{name} must lie in {domain}", value, index,
                                1 if scalar else int(mask.sum()))


def band_inputs(xp, x, d, *, logp: bool, q_floor: float = Q_FLOOR) -> Inputs:
    """The solver's :class:`~fbands._solver.Inputs` from valid ``p`` (or ``log p``) and
    ``delta`` of one shape; ``xp`` is numpy or torch.  ``1 - p`` is ``-expm1(log p)`` for
    log-probability input (exact near ``p = 1``) and floored at ``q_floor``.  For
    probability input ``log(1 - p)`` is ``log1p(-p)`` up to ``p = 1/2`` (``1 - p`` rounds
    there, and ``log`` of it is off by up to an ulp of 1: a relative ``eps / p`` in
    ``f(1 / q)``, which decides the lower edge's saturation) and ``log(1 - p)`` above, where
    ``1 - p`` is exact: as the tables take it (:func:`fbands.tables.build._solve_z`)."""
    if logp:
        lp, p, q = x, xp.exp(x), -xp.expm1(x)
    else:
        lp, p, q = xp.log(x), x, 1.0 - x
    q = xp.where(q < q_floor, q_floor, q)
    lq = xp.log(q)
    if not logp:
        lq = xp.where(x > 0.5, lq, xp.log1p(-xp.where(x > 0.5, 0.0, x)))
    return Inputs(lp, lq, p, q, d)


def finish_edges(xp, x: Inputs, lo, hi, bad, *, log: bool):
    """Log-edges ``(lo, hi)`` from the solver -> the output edges (log-edges or ratios):
    the ``p -> 0`` limit ``[0, inf)`` where ``log p = -inf``, ``1 / p`` exactly where the
    upper edge is saturated, and nan where ``bad`` (None: nothing invalid)."""
    zero = x.lp == -math.inf
    lo = xp.where(zero, -math.inf, lo)
    hi = xp.where(zero, math.inf, hi)
    if not log:
        top = hi == -x.lp
        lo = xp.exp(lo)
        hi = xp.where(top, 1.0 / x.p, xp.exp(hi))
    if bad is not None:
        lo = xp.where(bad, math.nan, lo)
        hi = xp.where(bad, math.nan, hi)
    return lo, hi


# ----------------------------------------------------------------------------- numpy


class NumpyInputs:
    """Validated, broadcast float64 inputs of the numpy-family backends, and the way back."""

    def __init__(self, p: Any, delta: Any, request: Request):
        self.scalar = isinstance(p, (int, float)) and not isinstance(p, bool)
        self.request = request
        self.logp = logp = request.logp
        arr = np.asarray(p)  # (bools were refused by check_kind)
        if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
            raise BandError(f"p must be real numbers, got dtype {arr.dtype}")
        self.dtype = arr.dtype if np.issubdtype(arr.dtype, np.floating) else np.dtype(np.float64)
        try:
            d = np.asarray(delta, dtype=np.float64)
        except (TypeError, ValueError, OverflowError) as err:
            raise BandError(f"delta must be a number or an array of numbers: {err}") from err
        x = arr.astype(np.float64)
        given = (x, d)  # (their own shapes: a scalar's error names no index)
        try:
            x, d = np.broadcast_arrays(x, d)
        except ValueError as err:
            raise BandError(
                f"delta of shape {d.shape} does not broadcast against p of shape {x.shape}"
            ) from err
        self.shape = x.shape
        self.scalar = self.scalar and x.ndim == 0  # a float p with an array delta: arrays
        with np.errstate(invalid="ignore"):
            bad_p, bad_d = invalid_masks(x, d, logp)
        self.bad = bad_p | bad_d
        if request.raises:
            raise_invalid(bad_p, given[0], bad_d, given[1], logp)
        with np.errstate(all="ignore"):
            x = np.where(self.bad, FILL_LOGP if logp else FILL_P, x)
            d = np.where(self.bad, FILL_DELTA, d)
            inputs = band_inputs(np, x, d, logp=logp)
        self.inputs = inputs
        self.lp, self.lq, self.p, self.q, self.delta = (
            inputs.lp, inputs.lq, inputs.p, inputs.q, inputs.delta)
        self.zero = np.isneginf(self.lp)  # logp = -inf: the p -> 0 limit

    def finish(self, lo, hi):
        """Apply the limits and the invalid mask, and return values of the input's kind (the
        edges, or their logs, as the request asks) from the log-edges ``lo``, ``hi``."""
        with np.errstate(all="ignore"):
            lo, hi = finish_edges(np, self, lo, hi, self.bad, log=self.request.log)
            # + 0.0 turns the -0.0 of log(1) into 0.0.
            lo, hi = (lo + 0.0).astype(self.dtype), (hi + 0.0).astype(self.dtype)
        if self.scalar:
            return float(lo), float(hi)
        return lo.reshape(self.shape), hi.reshape(self.shape)


# ----------------------------------------------------------------------------- torch


def work_dtype(device) -> Any:
    """The dtype a tensor's band is computed in: float64, or float32 on devices without
    float64 arithmetic (MPS)."""
    import torch

    return torch.float32 if torch.device(device).type == "mps" else torch.float64


class TensorInputs:
    """Validated, broadcast inputs of the torch backend on ``p``'s device, in
    :func:`work_dtype`, and the way back to the input's kind and dtype.

    Nothing here reads a tensor's values on the host but one synchronisation, when
    ``check`` (to be able to raise) or ``probe`` (the call may wait for the device): it
    also tells whether any element needs the solver's rarely used branches (:attr:`tiny`,
    :attr:`at_one`; the values do not depend on it).  ``bad`` is the mask of invalid
    elements (None when neither checked nor asked for).
    """

    def __init__(self, p: Any, delta: Any, request: Request, *, probe: bool = False):
        import torch

        self.request = request
        logp, invalid, check = request.logp, request.invalid, request.check

        if isinstance(p, torch.Tensor):
            self.kind = "tensor"
            t = p.detach()
        else:
            self.kind = "float" if isinstance(p, (int, float)) and not isinstance(p, bool) \
                else "array"
            t = torch.as_tensor(np.asarray(p))
        if t.dtype == torch.bool or t.is_complex():
            raise BandError(f"p must be real numbers, got dtype {t.dtype}")
        self.out_dtype = t.dtype if t.is_floating_point() else torch.float64
        device = t.device
        work = work_dtype(device)
        x = t.to(work)
        if isinstance(delta, torch.Tensor):
            d = delta.detach().to(device=device, dtype=work)
        elif isinstance(delta, (int, float)) and not isinstance(delta, bool):
            d = torch.full_like(x, float(delta))  # a fill on the device, not a host copy
        else:
            try:
                d = torch.as_tensor(np.asarray(delta, dtype=np.float64)).to(device=device,
                                                                           dtype=work)
            except (TypeError, ValueError) as err:
                raise BandError(f"delta must be a number or an array of numbers: {err}") \
                    from err
        try:
            x, d = torch.broadcast_tensors(x, d)
        except RuntimeError as err:
            raise BandError(
                f"delta of shape {tuple(d.shape)} does not broadcast against p of shape "
                f"{tuple(x.shape)}"
            ) from err
        self.bad = None
        given = x, d
        if check or invalid == "nan":
            bad_p, bad_d = invalid_masks(x, d, logp)
            self.bad = bad_p | bad_d
            x = torch.where(self.bad, FILL_LOGP if logp else FILL_P, x)
            d = torch.where(self.bad, FILL_DELTA, d)
        floor = Q_FLOOR if work == torch.float64 else Q_FLOOR_FLOAT32
        self.inputs = band_inputs(torch, x, d, logp=logp, q_floor=floor)
        #: Whether some element needs the solver's tiny-p branch (log p below LP_CLOSED) and
        #: its p = 1 branch: unknown (True) unless the synchronisation has looked.
        self.tiny = self.at_one = True
        if check or probe:  # the one synchronisation: to raise, and to skip unused branches
            lp = self.inputs.lp
            bad = self.bad.any() if self.bad is not None else torch.zeros((), dtype=torch.bool,
                                                                           device=lp.device)
            found = torch.stack((bad, ((lp < LP_CLOSED) & (lp > -math.inf)).any(),
                                 (lp == 0).any()))
            any_bad, self.tiny, self.at_one = (bool(v) for v in found.tolist())
            if any_bad and request.raises:
                raise_invalid(bad_p, given[0], bad_d, given[1], logp)

    def finish(self, lo, hi):
        """Output edges (or log-edges, as the request asks) of the input's kind (tensor,
        float or numpy array) and dtype, from the log-edges ``lo``, ``hi``."""
        import torch

        lo, hi = finish_edges(torch, self.inputs, lo, hi, self.bad, log=self.request.log)
        lo, hi = lo.to(self.out_dtype), hi.to(self.out_dtype)
        if self.kind == "tensor":
            return lo, hi
        if self.kind == "float":
            return float(lo), float(hi)
        return lo.numpy(), hi.numpy()
