"""What this process keeps between calls: one object, :data:`STATE`, owns all of it.

fbands remembers work whose result its key decides, so that a second call does not redo it:
a divergence's kernels bound to a backend's functions, compiled numba modules, band tables
and their copies on each device, grids, small device constants, hashes of the code that
decides a disk-cache key.  Each such cache is a :class:`Memo` made by :meth:`ProcessState.memo`
under a name, with a line that says what it holds; the table cache
(:data:`fbands.tables.cache.TABLES`), which keeps more than a mapping, joins with
:meth:`ProcessState.adopt`.  :meth:`ProcessState.clear` empties all of them at once: what a
fresh process holds, with the disk cache left as it is.

A key names the divergence by :attr:`fbands.Divergence.key` (its name and the exact text of
its generator: what decides its numbers), never by ``id`` (an id can be reused once its
object is gone), and a memo that can grow with the data (one entry per radius, say) keeps at
most ``max_entries``, dropping the oldest first, so that no divergence or radius is held for
the life of the process merely because a call once met it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any, Protocol

__all__ = ["STATE", "Memo", "ProcessState"]


class Memo(dict):
    """One named cache: a dict from keys to values, at most ``max_entries`` of them (None:
    no bound), the oldest dropped first.

    Reads are the dict's own (:meth:`dict.get`, ``in``): a read runs no Python code, and
    ``torch.compile`` traces it without a break once the entry exists.  Writes go through
    :meth:`put` and :meth:`get_or_make`, which keep the bound and hold a lock.
    """

    __slots__ = ("_lock", "doc", "max_entries", "name")

    def __init__(self, name: str, doc: str, max_entries: int | None = None):
        super().__init__()
        self.name, self.doc, self.max_entries = name, doc, max_entries
        self._lock = threading.Lock()

    def put(self, key: Hashable, value: Any) -> Any:
        """Keep ``value`` under ``key`` and return it."""
        with self._lock:
            self._insert(key, value)
        return value

    def get_or_make(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """The value under ``key``, made by ``make()`` and kept when there is none.  Two
        threads may both make it (``make`` runs outside the lock: it may take seconds); the
        values are equal, and the first one kept is the one both return."""
        found = self.get(key, _MISSING)
        if found is not _MISSING:
            return found
        value = make()
        with self._lock:
            found = self.get(key, _MISSING)
            if found is _MISSING:
                found = self._insert(key, value)
        return found

    def _insert(self, key: Hashable, value: Any) -> Any:
        self.pop(key, None)
        while self.max_entries is not None and len(self) >= self.max_entries:
            del self[next(iter(self))]
        self[key] = value
        return value

    def clear(self) -> None:
        with self._lock:
            super().clear()

    def __repr__(self) -> str:
        bound = "" if self.max_entries is None else f"/{self.max_entries}"
        return f"Memo({self.name!r}, {len(self)}{bound} entries)"


_MISSING = object()


class Clearable(Protocol):
    def clear(self) -> None: ...

    def __len__(self) -> int: ...


class ProcessState:
    """Every cache of the process, by name (see the module's text)."""

    def __init__(self) -> None:
        self._parts: dict[str, Memo | Clearable] = {}
        self._docs: dict[str, str] = {}

    def memo(self, name: str, doc: str, max_entries: int | None = None) -> Memo:
        """A new :class:`Memo` owned by this state.  Each module makes its memos once, at
        import; a name already taken is a programming error."""
        memo = Memo(name, doc, max_entries)
        self.adopt(name, memo, doc)
        return memo

    def adopt(self, name: str, part: Clearable, doc: str) -> None:
        """Let this state own ``part``, a cache with its own structure (``clear()`` and
        ``len()`` are all it needs)."""
        if name in self._parts:
            raise ValueError(f"the process state has a part named {name!r} already")
        self._parts[name] = part
        self._docs[name] = doc

    def clear(self) -> None:
        """Empty every cache: what a fresh process holds (the disk cache is kept)."""
        for part in self._parts.values():
            part.clear()

    def sizes(self) -> dict[str, int]:
        """The number of entries of each cache, by name."""
        return {name: len(part) for name, part in self._parts.items()}

    def describe(self) -> dict[str, str]:
        """What each cache holds, by name."""
        return dict(self._docs)

    def __repr__(self) -> str:
        return f"ProcessState({', '.join(f'{k}={v}' for k, v in self.sizes().items())})"


#: The process's state: every cache fbands keeps.
STATE = ProcessState()
