"""numba's on-disk cache for fbands' kernels: in fbands' private folder only, and failing soft.

**Where.** numba stores each compiled kernel (``cache=True``) as an index file (``.nbi``)
and data files (``.nbc``), and loads them with pickle, i.e. as code.  Left to itself it
chooses the folder from the environment: ``NUMBA_CACHE_DIR`` when set (often a shared
folder such as ``/tmp/numba`` on clusters and in containers), else ``__pycache__`` next to
the source, else the user's cache.  A folder that another user can write would let that
user run code in this process.  :class:`PrivateCache` ignores all of that: every cache file
of an fbands kernel lives under :func:`cache_root`, the ``numba`` folder of
:func:`fbands._cache.folder` (a directory private to this user, or one of this process
alone), whatever ``NUMBA_CACHE_DIR`` or ``NUMBA_CACHE_LOCATOR_CLASSES`` say.

**Failing soft.** A damaged, truncated or unreadable cache file makes numba raise on every
later call (``UnpicklingError``, ``EOFError``, ``PermissionError``, ...) until somebody
deletes it, and a full disk makes the compile itself raise after the work is done.
:class:`PrivateCache` treats any failure to load as a miss (the damaged index is removed, so
the fresh compile is stored in its place) and any failure to store as "not stored" (the
process keeps and uses what it compiled).

:func:`tolerate` gives every caching dispatcher of a module this cache, before its first
call (numba's own cache object, made when the function was decorated, has read nothing).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
from pathlib import Path

from numba.core.caching import (
    CompileResultCacheImpl,
    FunctionCache,
    _CacheLocator,
    _SourceFileBackedLocatorMixin,
)
from numba.core.dispatcher import Dispatcher

from fbands import _cache

__all__ = ["PrivateCache", "cache_root", "tolerate"]


def cache_root() -> Path:
    """The folder of fbands' numba code and cache files: ``numba`` in the private cache
    directory, or a directory of this process alone when that is not safe to use
    (:func:`fbands._cache.folder`)."""
    return _cache.folder("numba")


class _PrivateLocator(_SourceFileBackedLocatorMixin, _CacheLocator):
    """The cache files of the functions of one source file: a subfolder of
    :func:`cache_root` named after the file's folder (numba's own naming), checked against
    the hash of the file's text (numba's source stamp)."""

    def __init__(self, py_func, py_file):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._cache_path = str(cache_root() / self.get_suitable_cache_subpath(py_file))

    def get_cache_path(self) -> str:
        return self._cache_path


class _PrivateImpl(CompileResultCacheImpl):
    """numba's cache implementation with the one locator above, never the ones the
    environment names."""

    def __init__(self, py_func):
        self._lineno = py_func.__code__.co_firstlineno
        source = inspect.getfile(py_func)
        self._locator = _PrivateLocator.from_function(py_func, source)
        if self._locator is None:
            raise OSError(f"fbands cannot cache its kernels in {cache_root()}")
        module = os.path.splitext(os.path.basename(source))[0]
        self._filename_base = self.get_filename_base(f"{module}.{py_func.__qualname__}",
                                                     getattr(sys, "abiflags", ""))


class PrivateCache(FunctionCache):
    """numba's function cache, kept in :func:`cache_root`, with every failure to load or
    store made a miss."""

    _impl_class = _PrivateImpl

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
    disk a :class:`PrivateCache`, before its first call."""
    for obj in list(namespace.values()):
        cache = getattr(obj, "_cache", None) if isinstance(obj, Dispatcher) else None
        if isinstance(cache, FunctionCache) and not isinstance(cache, PrivateCache):
            obj._cache = PrivateCache(obj.py_func)
