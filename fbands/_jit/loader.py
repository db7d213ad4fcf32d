"""Compiles and imports the numba kernels of one divergence.

Each divergence gets a package in the private cache directory (:func:`cache_dir`): its
leaves (:func:`fbands._jit.codegen.leaves_source`) beside copies of
:mod:`fbands._jit.scalar` and :mod:`fbands._jit.closed_pass`.  The copies are what numba
needs: its on-disk cache (``cache=True``) is keyed by source file, so one file compiled
against the leaves of several divergences would mix their machine code.  They hold the
code alone (:func:`fbands._fingerprint.bare_code`: no comments, no docstrings), so that an
edit of their words leaves their bytes, and numba's cache of them, as they were.  The
folder's name is a hash of the code the compiled kernels depend on (the three files, and
the code, :func:`fbands._fingerprint.code_digest`, of :mod:`fbands._jit.prims`,
:mod:`fbands._solver`, :mod:`fbands._roots` and :mod:`fbands._band_function`, whose names
they import), so a change to any of it compiles afresh, a change of words does not, and a
second process loads the machine code from disk.

Import safety: every file is written by this process, or kept only when its bytes are the
ones this process would write (a damaged or planted file is replaced), and the modules are
imported by path, one by one, so nothing else in the folder is ever imported.

The first compile of a divergence's kernels (and of any other numba code of fbands, such as
the tables' kernels) takes seconds to a minute, once per machine.  A listener of numba's
``numba:compile`` event, which numba sends only when its on-disk cache does not hold the
function, emits one notice saying so (:func:`fbands._notice.notice`) before the compile
starts; a process that loads the kernels from disk prints nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numba
from numba.core import event as _numba_event

from fbands import _band_function, _cache, _notice, _roots, _solver
from fbands._fingerprint import bare_code, code_digest
from fbands._jit import codegen, disk_cache, prims
from fbands._state import STATE

__all__ = ["Kernels", "cache_dir", "is_ready", "kernels", "mark_ready", "package_files",
           "python_kernels"]

_HERE = Path(__file__).resolve().parent
#: The modules compiled against the leaves, in import order.
COMPILED = ("scalar", "closed_pass")
#: Files whose text the compiled code depends on besides those of the package.
_DEPENDS = tuple(Path(m.__file__) for m in (prims, _solver, _roots, _band_function))


@dataclass(frozen=True)
class Kernels:
    """The compiled entry points of one divergence (see :mod:`fbands._jit.scalar` and
    :mod:`fbands._jit.closed_pass`); ``name``, the package's name, hashes their text."""

    name: str
    solve_arrays: object
    trace_arrays: object
    closed_pass: object | None


def cache_dir() -> Path:
    """Where the packages live: :func:`fbands._jit.disk_cache.cache_root`, beside numba's
    cache files of every fbands kernel."""
    return disk_cache.cache_root()


def package_files(div) -> dict[str, bytes]:
    """The files of ``div``'s package: name -> bytes."""
    files = {"__init__.py": b"", "leaves.py": codegen.leaves_source(div).encode()}
    for name in COMPILED:
        files[f"{name}.py"] = _BARE.get_or_make(
            name, lambda n=name: bare_code((_HERE / f"{n}.py").read_text()).encode())
    return files


_BARE = STATE.memo("numba package sources", "the code of each module compiled against a "
                   "divergence's leaves, as its packages copy it, by module name")


