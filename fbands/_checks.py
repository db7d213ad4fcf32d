"""The one check of each scalar contract, for every door of the library.

A radius, a step size, a clip range, a schedule's gain: each is a real number (not a bool)
that is finite and lies in an interval.  :func:`number` checks that contract, and words the
mistake the same way whichever door it came through; the door only chooses the class of
the error, its own subclass of :class:`fbands.errors.FBandsError`
(:func:`fbands.bounds` a :class:`~fbands.errors.BandError`, the losses a
:class:`~fbands.errors.LossError`, configs and plug-ins a
:class:`~fbands.errors.ConfigError`, the registry a
:class:`~fbands.errors.DivergenceError`).  Arrays are judged element by element instead,
by :func:`fbands._inputs.invalid_masks`, and the first bad one is named with its index by
:func:`first_bad`.

>>> positive("delta", 0.05, ValueError)
0.05
>>> positive("delta", -1, ValueError)
Traceback (most recent call last):
...
ValueError: delta must be a finite number > 0, got -1
>>> number("delta", True, ValueError, finite=False)
Traceback (most recent call last):
...
ValueError: delta must be a number, got True
"""

from __future__ import annotations

import math
import numbers

__all__ = ["first_bad", "interval", "is_positive", "is_real", "number", "positive", "reason",
           "shown", "to_float", "violation"]

#: the largest finite float64 (a number beyond it, an int or a Fraction, overflows it)
FLOAT_MAX = 1.7976931348623157e308


def to_float(value) -> float:
    """``float(value)`` of a real number, or an infinity of its sign when it is too large
    for a float64 (an int or a Fraction of hundreds of digits, whose ``float`` raises)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def shown(value, limit: int = 80) -> str:
    """``repr(value)`` for a message, at most ``limit`` characters: an int of thousands of
    digits (which Python refuses to print) is named by its size instead."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        digits = int(value.bit_length() * math.log10(2)) + 1
        return f"{'a negative' if value < 0 else 'an'} integer of about {digits} digits"
    try:
        text = repr(value)
    except ValueError:  # a Fraction (or other number) of a huge int
        return f"a {type(value).__name__} too long to print"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def reason(err: BaseException, limit: int = 200) -> str:
    """The first line of ``err``'s message (its type's name when it has none), at most
    ``limit`` characters: what a one-line error quotes of the exception behind it."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:limit]


def first_bad(error: type[Exception], rule: str, value, index: tuple[int, ...],
              count: int) -> Exception:
    """The error that names the first bad element of an array, worded the same for the bands
    and the losses: ``rule; got value at index (i, j) (k invalid elements)``, without the
    index for a scalar (``index == ()``) and without the count for one element.

    >>> first_bad(ValueError, "p must lie in [0, 1]", 2.0, (0, 3), 5)
    ValueError('p must lie in [0, 1]; got 2.0 at index (0, 3) (5 invalid elements)')
    """
    where = f" at index {index}" if index else ""
    more = f" ({count} invalid elements)" if count > 1 else ""
    return error(f"{rule}; got {value!r}{where}{more}")


def is_real(value) -> bool:
    """Whether ``value`` is a real number: an int, a float or a numpy scalar, not a bool."""
    if type(value) in (float, int):  # (the usual case, without the ABC's slower check)
        return True
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_positive(value) -> bool:
    """Whether ``value`` is a real number in ``(0, inf)`` (the radius of a band, and every
    other strictly positive setting)."""
    return is_real(value) and math.isfinite(to_float(value)) and value > 0


def interval(low: float, high: float, low_open: bool, high_open: bool) -> str:
    """How a message states a range: ``> 0``, ``>= 1``, ``<= 1`` or ``in [0, 1]``."""
    if high == math.inf:
        return f"{'>' if low_open else '>='} {low:g}" if low > -math.inf else ""
    if low == -math.inf:
        return f"{'<' if high_open else '<='} {high:g}"
    return f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"


def violation(value, *, low: float = -math.inf, high: float = math.inf,
              low_open: bool = False, high_open: bool = False, finite: bool = True) -> str | None:
    """The rule ``value`` breaks, or None.  The rule is stated whole, whatever broke it
    (a bool, a string, nan, an infinity, a value out of range): ``"must be a finite number
    > 0"``, with the interval as :func:`interval` states it.  ``finite=False`` lets the
    infinities through, and the rule reads ``"must be a number"`` (nan never passes)."""
    x = to_float(value) if is_real(value) else math.nan
    inside = ((math.isfinite(x) or (not finite and x == x))
              and (x > low if low_open else x >= low)
              and (x < high if high_open else x <= high))
    if inside:
        return None
    rule = ("must be a finite number" if finite else "must be a number") + _where(
        low, high, low_open, high_open)
    if math.isinf(x) and isinstance(value, numbers.Rational):
        rule += f" (a float64: at most {FLOAT_MAX:.4g} in size)"  # an int or Fraction
    return rule


def _where(low, high, low_open, high_open) -> str:
    where = interval(low, high, low_open, high_open)
    return " " + where if where else ""


def number(name: str, value, error: type[Exception], **rule) -> float:
    """``value`` as a float when it keeps the rule (the keywords of :func:`violation`),
    else raise ``error``: ``"<name> must be a finite number > 0, got -1"``."""
    broken = violation(value, **rule)
    if broken is not None:
        raise error(f"{name} {broken}, got {shown(value)}")
    return float(value)


def positive(name: str, value, error: type[Exception]) -> float:
    """:func:`number` in ``(0, inf)``."""
    return number(name, value, error, low=0.0, low_open=True)
