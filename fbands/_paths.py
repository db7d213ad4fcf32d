"""The paths a band can take, and the plan of one call.

The dispatch (:func:`fbands._dispatch.plan`) chooses a :class:`Plan`; the backend it names
carries it out.  Both sides read the path names from here, so neither imports the other,
and the dispatch knows no backend's insides: every backend module offers the same
operation,

* ``run(plan, div, p, delta, request)``: the band of one call along ``plan.path``, with
  what the call asks besides its data in ``request`` (:class:`fbands._inputs.Request`);

and two backends answer a question that only they can, for the plan or for autograd:
numba ``is_ready(div, dtype)`` (compiled ahead), torch ``wants_grad(p, delta)`` and
``with_grad(...)``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CLOSED_PASS", "DEVICE_CLOSED", "DEVICE_GRID", "DEVICE_SOLVER", "DEVICE_TABLE",
           "EXACT", "HOST", "PATHS", "TABLE", "Plan"]

#: numba: the closed forms of both edges, chosen and clamped without a branch, in one pass.
CLOSED_PASS = "closed-pass"
#: numba: the interpolation tables of the (divergence, delta) pair, in one pass.
TABLE = "table"
#: numba, numpy or cvxpy: every element by the exact solver (closed form or safeguarded
#: Newton, refined in extended precision where float64 cannot resolve a lower edge).
EXACT = "exact"
#: torch: the tables read by torch operations on the tensor's device (the CPU included);
#: the elements they leave are solved on the host by the numpy backend after one
#: synchronisation, or, where the call may not synchronise (traced, or captured in a CUDA
#: graph), by the fixed-count solver on the device.
DEVICE_TABLE = "device-table"
#: torch: the grid of the (divergence, delta) pair read on the tensor's device, a fixed
#: graph of eighteen aten ops (twelve kernels) with no host read
#: (:mod:`fbands.tables.grid`).
DEVICE_GRID = "device-grid"
#: torch: the closed forms of both edges on the tensor's device, in float64, as numba's
#: closed-form pass takes them; the elements they cannot vouch for are finished as on
#: ``device-table``.
DEVICE_CLOSED = "device-closed"
#: torch: a CPU tensor with a radius per element, handed to the numpy backend's exact
#: solver through a zero-copy numpy view.
HOST = "host"
#: torch: the exact fixed-count solver on every element.
DEVICE_SOLVER = "device-solver"
#: The paths of each backend.
PATHS = {
    "numpy": (EXACT,),
    "cvxpy": (EXACT,),
    "numba": (CLOSED_PASS, TABLE, EXACT),
    "torch": (DEVICE_GRID, DEVICE_CLOSED, DEVICE_TABLE, HOST, DEVICE_SOLVER),
}


@dataclass(frozen=True)
class Plan:
    """The whole decision for one call.

    ``backend`` and ``path``: who computes it and how (:data:`PATHS`).  ``sync``: on the
    torch device paths, whether the call may wait for the device, once: to count and solve
    on the host what the tables or the closed forms leave (``device-table``,
    ``device-closed``), and to skip the solver branches no element needs
    (``device-solver``); a traced or captured call may not, and does both on the device.
    ``capacity`` (tests and benchmarks): the size of the sync-free fix-up buffer of
    ``device-table`` and ``device-closed`` (None:
    :func:`fbands.backends.torch_backend.capacity`).
    """

    backend: str
    path: str
    sync: bool = True
    capacity: int | None = None
