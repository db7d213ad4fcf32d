"""Strict reading of plug-in options that may arrive as YAML or command-line strings.

verl hands over values from Hydra / OmegaConf and TRL from Python or ``HfArgumentParser``,
so an option can come as the right type or as text.  Each reader accepts exactly the
spellings listed and raises :class:`fbands.ConfigError` naming the option otherwise:
``bool("false")`` is True and ``float(True)`` is 1.0, neither of which may happen here.
"""

from __future__ import annotations

import math

import numpy as np

from fbands import _checks
from fbands.errors import ConfigError

_TRUE, _FALSE = ("true", "yes", "1"), ("false", "no", "0")


def as_bool(name: str, value) -> bool:
    """``True``/``False``, or the text ``true``/``false`` (also ``yes``/``no``, ``1``/``0``).

    >>> as_bool("relax", "False")
    False
    >>> as_bool("relax", 2)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fbands.errors.ConfigError: relax must be true or false, got 2
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE or text in _FALSE:
            return text in _TRUE
    raise ConfigError(f"{name} must be true or false, got {value!r}")


def as_float(name: str, value, *, optional: bool = False) -> float | None:
    """A real number (not a bool), or text that reads as one (``"5e-2"``, which YAML 1.1
    leaves a string); ``None`` only when ``optional``.  Range checks are the caller's.

    >>> as_float("delta", "5e-2")
    0.05
    >>> as_float("delta", True)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fbands.errors.ConfigError: delta must be a number, got True
    >>> as_float("delta", 10**400)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fbands.errors.ConfigError: delta must be a number within float range ... too large for a float
    """
    if value is None and optional:
        return None
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            raise ConfigError(f"{name} must be a number, got {value!r}") from None
        if math.isnan(number) or "_" in value:
            raise ConfigError(f"{name} must be a number, got {value!r}")
        return number
    try:
        return _checks.number(name, value, ConfigError, finite=False)  # (numpy scalars pass)
    except OverflowError:  # an int or Fraction beyond float range (10**400)
        kind = type(value).__name__
        raise ConfigError(f"{name} must be a number within float range (|x| < 1.8e308), "
                          f"got a value of type {kind} too large for a float") from None


def as_str(name: str, value) -> str:
    """A non-empty string (a divergence spec or a method name), never another type."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{name} must be a non-empty string, got {value!r}")
    return value


def radius_schedule(name: str, text: str, cfg, error: type[ConfigError], *, method: str,
                    adaptive: bool = True):
    """The :func:`fbands.parse_schedule` schedule ``text`` of the radius of the loss ``cfg``
    (a :class:`fbands.losses.LossConfig`), or ``error`` naming the option ``name``: for a
    method without a radius (``method`` says how the user named it), a text that does not
    parse, and an adaptive schedule where ``adaptive`` is False."""
    from fbands.schedules import parse_schedule

    if not cfg.uses_radius:
        raise error(f"{name}={text!r}: {method} has no radius to schedule")
    try:
        schedule = parse_schedule(text, start=cfg.delta)
    except ValueError as err:  # (ConfigError is one)
        raise error(f"{name}={text!r}: {err}") from err
    if schedule.adaptive and not adaptive:
        raise error(f"{name}={text!r}: an adaptive radius needs each step's KL, which verl "
                    "does not hand to a policy loss; use a step schedule (linear, cosine, "
                    "poly, hold_linear, restarts)")
    return schedule
