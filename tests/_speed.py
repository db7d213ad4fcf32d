"""Which parametrisations run in the quick loop (``make test-fast``: ``pytest -m "not slow"``).

A test over the whole registry pays, per divergence, its sympy derivation, numba compile and
tables on a cold cache: in the quick loop it covers :data:`QUICK` (a divergence with root
finding, one with closed forms, a user-registered one), and ``make test`` covers all.
"""

from __future__ import annotations

import pytest

#: The divergences of the quick loop.
QUICK = ("kl", "tv", "triangular")


def registry(names, quick=QUICK) -> list:
    """``names`` as parameters, every one outside ``quick`` marked slow."""
    return [n if n in quick else pytest.param(n, marks=pytest.mark.slow) for n in names]
