"""How a band is computed: the one decision (:func:`plan`) and the one call (:func:`compute`).

The public doors (:func:`fbands.bounds`, :func:`fbands.log_bounds`) come here; from here the
call runs one way, to a backend's implementation of one path, and no backend calls back.
:func:`plan` reads the decision table below from the divergence, the input's type, dtype
and device, the kind of ``delta`` and the output (and, for ``backend="auto"`` on a large
array, whether numba's kernels were compiled ahead), never from the data's values, from
``check`` or from a global setting; :func:`compute` validates what only it can, carries
out the plan, and wraps it for autograd when a tensor requires grad.
"""

from __future__ import annotations

import importlib
import math
import sys
from dataclasses import replace
from typing import Any

import numpy as np

from fbands._checks import is_positive
from fbands._inputs import Request, check_kind, is_tensor, scalar_delta, work_dtype
from fbands._optional import raise_missing
from fbands._paths import (
    CLOSED_PASS,
    DEVICE_CLOSED,
    DEVICE_GRID,
    DEVICE_SOLVER,
    DEVICE_TABLE,
    EXACT,
    HOST,
    PATHS,
    TABLE,
    Plan,
)
from fbands._refine import HUGE_DELTA
from fbands.divergences import Divergence, get
from fbands.errors import BandError

__all__ = ["BACKENDS", "PATHS", "Plan", "backend_module", "compute", "plan"]

#: Backend name -> module holding its paths.
BACKENDS = {
    "numpy": "fbands.backends.numpy_backend",
    "numba": "fbands._jit.backend",
    "torch": "fbands.backends.torch_backend",
    "cvxpy": "fbands.backends.cvxpy_backend",
}

#: ``backend="auto"`` hands arrays of at least this many elements to numba once the
#: kernels of their divergence and dtype were compiled ahead (:func:`fbands.precompile`):
#: below it the numpy solver takes at most a few tens of milliseconds; above it numba's
#: compiled passes, tens of times faster, pay.  Without compiled kernels the numpy solver
#: answers every size: no call waits on a compile (up to a minute, once per machine) that
#: it did not ask for.
NUMBA_FROM = 1 << 16
#: The smallest radius that the tables serve.  Below it a complete table takes the numpy
#: solver seconds to minutes to build (most cells need subrows, their elements many
#: Newton steps), far beyond what its calls would save; those radii take the exact solver.
TABLE_DELTA_MIN = 1e-6
#: What an invalid element may do.
INVALID = ("raise", "nan")


