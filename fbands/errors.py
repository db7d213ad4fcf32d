"""Exceptions raised by fbands.

All are :class:`ValueError` subclasses, so ``except ValueError`` keeps working for callers
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


class LossError(ValueError):
    """An invalid input of a policy loss (:mod:`fbands.losses`): a positive log-probability,
    a band whose edges are NaN or crossed, a mask or aggregation denominator that is not
    usable.  The message names the argument."""


class ConfigError(ValueError):
    """An invalid trainer or plug-in configuration (:mod:`fbands.rl`, the verl and TRL
    integrations): a bad value, a file that is not what it should be, a malformed
    JSON / TOML config.  The command line prints it as one line and exits with code 2."""
