"""The derivations shipped in the package (fbands/_shipped/, scripts/ship_derivations.py) and
the notices of slow first-time work (a sympy derivation, a complete table build)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from fbands import _derived, _notice, divergences, symbolic
from fbands.tables import cache as table_cache
from fbands.tables import store

from .test_derived_cache import TRIANGULAR, cache, counted  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("ship_derivations",
                                                  ROOT / "scripts" / "ship_derivations.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def fresh():
    """Each built-in's derivation done afresh by sympy, and the script's file of each."""
    script = _script()
    return ({n: symbolic.derive(divergences._REGISTRY[n].f) for n in divergences.BUILTINS},
            script.files())


@pytest.fixture
def notices(monkeypatch):
    said = []
    monkeypatch.setattr(_notice, "notice", said.append)
    return said


def test_the_builtins_are_the_registry_without_families():
    assert divergences.BUILTINS == [n for n in divergences.available()
                                    if n not in divergences._FAMILIES]


def test_the_shipped_files_are_current(fresh):
    """Fails after a change to fbands/symbolic.py (or sympy): run scripts/ship_derivations.py."""
    _, files = fresh
    have = {p.name: p.read_bytes() for p in _derived.SHIPPED.glob("*.json")}
    assert set(have) == set(_script().expected_keys()), "run python scripts/ship_derivations.py"
    assert have == files, "run python scripts/ship_derivations.py"
    assert _script().main(["--check"]) == 0


@pytest.mark.parametrize("name", divergences.BUILTINS)
def test_a_cold_cache_derives_a_builtin_without_sympy(name, cache, counted, notices,  # noqa: F811
                                                      fresh):
    div = divergences._REGISTRY[name]
    d = _derived.derive(div.f, name=name)
    assert counted == [] and notices == []
    assert _derived._same(d, fresh[0][name])
    assert not cache.exists() or not list(cache.glob("*.json"))  # nothing copied to the cache


def test_a_stale_or_damaged_shipped_file_is_ignored(cache, counted, notices, tmp_path,  # noqa: F811
                                                    monkeypatch, fresh):
    kl = divergences._REGISTRY["kl"]
    here = tmp_path / "shipped"
    shutil.copytree(_derived.SHIPPED, here)
    monkeypatch.setattr(_derived, "SHIPPED", here)
    (path,) = [p for p in here.glob("*.json") if p.stem == _derived.key(kl.f)]
    obj = json.loads(path.read_text())
    obj["data"]["f0"] = 123.0  # hash left as it was
    path.write_text(json.dumps(obj))
    d = _derived.derive(kl.f, name="kl")
    assert len(counted) == 1 and _derived._same(d, fresh[0]["kl"])
    assert len(notices) == 1 and "'kl'" in notices[0]
    # another symbolic.py: every shipped key is stale, and the derivation is redone
    monkeypatch.setattr(_derived, "_code_hash", lambda: "another symbolic.py")
    assert _derived.shipped(divergences._REGISTRY["tv"].f) is None
    _derived.derive(divergences._REGISTRY["tv"].f, name="tv")
    assert len(counted) == 2


def test_a_derivation_done_says_so_once_per_machine(cache, counted, notices):  # noqa: F811
    first = _derived.derive(TRIANGULAR, name="triangular")
    assert len(counted) == 1
    assert notices == ["deriving the band formulas of divergence 'triangular' with sympy, once "
                       "per machine (later runs read it from the disk cache): this may take "
                       "a few seconds"]
    assert _derived._same(_derived.derive(TRIANGULAR, name="triangular"), first)
    assert len(counted) == 1 and len(notices) == 1  # a cache hit is silent


def test_a_complete_table_build_says_so_a_load_is_silent(monkeypatch, notices):
    kl = divergences._REGISTRY["kl"]
    built, stored = [], {}

    def complete(self):
        built.append(self.delta)
        self.built[:] = True
        return self.modes

    monkeypatch.setattr(table_cache.TableSet, "complete", complete)
    monkeypatch.setattr(store, "load", lambda k, *a: stored.get(k))
    monkeypatch.setattr(store, "store", lambda k, t: stored.setdefault(k, t) is t)
    monkeypatch.setattr(table_cache.TableSet, "from_tables",
                        classmethod(lambda cls, div, delta, lay, found, filler:
                                    SimpleNamespace(found=found)))
    tables = table_cache.TableCache()
    tables.complete_set(kl, 0.05, "float32")
    assert built == [0.05] and len(notices) == 1
    assert notices[0].startswith("building the complete band tables of divergence 'kl' at "
                                 "delta=0.05 (float32), once per machine")
    tables.complete_set(kl, 0.05, "float32")  # complete in this process: nothing to say
    table_cache.TableCache().complete_set(kl, 0.05, "float32")  # a new process loads it
    assert built == [0.05] and len(notices) == 1