def _package_name(div, files: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for name, data in sorted(files.items()):
        h.update(f"{name}\n{len(data)}\n".encode() + data)
    for path in _DEPENDS:
        h.update(f"{path.name} {code_digest(path.read_bytes())}\n".encode())
    safe = "".join(c if c.isalnum() else "_" for c in div.name)
    name = f"fbands_{safe}_{h.hexdigest()[:32]}"
    _DIVERGENCE_OF.put(name, div.name)
    return name


_DIVERGENCE_OF = STATE.memo("numba package divergences", "the name of the divergence of "
                            "each numba package made, by package name (for the compile "
                            "notice)")


def compile_notice(module: str) -> str | None:
    """The notice for a compile of numba code from ``module`` (None: not fbands' code)."""
    package = module.split(".", 1)[0]
    if package in _DIVERGENCE_OF:
        what = f"the numba kernels of divergence {_DIVERGENCE_OF.get(package)!r}"
    elif module == "fbands._jit.table_kernels":
        what = "the numba kernels of the band tables"
    elif module == "fbands" or module.startswith("fbands."):
        what = f"numba kernels ({module})"
    else:
        return None
    return (f"compiling {what}, once per machine (later runs load them from the disk "
            "cache): this may take a minute")


class _CompileListener(_numba_event.Listener):
    """Emits :func:`compile_notice` for the outermost compile only (numba compiles a
    kernel's callees while compiling it): once per process for each divergence, and for
    the kernels that all divergences share only when no notice came before.  numba compiles
    under one global lock, so the depth count needs none of its own."""

    def __init__(self):
        self.depth = 0
        self.told: set[str] = set()

    def on_start(self, event) -> None:
        self.depth += 1
        if self.depth != 1:
            return
        try:
            dispatcher = (event.data or {}).get("dispatcher")
            module = getattr(getattr(dispatcher, "py_func", None), "__module__", None) or ""
            message = compile_notice(module)
            package = module.split(".", 1)[0]
            key = package if package in _DIVERGENCE_OF else module
            # kernels shared by every divergence (the tables'): one notice in a process will do
            shared = key != package and self.told
            if message is not None and key not in self.told and not shared:
                self.told.add(key)
                _notice.notice(message)
        except Exception:  # a notice must never break a compile
            pass

    def on_end(self, event) -> None:
        self.depth -= 1


#: the listener of this process (a test swaps in a fresh one)
LISTENER = _CompileListener()
_numba_event.register("numba:compile", LISTENER)


#: The files of the kernels that every divergence shares (the tables' passes), whose text a
#: precompiled marker stands for, besides the divergence's own package.
_SHARED = ("table_kernels.py", "prims.py", "vmath.py", "threads.py")
_READY = STATE.memo("numba ready", "the (package name, dtype) pairs whose every kernel "
                    "was compiled ahead")
_NAMES = STATE.memo("numba package names", "each divergence's numba package name, by "
                    "divergence key", max_entries=256)


def _marker(div, dtype: str) -> tuple[tuple[str, str], Path]:
    """The key of ``(div, dtype)`` in :data:`_READY` and the file that says, in the private
    cache, that :func:`fbands._jit.backend.precompile` stored all of its kernels there."""
    package = _NAMES.get_or_make(div.key, lambda: _package_name(div, package_files(div)))
    name = f"{package}-{dtype}-{_shared_stamp()}.ready"
    return (package, dtype), cache_dir() / "ready" / name


def _shared_stamp() -> str:
    """A hash of numba's version and of the shared kernels' text (and the tables' layout,
    which they are compiled against)."""
    def stamp():
        from fbands.tables import layout

        h = hashlib.sha256(numba.__version__.encode())
        for path in (*(_HERE / name for name in _SHARED), Path(layout.__file__)):
            h.update(path.read_bytes())
        return h.hexdigest()[:16]

    return _READY.get_or_make("shared stamp", stamp)


def is_ready(div, dtype: str) -> bool:
    """Whether every kernel that a numba call of ``div`` on ``dtype`` arrays can reach was
    compiled ahead (:func:`fbands._jit.backend.precompile`), in this process or into the
    disk cache, so that such a call compiles nothing (``backend="auto"`` asks this)."""
    key, path = _marker(div, dtype)
    if key in _READY:
        return True
    if path.is_file():
        _READY.put(key, True)
        return True
    return False


def mark_ready(div, dtype: str) -> None:
    """Record that :func:`fbands._jit.backend.precompile` compiled ``(div, dtype)``."""
    key, path = _marker(div, dtype)
    _READY.put(key, True)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    _cache.write_file(path, b"")


_LOCK = threading.Lock()
_LOADED = STATE.memo("numba kernels", "each divergence's compiled kernels, by (divergence "
                     "key, pure Python)", max_entries=64)


def kernels(div) -> Kernels:
    """The compiled kernels of ``div`` (numba compiles each on its first call, or loads it
    from its on-disk cache)."""
    return _load(div, python=bool(numba.config.DISABLE_JIT))


def python_kernels(div) -> Kernels:
    """The same kernels as plain Python, run from the files of :mod:`fbands._jit` themselves
    (for tests: the code that the compiled kernels are made from, line by line)."""
    return _load(div, python=True)


def _load(div, *, python: bool) -> Kernels:
    key = (div.key, python)
    found = _LOADED.get(key)
    if found is not None:
        return found
    with _LOCK:  # (one import of a package at a time)
        return _LOADED.get_or_make(key, lambda: _import(div, python))


def _import(div, python: bool) -> Kernels:
    files = package_files(div)
    name = _package_name(div, files)
    folder = cache_dir() / name
    folder.mkdir(mode=0o700, exist_ok=True)
    for fname, data in files.items():
        if not _cache.holds(folder / fname, data) and not _cache.write_file(folder / fname, data):
            raise OSError(f"fbands could not write its kernels to {folder}")
    if python:
        name += "_python"
    package = ModuleType(name)
    package.__path__ = []  # submodules are imported by path below, never searched for
    sys.modules[name] = package
    with _pure_python(python):
        mods = [_exec(f"{name}.leaves", folder / "leaves.py")]
        mods += [_exec(f"{name}.{m}", (_HERE if python else folder) / f"{m}.py")
                 for m in COMPILED]
    if python:  # the math the compiled kernels have: IEEE's, not the exceptions of math's
        for mod in mods:
            vars(mod).update({k: v for k, v in prims.IEEE.items() if k in vars(mod)})
    _, scalar, closed = mods
    return Kernels(name, scalar.solve_arrays, scalar.trace_arrays,
                   closed.closed_pass if div.closed_form_edges else None)


def _exec(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@contextlib.contextmanager
def _pure_python(on: bool):
    """numba's decorators return the plain functions while ``on`` (numba reads
    ``DISABLE_JIT`` when a function is decorated)."""
    before = numba.config.DISABLE_JIT
    numba.config.DISABLE_JIT = bool(on) or before
    try:
        yield
    finally:
        numba.config.DISABLE_JIT = before
