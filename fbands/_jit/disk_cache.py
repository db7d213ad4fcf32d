"""numba's on-disk cache, made to fail soft: a cache file that cannot be read or written
costs a compile, never a call.

numba stores each compiled kernel (``cache=True``) as an index file (``.nbi``) and data
files (``.nbc``), and a damaged, truncated or unreadable one makes every later call raise
(``UnpicklingError``, ``EOFError``, ``PermissionError``, ...) until somebody deletes it; a
full disk or a file size limit makes the compile itself raise after the work is done.
:func:`tolerate` gives the dispatchers of a module a cache that treats any failure to load
as a miss (the damaged index is removed, so the fresh compile is stored in its place) and
any failure to store as "not stored" (the process keeps and uses what it compiled).

The files are pickles, i.e. code: they are loaded only from folders that
:func:`fbands._cache.folder` found private to this user.
"""

from __future__ import annotations

import contextlib
import os

from numba.core.caching import FunctionCache
from numba.core.dispatcher import Dispatcher

__all__ = ["TolerantCache", "tolerate"]


class TolerantCache(FunctionCache):
    """numba's function cache, with every failure to load or store made a miss."""

    def load_overload(self, sig, target_context):
        try:
            return super().load_overload(sig, target_context)
        except Exception:  # damaged, truncated, garbled or unreadable: compile afresh
            self._forget_index()
            return None

    def save_overload(self, sig, data):
        try:
            super().save_overload(sig, data)
        except Exception:  # a full disk, a size limit, a folder gone: not stored
            pass

    def _forget_index(self) -> None:
        """Remove the index (numba would fail on it again, and could not store the
        fresh compile beside it); the data files it named are overwritten in turn."""
        with contextlib.suppress(OSError, AttributeError):
            os.unlink(self._cache_file._index_path)


def tolerate(namespace: dict) -> None:
    """Give every numba dispatcher in ``namespace`` (a module's globals) that caches on
    disk a :class:`TolerantCache`, before its first call."""
    for obj in list(namespace.values()):
        cache = getattr(obj, "_cache", None) if isinstance(obj, Dispatcher) else None
        if isinstance(cache, FunctionCache) and not isinstance(cache, TolerantCache):
            obj._cache = TolerantCache(obj.py_func)
