"""The band tables read by torch operations, on any device (the ``device-table`` path).

The reading itself is :func:`.layout.read_array`, written once for numpy and torch (the
numba pass, :mod:`.kernels`, takes the same steps one element at a time); this module keeps
each table's arrays on each device.  Importing it imports torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from fbands._state import STATE, Memo
from fbands.tables import grid, layout
from fbands.tables.cache import MAX_TABLES, TABLES

__all__ = ["DeviceGrid", "DeviceTable", "cells_reached", "device_grid", "device_table", "read",
           "read_grid"]


@dataclass(frozen=True)
class DeviceTable:
    """One table on one device: its arrays as tensors (the coefficients as ``ROW`` columns,
    one per power and edge: :data:`.layout.ROW`), its layout bits, whether any row gives its
    lower edge as an exponential, and the lower edge (or its log) at ``p = 1``."""

    columns: torch.Tensor
    row_code: torch.Tensor
    cells_info: torch.Tensor
    kbits: int
    exp_lo: bool
    at_one: float


_READY = STATE.memo("device tables", "complete band tables on a device, by (divergence key, "
                    "delta, layout, log, device)", max_entries=4 * MAX_TABLES)


def device_table(div, d: float, layout_name: str, log: bool, device, *,
                 reached: Callable[[int], np.ndarray] | None = None) -> DeviceTable:
    """The table of ``div`` at ``d`` on ``device``: with ``reached=None`` the complete one
    (built, or loaded from disk, on the first call; what a traced or captured call must
    read, and all it traces once the entry exists is a plain dict read), else the one the
    table-completion policy gives a call whose data falls in the cells ``reached(kbits)``
    marks (:meth:`fbands.tables.cache.TableCache.reading_set`: by default a radius's first
    call builds those cells only, and the host fix-up solves whatever a partial table
    leaves, so that a radius that changes every call costs milliseconds)."""
    key = (div.key, d, layout_name, bool(log), device)
    found = _READY.get(key)
    if found is not None:
        return found
    if reached is not None:
        ts = TABLES.reading_set(div, d, layout_name, reached)
        if not ts.is_complete:
            return _on_device(div, d, layout_name, log, ts.modes[bool(log)], device)
    table = TABLES.complete(div, d, layout_name)[bool(log)]
    return _READY.put(key, _on_device(div, d, layout_name, log, table, device))


def _on_device(div, d, layout_name, log, table, device) -> DeviceTable:
    def copy(tab):
        columns = np.ascontiguousarray(tab.coef.reshape(-1, layout.ROW).T)
        columns, code, info = (torch.from_numpy(a).to(device) for a in
                               (columns, tab.row_code.astype(np.int64), tab.cells_info))
        return DeviceTable(columns, code, info, tab.kbits, tab.exp_lo,
                           TABLES.at_one(div, d, layout_name, log))

    return TABLES.on_device(div, d, layout_name, log, table, device, copy)


#: torch's functions and types for :func:`.layout.read_array`.
TORCH_OPS = layout.ArrayOps(torch.where, torch.exp, torch.log, torch.expm1, torch.int64,
                            torch.float64, torch.take)


def cells_reached(x, logp: bool, kbits: int) -> np.ndarray:
    """Mask, on the host, of the table cells (of ``kbits``) that the float64 tensor ``x``
    (p, or log p) falls in (:func:`.layout.cells_of`): what a radius's first call builds
    (:meth:`fbands.tables.build.TableSet.cover`)."""
    touched = torch.zeros(layout.cell_count(kbits), dtype=torch.bool, device=x.device)
    touched[layout.cells_of(x, logp, kbits, TORCH_OPS)] = True
    return touched.cpu().numpy()


def read(tab: DeviceTable, x, *, logp: bool, log: bool):
    """``(lower, upper, more)`` of float64 ``x`` (p, or log p) from ``tab``
    (:func:`.layout.read_array` in torch operations, on ``x``'s device)."""
    return layout.read_array(tab, tab.at_one, x, logp=logp, log=log, ops=TORCH_OPS)


@dataclass(frozen=True)
class DeviceGrid:
    """One :class:`~.grid.Grid` on one device: its cut points as a tensor of its dtype, its
    lowest float, and its rows packed as :func:`.grid.pack_rows` does."""

    bounds: torch.Tensor
    lowest: float
    packed: torch.Tensor


_GRIDS = STATE.memo("device grids", "band grids on a device, by (divergence key, delta, "
                    "dtype, device)", max_entries=4 * MAX_TABLES)
#: Grids read while a CUDA graph was captured, kept for the life of the process: the graph
#: may replay reads of their memory (a few hundred kilobytes each at most).  Not a cache, so
#: not part of the process state: :meth:`fbands._state.ProcessState.clear` must not free them.
_CAPTURED = Memo("captured grids", "grids a captured CUDA graph reads")


def _capturing(device) -> bool:
    """Whether a CUDA graph is being captured on ``device``'s current stream (the
    tensor's device, not the current one)."""
    device = torch.device(device)
    if device.type != "cuda":
        return False
    with torch.cuda.device(device):
        return torch.cuda.is_current_stream_capturing()


def device_grid(div, d: float, dtype: str, device, *, wait: bool = True) -> DeviceGrid | None:
    """The grid of ``div`` at ``d`` for ``dtype`` on ``device`` (loaded from the disk
    cache, or built, on the first call of the process); None where no grid meets
    :data:`.grid.FLOAT32_BOUND` (a user's divergence may not), or, with ``wait=False``,
    on a radius's first call when no grid is stored (:meth:`.cache.TableCache.grid`)."""
    key = (div.key, d, dtype, device)
    found = _GRIDS.get(key, _NONE)
    if found is _NONE:
        g = TABLES.grid(div, d, dtype, wait=wait)
        if g is None and TABLES.grid_deferred(div, d, dtype):
            return None  # (not remembered: the next call builds it)
        found = None
        if g is not None and (dtype != "float32" or g.worst <= grid.FLOAT32_BOUND):
            found = DeviceGrid(torch.from_numpy(g.bounds).to(device), float(g.bounds[0]),
                               torch.from_numpy(grid.pack_rows(g.rows)).to(device))
        _GRIDS.put(key, found)
    if found is not None and not torch.compiler.is_compiling() and _capturing(device):
        _CAPTURED.put(key, found)
    return found


_NONE = object()  # (a grid remembered as None: none meets the bound)


def read_grid(g: DeviceGrid, x):
    """``(log lower, log upper)`` of the tensor ``x`` of log-probabilities (in the grid's
    dtype, on its device, any shape): :func:`.grid.read_grid` in torch operations."""
    return grid.read_grid(g.bounds, g.lowest, g.packed, x, torch)
