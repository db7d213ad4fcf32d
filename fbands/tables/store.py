"""The band tables on disk, so that a fresh process reads them.

Building the tables of one ``(divergence, delta, layout)`` solves a few hundred thousand
points exactly (a second or more on a small machine); each fresh process with the same
radius (every Ray worker of a training job) would pay it again.  They are stored in the
private cache directory (:func:`fbands._cache.private_dir`, ``tables/``) as plain numeric
arrays (``.npz``, read with ``allow_pickle=False``), next to a JSON record (checked by
:func:`fbands._cache.read_json`) that holds the archive's sha256 and size: an archive is
loaded only when its bytes hash to the recorded value, and its arrays have the expected
types and shapes.  The key hashes the divergence's derivation (the formulas and constants
that its kernels are made from, :class:`fbands.symbolic.Derivation`), the code that builds
tables, numpy's version, ``delta`` and the layout.  At most
:data:`MAX_FILES` archives are kept (least recently used go first).
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import numpy as np

from fbands import _cache
from fbands._fingerprint import package_fingerprint
from fbands.tables import layout

__all__ = ["key", "load", "load_grid", "store", "store_grid"]

#: Archives kept in the directory (a float64 pair is about 9 MB, a float32 pair 2.5 MB).
MAX_FILES = 32

#: The code that builds tables and grids: the layouts, the fits and the array solver.
_BUILDERS = ("build.py", "layout.py", "grid.py", "../_solver.py", "../_band_function.py",
             "../_refine.py")


def _code_hash() -> str:
    """The code of :data:`_BUILDERS` (comments and docstrings aside) and numpy's version."""
    here = Path(__file__).resolve().parent
    return package_fingerprint("tables", (here / name for name in _BUILDERS), np.__version__)


def key(derivation: str, delta: float, layout: str) -> str:
    """Key of the tables of the divergence whose derivation prints as ``derivation`` (its
    generator's formulas and constants, all that its kernels are made from) at ``delta`` in
    ``layout``."""
    text = f"{_code_hash()}\n{derivation}\n{float(delta)!r}\n{layout}"
    return hashlib.sha256(text.encode()).hexdigest()


def _load_arrays(k: str, names: tuple[str, ...]) -> dict | None:
    """The arrays ``names`` of the archive stored under ``k``, or None (absent, damaged, or
    its bytes do not hash to the recorded value)."""
    store = _cache.private_dir("tables")
    if store is None:
        return None
    meta = _cache.read_json(store / f"{k}.json", k)
    if not isinstance(meta, dict) or not isinstance(meta.get("size"), int):
        return None
    raw = _cache.read_file(store / f"{k}.npz", meta["size"])
    if (raw is None or len(raw) != meta["size"]
            or hashlib.sha256(raw).hexdigest() != meta.get("sha256")):
        return None
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as z:
            arrays = {name: z[name] for name in names}
    except (OSError, ValueError, KeyError):
        return None
    try:
        os.utime(store / f"{k}.npz")  # recently used
    except OSError:
        pass
    return arrays


def _store_arrays(k: str, **arrays) -> bool:
    directory = _cache.private_dir("tables")
    if directory is None:
        return False
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    raw = buf.getvalue()
    if not _cache.write_file(directory / f"{k}.npz", raw):
        return False
    ok = _cache.write_json(directory / f"{k}.json", k,
                           {"sha256": hashlib.sha256(raw).hexdigest(), "size": len(raw)})
    _evict(directory)
    return ok


def load(k: str, kbits: int, cells: int, row: int, table_cls):
    """``{log: Table}`` stored under ``k``, or None (absent, damaged or not verified).

    ``cells``: the length of ``cells_info`` the layout has; ``row``: coefficients a row.
    Every row index a cell can reach is checked to lie inside the table (the kernels read
    without bounds checks)."""
    arrays = _load_arrays(k, ("info", "coef_log", "code_log", "coef_ratio", "code_ratio"))
    if arrays is None:
        return None
    info = arrays["info"]
    if info.dtype != np.int64 or info.shape != (cells,):
        return None
    out = {}
    for log, tag in ((True, "log"), (False, "ratio")):
        coef, code = arrays[f"coef_{tag}"], arrays[f"code_{tag}"]
        if (coef.dtype != np.float64 or code.dtype != np.int32 or coef.ndim != 1
                or code.ndim != 1 or coef.size != code.size * row):
            return None
        first, extra = layout.unpack_info(info)
        if (first.min() < 0 or not np.isin(extra, layout.SUBBITS).all()
                or (first + (1 << extra)).max() > code.size):
            return None
        out[log] = table_cls(kbits, coef, code, info)
    return out


def store(k: str, tables) -> bool:
    """Write ``tables`` (``{log: Table}``) under ``k``; False when it could not."""
    return _store_arrays(k, info=tables[True].cells_info, coef_log=tables[True].coef,
                         code_log=tables[True].row_code, coef_ratio=tables[False].coef,
                         code_ratio=tables[False].row_code)


def load_grid(k: str, dtype: str):
    """The :class:`~.grid.Grid` stored under ``k`` for ``dtype``, or None.  Its arrays are
    checked for type and shape (the reader's gathers index ``rows`` by ``bounds``)."""
    from fbands.tables.grid import ROW_SHAPE, Grid

    arrays = _load_arrays(k, ("bounds", "rows", "worst"))
    if arrays is None:
        return None
    bounds, rows, worst = arrays["bounds"], arrays["rows"], arrays["worst"]
    if (bounds.dtype != np.dtype(dtype) or rows.dtype != bounds.dtype or bounds.ndim != 1
            or rows.shape != (bounds.size + 1, *ROW_SHAPE) or worst.shape != ()
            or not np.all(bounds[1:] > bounds[:-1])):
        return None
    return Grid(bounds, rows, dtype, float(worst))


def store_grid(k: str, grid) -> bool:
    """Write ``grid`` under ``k``; False when it could not."""
    return _store_arrays(k, bounds=grid.bounds, rows=grid.rows, worst=np.float64(grid.worst))


def _evict(directory: Path) -> None:
    try:
        archives = sorted(directory.glob("*.npz"), key=lambda p: p.stat().st_mtime)
        for old in archives[: max(0, len(archives) - MAX_FILES)]:
            old.unlink(missing_ok=True)
            old.with_suffix(".json").unlink(missing_ok=True)
    except OSError:
        pass