def plan(div: Divergence, p: Any, delta: Any, *, backend: str = "auto", logp: bool,
         log: bool, path: str | None = None, sync_free: bool | None = None) -> Plan:
    """The :class:`Plan` of one call; the first row that matches wins (the same table is in
    the docs, ``docs/theory/implementation.md``):

    ========  ==================================================================  ==============
    backend   when                                                                path
    ========  ==================================================================  ==============
    auto      a tensor: torch; an array of at least :data:`NUMBA_FROM` elements:
              numba when its kernels for the array's divergence and dtype were
              compiled ahead (:func:`fbands.precompile`); else numpy
    numpy     always                                                              exact
    cvxpy     always                                                              exact
    numba     float32/float64 array of size > 0, one valid scalar ``delta`` below  closed-pass
              :data:`~fbands._refine.HUGE_DELTA`,
              ratios of ``p`` (neither ``logp`` nor ``log``), closed forms of
              both edges with no squaring (:attr:`Divergence.closed_form_edges`)
    numba     float32/float64 array of size > 0, one valid scalar ``delta`` of     table
              at least :data:`TABLE_DELTA_MIN`
    numba     otherwise (per-element ``delta``, a scalar ``p``, other dtypes,      exact
              an invalid or smaller ``delta``)
    torch     ``path`` given (tests, benchmarks): that path, if it applies         ``path``
    torch     float32/bf16/fp16 tensor of log p not on the CPU (meta included),    device-grid
              log-edges, one valid scalar ``delta`` of at least
              :data:`TABLE_DELTA_MIN`
    torch     floating tensor (meta included), ratios of ``p``, one valid scalar  device-closed
              ``delta`` below :data:`~fbands._refine.HUGE_DELTA`, closed forms of
              both edges with no squaring and a finite ``f(0)`` (tv, chi2), a
              device with float64
    torch     floating tensor with values (not meta), one valid scalar ``delta``    device-table
              (a number on the host) of at least :data:`TABLE_DELTA_MIN`, a device
              with float64 (not MPS); the CPU included
    torch     floating CPU tensor, ``delta`` not on another device, not being      host
              traced by ``torch.compile``
    torch     otherwise (per-element ``delta`` on a device, MPS, traced)           device-solver
    ========  ==================================================================  ==============

    On the torch device paths, ``sync`` is False while ``torch.compile`` traces the call
    or a CUDA graph is captured (:func:`must_not_sync`), when ``sync_free`` says so, and
    for a meta tensor.  (``check=True`` synchronises to validate in any case, and changes
    nothing else.)

    Within a path, elements are treated apart by value, never by a choice of path:
    ``p = 1`` and ``log p = -inf`` take their limits, the elements a pass or a table
    cannot vouch for go to the exact solver, and the lower edges that float64 cannot
    resolve are refined in extended precision (numpy and numba).
    """
    if backend == "auto":
        if is_tensor(p):
            backend = "torch"
        else:
            backend = "numba" if _numba_ready(div, p) else "numpy"
    if backend not in BACKENDS:
        raise BandError(f"unknown backend {backend!r}; choose one of {['auto', *BACKENDS]}")
    if is_tensor(p) and backend != "torch":
        raise BandError(f"backend {backend!r} takes numpy arrays or floats, not torch tensors")
    if backend == "numba":
        return Plan("numba", _numba_path(div, p, delta, logp=logp, log=log))
    if backend != "torch":
        return Plan(backend, EXACT)
    backend_module("torch")  # (without torch: an error that names the extra to install)
    reasons = {DEVICE_GRID: _why_not_device_grid(p, delta, logp=logp, log=log),
               DEVICE_CLOSED: _why_not_device_closed(div, p, delta, logp=logp, log=log),
               DEVICE_TABLE: _why_not_device_table(p, delta), HOST: _why_not_host(p, delta),
               DEVICE_SOLVER: None}
    if path is None and reasons[DEVICE_GRID] is None and p.device.type == "cpu":
        reasons[DEVICE_GRID] = "a CPU tensor reads the tables (the numpy backend's bits)"
    if path is None:
        path = next(name for name, why in reasons.items() if why is None)
    elif path not in reasons:
        raise BandError(f"unknown path {path!r} for torch; choose one of {PATHS['torch']}")
    elif reasons[path] is not None:
        raise BandError(f"path {path!r} does not apply: {reasons[path]}")
    if path == HOST:
        return Plan("torch", HOST)
    device = p.device if is_tensor(p) else "cpu"  # (a float or an array: a CPU tensor)
    sync = not (must_not_sync(device) if sync_free is None else sync_free)
    if is_tensor(p) and p.is_meta:  # no values to wait for
        sync = False
    return Plan("torch", path, sync=sync)


def _numba_path(div, p, delta, *, logp: bool, log: bool) -> str:
    d = scalar_delta(delta)
    if (d is None or not is_positive(d) or not isinstance(p, np.ndarray)
            or p.dtype not in (np.float32, np.float64) or p.size == 0):
        return EXACT
    if not (logp or log) and d < HUGE_DELTA and div.closed_form_edges:
        return CLOSED_PASS
    return TABLE if d >= TABLE_DELTA_MIN else EXACT


def compute(method: str, div: str | Divergence, p: Any, delta: Any, backend: str = "auto", *,
            logp: bool = False, invalid: str = "raise", check: bool = True,
            path: str | None = None, capacity: int | None = None,
            sync_free: bool | None = None):
    """The edges (``method`` ``"edges"``) or log-edges (``"log_edges"``) of the band, as
    :func:`fbands.bounds` documents.  For tests and benchmarks, ``path`` forces a torch path,
    ``sync_free`` forces whether a torch device path may synchronise, and ``capacity`` sets
    the size of the sync-free fix-up buffer of ``device-table``
    (:func:`fbands.backends.torch_backend.capacity`)."""
    if invalid not in INVALID:
        raise BandError(f"invalid must be one of {INVALID}, got {invalid!r}")
    for name, value in (("p", p), ("delta", delta)):
        check_kind(name, value, check)
    request = Request(logp=logp, log=method == "log_edges", invalid=invalid, check=check)
    divergence = get(div)
    chosen = plan(divergence, p, delta, backend=backend, logp=logp, log=request.log, path=path,
                  sync_free=sync_free)
    if capacity is not None:
        chosen = replace(chosen, capacity=capacity)
    runner = backend_module(chosen.backend)
    if chosen.backend == "torch" and runner.wants_grad(p, delta):
        def solve(x, radius):  # the call itself, on detached inputs
            return runner.run(chosen, divergence, x, radius, request)

        def log_edges(x, radius):  # what the backward pass differentiates
            return compute("log_edges", divergence, x, radius, "torch", logp=logp,
                           invalid="nan", check=False)

        return runner.with_grad(divergence, p, delta, solve, log_edges, logp=logp,
                                log=request.log)
    return runner.run(chosen, divergence, p, delta, request)


