"""The one door: :func:`bounds` and :func:`log_bounds`.

They check the input, pick a backend from the input's type, and hand the solver float64
arrays of ``log p``, ``log(1 - p)``, ``p``, ``1 - p`` and ``delta``.  The result has the
input's type, shape and dtype.
"""

from __future__ import annotations

import importlib
import math
import sys
from typing import Any

import numpy as np

from fbands._optional import raise_missing
from fbands.divergences import Divergence, get
from fbands.errors import BandError

__all__ = ["bounds", "log_bounds", "BACKENDS"]

#: Backend name -> module implementing ``log_edges(div, p, delta, *, logp, invalid, check)``.
BACKENDS = {
    "numpy": "fbands.backends.numpy_backend",
    "numba": "fbands.backends.numba_backend",
    "torch": "fbands.backends.torch_backend",
    "cvxpy": "fbands.backends.cvxpy_backend",
}

_INVALID = ("raise", "nan")


def _is_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")  # only a loaded torch can have made x
    return torch is not None and isinstance(x, torch.Tensor)


def _backend_module(name: str, p: Any):
    if name == "auto":
        if _is_tensor(p):
            name = "torch"
        else:
            name = "numba" if _numba_usable() else "numpy"
    if name not in BACKENDS:
        raise BandError(f"unknown backend {name!r}; choose one of {['auto', *BACKENDS]}")
    if _is_tensor(p) and name != "torch":
        raise BandError(f"backend {name!r} takes numpy arrays or floats, not torch tensors")
    try:
        return importlib.import_module(BACKENDS[name])
    except ModuleNotFoundError as exc:  # numba (a core dependency) gone: say how to restore it
        raise_missing(exc, f"backend {name!r}")
        raise


def _numba_usable() -> bool:
    try:
        importlib.import_module(BACKENDS["numba"])
    except ImportError:
        return False
    return True


def log_bounds(
    p: Any,
    delta: Any,
    div: str | Divergence = "kl",
    backend: str = "auto",
    *,
    logp: bool = False,
    invalid: str = "raise",
    check: bool = True,
):
    r"""Log-edges ``(log lower, log upper)`` of the band of ratios allowed by ``D_f <= delta``.

    The same as :func:`bounds` in log space: exact where ``lower`` underflows (``log lower``
    stays finite while the ratio is below the smallest float) and where ``upper`` overflows
    (for ``p`` below ``1e-308``, or below ``1e-38`` in float32).  ``log lower = -inf`` means
    the lower edge is saturated at ratio 0.

    Examples
    --------
    >>> import numpy as np, fbands
    >>> lo, hi = fbands.log_bounds(np.array([-1e4, -50.0]), 0.05, "kl", logp=True)
    >>> (hi + [-1e4, -50.0]).round(6).tolist()   # log(p r): v = p r = 1 - exp(-delta)
    [-3.020628, -3.020628]
    """
    return _dispatch("log_edges", p, delta, div, backend, logp, invalid, check)


def bounds(
    p: Any,
    delta: Any,
    div: str | Divergence = "kl",
    backend: str = "auto",
    *,
    logp: bool = False,
    invalid: str = "raise",
    check: bool = True,
):
    r"""The band ``[lower, upper]`` of ratios ``r = pi(a) / p`` inside an f-divergence ball.

    For a token whose old probability is ``p``, ``r`` is allowed when some new distribution
    ``pi`` with ``pi(a) = r p`` satisfies ``D_f(pi || pi_old) <= delta``.  By the two-point
    reduction that holds iff

    .. math::

        g_f(p, r) = p\,f(r) + (1 - p)\,f\!\left(\frac{1 - r p}{1 - p}\right) \le \delta,
        \qquad 0 \le r \le 1/p,

    and the band is the interval between the two roots of ``g_f(p, r) = delta`` (clamped to
    ``0`` and ``1/p`` when the ball reaches them).

    Parameters
    ----------
    p : float, numpy.ndarray or torch.Tensor
        Old probabilities in ``(0, 1]``, or log-probabilities in ``[-inf, 0]`` with
        ``logp=True`` (``-inf`` gives the ``p -> 0`` limit ``[0, inf)``).
    delta : float or array-like
        Radius ``> 0``; broadcasts against ``p``.
    div : str or Divergence
        A name from :func:`fbands.available` (``"kl"``, ``"tv"``, ``"alpha(a=0.5)"`` ...).
    backend : {"auto", "numpy", "numba", "torch", "cvxpy"}
        ``auto`` takes torch for tensors and numba (else numpy) for everything else.
    logp : bool
        ``p`` holds log-probabilities.
    invalid : {"raise", "nan"}
        What an invalid element (nan, out-of-range ``p`` or ``delta``) does: raise
        :class:`fbands.BandError`, or give ``nan`` for both edges in its place.
    check : bool
        Validate the input.  ``False`` skips the checks (and, on torch, the host
        synchronisation they cost); invalid elements then give unspecified values.

    Returns
    -------
    (lower, upper)
        Of ``p``'s type, shape and dtype (Python floats for a Python float).  Computed in
        float64 and rounded once.  Constants for autograd, unless ``p`` (or a ``delta``
        tensor) is a tensor that requires grad: then the edges are differentiable in ``p``
        and ``delta`` (implicit function theorem, see
        :class:`fbands.backends.torch_backend.ImplicitEdges`).

    Raises
    ------
    BandError
        For invalid input (the message names the argument, the index and the value).
    DivergenceError
        For an unknown divergence (the message lists the available ones).

    Examples
    --------
    >>> import fbands
    >>> lo, hi = fbands.bounds(0.5, 0.05, div="tv")     # closed form 1 -+ delta / p
    >>> round(lo, 12), round(hi, 12)
    (0.9, 1.1)
    >>> lo, hi = fbands.bounds(0.01, 0.05, div="kl")    # a rare token may grow a lot more
    >>> round(lo, 4), round(hi, 4)
    (0.0025, 7.8098)
    """
    return _dispatch("edges", p, delta, div, backend, logp, invalid, check)


