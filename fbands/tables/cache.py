"""The band tables this process holds: one cache object for every reader.

:data:`TABLES` keeps, per ``(divergence, delta, layout, filler)``, the
:class:`~.build.TableSet` that the numba passes read (built cell by cell as data reaches it,
its points solved by numba's exact solver: :class:`~.build.Filler`), the complete tables
that the torch reader copies to a device (loaded from :mod:`.store` when an earlier process
stored them, else built and stored), their copies on each device, and the lower edge at
``p = 1`` the passes need.  At most :data:`MAX_TABLES` sets are kept; the least recently
used goes first, with everything derived from it.  :data:`TABLES` is part of the process's
state (:data:`fbands._state.STATE`), which clears it with the rest.

When a reader builds a whole set is the table-completion policy (:data:`COMPLETION`), one
attribute of the cache that both readers (the numba pass and the torch device-table path)
ask through :meth:`TableCache.reading_set`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from fbands import _notice, _solver
from fbands._state import STATE
from fbands.errors import BandError
from fbands.tables import layout, store
from fbands.tables.build import LAYOUTS, NUMPY_FILLER, Filler, Table, TableSet

__all__ = ["COMPLETION", "MAX_TABLES", "TABLES", "TableCache"]

#: How many (divergence, delta, layout) table sets are kept (least recently used go first).
#: A complete float64 pair takes about 9 MB and a float32 pair about 2.5 MB; one built for a
#: batch's data holds only the cells the batch reached.
MAX_TABLES = 16

#: The table-completion policies (:attr:`TableCache.completion`), and what each does.
COMPLETION = {
    "on-return": "a radius's first call builds the cells its data reaches (milliseconds, so "
                 "that a radius that changes every call, a schedule's, costs little); its "
                 "next call (the radius came back, as a trainer's fixed one does) completes "
                 "the set once, from the disk cache when an earlier process stored it",
    "first-call": "every call reads complete tables: a radius's first call builds, or "
                  "loads, all of them",
}


class TableCache:
    """Table sets keyed by ``(divergence, delta, layout, filler)``, and what hangs off each:
    its device copies (keyed by device as well) and its limit at ``p = 1`` (by output kind).
    The filler (:class:`~.build.Filler`) is the exact solver of the path that reads the
    set: numpy's by default (the torch reader, the grids), numba's for the numba passes.

    ``completion`` is the table-completion policy, a key of :data:`COMPLETION`.  A cell's
    rows depend on that cell alone, so the policy decides the work, never the bits."""

    def __init__(self, max_sets: int = MAX_TABLES, completion: str = "on-return"):
        if completion not in COMPLETION:
            raise ValueError(f"completion must be one of {', '.join(COMPLETION)}, not "
                             f"{completion!r}")
        self.max_sets = max_sets
        self.completion = completion
        self._lock = threading.RLock()
        self._sets: OrderedDict[tuple, TableSet] = OrderedDict()
        self._derived: dict[tuple, dict] = {}

    def clear(self) -> None:
        """Forget every set (what a fresh process holds)."""
        with self._lock:
            self._sets.clear()
            self._derived.clear()

    def __len__(self) -> int:
        return len(self._sets)

    @staticmethod
    def _key(div, delta: float, layout_name: str, filler: Filler) -> tuple:
        return div.key, float(delta), layout_name, filler.name

    def table_set(self, div, delta: float, layout_name: str = "float64",
                  filler: Filler = NUMPY_FILLER) -> TableSet:
        """The :class:`TableSet` of ``div`` at ``delta`` (nothing built yet when new)."""
        key = self._key(div, delta, layout_name, filler)
        with self._lock:
            found = self._sets.get(key)
            if found is None:
                found = self._put(key, TableSet(div, delta, layout_name, filler))
            self._sets.move_to_end(key)
            return found

    def _put(self, key: tuple, ts: TableSet) -> TableSet:  # (ts.div keeps key[0] alive)
        self._sets[key] = ts
        self._derived[key] = {}
        while len(self._sets) > self.max_sets:
            old, _ = self._sets.popitem(last=False)
            self._derived.pop(old, None)
        return ts

    def reading_set(self, div, delta: float, layout_name: str,
                    reached: Callable[[int], np.ndarray],
                    filler: Filler = NUMPY_FILLER) -> TableSet:
        """The set a reading call of ``div`` at ``delta`` reads, built as the policy
        (:attr:`completion`) says: complete, or with at least the cells that
        ``reached(kbits)`` (a boolean mask of the cells the call's data falls in) marks."""
        ts = self.table_set(div, delta, layout_name, filler)
        if ts.is_complete:
            return ts
        key = self._key(div, delta, layout_name, filler)
        with self._lock:
            derived = self._derived.setdefault(key, {})
            returning = derived.get("read", False)
            derived["read"] = True
        if returning or self.completion == "first-call":
            return self.complete_set(div, delta, layout_name, filler)
        ts.cover(reached(ts.kbits))
        return ts

    def complete(self, div, delta: float, layout_name: str = "float64",
                 filler: Filler = NUMPY_FILLER) -> dict[bool, Table]:
        """The complete tables of ``div`` at ``delta`` (``{log: Table}``): see
        :meth:`complete_set`."""
        return self.complete_set(div, delta, layout_name, filler).modes

    def complete_set(self, div, delta: float, layout_name: str = "float64",
                     filler: Filler = NUMPY_FILLER) -> TableSet:
        """The set of ``div`` at ``delta`` with every cell built: from the private cache
        when an earlier process stored it, else completed from the cells built so far (or
        from none) and stored, so that the next process reads it."""
        ts = self.table_set(div, delta, layout_name, filler)
        if ts.is_complete:
            return ts
        kbits = LAYOUTS[layout_name]["kbits"]
        k = store.key(repr(div.derivation), delta,
                      f"{layout_name} {sorted(LAYOUTS[layout_name].items())} "
                      f"{filler.name} {filler.tag(div)}")
        found = store.load(k, kbits, layout.cell_count(kbits), layout.ROW, Table)
        if found is None:
            _notice.notice(f"building the complete band tables of divergence {div.name!r} at "
                           f"delta={float(delta):g} ({layout_name}), once per machine (later "
                           "runs load them from the disk cache): this may take seconds")
            store.store(k, ts.complete())
            return ts
        with self._lock:
            return self._put(self._key(div, delta, layout_name, filler),
                             TableSet.from_tables(div, delta, layout_name, found, filler))

    def grid(self, div, delta: float, dtype: str, *, wait: bool = True):
        """The :class:`~.grid.Grid` of ``div`` at ``delta`` for ``dtype``: kept with the
        tables of the pair, loaded from the private cache when an earlier process stored
        it, else built (a second or two) and stored; None where it cannot be built (more
        cells than :data:`~.grid.MAX_CELLS`).  ``wait=False``: the first request for a
        grid neither held nor stored returns None at once (:meth:`grid_deferred` then
        says so), and the next request builds it, so that a radius met once (a delta
        schedule's) costs no build."""
        from fbands.tables.grid import GRIDS, build_grid

        key = self._key(div, delta, dtype, NUMPY_FILLER)
        self.table_set(div, delta, dtype)  # (the set the grid is kept with)
        with self._lock:
            derived = self._derived.setdefault(key, {})
            found = derived.get("grid")
        if found is not None:
            return found or None
        k = store.key(repr(div.derivation), delta, f"grid {dtype} {sorted(GRIDS[dtype].items())}")
        found = store.load_grid(k, dtype)
        if found is None:
            with self._lock:
                if not wait and not derived.get("grid_deferred"):
                    derived["grid_deferred"] = True
                    return None
            _notice.notice(f"building the band grid of divergence {div.name!r} at "
                           f"delta={float(delta):g} ({dtype}), once per machine (later runs "
                           "load it from the disk cache): this may take seconds")
            try:
                found = build_grid(div, delta, dtype)
            except BandError:  # (too many cells: the device path reads the tables)
                found = False
            else:
                store.store_grid(k, found)
        with self._lock:
            derived["grid"] = found
            derived.pop("grid_deferred", None)
        return found or None

    def grid_deferred(self, div, delta: float, dtype: str) -> bool:
        """Whether a request with ``wait=False`` put off building this grid, and none has
        been built since."""
        with self._lock:
            derived = self._derived.get(self._key(div, delta, dtype, NUMPY_FILLER), {})
            return bool(derived.get("grid_deferred")) and "grid" not in derived

    def on_device(self, div, delta: float, layout_name: str, log: bool, table: Table,
                  device, to_device):
        """``to_device(table)`` for ``device``, made once per published table (a set that
        gains cells publishes a new one) and kept while its set is."""
        key = self._key(div, delta, layout_name, NUMPY_FILLER)
        with self._lock:
            derived = self._derived.setdefault(key, {})
            found = derived.get(("device", log, device))
            if found is None or found[0] is not table:
                found = derived[("device", log, device)] = (table, to_device(table))
            return found[1]

    def at_one(self, div, delta: float, layout_name: str, log: bool,
               filler: Filler = NUMPY_FILLER) -> float:
        """The lower edge at ``p = 1`` (``log``: its log) by ``filler``'s solver: the limit
        the passes store there (:meth:`fbands.Divergence.lower_limit_at_one`), kept with the
        set of ``layout_name`` and ``filler``."""
        key = self._key(div, delta, layout_name, filler)
        with self._lock:
            derived = self._derived.get(key)
            if derived is not None and ("at_one", log) in derived:
                return derived[("at_one", log)]
        value = _solver.lower_limit_at_one(div, delta, log=log, edges=filler.solve)
        self.table_set(div, delta, layout_name, filler)  # (the set the value is kept with)
        with self._lock:
            self._derived.setdefault(key, {})[("at_one", log)] = value
        return value


#: The process's tables.
TABLES = TableCache()
STATE.adopt("tables", TABLES, "band tables, grids and their device copies, by (divergence "
            "key, delta, layout, filler)")
