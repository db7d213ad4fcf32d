"""What sympy derives from a generator, kept on disk as data, so that a warm process skips it.

:func:`fbands.symbolic.derive` (simplification, limits, closed forms) costs seconds per
divergence, and every fresh process (a Ray worker, a test run, a CLI call) would pay it again
on its first call.  :func:`derive` below answers from a file when an earlier process on the
machine derived the same ``f`` with the same code, and derives and stores it otherwise.

The file is JSON, never pickle: each expression is a tree of ``[kind, ...]`` lists over a
fixed vocabulary (the node classes in :data:`_CLASSES`, the known symbols, integers,
rationals, floats as their exact binary value, a few constants), rebuilt without evaluating
any text.  A file is used only when

* it sits in a private directory (:func:`fbands._cache.private_dir`: owned by this user,
  mode 0700),
* its name and its ``key`` are the hash of ``f``, of the code of :mod:`fbands.symbolic` and
  :mod:`fbands._stable` (comments and docstrings aside: :mod:`fbands._fingerprint`) and of
  sympy's version (a change to any is a different key; a reworded comment is not),
* the hash of its payload matches the one it records, and
* the ``f`` it rebuilds equals the requested ``f``.

Anything else (no directory, a damaged or foreign file, a node outside the vocabulary)
falls back to deriving in the process; the cache never changes an answer.

The built-in divergences' derivations also ship inside the package (:data:`SHIPPED`, files
of the same format written by ``scripts/ship_derivations.py``), read when the user's cache
misses: the same key, hash and ``f`` checks apply, so a shipped file that the current code
(or sympy version) would not have written is ignored and the derivation is redone.  A
derivation done in the process (a user-registered divergence, or a shipped file gone stale)
announces itself with one notice (:func:`fbands._notice.notice`).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import sympy as sp
from sympy.codegen import cfunctions

from fbands import _cache, _notice, _stable, symbolic
from fbands._fingerprint import package_fingerprint

__all__ = ["derive", "intercept", "encode", "decode"]

#: Format of the files; part of the key.
FORMAT = 2

#: The derivations shipped in the package (``scripts/ship_derivations.py`` writes them).
SHIPPED = Path(__file__).resolve().parent / "_shipped" / "derived"

#: Node classes an expression may hold, by name (anything else is not cached).
_CLASSES = {
    cls.__name__: cls
    for cls in (
        sp.Add, sp.Mul, sp.Pow, sp.exp, sp.log, sp.sinh, sp.cosh, sp.tanh, sp.sign, sp.Abs,
        sp.Max, sp.Min, sp.LambertW,
        cfunctions.expm1, cfunctions.log1p, cfunctions.exp2, cfunctions.log2,
        cfunctions.log10, cfunctions.Sqrt, cfunctions.Cbrt, cfunctions.hypot,
        *_stable.CLASSES,
    )
}
_SYMBOLS = {
    s.name: s
    for s in (symbolic.U, symbolic.S, symbolic.T, symbolic.P, symbolic.Q, symbolic.D,
              symbolic.Y, symbolic.R)
}
_CONSTANTS = {"pi": sp.pi, "E": sp.E, "oo": sp.oo, "-oo": -sp.oo, "zoo": sp.zoo,
              "nan": sp.nan, "EulerGamma": sp.EulerGamma}


class _Unsupported(ValueError):
    """An expression holds a node outside the vocabulary: derive, do not store."""


def encode(e: sp.Expr) -> list:
    """``e`` as a JSON-ready tree (raises :class:`_Unsupported` outside the vocabulary)."""
    if e.is_Symbol:
        if _SYMBOLS.get(e.name) != e:
            raise _Unsupported(f"symbol {e!r}")
        return ["sym", e.name]
    if e.is_Integer:
        return ["int", str(int(e))]
    if e.is_Rational:
        return ["rat", str(e.p), str(e.q)]
    if e.is_Float:
        sign, man, exp, bc = e._mpf_
        return ["float", sign, hex(man), exp, bc, e._prec]
    for name, value in _CONSTANTS.items():
        if e == value:
            return ["const", name]
    name = type(e).__name__
    if _CLASSES.get(name) is not type(e):
        raise _Unsupported(f"node {name}")
    return ["fn", name, [encode(a) for a in e.args]]


def decode(tree: list) -> sp.Expr:
    """The expression of a tree made by :func:`encode` (a ``KeyError`` / ``ValueError`` on a
    malformed one)."""
    kind = tree[0]
    if kind == "sym":
        return _SYMBOLS[tree[1]]
    if kind == "int":
        return sp.Integer(int(tree[1]))
    if kind == "rat":
        return sp.Rational(int(tree[1]), int(tree[2]))
    if kind == "float":
        _, sign, man, exp, bc, prec = tree
        return sp.Float._new((int(sign), int(man, 16), int(exp), int(bc)), int(prec))
    if kind == "const":
        return _CONSTANTS[tree[1]]
    if kind == "fn":
        return _CLASSES[tree[1]](*(decode(a) for a in tree[2]), evaluate=False)
    raise ValueError(f"unknown node kind {kind!r}")


def _encode_form(cf: symbolic.ClosedForm | None):
    return None if cf is None else {"coeffs": [encode(c) for c in cf.coeffs],
                                    "squared": cf.squared}


def _decode_form(data) -> symbolic.ClosedForm | None:
    if data is None:
        return None
    return symbolic.ClosedForm(tuple(decode(c) for c in data["coeffs"]), bool(data["squared"]))


def _tail(t):
    return None if t is None else (float(t[0]), float(t[1]), int(t[2]), float(t[3]))


def _to_data(d: symbolic.Derivation) -> dict:
    return {
        "f": encode(d.f), "F_near": encode(d.F_near), "F_far": encode(d.F_far),
        "dF": encode(d.dF), "f0": d.f0, "fpinf": d.fpinf, "fpp1": d.fpp1,
        "upper": _encode_form(d.upper), "lower": _encode_form(d.lower),
        "lower_y": _encode_form(d.lower_y), "tail0": d.tail0, "tail_inf": d.tail_inf,
        "f0_text": d.f0_text, "offset_inf": d.offset_inf,
    }


def _from_data(data: dict) -> symbolic.Derivation:
    return symbolic.Derivation(
        f=decode(data["f"]), F_near=decode(data["F_near"]), F_far=decode(data["F_far"]),
        dF=decode(data["dF"]), f0=float(data["f0"]), fpinf=float(data["fpinf"]),
        fpp1=float(data["fpp1"]), upper=_decode_form(data["upper"]),
        lower=_decode_form(data["lower"]), tail0=_tail(data["tail0"]),
        tail_inf=_tail(data["tail_inf"]), lower_y=_decode_form(data["lower_y"]),
        f0_text=str(data["f0_text"]), offset_inf=float(data["offset_inf"]),
    )


def _code_hash() -> str:
    """Hash of what decides a derivation: the code of :mod:`fbands.symbolic` and
    :mod:`fbands._stable` (their comments and docstrings aside:
    :func:`fbands._fingerprint.code_fingerprint`), this module's format and sympy's
    version."""
    return package_fingerprint("derivations", (Path(symbolic.__file__), Path(_stable.__file__)),
                               str(FORMAT), sp.__version__)


def key(f: sp.Expr, closed_forms: bool = True) -> str:
    """The cache key of ``derive(f, closed_forms=...)``."""
    text = f"{_code_hash()}\n{closed_forms}\n{sp.srepr(f)}"
    return hashlib.sha256(text.encode()).hexdigest()


def _same(a: symbolic.Derivation, b: symbolic.Derivation) -> bool:
    """Field by field equality (floats: nan equals nan)."""
    for name in a.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
            continue
        if x != y:
            return False
    return True


def _load(path: Path, k: str, f: sp.Expr) -> symbolic.Derivation | None:
    """The derivation stored at ``path`` under key ``k`` when it rebuilds ``f``, else None."""
    data = _cache.read_json(path, k)
    if data is None:
        return None
    try:
        found = _from_data(data)
    except (KeyError, ValueError, TypeError, IndexError, RecursionError):
        return None
    return found if found.f == f else None


def shipped(f: sp.Expr, closed_forms: bool = True) -> symbolic.Derivation | None:
    """The derivation of ``f`` shipped in the package, when there is a current one."""
    k = key(f, closed_forms)
    return _load(SHIPPED / f"{k}.json", k, f)


def storable(d: symbolic.Derivation) -> dict | None:
    """The data of ``d`` for a file, or None when a file would not rebuild the very same
    derivation (a node outside the vocabulary, a number that does not round-trip)."""
    try:
        data = _to_data(d)
    except _Unsupported:
        return None
    return data if _same(_from_data(json.loads(json.dumps(data))), d) else None


def _announce(work: str, f: sp.Expr, name: str | None, store, duration: str) -> None:
    """The notice of a derivation with sympy (``store``: the private cache, or None)."""
    what = f"divergence {name!r}" if name else f"f = {f}"
    where = ("once per machine (later runs read it from the disk cache)" if store is not None
             else "in every process (no private cache directory to keep it in)")
    _notice.notice(f"deriving {work} of {what} with sympy, {where}: this may take {duration}")


def derive(f: sp.Expr, *, closed_forms: bool = True,
           name: str | None = None) -> symbolic.Derivation:
    """:func:`fbands.symbolic.derive`, answered from the private cache, or from the files
    shipped in the package, when it can be (``name``: the divergence's, for the notice)."""
    k = key(f, closed_forms)
    store = _cache.private_dir("derived")
    if store is not None:
        found = _load(store / f"{k}.json", k, f)
        if found is not None:
            return found
    found = _load(SHIPPED / f"{k}.json", k, f)
    if found is not None:
        return found
    _announce("the band formulas", f, name, store, "a few seconds")
    d = symbolic.derive(f, closed_forms=closed_forms)
    if store is not None:
        data = storable(d)
        if data is not None:  # only what rebuilds to the very same derivation
            _cache.write_json(store / f"{k}.json", k, data)
    return d


def tangent_intercept(f: sp.Expr) -> sp.Expr | None:
    """``T(s) = f(c) - c f'(c)`` at ``c = e^s > 1``, the intercept of ``f``'s tangent,
    simplified (kl: ``-s``; tv: ``-1/2``), as an expression in ``s``; None where sympy gives
    no plain form (a free symbol besides ``s``, an ``Abs``, ``sign`` or ``Piecewise``
    left).  Meant for ``f`` with a finite ``f'(inf)``, where ``f(c)`` and ``c f'(c)``
    cancel to leading order."""
    w, t = sp.Symbol("w", positive=True), sp.Symbol("t", positive=True)
    fw = f.subs(symbolic.U, 1 + w)  # c = 1 + w > 1: |.| and sign resolve
    T = sp.simplify(fw - (1 + w) * sp.diff(fw, w))
    T = sp.simplify(sp.expand_log(T.subs(w, sp.exp(t) - 1), force=True))  # c = e^t
    if not T.free_symbols <= {t} or T.has(sp.Abs, sp.sign, sp.Piecewise):
        return None
    return T.subs(t, symbolic.S)


def intercept(f: sp.Expr, *, name: str | None = None) -> sp.Expr | None:
    """:func:`tangent_intercept`, answered from the private cache when it can be (an
    expression tree under its own key, which hashes the derivation's key and this module,
    where :func:`tangent_intercept` lives; a file that does not decode is derived again)."""
    own = package_fingerprint("intercepts", (Path(__file__),))
    k = hashlib.sha256(f"{key(f)}\nintercept\n{own}".encode()).hexdigest()
    store = _cache.private_dir("derived")
    path = None if store is None else store / f"{k}.json"
    if path is not None:
        data = _cache.read_json(path, k)
        if isinstance(data, dict) and "T" in data:
            try:
                return None if data["T"] is None else decode(data["T"])
            except (KeyError, ValueError, TypeError, IndexError, RecursionError):
                pass
    _announce("the edge gradients", f, name, store, "a second")
    T = tangent_intercept(f)
    if path is not None:
        try:
            tree = None if T is None else encode(T)
        except _Unsupported:
            return T
        if tree is None or decode(tree) == T:  # only what rebuilds to the same expression
            _cache.write_json(path, k, {"T": tree})
    return T
