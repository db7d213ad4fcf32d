"""torch backend: the band on tensors, on any device, with at most one host
synchronisation (none on a device's loss path).

Which way a call is computed is decided by :func:`fbands._dispatch.plan` (the table is in
its docstring and in the docs' implementation notes); this module carries out the five
torch paths, and :func:`fbands._dispatch.compute` calls them:

* ``device-grid`` (log-edges of float32, bf16 or fp16 log-probabilities on a device other
  than the CPU, one scalar ``delta``: a policy loss on a GPU): the grid of the pair
  (:mod:`fbands.tables.grid`), a fixed graph of eighteen aten ops (twelve kernels) with no
  host read (:func:`device_grid`).

* ``device-closed`` (ratios of ``p``, one scalar ``delta``, a divergence whose edges are
  both unsquared closed forms reaching 0: tv, chi2): the roots of those forms in float64
  (:func:`device_closed`), no table; what they leave is finished as on ``device-table``.

* ``device-table`` (a tensor and one scalar ``delta``, not served by the grid or the closed
  forms: the usual call on the CPU, and ratios or float64 on a GPU): the interpolation
  tables of the (divergence, delta) pair (:mod:`fbands.tables`), copied to the device once,
  are read with torch operations (:mod:`fbands.tables.torch_reader`: bit fields, gathers and
  two Horner chains, a few dozen elementwise kernels).  The elements the tables leave (rows
  marked exact, ``log p < LP_CLOSED``) are solved in one of two ways.  Eagerly, one
  synchronisation counts them (and, with ``check=True``, the invalid input), and the numpy
  backend solves them on the host (:func:`_fix_up_on_host`): a count and two small copies,
  where the fixed-count solver costs tens of thousands of kernel launches.  A radius's first
  call builds the cells its data reaches (one more copy to the host: which cells), so that
  every call answers with the same bits; from its second call on, the call reads the
  complete tables (loaded from the disk cache, or built there once).  Nothing on this path
  imports numba: a training process keeps no compiler and no worker threads of fbands'.
  While ``torch.compile`` traces the call or a CUDA graph is captured
  (:func:`fbands._dispatch.must_not_sync`), nothing synchronises: the leftovers are gathered
  by ``torch.nonzero_static`` into a buffer of static size :func:`capacity` and solved by
  the fixed-count solver on the device (:func:`_fix_up`); should more elements need it than
  the buffer holds, those beyond it get nan (never a silently wrong edge).
* ``host`` (a CPU tensor with a ``delta`` per element): the numpy backend's exact solver
  on a zero-copy numpy view (bf16 and fp16 through a float64 copy).
* ``device-solver`` (a per-token ``delta`` tensor on a device, MPS, a traced CPU call): the
  shared solver
  (:mod:`fbands._solver`) on every element, bound to torch through
  :class:`TorchNamespace`, with a fixed number of Newton steps (:data:`NEWTON_STEPS`)
  instead of a data-dependent stop: a fixed graph of elementwise kernels, with no host
  synchronisation (it traces under ``torch.compile(fullgraph=True)``).

Tests and benchmarks force a path with the ``path`` keyword of
:func:`fbands._dispatch.compute` (for instance the device path on CPU tensors, which is how
the tests run every CUDA path here); ``check`` only switches validation, never the path.

Common to all:

* **Validation** (:class:`fbands._inputs.TensorInputs`, the one input contract of every
  backend): ``check=True`` costs one synchronisation (``bad.any()``), to be able to raise.
  An eager call waits for the device at most once: the device-solver path uses that wait
  (or, unchecked, one of its own) to skip the solver branches no element needs.
* **Precision.**  The work is done in float64 (float32 on devices without float64, such as
  Apple's MPS) and the result is cast back to the input's dtype once, so bfloat16 and
  float16 inputs get correctly rounded edges.
* **No autograd graph unless asked.**  The edges are computed under :func:`torch.no_grad`;
  they are constants for the policy loss.  When ``p`` or a ``delta`` tensor requires
  grad (and grad mode is on), the edges carry gradients by the implicit function theorem
  (:class:`ImplicitEdges`): for an edge inside the simplex ``g(p, r) = delta`` gives
  ``dr/dp = -g_p / g_r`` and ``dr/d delta = 1 / g_r``; a saturated edge is ``1 / p`` or
  ``0``.  Nothing is stored for it but the inputs, and the backward pass is a handful of
  elementwise kernels.
* **Device and shape.**  The result lives on ``p``'s device with the broadcast shape of
  ``p`` and ``delta``; ``delta`` may be a float, an array or a per-token tensor.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from fbands._optional import raise_missing

try:
    import torch
except ModuleNotFoundError as exc:
    raise_missing(exc, "the torch backend")

from fbands._band_function import P_CLOSED
from fbands._inputs import (
    Request,
    TensorInputs,
    finish_edges,
    invalid_masks,
    raise_invalid,
    scalar_delta,
)
from fbands._paths import DEVICE_CLOSED, DEVICE_GRID, DEVICE_TABLE, HOST, Plan
from fbands._refine import is_huge
from fbands._roots import lower_root, upper_root
from fbands._solver import Inputs, lower_limit_at_one, solve
from fbands._state import STATE
from fbands.backends import numpy_backend
from fbands.backends.torch_grad import ImplicitEdges
from fbands.errors import BandError
from fbands.tables import torch_reader
from fbands.tables.build import LAYOUTS

__all__ = [
    "MIN_CAPACITY", "NEWTON_STEPS", "ImplicitEdges", "TorchNamespace",
    "capacity", "device_closed", "device_grid", "device_solver", "device_table", "run",
    "to_numpy", "with_grad",
]

#: Newton steps per edge of the fixed-count solver.  Enough for every built-in divergence
#: to reach full float64 accuracy from the solver's initial guess for p in [1e-12, 1 - 1e-9]
#: and delta in [1e-4, 1] (the slowest, kl, needs about 45).
NEWTON_STEPS = 60
#: The fix-up buffer of the sync-free table path holds at least this many elements: on a
#: GPU the fixed-count solver's elementwise kernels cost their launch, not their size,
#: up to about this many float64 elements, so a smaller buffer would save nothing.
MIN_CAPACITY = 1 << 18
#: ... and at least one element in this many: the tables leave about 1e-4 of LLM-shaped
#: data and a few percent at worst on the measured p distributions.
CAPACITY_SHARE = 16


def capacity(n: int) -> int:
    """Size of the sync-free fix-up buffer for ``n`` elements: all of them up to
    :data:`MIN_CAPACITY`, then one in :data:`CAPACITY_SHARE`."""
    return min(n, max(MIN_CAPACITY, -(-n // CAPACITY_SHARE)))


class TorchNamespace:
    """The functions the solver and the generated kernels call, for tensors of one dtype.

    torch's ``where``, ``minimum`` and ``maximum`` do not accept every mix of tensors and
    Python numbers that numpy does; the adapters here fill that gap without creating tensors
    from host data (a Python number becomes a ``full_like`` on the device), so they cost no
    transfer and no synchronisation.
    """

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype
        # Instance attributes, so that ``vars(namespace)`` (what Divergence.kernels reads)
        # lists every binding.
        self.exp, self.expm1, self.log, self.log1p = torch.exp, torch.expm1, torch.log, torch.log1p
        self.sqrt, self.sinh, self.cosh, self.sign = torch.sqrt, torch.sinh, torch.cosh, torch.sign
        self.tanh = torch.tanh
        self.abs, self.isfinite = torch.abs, torch.isfinite
        self.where, self.minimum, self.maximum = self._where, self._minimum, self._maximum

    def _where(self, cond, a, b):
        if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
            a = torch.full_like(cond, a, dtype=self.dtype)
        return torch.where(cond, a, b)

    def _minimum(self, a, b):
        if not isinstance(b, torch.Tensor):
            return torch.clamp(a, max=b)
        if not isinstance(a, torch.Tensor):
            return torch.clamp(b, max=a)
        return torch.minimum(a, b)

    def _maximum(self, a, b):
        if not isinstance(b, torch.Tensor):
            return torch.clamp(a, min=b)
        if not isinstance(a, torch.Tensor):
            return torch.clamp(b, min=a)
        return torch.maximum(a, b)


_NAMESPACES = STATE.memo("torch namespaces", "torch's functions for the generated sources, one "
                        "object per dtype")
_TORCH_KERNELS = STATE.memo("torch kernels", "each divergence's kernels bound to torch, by "
                            "(divergence key, dtype)", max_entries=256)


def _kernels(div, dtype: torch.dtype):
    """``div.kernels`` bound to torch.

    A plain dict read is all that ``torch.compile`` has to trace once the kernels exist;
    the first call for a divergence derives them with sympy, which dynamo cannot trace: an
    eager call first (on the device-table path, a radius's second eager call, which binds
    them with its complete tables: see :func:`device_table`).
    """
    found = _TORCH_KERNELS.get((div.key, dtype))
    if found is None:
        found = _TORCH_KERNELS.put((div.key, dtype), div.kernels(_namespace(dtype)))
    return found


def _namespace(dtype: torch.dtype) -> TorchNamespace:
    return _NAMESPACES.get_or_make(dtype, lambda: TorchNamespace(dtype))


def solve_log_edges(div, x: Inputs, *, tiny: bool = True, at_one: bool = True):
    """``(log lower, log upper)`` for prepared inputs: the fixed-count solver, with no host
    synchronisation.  ``tiny`` and ``at_one`` say whether some element may have ``log p``
    below ``LP_CLOSED`` or ``p == 1`` (see :func:`fbands._solver.solve`): True is always
    right, False skips a branch (for a closed-form divergence, nearly all the work).
    A huge radius (:func:`fbands._refine.is_huge`), whose terms overflow float64 on the
    way to the root (the host paths solve it in extended precision), gives nan."""
    dtype = x.lp.dtype
    lo, hi = solve(div, _namespace(dtype), x, kernels=_kernels(div, dtype),
                   fixed_iter=NEWTON_STEPS, tiny=tiny, at_one=at_one)
    huge = is_huge(torch, x)
    return torch.where(huge, math.nan, lo), torch.where(huge, math.nan, hi)


def to_numpy(p, delta):
    """The ``host`` path's way to the numpy backend and back: ``(x, radius, back)``, a
    numpy view of the CPU tensor ``p`` (bf16 and fp16, which numpy lacks, through float64,
    so that their edges are rounded once), ``delta`` on the host, and the function that
    turns the numpy backend's edges into tensors of ``p``'s dtype."""
    native = p.dtype in (torch.float32, torch.float64)
    x = (p.detach() if native else p.detach().to(torch.float64)).numpy()
    if isinstance(delta, torch.Tensor):
        delta = delta.detach().to(torch.float64).numpy()

    def back(lo, hi):
        lo, hi = torch.from_numpy(np.asarray(lo)), torch.from_numpy(np.asarray(hi))
        return (lo, hi) if native else (lo.to(p.dtype), hi.to(p.dtype))

    return x, delta, back


def wants_grad(p, delta) -> bool:
    """Whether the edges must carry gradients: grad mode is on and ``p`` or a ``delta``
    tensor requires grad."""
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in (p, delta))


def with_grad(div, p, delta, solve, log_edges, *, logp: bool, log: bool):
    """The edges with their derivatives (:class:`ImplicitEdges`): ``solve(p, delta)`` is
    the call itself, ``log_edges(p, delta)`` the log-edges that backward differentiates."""
    if not isinstance(p, torch.Tensor):
        raise BandError("gradients need p as a tensor (delta alone requires grad)")
    radius = delta
    if not isinstance(delta, torch.Tensor):  # float64: the radius is not rounded to p's dtype
        delta = torch.tensor(float(delta), dtype=torch.float64, device=p.device)
    return ImplicitEdges.apply(p, delta, div, radius,
                               (solve, log_edges, logp, log, _namespace, _kernels))


def run(plan: Plan, div, p, delta, request: Request):
    """Carry out ``plan``: one of the torch paths (:data:`~fbands._paths.PATHS`)."""
    if plan.path == HOST:
        x, radius, back = to_numpy(p, delta)
        return back(*numpy_backend.exact(div, x, radius, request))
    if plan.path == DEVICE_GRID:
        return device_grid(div, p, scalar_delta(delta), request, sync=plan.sync)
    if plan.path == DEVICE_TABLE:
        return device_table(div, p, scalar_delta(delta), request, sync=plan.sync,
                            size=plan.capacity)
    if plan.path == DEVICE_CLOSED:
        return device_closed(div, p, scalar_delta(delta), request, sync=plan.sync,
                             size=plan.capacity)
    return device_solver(div, p, delta, request, probe=plan.sync)


def device_solver(div, p, delta, request: Request, *, probe: bool):
    """The ``device-solver`` path: the fixed-count solver on every element.  ``probe``:
    the call may wait for the device once, to skip the branches no element needs."""
    with torch.no_grad():
        x = TensorInputs(p, delta, request, probe=probe)
        return x.finish(*solve_log_edges(div, x.inputs, tiny=x.tiny, at_one=x.at_one))


def device_grid(div, p, d: float, request: Request, *, sync: bool):
    """The ``device-grid`` path (log-edges of log-probabilities, ``logp`` and ``log``
    true): every element read from the float32 grid of ``(div, d)``
    (:mod:`fbands.tables.grid`) on ``p``'s device, a fixed graph of eighteen aten ops with no
    host read; ``check=True`` adds one, to validate.

    A radius new to the process whose grid is not in the disk cache reads the tables on
    its first eager call (``sync``: the cells its tokens reach, milliseconds, and one wait
    for the device), and builds its grid on its second (a second or two, once per
    machine): a delta schedule that moves every step never pays a build.  A divergence
    whose grid misses its bound (none of the built-in ones) always reads the tables."""
    g = torch_reader.device_grid(div, d, "float32", p.device, wait=not sync)
    if g is None:
        return device_table(div, p, d, request, sync=sync)
    with torch.no_grad():
        x = p.to(torch.float32)
        if request.raises:
            bad, _ = invalid_masks(x, d, request.logp)
            if bool(bad.any()):
                raise_invalid(bad, x, False, d, request.logp)
        lo, hi = torch_reader.read_grid(g, x)
        return lo.to(p.dtype), hi.to(p.dtype)


def device_table(div, p, d: float, request: Request, *, sync: bool, size=None):
    """The ``device-table`` path: every element read from the tables, then the exact
    solver on the elements they leave (:func:`_settle`; see the module docstring).
    ``sync``: a radius's first call builds the cells its data reaches (one more copy to the
    host: which cells)."""
    layout = "float64" if p.dtype == torch.float64 else "float32"
    logp, log = request.logp, request.log
    with torch.no_grad():
        x = p.detach().reshape(-1).to(torch.float64)
        # Eagerly, the kernels of the sync-free fix-up are bound too, so that a traced call
        # (which reads complete tables, takes no lock and cannot run sympy) finds them.
        _kernels(div, torch.float64)
        reached = (lambda kbits: torch_reader.cells_reached(x, logp, kbits)) if sync else None
        tab = torch_reader.device_table(div, d, layout, bool(log), x.device, reached=reached)
        lo, hi, more = torch_reader.read(tab, x, logp=logp, log=log)
        return _settle(div, p, x, d, lo, hi, more, request, sync=sync, size=size)


_LIMITS = STATE.memo("closed-form limits", "the lower edge at p = 1 of the device-closed "
                     "path, by (divergence key, delta)", max_entries=256)


def device_closed(div, p, d: float, request: Request, *, sync: bool, size=None):
    """The ``device-closed`` path (ratios of ``p``, a divergence whose edges are both
    unsquared closed forms: :attr:`~fbands.divergences.Divergence.closed_form_edges`): the
    roots of the closed forms on every element, in float64, as the numba closed-form pass
    takes them (:func:`fbands._roots.upper_root`, :func:`fbands._roots.lower_root`, the
    lower edge polished by a Newton step for float64 output), a few dozen elementwise
    kernels and no table.  The elements the roots cannot vouch for (ill-conditioned
    roots, a lower edge below the output's ``small_edge``, ``p`` below
    :data:`fbands._band_function.P_CLOSED`) are finished as on the ``device-table`` path
    (:func:`_settle`)."""
    layout = "float64" if p.dtype == torch.float64 else "float32"
    at_one = _LIMITS.get((div.key, d))
    if at_one is None:  # (eagerly: a traced call finds it here, a plain dict read)
        at_one = _LIMITS.put((div.key, d), lower_limit_at_one(div, d))
    with torch.no_grad():
        x = p.detach().reshape(-1).to(torch.float64)
        forms = _kernels(div, torch.float64)[2]
        q = 1.0 - x
        y, ill_hi = upper_root(torch, forms["upper"], x, q, d)
        r, _, ill_lo = lower_root(torch, forms["lower_y"], forms["lower"], x, q, d,
                                  polish=layout == "float64")
        one = x == 1.0
        doubt = ill_hi | ill_lo | (r.abs() < LAYOUTS[layout]["small_edge"])
        more = (doubt & ~one) | ~((x >= P_CLOSED) & (x <= 1.0))
        lo = torch.where(one, at_one, r.clamp(min=0.0))
        hi = torch.where(one, 1.0, torch.minimum(1.0 + y, 1.0 / x))
        return _settle(div, p, x, d, lo, hi, more, request, sync=sync, size=size)


def _settle(div, p, x, d: float, lo, hi, more, request: Request, *, sync: bool, size):
    """The end of the ``device-table`` and ``device-closed`` paths: ``lo, hi`` (float64,
    flat, of ``x``: ``p``'s values) with the elements marked ``more`` solved exactly,
    invalid ones nan (raised with ``check``), and ``log p = -inf`` at its limit; cast to
    ``p``'s dtype and shape.

    ``sync``: one synchronisation counts the leftovers (and the invalid elements, to raise
    when ``check``), and the numpy backend solves them on the host.  Otherwise they go to
    the fixed-count solver on the device through a buffer of static ``size`` (default
    :func:`capacity`), and any beyond it get nan; ``check`` then synchronises once to
    validate, and nothing else."""
    logp, log = request.logp, request.log
    bad, _ = invalid_masks(x, d, logp)  # (d: a valid number, checked on the host)
    zero = x == -math.inf if logp else None  # the p -> 0 limit [0, inf) (p = 0: invalid)
    more = more & ~(bad if zero is None else bad | zero)
    left = None
    if sync or request.check:  # the one synchronisation
        n_bad, n_more = torch.stack((bad.sum(), more.sum())).tolist()
        if n_bad and request.raises:  # indices of p's own shape
            raise_invalid(bad.reshape(p.shape), x.reshape(p.shape), False, d, logp)
    if sync:
        if n_more:
            lo, hi = _fix_up_on_host(div, x, lo, hi, more, d, request, dtype=p.dtype)
    else:
        size = capacity(x.numel()) if size is None else min(int(size), x.numel())
        if size < x.numel():
            left = more & (torch.cumsum(more, 0) > size)  # beyond the buffer: nan
        if size:
            lo, hi = _fix_up(div, x, d, lo, hi, more, size, logp=logp, log=log)
    if zero is not None:
        lo = torch.where(zero, -math.inf if log else 0.0, lo)
        hi = torch.where(zero, math.inf, hi)
    unknown = bad if left is None else bad | left
    lo = torch.where(unknown, math.nan, lo)
    hi = torch.where(unknown, math.nan, hi)
    return lo.to(p.dtype).reshape(p.shape), hi.to(p.dtype).reshape(p.shape)


def _fix_up(div, x, d: float, lo, hi, more, size: int, *, logp, log):
    """``lo, hi`` with the first ``size`` elements marked ``more`` solved exactly, with no
    synchronisation: ``nonzero_static`` pads its index list with -1, and the padding slots
    repeat the first real index (so every write to a position carries the same value), or,
    when there is none, rewrite position 0 with its own values."""
    idx = torch.nonzero_static(more, size=size, fill_value=-1).reshape(-1)
    real = idx >= 0
    any_real = real[:1]  # the list is sorted: one real index iff the first is
    safe = torch.where(real, idx, idx[:1].clamp(min=0))
    sub = TensorInputs(x[safe], d, Request(logp=logp, invalid="nan", check=False))
    # p == 1 never needs the solver here (the table holds its limit)
    s_lo, s_hi = solve_log_edges(div, sub.inputs, at_one=False)
    s_lo, s_hi = finish_edges(torch, sub.inputs, s_lo, s_hi, None, log=log)
    lo = lo.index_put((safe,), torch.where(any_real, s_lo, lo[safe]))
    hi = hi.index_put((safe,), torch.where(any_real, s_hi, hi[safe]))
    return lo, hi


def _fix_up_on_host(div, x, lo, hi, more, d: float, request: Request, *, dtype):
    """``lo, hi`` with every element marked ``more`` solved on the host by the numpy
    backend's exact solver (after the call's synchronisation: a copy of those few elements
    each way, where the device's fixed-count solver costs thousands of kernel launches)."""
    idx = torch.nonzero(more).reshape(-1)
    sub = x[idx].cpu().numpy()  # float64: p's values exactly
    # float32 p as a float32 array: the numpy backend's answer for that array (its dtype
    # decides the output's rounding); other dtypes in float64, rounded once afterwards
    work = sub.astype(np.float32) if dtype == torch.float32 else sub
    s_lo, s_hi = numpy_backend.exact(div, work, d, replace(request, invalid="nan",
                                                           check=False))
    lo = lo.index_put((idx,), torch.from_numpy(s_lo).to(lo.device, lo.dtype))
    hi = hi.index_put((idx,), torch.from_numpy(s_hi).to(hi.device, hi.dtype))
    return lo, hi
