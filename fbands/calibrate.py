r"""Calibration of the radius against a PPO clip range.

A PPO user knows ``eps``: the ratio ``r = pi(a) / pi_old(a)`` is clipped to
``[1 - eps, 1 + eps]`` whatever the token's probability.  The band of an f-divergence ball
instead depends on ``p``; :func:`calibrate_delta` gives the radius whose band, at a chosen
``p``, has exactly PPO's edge.

Why no root finding is needed: for ``r >= 1`` the two-point divergence

.. math::

    g_f(p, r) = p\,f(r) + (1 - p)\,f\!\left(\frac{1 - r p}{1 - p}\right)

is strictly increasing in ``r`` up to ``r = 1/p`` (and decreasing for ``r <= 1``), and the
upper edge of the band of radius ``delta`` is the ``r`` where ``g_f(p, r) = delta``.  So the
edge is the inverse function of ``g_f(p, .)``, and the radius whose edge is ``1 + eps`` is
``g_f(p, 1 + eps)`` itself, a closed form for every divergence.  It is evaluated in
``s = log r`` with the divergence's cancellation-free kernels (the same ``F(s) = f(e^s)``
and complement ``s_c`` as the solver, :class:`fbands._solver.BandFunction`), so that the
result keeps full relative precision even though ``g`` is of order ``eps**2``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fbands._inputs import raise_first
from fbands.divergences import Divergence, get
from fbands.errors import BandError

_SIDES = ("upper", "lower")
_UNREACHABLE = ("inf", "raise")


def calibrate_delta(
    eps: Any,
    p: Any,
    div: str | Divergence = "kl",
    side: str = "upper",
    *,
    unreachable: str = "inf",
):
    r"""The radius whose band edge at probability ``p`` is PPO's ``1 + eps`` (or ``1 - eps``).

    Returns ``delta = g_f(p, 1 + eps)`` (``side="upper"``) or ``g_f(p, 1 - eps)``
    (``side="lower"``): the smallest radius with ``fbands.bounds(p, delta, div)`` having that
    edge.  A larger radius lets tokens of probability ``p`` move further than PPO would,
    a smaller one less; tokens rarer than ``p`` get a wider band than at ``p``, more likely
    ones a narrower one.

    Parameters
    ----------
    eps : float or array-like
        PPO's clip range, ``>= 0`` (``eps = 0`` gives ``delta = 0``); at most 1 for
        ``side="lower"`` (``eps = 1`` is the edge ``r = 0``: the radius at which the band
        reaches zero, infinite for divergences such as ``kl`` whose ``f(0)`` is infinite).
    p : float or array-like
        Old probabilities in ``(0, 1]``; broadcasts against ``eps``.
    div : str or Divergence
        A name from :func:`fbands.available`.
    side : {"upper", "lower"}
        Which edge to match.
    unreachable : {"inf", "raise"}
        An upper edge ``1 + eps`` above ``1 / p`` cannot be reached by any radius (the band
        never goes beyond ``r = 1/p``, where the token takes all the probability):
        ``"inf"`` returns ``inf`` there, ``"raise"`` raises :class:`fbands.BandError`.
        ``1 + eps = 1/p`` exactly gives the radius at which the band reaches ``1/p``.

    Returns
    -------
    float or numpy.ndarray
        A Python float for scalar inputs, else a float64 array of the broadcast shape.

    Raises
    ------
    BandError
        For ``eps`` or ``p`` outside their domain, an unknown ``side``, or (with
        ``unreachable="raise"``) an unreachable edge.

    Notes
    -----
    Accuracy: within ``1e-12`` relative (tested against 60-digit values for every
    registered divergence, ``eps`` from ``1e-6`` to ``0.9``, ``p`` from ``1e-12`` to
    ``1 - 1e-9``).  ``g`` is of order ``eps**2`` while ``f`` is evaluated at ``1 + O(eps)``,
    so float64 loses about ``log10(1/eps)`` digits: for ``eps < 0.01`` the elements are
    evaluated in mpmath with that many extra digits (a few microseconds each), above it in
    float64 with the solver's kernels.  For a registered generator with ``f'(1) != 0`` the
    two terms of ``g`` also carry opposite linear parts, and above ``eps = 0.01`` the
    relative error is then about ``1e-16 / eps``.

    Examples
    --------
    >>> import fbands
    >>> delta = fbands.calibrate_delta(0.2, 0.5, "kl")
    >>> round(delta, 12)            # g(0.5, 1.2) = 0.5 (0.2 - log 1.2) + 0.5 (-0.2 - log 0.8)
    0.02041099726
    >>> round(fbands.bounds(0.5, delta, "kl")[1], 12)
    1.2
    """
    if side not in _SIDES:
        raise BandError(f"side must be one of {_SIDES}, got {side!r}")
    if unreachable not in _UNREACHABLE:
        raise BandError(f"unreachable must be one of {_UNREACHABLE}, got {unreachable!r}")
    divergence = get(div)
    scalar = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (eps, p))
    e, x = _as_array(eps, "eps"), _as_array(p, "p")
    try:
        e, x = np.broadcast_arrays(e, x)
    except ValueError as err:
        raise BandError(f"eps of shape {e.shape} does not broadcast against p of shape "
                        f"{x.shape}") from err
    top = 1.0 if side == "lower" else math.inf
    raise_first(~((e >= 0) & (e <= top)), e, "eps", "[0, 1]" if side == "lower" else "[0, inf)")
    raise_first(~((x > 0) & (x <= 1)), x, "p", "(0, 1]")
    with np.errstate(all="ignore"):
        out = _radius(divergence, e, x, side)
    if unreachable == "raise":
        raise_first(np.isposinf(out) & (side == "upper"), e, "eps",
               "reach of the band (1 + eps <= 1/p)")
    return float(out) if scalar else out


def _as_array(value: Any, name: str) -> np.ndarray:
    if isinstance(value, bool):
        raise BandError(f"{name} must be a number, got a bool")
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise BandError(f"{name} must be a number or an array of numbers: {err}") from err
    return arr


def _radius(div: Divergence, eps: np.ndarray, p: np.ndarray, side: str) -> np.ndarray:
    """``g_f(p, 1 +- eps)`` in ``s = log r`` with the solver's kernels."""
    from fbands._solver import NUMPY as xp
    from fbands._solver import Q_FLOOR, AtOne, BandFunction, Inputs

    lp = np.log(p)
    q = np.maximum(-np.expm1(lp), Q_FLOOR)
    inputs = Inputs(lp, np.log(q), p, q, np.zeros_like(p))
    fun = BandFunction(div, xp, inputs)
    if side == "upper":
        s = np.log1p(eps)
        beyond = s > -lp  # 1 + eps > 1/p: no radius reaches it
        value = fun.value(np.minimum(s, -lp))
        value = np.where(beyond, math.inf, value)
    else:
        s = np.log1p(-eps)  # -inf at eps = 1
        at_zero = np.isneginf(s)
        safe = np.where(at_zero, -1.0, s)
        value = np.where(at_zero, fun.at_zero(), fun.value(safe))
        # p = 1: the limit of g as q -> 0, f(r) + (1 - r) f'(inf) (inf when f'(inf) is).
        one = p == 1.0
        if one.any():
            limit = AtOne(div, xp, inputs).value_and_slope(safe)[0]
            limit = np.where(at_zero, div.f0 + div.fprime_inf if math.isfinite(div.f0)
                             else math.inf, limit)
            limit = np.where(eps == 0, 0.0, limit)
            value = np.where(one, limit, value)
    # Small eps: F(s) = f(e^s) is O(s^2) while the kernels round at O(s), so the relative
    # error of float64 grows like 1e-16 / eps; those few elements are evaluated in mpmath.
    small = (eps > 0) & (eps < SMALL_EPS) & np.isfinite(value) & (p < 1)
    if small.any():
        value = np.array(value, dtype=np.float64)
        for i in zip(*np.nonzero(small), strict=True):
            value[i] = _g_mpmath(div, float(eps[i]), float(p[i]), side)
    # eps = 0 is delta = 0 exactly (also at p = 1, where 1 + 0 = 1/p).
    value = np.where(eps == 0, 0.0, value)
    return value + 0.0


#: Below this eps, :func:`calibrate_delta` evaluates ``g`` in mpmath (see ``_radius``).
SMALL_EPS = 1e-2


def _g_mpmath(div: Divergence, eps: float, p: float, side: str) -> float:
    """``g_f(p, 1 +- eps)`` in mpmath, with digits for the cancellation inside ``f``
    (about ``log10(1/eps)``) and in the complement's ``c - 1 = -+ p eps / q``."""
    import mpmath

    f = div.mpmath_f
    digits = 30 + math.ceil(-math.log10(eps)) + math.ceil(-math.log10(p))
    with mpmath.workdps(digits):
        e, pp = mpmath.mpf(eps), mpmath.mpf(p)
        r = 1 + e if side == "upper" else 1 - e
        q = 1 - pp
        return float(pp * f(r) + q * f((1 - r * pp) / q))