def _dispatch(method, p, delta, div, backend, logp, invalid, check):
    if invalid not in _INVALID:
        raise BandError(f"invalid must be one of {_INVALID}, got {invalid!r}")
    for name, value in (("p", p), ("delta", delta)):
        _check_kind(name, value, check)
    d = get(div)
    module = _backend_module(backend, p)
    return getattr(module, method)(d, p, delta, logp=logp, invalid=invalid, check=check)


def _check_kind(name: str, value: Any, check: bool) -> None:
    """Refuse what no backend can read as real numbers: bools (``True`` is not a radius),
    strings, objects, sparse tensors, and (when values are to be checked) meta tensors,
    which have none."""
    if _is_tensor(value):
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
        what = "bool" if kind == "b" else f"{type(value).__name__} {value!r:.60}"
        raise BandError(f"{name} must be a float or an array of floats, not {what}")


# ----------------------------------------------------------------------------- numpy side


class NumpyInputs:
    """Validated, broadcast float64 inputs of the numpy-family backends, and the way back."""

    def __init__(self, p: Any, delta: Any, *, logp: bool, invalid: str, check: bool):
        self.scalar = isinstance(p, (int, float)) and not isinstance(p, bool)
        self.logp = logp
        arr = np.asarray(p)  # (bools were refused by _check_kind)
        if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
            raise BandError(f"p must be real numbers, got dtype {arr.dtype}")
        self.dtype = arr.dtype if np.issubdtype(arr.dtype, np.floating) else np.dtype(np.float64)
        try:
            d = np.asarray(delta, dtype=np.float64)
        except (TypeError, ValueError) as err:
            raise BandError(f"delta must be a number or an array of numbers: {err}") from err
        x = arr.astype(np.float64)
        try:
            x, d = np.broadcast_arrays(x, d)
        except ValueError as err:
            raise BandError(
                f"delta of shape {d.shape} does not broadcast against p of shape {x.shape}"
            ) from err
        self.shape = x.shape
        self.scalar = self.scalar and x.ndim == 0  # a float p with an array delta: arrays
        bad_p, bad_d = invalid_masks(x, d, logp, np.isnan, np.isinf)
        self.bad = bad_p | bad_d
        if check and invalid == "raise":
            raise_invalid(bad_p, x, bad_d, d, logp)
        with np.errstate(all="ignore"):
            x = np.where(self.bad, 0.5 if not logp else -math.log(2.0), x)
            d = np.where(self.bad, 1.0, d)
            if logp:
                lp = x
                p_ = np.exp(lp)
                q = -np.expm1(lp)
            else:
                p_ = x
                lp = np.log(x)
                q = 1.0 - x
            q = np.maximum(q, 1e-300)
            lq = np.log(q)
        self.lp, self.lq, self.p, self.q, self.delta = lp, lq, p_, q, d
        self.zero = np.isneginf(lp)  # logp = -inf: the p -> 0 limit

    def finish(self, lo, hi, *, log: bool):
        """Apply the limits and the invalid mask, and return values of the input's kind."""
        with np.errstate(all="ignore"):
            lo = np.where(self.zero, -math.inf, lo)
            hi = np.where(self.zero, math.inf, hi)
            if not log:
                top = hi == -self.lp
                lo = np.exp(lo)
                hi = np.where(top, 1.0 / self.p, np.exp(hi))
            lo = np.where(self.bad, math.nan, lo)
            hi = np.where(self.bad, math.nan, hi)
            # + 0.0 turns the -0.0 of log(1) into 0.0.
            lo, hi = (lo + 0.0).astype(self.dtype), (hi + 0.0).astype(self.dtype)
        if self.scalar:
            return float(lo), float(hi)
        return lo.reshape(self.shape), hi.reshape(self.shape)


def invalid_masks(x, d, logp: bool, isnan, isinf):
    """Element masks of invalid ``p`` (or ``log p``) and ``delta``, for numpy or torch."""
    if logp:
        bad_p = isnan(x) | (x > 0)
    else:
        bad_p = isnan(x) | (x <= 0) | (x > 1) | isinf(x)
    return bad_p, ~(d > 0) | isinf(d)


def raise_invalid(bad_p, x, bad_d, d, logp: bool) -> None:
    """Raise a :class:`BandError` for the first invalid element (numpy arrays)."""
    _raise_first(bad_p, x, "log p" if logp else "p", "[-inf, 0]" if logp else "(0, 1]")
    _raise_first(bad_d, d, "delta", "(0, inf)")


def _raise_first(mask: np.ndarray, values: np.ndarray, name: str, domain: str) -> None:
    if mask.any():
        idx = np.unravel_index(int(np.argmax(mask)), mask.shape) if mask.ndim else ()
        where = f" at index {tuple(int(i) for i in idx)}" if mask.ndim else ""
        count = int(mask.sum())
        raise BandError(
            f"{name} must lie in {domain}; got {float(values[idx])!r}{where}"
            + (f" ({count} invalid elements)" if count > 1 else "")
        )
