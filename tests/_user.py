"""The user-registered divergence that the registry-wide tests cover beside the built-ins.

Registered once for the session (its checks and sympy derivation then happen once) and
taken out of the registry again; the ``user_divergence`` fixture of conftest puts this same
object back for each test that asks for it, after which the registry is restored.
"""

from __future__ import annotations

import fbands
from fbands import divergences

from . import reference as ref

TRIANGULAR = fbands.register("triangular", ref.USER_F, overwrite=True)
del divergences._REGISTRY["triangular"]


def get(name: str):
    """``fbands.get(name)``, with the user divergence also outside a test."""
    return TRIANGULAR if name == "triangular" else fbands.get(name)
