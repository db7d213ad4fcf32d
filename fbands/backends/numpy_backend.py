"""numpy backend: the shared solver (:mod:`fbands._solver`) on float64 numpy arrays.

Closed forms where the divergence has them, safeguarded Newton elsewhere; the loop stops as
soon as every element has converged.
"""

from __future__ import annotations

import numpy as np

from fbands._solver import Inputs, solve
from fbands.bands import NumpyInputs

#: The array namespace the generated kernels and the solver are bound to.
NAMESPACE = {
    "exp": np.exp,
    "expm1": np.expm1,
    "log": np.log,
    "log1p": np.log1p,
    "sqrt": np.sqrt,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "sign": np.sign,
    "abs": np.abs,
    "where": np.where,
    "minimum": np.minimum,
    "maximum": np.maximum,
    "isfinite": np.isfinite,
}


class _Namespace:
    def __init__(self, table):
        self.__dict__.update(table)


xp = _Namespace(NAMESPACE)


def solve_log_edges(div, x: NumpyInputs):
    """``(log lower, log upper)`` as float64 arrays for prepared inputs."""
    with np.errstate(all="ignore"):
        return solve(div, xp, Inputs(x.lp, x.lq, x.p, x.q, x.delta))


def log_edges(div, p, delta, *, logp, invalid, check):
    x = NumpyInputs(p, delta, logp=logp, invalid=invalid, check=check)
    lo, hi = solve_log_edges(div, x)
    return x.finish(lo, hi, log=True)


def edges(div, p, delta, *, logp, invalid, check):
    x = NumpyInputs(p, delta, logp=logp, invalid=invalid, check=check)
    lo, hi = solve_log_edges(div, x)
    return x.finish(lo, hi, log=False)
