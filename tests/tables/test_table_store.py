"""The band tables on disk (fbands/tables/store.py): reused, verified, bounded."""

from __future__ import annotations

import hashlib
import io
import json

import numpy as np
import pytest

import fbands

pytest.importorskip("fbands._jit.backend")
from fbands.tables import layout as _table_layout  # noqa: E402
from fbands.tables import store as _table_store  # noqa: E402
from fbands.tables.build import TableSet  # noqa: E402
from fbands.tables.cache import TABLES  # noqa: E402

DIV, DELTA, LAYOUT = "tv", 0.05, "float32"


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("FBANDS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(TABLES, "_sets", type(TABLES._sets)())
    monkeypatch.setattr(TABLES, "_derived", {})
    return tmp_path / "cache" / "tables"


@pytest.fixture
def builds(monkeypatch):
    calls = []
    real = TableSet.complete

    def build(self):
        calls.append((self.div, self.delta, self.layout))
        return real(self)

    monkeypatch.setattr(TableSet, "complete", build)
    return calls


def _fresh_process_tables():
    """What a new process sees: nothing in memory, the directory on disk."""
    TABLES.clear()
    return TABLES.complete(fbands.get(DIV), DELTA, LAYOUT)


def _same(a, b):
    for log in (True, False):
        assert a[log].kbits == b[log].kbits
        for name in ("coef", "row_code", "cells_info"):
            x, y = getattr(a[log], name), getattr(b[log], name)
            assert x.dtype == y.dtype and np.array_equal(x, y), (log, name)


def test_a_second_process_reads_the_tables_instead_of_building(store, builds):
    first = _fresh_process_tables()
    assert len(builds) == 1 and len(list(store.glob("*.npz"))) == 1
    second = _fresh_process_tables()
    assert len(builds) == 1
    _same(first, second)
    # log-edges of float32 probabilities: the table path, against the numpy solver
    p = np.linspace(1e-6, 1 - 1e-6, 1000).astype(np.float32)
    want = fbands.log_bounds(p.astype(np.float64), DELTA, DIV, backend="numpy")
    got = fbands.log_bounds(p, DELTA, DIV, backend="numba")
    for g, w in zip(got, want, strict=True):
        assert np.allclose(g, w, rtol=1e-6, atol=1e-6)


def test_damaged_or_forged_archives_are_rebuilt(store, builds):
    want = _fresh_process_tables()
    (archive,) = store.glob("*.npz")
    good = archive.read_bytes()
    archive.write_bytes(good[:100] + bytes([good[100] ^ 1]) + good[101:])  # one bit
    _same(_fresh_process_tables(), want)
    assert len(builds) == 2
    # a row index out of the table, with the hash and record made to match: refused
    with np.load(io.BytesIO(archive.read_bytes())) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["info"] = arrays["info"].copy()
    arrays["info"][5] = _table_layout.pack_info(10**9, 0)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    raw = buf.getvalue()
    archive.write_bytes(raw)
    record = archive.with_suffix(".json")
    obj = json.loads(record.read_text())
    obj["data"] = {"sha256": hashlib.sha256(raw).hexdigest(), "size": len(raw)}
    from fbands import _cache

    obj["sha256"] = _cache._digest(obj["data"])
    record.write_text(json.dumps(obj))
    _same(_fresh_process_tables(), want)
    assert len(builds) == 3


def test_the_key_follows_the_kernels_delta_and_layout():
    k = _table_store.key("_fbands_numba_kl_abc", 0.05, "float32")
    assert k != _table_store.key("_fbands_numba_kl_abd", 0.05, "float32")
    assert k != _table_store.key("_fbands_numba_kl_abc", 0.05000000000000001, "float32")
    assert k != _table_store.key("_fbands_numba_kl_abc", 0.05, "float64")


def test_old_archives_are_evicted(store, monkeypatch):
    monkeypatch.setattr(_table_store, "MAX_FILES", 1)
    TABLES.complete(fbands.get(DIV), DELTA, LAYOUT)
    TABLES.complete(fbands.get(DIV), 0.07, LAYOUT)
    assert len(list(store.glob("*.npz"))) == 1 and len(list(store.glob("*.json"))) == 1
