"""The one door: :func:`bounds` and :func:`log_bounds`, and the one decision of how a band
is computed: :func:`choose_path`.

They check the input's kind, pick a backend from the input's type, and the backend picks
its path with :func:`choose_path`; the input contract itself (validation, broadcasting,
error messages) is :mod:`fbands._inputs`.  The result has the input's type, shape and dtype.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import numpy as np

from fbands._inputs import (  # noqa: F401  (NumpyInputs, invalid_masks, raise_invalid: re-exported)
    NumpyInputs,
    check_kind,
    invalid_masks,
    raise_first,
    raise_invalid,
    scalar_delta,
    valid_delta,
    work_dtype,
)
from fbands._optional import raise_missing
from fbands.divergences import Divergence, get
from fbands.errors import BandError

__all__ = ["bounds", "log_bounds", "choose_path", "BACKENDS", "PATHS"]

#: The old private name of :func:`fbands._inputs.raise_first` (fbands.calibrate uses it).
_raise_first = raise_first

#: Backend name -> module implementing ``log_edges(div, p, delta, *, logp, invalid, check)``.
BACKENDS = {
    "numpy": "fbands.backends.numpy_backend",
    "numba": "fbands.backends.numba_backend",
    "torch": "fbands.backends.torch_backend",
    "cvxpy": "fbands.backends.cvxpy_backend",
}

_INVALID = ("raise", "nan")


def _is_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")  # only a loaded torch can have made x
    return torch is not None and isinstance(x, torch.Tensor)


def _is_float_tensor(x: Any) -> bool:
    return _is_tensor(x) and x.is_floating_point()


def _backend_module(name: str, p: Any):
    if name == "auto":
        if _is_tensor(p):
            name = "torch"
        else:
            name = "numba" if _numba_usable() else "numpy"
    if name not in BACKENDS:
        raise BandError(f"unknown backend {name!r}; choose one of {['auto', *BACKENDS]}")
    if _is_tensor(p) and name != "torch":
        raise BandError(f"backend {name!r} takes numpy arrays or floats, not torch tensors")
    try:
        return importlib.import_module(BACKENDS[name])
    except ModuleNotFoundError as exc:  # numba (a core dependency) gone: say how to restore it
        raise_missing(exc, f"backend {name!r}")
        raise


def _numba_usable() -> bool:
    if BACKENDS["numba"] in sys.modules:  # (a dict lookup: torch.compile traces it)
        return True
    try:
        importlib.import_module(BACKENDS["numba"])
    except ImportError:
        return False
    return True


def log_bounds(
    p: Any,
    delta: Any,
    div: str | Divergence = "kl",
    backend: str = "auto",
    *,
    logp: bool = False,
    invalid: str = "raise",
    check: bool = True,
):
    r"""Log-edges ``(log lower, log upper)`` of the band of ratios allowed by ``D_f <= delta``.

    The same as :func:`bounds` in log space: exact where ``lower`` underflows (``log lower``
    stays finite while the ratio is below the smallest float) and where ``upper`` overflows
    (for ``p`` below ``1e-308``, or below ``1e-38`` in float32).  ``log lower = -inf`` means
    the lower edge is saturated at ratio 0.

    Examples
    --------
    >>> import numpy as np, fbands
    >>> lo, hi = fbands.log_bounds(np.array([-1e4, -50.0]), 0.05, "kl", logp=True)
    >>> (hi + [-1e4, -50.0]).round(6).tolist()   # log(p r): v = p r = 1 - exp(-delta)
    [-3.020628, -3.020628]
    """
    return _dispatch("log_edges", p, delta, div, backend, logp, invalid, check)


def bounds(
    p: Any,
    delta: Any,
    div: str | Divergence = "kl",
    backend: str = "auto",
    *,
    logp: bool = False,
    invalid: str = "raise",
    check: bool = True,
):
    r"""The band ``[lower, upper]`` of ratios ``r = pi(a) / p`` inside an f-divergence ball.

    For a token whose old probability is ``p``, ``r`` is allowed when some new distribution
    ``pi`` with ``pi(a) = r p`` satisfies ``D_f(pi || pi_old) <= delta``.  By the two-point
    reduction that holds iff

    .. math::

        g_f(p, r) = p\,f(r) + (1 - p)\,f\!\left(\frac{1 - r p}{1 - p}\right) \le \delta,
        \qquad 0 \le r \le 1/p,

    and the band is the interval between the two roots of ``g_f(p, r) = delta`` (clamped to
    ``0`` and ``1/p`` when the ball reaches them).

    Parameters
    ----------
    p : float, numpy.ndarray or torch.Tensor
        Old probabilities in ``(0, 1]``, or log-probabilities in ``[-inf, 0]`` with
        ``logp=True`` (``-inf`` gives the ``p -> 0`` limit ``[0, inf)``).
    delta : float or array-like
        Radius ``> 0``; broadcasts against ``p``.
    div : str or Divergence
        A name from :func:`fbands.available` (``"kl"``, ``"tv"``, ``"alpha(a=0.5)"`` ...).
    backend : {"auto", "numpy", "numba", "torch", "cvxpy"}
        ``auto`` takes torch for tensors and numba (else numpy) for everything else.
    logp : bool
        ``p`` holds log-probabilities.
    invalid : {"raise", "nan"}
        What an invalid element (nan, out-of-range ``p`` or ``delta``) does: raise
        :class:`fbands.BandError`, or give ``nan`` for both edges in its place.
    check : bool
        Validate the input.  ``False`` skips the checks (and, on torch, the host
        synchronisation they cost); invalid elements then give unspecified values.  It
        never changes how the band is computed (:func:`choose_path` decides that).  On a
        GPU with one scalar ``delta``, an eager call synchronises once anyway, to solve
        the few elements the tables leave on the host; traced by ``torch.compile`` or
        captured in a CUDA graph it does not, and solves them on the device through a
        buffer of static size; in the rare call that needs more, those beyond it are nan
        (see :func:`fbands.backends.torch_backend.capacity`).

    Returns
    -------
    (lower, upper)
        Of ``p``'s type, shape and dtype (Python floats for a Python float).  Computed in
        float64 and rounded once.  Constants for autograd, unless ``p`` (or a ``delta``
        tensor) is a tensor that requires grad: then the edges are differentiable in ``p``
        and ``delta`` (implicit function theorem, see
        :class:`fbands.backends.torch_backend.ImplicitEdges`).

    Raises
    ------
    BandError
        For invalid input (the message names the argument, the index and the value).
    DivergenceError
        For an unknown divergence (the message lists the available ones).

    Examples
    --------
    >>> import fbands
    >>> lo, hi = fbands.bounds(0.5, 0.05, div="tv")     # closed form 1 -+ delta / p
    >>> round(lo, 12), round(hi, 12)
    (0.9, 1.1)
    >>> lo, hi = fbands.bounds(0.01, 0.05, div="kl")    # a rare token may grow a lot more
    >>> round(lo, 4), round(hi, 4)
    (0.0025, 7.8098)
    """
    return _dispatch("edges", p, delta, div, backend, logp, invalid, check)


def _dispatch(method, p, delta, div, backend, logp, invalid, check):
    if invalid not in _INVALID:
        raise BandError(f"invalid must be one of {_INVALID}, got {invalid!r}")
    for name, value in (("p", p), ("delta", delta)):
        check_kind(name, value, check)
    d = get(div)
    module = _backend_module(backend, p)
    return getattr(module, method)(d, p, delta, logp=logp, invalid=invalid, check=check)


# ----------------------------------------------------------------------------- paths

#: numba: the closed forms of both edges, chosen and clamped without a branch, in one pass.
CLOSED_PASS = "closed-pass"
#: numba: the interpolation tables of the (divergence, delta) pair, in one pass.
TABLE = "table"
#: numba or numpy: every element by the exact solver (closed form or safeguarded Newton,
#: refined in extended precision where float64 cannot resolve a lower edge).
EXACT = "exact"
#: torch: a CPU tensor handed to the numba backend through a numpy view (which then takes
#: one of the three paths above).
NUMBA = "numba"
#: torch: the tables read by torch operations on the tensor's device; the elements they
#: leave are solved on the host after one synchronisation, or, where the call may not
#: synchronise (traced, or captured in a CUDA graph), by the fixed-count solver on the device.
DEVICE_TABLE = "device-table"
#: torch: the exact fixed-count solver on every element (no host synchronisation).
DEVICE_SOLVER = "device-solver"
#: The paths of each backend.
PATHS = {
    "numpy": (EXACT,),
    "cvxpy": (EXACT,),
    "numba": (CLOSED_PASS, TABLE, EXACT),
    "torch": (NUMBA, DEVICE_TABLE, DEVICE_SOLVER),
}


def choose_path(backend: str, div: Divergence, p: Any, delta: Any, *, logp: bool, log: bool,
                path: str | None = None) -> str:
    """How ``backend`` computes the band of ``p`` at ``delta``: the one place that decides it.

    The choice depends on the divergence, the input's type, dtype and device, the kind of
    ``delta`` and the output (``log``: log-edges), never on the data's values, on ``check``
    or on any global setting.  In order, first match wins (the same table is in the docs,
    ``docs/theory/implementation.md``):

    ========  ==================================================================  ==============
    backend   when                                                                path
    ========  ==================================================================  ==============
    numpy     always                                                              exact
    numba     float32/float64 array of size > 0, one valid scalar ``delta``,       closed-pass
              ratios of ``p`` (neither ``logp`` nor ``log``), closed forms of
              both edges with no squaring (``numba_backend.has_closed_pass``)
    numba     float32/float64 array of size > 0, one valid scalar ``delta``        table
    numba     otherwise (per-element ``delta``, a scalar ``p``, other dtypes,      exact
              an invalid ``delta``)
    torch     ``path`` given (tests, benchmarks): that path, if it applies         ``path``
    torch     floating CPU tensor, ``delta`` not on another device, numba          numba
              installed, not being traced by ``torch.compile``
    torch     floating tensor with values (not meta), one valid scalar ``delta``    device-table
              (a number on the host), a device with float64 (not MPS), numba
              installed (it builds the tables)
    torch     otherwise (per-element ``delta`` tensor, MPS, no numba)              device-solver
    ========  ==================================================================  ==============

    Within a path, elements are treated apart by value, never by a choice of path: ``p = 1``
    and ``log p = -inf`` take their limits, the elements a pass or a table cannot vouch for
    go to the exact solver (a fixed-count one, with a static capacity, on devices:
    :data:`fbands.backends.torch_backend.CAPACITY`), and the lower edges that float64
    cannot resolve are refined in extended precision (numpy and numba).

    ``path`` forces one of the torch paths (:data:`PATHS`); a :class:`BandError` says why when
    it does not apply to the input.
    """
    if backend == "numba":
        d = scalar_delta(delta)
        if (
            d is None
            or not valid_delta(d)
            or not isinstance(p, np.ndarray)
            or p.dtype not in (np.float32, np.float64)
            or p.size == 0
        ):
            return EXACT
        from fbands.backends.numba_backend import has_closed_pass

        return CLOSED_PASS if not (logp or log) and has_closed_pass(div) else TABLE
    if backend != "torch":
        return EXACT
    reasons = {NUMBA: _why_not_numba(p, delta), DEVICE_TABLE: _why_not_device_table(p, delta),
               DEVICE_SOLVER: None}
    if path is not None:
        if path not in reasons:
            raise BandError(f"unknown path {path!r} for torch; choose one of {PATHS['torch']}")
        if reasons[path] is not None:
            raise BandError(f"path {path!r} does not apply: {reasons[path]}")
        return path
    return next(name for name, why in reasons.items() if why is None)


def _traced() -> bool:
    torch = sys.modules["torch"]
    return torch.compiler.is_compiling()


def _why_not_numba(p, delta) -> str | None:
    """Why a CPU tensor cannot go to numba (None: it can)."""
    if not _is_float_tensor(p) or p.device.type != "cpu":
        return "p is not a floating-point CPU tensor"
    if _is_tensor(delta) and delta.device.type != "cpu":
        return "delta is on another device"
    if not _numba_usable():
        return "numba is not installed"
    if _traced():
        return "torch.compile is tracing the call"
    return None


def _why_not_device_table(p, delta) -> str | None:
    """Why the tables cannot be read on p's device (None: they can)."""
    if not _is_float_tensor(p):
        return "p is not a floating-point tensor"
    if p.is_meta:
        return "a meta tensor has no values to read the tables with"
    d = scalar_delta(delta)
    if d is None or not valid_delta(d):
        return "delta is not one valid number (a radius per element takes the solver)"
    if work_dtype(p.device) != sys.modules["torch"].float64:
        return f"{p.device.type} has no float64 (the tables are read in float64)"
    if not _numba_usable():
        return "numba is not installed (it builds the tables)"
    return None
