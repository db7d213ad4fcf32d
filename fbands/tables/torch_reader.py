"""The band tables read by torch operations, on any device (the ``device-table`` path).

The same reading as the numba pass (:mod:`.kernels`), step for step through the same layout
(:func:`.layout.prepare_z_array`, :func:`.layout.locate_array`): the cell from the bits of
``z = min(p, 1 - p)``, the coordinate from the remaining mantissa bits, two Horner chains
(the lower one exponentiated on rows so marked), ``1 / p`` (or ``-log p``) where the upper
edge is saturated, and the limit ``(at_one, 1)`` at ``p == 1``.  Importing this module
imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from fbands._solver import LP_CLOSED
from fbands.tables import layout
from fbands.tables.cache import TABLES

__all__ = ["DeviceTable", "cells_reached", "device_table", "read"]


@dataclass(frozen=True)
class DeviceTable:
    """One table on one device: its arrays as tensors, its layout bits, whether any row
    gives its lower edge as an exponential, and the lower edge (or its log) at ``p = 1``."""

    coef: torch.Tensor
    row_code: torch.Tensor
    cells_info: torch.Tensor
    kbits: int
    exp_lo: bool
    at_one: float


#: Complete tables already on a device, by (divergence name, delta, layout, log, device):
#: plain dict reads (and an identity check of the divergence), which is all that
#: ``torch.compile`` has to trace once an entry exists.  Entries follow the table cache's
#: sets (:meth:`fbands.tables.cache.TableCache.on_device` holds the tensors).
_READY: dict[tuple, tuple] = {}


def device_table(div, d: float, layout_name: str, log: bool, device, *,
                 complete: bool) -> DeviceTable:
    """The table of ``div`` at ``d`` on ``device``: the complete one (built, or loaded
    from disk, on the first call; what a traced or captured call must read), or with
    ``complete=False`` the cells built so far for a radius new to the process (the host
    fix-up builds those its elements reach, so a radius that changes every call costs
    milliseconds, not a complete build), and the complete one once a call has read the
    radius (:attr:`fbands.tables.build.TableSet.met`)."""
    key = (div.name, d, layout_name, bool(log), device)
    found = _READY.get(key)
    if found is not None and found[0] is div:
        return found[1]
    ts = TABLES.table_set(div, d, layout_name)
    if not complete and not ts.met:
        return _on_device(div, d, layout_name, log, ts.modes[bool(log)], device)
    out = _on_device(div, d, layout_name, log, TABLES.complete(div, d, layout_name)[bool(log)],
                     device)
    while len(_READY) >= 4 * TABLES.max_sets:
        del _READY[next(iter(_READY))]
    _READY[key] = (div, out)
    return out


def _on_device(div, d, layout_name, log, table, device) -> DeviceTable:
    def copy(tab):
        coef, code, info = (torch.from_numpy(a).to(device) for a in
                            (tab.coef, tab.row_code.astype(np.int64), tab.cells_info))
        return DeviceTable(coef, code, info, tab.kbits, tab.exp_lo,
                           TABLES.at_one(div, d, layout_name, log))

    return TABLES.on_device(div, d, layout_name, log, table, device, copy)


def cells_reached(x, logp: bool, kbits: int) -> np.ndarray:
    """Mask, on the host, of the table cells (of ``kbits``) that the float64 tensor ``x``
    (p, or log p) falls in: what a radius's first call builds
    (:meth:`fbands.tables.build.TableSet.cover`).  Elements outside the tables' domain
    count as :data:`.layout.FILL_P` does, as in the numba backend's cell scan."""
    closed = LP_CLOSED if logp else math.exp(LP_CLOSED)
    _, z, high, _ = layout.prepare_z_array(x, logp, closed, torch.where, torch.exp,
                                           torch.expm1)
    touched = torch.zeros(layout.cell_count(kbits), dtype=torch.bool, device=x.device)
    touched[layout.cell_array(z.view(torch.int64), high, kbits, torch.where)] = True
    return touched.cpu().numpy()


def read(tab: DeviceTable, x, *, logp: bool, log: bool):
    """``(lower, upper, more)`` of float64 ``x`` (p, or log p) from ``tab``; ``more`` marks
    the elements to solve exactly: rows marked so, invalid input, and ``p`` (``log p``)
    below ``LP_CLOSED``, the solver's tails."""
    closed = LP_CLOSED if logp else math.exp(LP_CLOSED)
    p, z, high, valid = layout.prepare_z_array(x, logp, closed, torch.where, torch.exp,
                                               torch.expm1)
    if log:  # (0.0 - : log 1 gives +0.0)
        top = 0.0 - (torch.where(valid, x, 0.0) if logp else torch.log(p))
    else:
        top = 1.0 / p
    one = x == (0.0 if logp else 1.0)
    row, u = layout.locate_array(z.view(torch.int64), high, tab.cells_info, tab.kbits,
                                 torch.where, torch.float64)
    k = row * layout.ROW
    coef = tab.coef
    lo, hi = coef[k], coef[k + 1]
    for i in range(1, layout.DEG + 1):
        lo = lo * u + coef[k + 2 * i]
        hi = hi * u + coef[k + 2 * i + 1]
    code = tab.row_code[row]
    if tab.exp_lo:  # rows whose lower polynomial is of log r
        lo = torch.where((code & layout.ROW_EXP_LO) != 0, torch.exp(lo), lo)
    hi = torch.where(((code & layout.ROW_TOP) != 0) | one, top, hi)
    lo = torch.where(one, tab.at_one, lo)
    more = (((code & layout.ROW_EXACT) != 0) & ~one) | ~valid
    return lo, hi, more