def backend_module(name: str):
    """The module of backend ``name`` (:data:`BACKENDS`), imported on first use; an error
    that says which extra to install where its library is missing."""
    found = sys.modules.get(BACKENDS[name])
    if found is not None:
        return found
    try:
        return importlib.import_module(BACKENDS[name])
    except ModuleNotFoundError as exc:  # numba (a core dependency) gone: say how to restore it
        raise_missing(exc, f"backend {name!r}")
        raise


def _size(p) -> int:
    """How many elements ``p`` holds (0 for what is no array: the backend says why)."""
    try:
        return int(np.size(p))
    except (TypeError, ValueError):
        return 0


def _numba_ready(div: Divergence, p) -> bool:
    """``backend="auto"``'s choice of numba for ``p``: an array of at least
    :data:`NUMBA_FROM` elements whose kernels were compiled ahead (:func:`fbands.precompile`),
    so that the call compiles nothing."""
    if _size(p) < NUMBA_FROM or not _numba_usable():
        return False
    dtype = "float32" if getattr(p, "dtype", None) == np.float32 else "float64"
    return backend_module("numba").is_ready(div, dtype)


def _numba_usable() -> bool:
    if BACKENDS["numba"] in sys.modules:  # (a dict lookup: torch.compile traces it)
        return True
    try:
        importlib.import_module(BACKENDS["numba"])
    except ImportError:
        return False
    return True


def _torch():
    return sys.modules["torch"]


def must_not_sync(device) -> bool:
    """Whether a call may not wait for ``device``: while ``torch.compile`` traces it, or
    while a CUDA graph is captured on the current stream (the uses of a sync-free call)."""
    torch = _torch()
    if torch.compiler.is_compiling():
        return True
    return torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing()


def _is_float_tensor(x: Any) -> bool:
    return is_tensor(x) and x.is_floating_point()


def _why_not_host(p, delta) -> str | None:
    """Why a tensor cannot go to the numpy backend through a view (None: it can)."""
    if not _is_float_tensor(p) or p.device.type != "cpu":
        return "p is not a floating-point CPU tensor"
    if is_tensor(delta) and delta.device.type != "cpu":
        return "delta is on another device"
    if _torch().compiler.is_compiling():
        return "torch.compile is tracing the call"
    return None


def _one_radius(delta) -> float | None:
    """``delta`` as one valid radius held on the host, or None.  Compared, not passed to
    ``math.isfinite``: under ``torch.compile`` a radius that changed between calls is a
    symbolic float, which comparisons guard and ``math`` cannot read."""
    d = scalar_delta(delta)
    return d if d is not None and 0 < d < math.inf else None


def _why_not_device_grid(p, delta, *, logp: bool, log: bool) -> str | None:
    """Why the grid cannot be read on p's device (None: it can)."""
    if not _is_float_tensor(p):
        return "p is not a floating-point tensor"
    d = _one_radius(delta)
    if d is None:
        return "delta is not one valid number (a radius per element takes the solver)"
    if d < TABLE_DELTA_MIN:
        return f"grids serve radii from {TABLE_DELTA_MIN:g} on (delta is {d:g})"
    if not (logp and log) or p.dtype == _torch().float64:
        return "grids serve log-edges of float32, bfloat16 and float16 log-probabilities"
    return None


def _why_not_device_closed(div: Divergence, p, delta, *, logp: bool,
                           log: bool) -> str | None:
    """Why the closed forms cannot serve the call on p's device (None: they can)."""
    if not _is_float_tensor(p):
        return "p is not a floating-point tensor"
    d = _one_radius(delta)
    if d is None:
        return "delta is not one valid number (a radius per element takes the solver)"
    if d >= HUGE_DELTA:
        return f"radii from {HUGE_DELTA:g} on take the exact solver (delta is {d:g})"
    if logp or log:
        return "the closed-form path gives ratios of p"
    if not (div.closed_form_edges and math.isfinite(div.f0)):
        # (An infinite f(0): a lower edge that only tends to 0, whose small values, a few
        # percent of LLM-shaped tokens, the closed forms leave to the host; the tables
        # serve them.)
        return f"{div.name}'s edges are not both unsquared closed forms reaching r = 0"
    if work_dtype(p.device) != _torch().float64:
        return f"{p.device.type} has no float64 (the closed forms are solved in float64)"
    return None


def _why_not_device_table(p, delta) -> str | None:
    """Why the tables cannot be read on p's device (None: they can)."""
    if not _is_float_tensor(p):
        return "p is not a floating-point tensor"
    if p.is_meta:
        return "a meta tensor has no values to read the tables with"
    d = _one_radius(delta)
    if d is None:
        return "delta is not one valid number (a radius per element takes the solver)"
    if d < TABLE_DELTA_MIN:
        return f"tables serve radii from {TABLE_DELTA_MIN:g} on (delta is {d:g})"
    if work_dtype(p.device) != _torch().float64:
        return f"{p.device.type} has no float64 (the tables are read in float64)"
    return None
