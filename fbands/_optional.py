"""Optional dependencies: imported where they are used, with an error that names the extra.

``pip install fbands`` brings only numpy, sympy (with mpmath) and numba: enough for
:func:`fbands.bounds` and :func:`fbands.log_bounds` on arrays and for the registry.  The rest
comes with an extra (see the installation page of the docs):

=============  ==========================================================
extra          for
=============  ==========================================================
``torch``      the torch backend (tensors, CPU and CUDA) and :mod:`fbands.losses`
``cvxpy``      :func:`fbands.reference_band` and ``backend="cvxpy"``
``plot``       :mod:`fbands.plotting` and ``fbands plot``
``rl``         the reference trainer :mod:`fbands.rl` (torch, transformers, matplotlib)
``verl``       :mod:`fbands.integrations.verl`
``trl``        :mod:`fbands.integrations.trl`
=============  ==========================================================

A module that needs one of them imports it through :func:`require`, or wraps its imports in
``try`` / ``except ModuleNotFoundError`` and calls :func:`raise_missing`, so that a missing
package raises :class:`MissingDependencyError` (an :class:`ImportError`) whose message is the
``pip install`` command that fixes it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["EXTRAS", "MissingDependencyError", "raise_missing", "require"]

#: Top-level module -> the extra of fbands that installs it.
EXTRAS = {
    "torch": "torch",
    "cvxpy": "cvxpy",
    "matplotlib": "plot",
    "transformers": "rl",
    "tokenizers": "rl",
    "tqdm": "rl",
    "verl": "verl",
    "trl": "trl",
    "numba": None,  # a core dependency (the error says: pip install numba)
}


class MissingDependencyError(ImportError):
    """An optional dependency of fbands is not installed; the message says which extra
    installs it."""

    def __init__(self, module: str, extra: str | None, feature: str):
        self.module, self.extra, self.feature = module, extra, feature
        spec = f'"fbands[{extra}]"' if extra else module  # a core dependency: itself
        super().__init__(
            f"{feature} needs {module}, which is not installed: pip install {spec}",
            name=module,
        )


def _top(name: str) -> str:
    return name.split(".", 1)[0]


def raise_missing(exc: ModuleNotFoundError, feature: str) -> None:
    """Re-raise ``exc`` (from importing an optional dependency of ``feature``) as
    :class:`MissingDependencyError` when the missing module is one of :data:`EXTRAS`;
    anything else (a broken install of the package itself) is re-raised unchanged."""
    top = _top(exc.name or "")
    if top not in EXTRAS:
        raise exc
    raise MissingDependencyError(top, EXTRAS[top], feature) from exc


def require(module: str, feature: str) -> ModuleType:
    """``import module`` for ``feature``, or :class:`MissingDependencyError` naming the extra.

    >>> require("math", "a doctest").pi > 3
    True
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise_missing(exc, feature)
        raise  # unreachable: raise_missing always raises
