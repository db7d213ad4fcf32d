"""The on-disk cache of sympy derivations (fbands/_derived.py over fbands/_cache.py)."""

from __future__ import annotations

import json
import logging
import os

import pytest
import sympy as sp

import fbands
from fbands import _cache, _derived, symbolic


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FBANDS_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "derived"


@pytest.fixture
def counted(monkeypatch):
    """Counts the calls of the real (sympy) derivation."""
    calls = []
    real = symbolic.derive

    def derive(f, **kw):
        calls.append(f)
        return real(f, **kw)

    monkeypatch.setattr(symbolic, "derive", derive)
    return calls


U = symbolic.U
TRIANGULAR = (U - 1) ** 2 / (U + 1)


@pytest.mark.parametrize("name", ["kl", "tv", "hellinger", "js", "alpha(a=0.3)"])
def test_round_trip_gives_the_same_derivation_and_the_same_code(name, cache):
    div = fbands.get(name)
    d = div.derivation
    back = _derived._from_data(json.loads(json.dumps(_derived._to_data(d))))
    assert _derived._same(back, d)
    forms = [(k, getattr(d, k), getattr(back, k)) for k in ("F_near", "F_far", "dF")]
    for edge in ("upper", "lower", "lower_y"):
        if getattr(d, edge) is not None:
            forms += [(edge, a, b) for a, b in zip(getattr(d, edge).coeffs,
                                                   getattr(back, edge).coeffs, strict=True)]
    for key, a, b in forms:
        args = (symbolic.S,) if key in ("F_near", "F_far", "dF") else (symbolic.P, symbolic.Q,
                                                                        symbolic.D)
        assert symbolic.compile_expr(a, args) == symbolic.compile_expr(b, args), key


def test_a_warm_derivation_does_no_sympy_work(cache, counted):
    first = _derived.derive(TRIANGULAR)
    assert len(counted) == 1
    (path,) = cache.glob("*.json")
    assert oct(os.stat(cache).st_mode & 0o777) == "0o700"
    again = _derived.derive(TRIANGULAR)
    assert len(counted) == 1
    assert _derived._same(again, first)


def _rewrite(path, edit):
    obj = json.loads(path.read_text())
    edit(obj)
    path.write_text(json.dumps(obj))


def test_a_damaged_or_foreign_file_is_never_trusted(cache, counted):
    want = _derived.derive(TRIANGULAR)
    (path,) = cache.glob("*.json")
    good = path.read_text()

    def tamper(obj):  # a changed number, hash left as it was
        obj["data"]["f0"] = 123.0

    _rewrite(path, tamper)
    assert _derived._same(_derived.derive(TRIANGULAR), want) and len(counted) == 2

    def forge(obj):  # another f under this key, with a matching hash
        obj["data"]["f"] = _derived.encode(U * sp.log(U) - U + 1)
        obj["sha256"] = _cache._digest(obj["data"])

    path.write_text(good)
    _rewrite(path, forge)
    assert _derived._same(_derived.derive(TRIANGULAR), want) and len(counted) == 3

    path.write_text(good[: len(good) // 2])  # truncated
    assert _derived._same(_derived.derive(TRIANGULAR), want) and len(counted) == 4
    path.write_text(good)
    assert _derived._same(_derived.derive(TRIANGULAR), want) and len(counted) == 4


def test_a_cache_directory_that_is_not_private_is_tightened_or_skipped(cache, tmp_path,
                                                                       counted):
    cache.mkdir(parents=True, mode=0o755)
    os.chmod(cache, 0o755)
    assert _cache.private_dir("derived") == cache
    assert os.stat(cache).st_mode & 0o777 == 0o700
    # a link in place of the directory: not used, and the derivation still answers
    cache.rename(tmp_path / "elsewhere")
    cache.symlink_to(tmp_path / "elsewhere")
    assert _cache.private_dir("derived") is None
    _derived.derive(TRIANGULAR)
    assert len(counted) == 1 and not list((tmp_path / "elsewhere").glob("*.json"))


def test_an_unusable_cache_directory_costs_only_the_derivation(tmp_path, monkeypatch, counted):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("FBANDS_CACHE_DIR", str(blocker / "cache"))
    assert _cache.private_dir("derived") is None
    d = _derived.derive(TRIANGULAR)
    assert d.upper is not None and len(counted) == 1


def test_the_key_follows_f_and_the_code(monkeypatch):
    k = _derived.key(TRIANGULAR)
    assert k != _derived.key(TRIANGULAR + 0 * U + (U - 1) ** 2)
    assert k != _derived.key(TRIANGULAR, closed_forms=False)
    monkeypatch.setattr(_derived, "_code_hash", lambda: "another symbolic.py")
    assert k != _derived.key(TRIANGULAR)


def test_nodes_outside_the_vocabulary_are_refused():
    with pytest.raises(_derived._Unsupported):
        _derived.encode(sp.gamma(U))
    with pytest.raises(_derived._Unsupported):
        _derived.encode(sp.Symbol("x") + 1)
    with pytest.raises((KeyError, ValueError)):
        _derived.decode(["fn", "__import__", [["int", "1"]]])


@pytest.mark.parametrize("name", ["kl", "js"])
def test_the_tangent_intercept_is_derived_once_per_machine(name, cache, monkeypatch, caplog):
    """The edge gradients' intercept costs sympy's simplify (a second or two for kl): a
    first process derives it with a notice and stores it; a later one reads it, with no
    sympy work and the same generated code; a damaged file is derived again."""
    monkeypatch.delenv("FBANDS_QUIET", raising=False)
    caplog.set_level(logging.INFO, logger="fbands")
    f = fbands.get(name).f
    first = _derived.intercept(f, name=name)
    notes = [r.getMessage() for r in caplog.records if r.name == "fbands"]
    assert len(notes) == 1 and "deriving the edge gradients" in notes[0]
    caplog.clear()
    # the expression is the intercept: f(c) - c f'(c) at c = e^s, checked at s = 3
    c = sp.exp(3)
    want = (f - U * sp.diff(f, U)).subs(U, c)
    assert abs(float(first.subs(symbolic.S, 3) - want)) < 1e-12
    files = list(cache.glob("*.json"))
    assert files

    def no_sympy(*args, **kwargs):
        raise AssertionError("derived again")

    with monkeypatch.context() as m:
        m.setattr(sp, "simplify", no_sympy)
        again = _derived.intercept(f, name=name)
    assert not [r for r in caplog.records if r.name == "fbands"]
    assert symbolic.compile_expr(again, (symbolic.S,)) == symbolic.compile_expr(
        first, (symbolic.S,))
    for path in files:
        path.write_text("{not json")
    assert _derived.intercept(f, name=name) == first
