"""Exceptions raised by fbands: one base, :class:`FBandsError`, and one subclass per door.

Every error of the library is an :class:`FBandsError` (``except fbands.FBandsError``
catches them all), and a :class:`ValueError`, so ``except ValueError`` keeps working for
callers that do not care which part of the input was wrong.  The same mistake is worded the
same way at every door (:mod:`fbands._checks`); the door decides the subclass.
"""

from __future__ import annotations


class FBandsError(ValueError):
    """The base of every error fbands raises."""


class BandError(FBandsError):
    """An argument of :func:`fbands.bounds` (or a function built on it) is invalid.

    The message names the argument and, for arrays, the first offending index and value.
    """


class DivergenceError(FBandsError):
    """An unknown divergence name, a bad parameter, or an ``f`` that is not a valid
    f-divergence generator (not zero at 1, or not convex)."""


class LossError(FBandsError):
    """An invalid input of a policy loss (:mod:`fbands.losses`): a positive log-probability,
    a band whose edges are NaN or crossed, a mask or aggregation denominator that is not
    usable.  The message names the argument."""


class SolverError(FBandsError, RuntimeError):
    """A reference solver (:func:`fbands.reference_band`, cvxpy) could not solve a band
    problem it was given: also a :class:`RuntimeError`, since the input was valid."""


class ConfigError(FBandsError):
    """An invalid trainer or plug-in configuration (:mod:`fbands.rl`, the verl and TRL
    integrations): a bad value, a file that is not what it should be, a malformed
    JSON / TOML config.  The command line prints it as one line and exits with code 2."""
