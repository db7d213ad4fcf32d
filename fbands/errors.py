"""Exceptions raised by fbands.

Both are :class:`ValueError` subclasses, so ``except ValueError`` keeps working for callers
that do not care which part of the input was wrong.
"""

from __future__ import annotations


class BandError(ValueError):
    """An argument of :func:`fbands.bounds` (or a function built on it) is invalid.

    The message names the argument and, for arrays, the first offending index and value.
    """


class DivergenceError(ValueError):
    """An unknown divergence name, a bad parameter, or an ``f`` that is not a valid
    f-divergence generator (not zero at 1, or not convex)."""
