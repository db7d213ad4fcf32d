"""The divergence registry.

A :class:`Divergence` is a generator ``f`` (a sympy expression in ``u``, convex, ``f(1) = 0``)
with a name.  Everything the band solvers use is derived from ``f`` on first use
(:func:`fbands.symbolic.derive`) and cached, so adding a divergence is one line::

    >>> import fbands
    >>> d = fbands.register("triangular", "(u - 1)**2 / (u + 1)", overwrite=True)
    >>> d.name, d.f0, d.fprime_inf
    ('triangular', 1.0, 1.0)

The built-in generators (:data:`fbands._generators.BUILTIN_GENERATORS`, and the docs'
catalogue) follow THEORY's conventions: no hidden factors of 1/2, ``kl`` is KL(pi_old || pi).
"""

from __future__ import annotations

import difflib
import math
import re
import threading
from functools import cached_property
from typing import Any

import sympy as sp

from fbands import _checks, _derived, _expr, _generators, _presets, symbolic
from fbands._generators import BUILTIN_FAMILIES, BUILTIN_GENERATORS
from fbands._roots import both_unsquared
from fbands._state import STATE
from fbands.errors import DivergenceError

__all__ = ["Divergence", "available", "get", "register"]


class Divergence:
    """An f-divergence ``D_f(pi || pi_old) = sum_x pi_old(x) f(pi(x) / pi_old(x))``.

    Parameters
    ----------
    name : str
        Registry name (``"kl"``, ...), or ``"alpha(a=0.5)"`` for a member of a family.
    f : sympy.Expr
        The generator, in the symbol :data:`fbands.symbolic.U` (``u``).
    description : str
        One line for listings.

    Notes
    -----
    The derived attributes (:attr:`f0`, :attr:`fprime_inf`, :attr:`closed_form_upper`, ...)
    are computed by sympy on first access, which takes a fraction of a second per divergence.
    """

    def __init__(self, name: str, f: sp.Expr, description: str = "", *,
                 family: str | None = None, params: dict[str, sp.Rational] | None = None):
        self.name = name
        self.f = f
        self.description = description
        #: For a member of a family (``alpha(a=1/2)``): the family's name and the values.
        self.family = family
        self.params = dict(params or {})
        #: What decides the numbers: the name and the exact text of the generator.  Every
        #: cache of the process (:mod:`fbands._state`) names a divergence by it.
        self.key = f"{name} {sp.srepr(f)}"
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Divergence({self.name!r}, f={self.f})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Divergence) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    @cached_property
    def derivation(self) -> symbolic.Derivation:
        """The sympy-derived ingredients (see :mod:`fbands.symbolic`)."""
        with self._lock:
            return _derived.derive(self.f, name=self.name)  # from disk when it can

    @property
    def f0(self) -> float:
        """``f(0+)``; ``inf`` means the lower edge never reaches 0."""
        return self.derivation.f0

    @property
    def fprime_inf(self) -> float:
        """``f'(inf) = lim f(u) / u``; ``inf`` means the lower edge tends to 1 as p -> 1."""
        return self.derivation.fpinf

    @property
    def offset_at_inf(self) -> float:
        """``lim f(c) - f'(inf) (c - 1)`` as ``c -> inf`` (``-inf`` for kl; nan where
        ``f'(inf)`` is infinite): what the lower edge's derivative at ``p = 1`` needs."""
        return self.derivation.offset_inf

    @property
    def curvature(self) -> float:
        """``f''(1)`` (``inf`` at a kink, as for ``tv``)."""
        return self.derivation.fpp1

    @property
    def has_closed_form(self) -> bool:
        """True when both edges have a closed form."""
        d = self.derivation
        return d.upper is not None and d.lower is not None

    @cached_property
    def closed_form_edges(self) -> bool:
        """Whether both edges are unsquared closed-form roots (the closed-form passes)."""
        return both_unsquared(self.derivation)

    def lower_limit_at_one(self, delta: float) -> float:
        """``r* = lim_{p -> 1} lower(p, delta)``: the root in ``[0, 1]`` of ``f(r) + (1 - r)
        f'(inf) = delta`` (0 if there is none), or 1 when ``f'(inf)`` is infinite."""
        delta = _checks.positive("delta", delta, DivergenceError)
        from fbands._solver import lower_limit_at_one

        return lower_limit_at_one(self, delta)

    @cached_property
    def mpmath_f(self):
        """``f`` as an mpmath function (for extended-precision refinement)."""
        return sp.lambdify(symbolic.U, self.f, "mpmath")

    @cached_property
    def mpmath_f0(self):
        """``f(0+)`` exact at mpmath's precision, a function of no argument (:attr:`f0` is not)."""
        return sp.lambdify([], sp.limit(self.f, symbolic.U, 0, "+"), "mpmath")

    # -- code for the backends -------------------------------------------------------------

    @cached_property
    def sources(self) -> dict[str, str]:
        """Generated Python source of ``F`` (near and far forms), ``F'`` and the closed-form
        coefficients, over bare function names (see :func:`fbands.symbolic.compile_expr`)."""
        return self._sources(numbers=False)

    @cached_property
    def extended_sources(self) -> dict[str, str]:
        """:attr:`sources` with their constants to 30 digits, through the namespace's
        ``from_decimal`` (for arithmetic finer than float64)."""
        return self._sources(numbers=True)

    def _sources(self, numbers: bool) -> dict[str, str]:
        d = self.derivation
        out = {
            "F_near": symbolic.compile_expr(d.F_near, (symbolic.S,), numbers=numbers),
            "F_far": symbolic.compile_expr(d.F_far, (symbolic.S,), numbers=numbers),
            "dF": symbolic.compile_expr(d.dF, (symbolic.S,), numbers=numbers),
        }
        for edge, cf in (("upper", d.upper), ("lower", d.lower), ("lower_y", d.lower_y)):
            if cf is not None:
                for i, c in zip((2, 1, 0), cf.coeffs, strict=True):
                    out[f"{edge}_a{i}"] = symbolic.compile_expr(
                        c, (symbolic.P, symbolic.Q, symbolic.D), numbers=numbers
                    )
        return out

    @cached_property
    def intercept_source(self) -> str | None:
        r"""Generated source of ``T(s) = f(c) - c f'(c)`` at ``c = e^s > 1``, the intercept of
        ``f``'s tangent, simplified by sympy (kl: ``-s``; tv: ``-1/2``; js:
        ``-log((1 + e^s) / 2) / 2``); None where ``f'(inf)`` is infinite (``f(c)`` and
        ``c f'(c)`` then do not cancel to leading order) or sympy gives no plain form.  The
        edges' derivatives use it where ``c`` is large (:mod:`fbands.backends.torch_backend`).
        Derived once per machine (up to a second or two for kl), with a notice, and kept in
        the private cache (:func:`fbands._derived.intercept`).
        """
        if not math.isfinite(self.fprime_inf):
            return None
        with self._lock:
            T = _derived.intercept(self.f, name=self.name)  # from disk when it can
        return None if T is None else symbolic.compile_expr(T, (symbolic.S,))

    def kernels(self, namespace: Any):
        """``(F, dF, closed)`` bound to a backend's functions.

        ``namespace`` is a module or mapping providing ``exp``, ``expm1``, ``log``, ``log1p``,
        ``sqrt``, ``sinh``, ``cosh``, ``sign``, ``where`` and ``abs``; one that also provides
        ``from_decimal`` (a constructor from a decimal string) gets :attr:`extended_sources`.
        ``F`` selects the near form for ``|s| < NEAR``.  ``closed`` maps each closed form
        the divergence has (``"upper"``, ``"lower"``, ``"lower_y"``: see
        :class:`fbands.symbolic.ClosedForm`) to its coefficients ``a2, a1, a0`` as functions
        of ``(p, q, delta)``, its ``squared`` flag and its ``zero`` facts.
        """
        return _KERNELS.get_or_make((self.key, id(namespace)),
                                    lambda: (namespace, self._bind(namespace)))[1]

    def _bind(self, namespace: Any):
        ns = functions(namespace)
        src = self.extended_sources if "from_decimal" in ns else self.sources
        far = symbolic.bind(src["F_far"], ns)
        if src["F_near"] == src["F_far"]:
            F = far
        else:
            near = symbolic.bind(src["F_near"], ns)
            where, absf = ns["where"], ns["abs"]

            def F(s):
                small = absf(s) < symbolic.NEAR
                # Evaluate each form where it is meant to be used only, so that the far form
                # at tiny s and the near form at large |s| never produce inf or nan warnings.
                return where(small, near(where(small, s, 0.0)), far(where(small, 1.0, s)))

        dF = symbolic.bind(src["dF"], ns)
        closed = {}
        d = self.derivation
        for edge, cf in (("upper", d.upper), ("lower", d.lower), ("lower_y", d.lower_y)):
            if cf is not None:
                fns = [symbolic.bind(src[f"{edge}_a{i}"], ns) for i in (2, 1, 0)]
                closed[edge] = (fns, cf.squared, cf.zero)
        return F, dF, closed


def functions(namespace: Any) -> dict:
    """The functions of a backend's namespace (module or mapping) that generated sources
    call: :data:`fbands.symbolic._FUNCTIONS`, ``abs``, and ``from_decimal`` where it has one."""
    ns = namespace if isinstance(namespace, dict) else vars(namespace)
    names = (*symbolic._FUNCTIONS, "abs", *(("from_decimal",) if "from_decimal" in ns else ()))
    return {k: ns[k] for k in names}


#: The kernels of each divergence bound to each namespace (:meth:`Divergence.kernels`), by
#: ``(divergence key, id(namespace))``; each entry holds its namespace, so its id stays its.
_KERNELS = STATE.memo("kernels", "each divergence's F, F' and closed forms bound to a "
                      "backend's functions", max_entries=256)


# ----------------------------------------------------------------------------- the registry

_REGISTRY: dict[str, Divergence] = {}
_FAMILIES: dict[str, tuple[sp.Expr, tuple[str, ...], str]] = {}
_ALIASES = {
    "kullback_leibler": "kl",
    "forward_kl": "kl",
    "rkl": "reverse_kl",
    "total_variation": "tv",
    "pearson": "chi2",
    "chi_squared": "chi2",
    "neyman": "neyman_chi2",
    "jensen_shannon": "js",
}


#: Longest name :func:`register` accepts (a spec with parameters must stay parseable).
MAX_NAME = 100


def register(
    name: str,
    f: str | sp.Expr,
    *,
    params: tuple[str, ...] | list[str] = (),
    description: str = "",
    overwrite: bool = False,
    check: bool = True,
) -> Divergence:
    """Add a divergence to the registry.

    Parameters
    ----------
    name : str
        A new name (letters, digits, underscores; at most :data:`MAX_NAME` characters).
    f : str or sympy.Expr
        The generator as an expression in ``u``, e.g. ``"(u - 1)**2 / (u + 1)"``.
    params : sequence of str
        Names of free parameters of a family (e.g. ``("a",)``); ``get(name, a=...)`` then
        returns the member with that value.
    description : str
        One line for ``fbands divergences``.
    overwrite : bool
        Replace an existing entry of the same name (without it, the same generator,
        parameters and description again return the registered divergence).
    check : bool
        Verify ``f(1) = 0``, finiteness on ``(0, inf)``, convexity (on a grid of 81 points
        from 1e-10 to 1e10, in 30-digit arithmetic) and strict convexity at 1.

    Returns
    -------
    Divergence
        The registered divergence (for a family: the family's template, not a member).

    Raises
    ------
    DivergenceError
        For a name taken by another generator, a bad expression, or an invalid generator.

    Examples
    --------
    >>> import fbands
    >>> d = fbands.register("triangular", "(u - 1)**2 / (u + 1)", overwrite=True)
    >>> lo, hi = fbands.bounds(0.1, 0.05, div="triangular")
    >>> bool(lo < 1 < hi)
    True
    """
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise DivergenceError(f"invalid divergence name {name!r}")
    if len(name) > MAX_NAME:
        raise DivergenceError(f"a divergence name has at most {MAX_NAME} characters, got "
                              f"{len(name)}")
    bad = [k for k in params if not isinstance(k, str) or not k.isidentifier() or k == "u"]
    if bad:
        raise DivergenceError(f"invalid parameter name(s) {bad} (u is the variable of f)")
    params = tuple(params)
    expr = _generators.parse_f(f, params)
    if not overwrite and (name in _REGISTRY or name in _FAMILIES or name in _ALIASES):
        old = _REGISTRY.get(name)  # the same registration again: a notebook cell run twice
        if old is not None and not params and (old.f, old.description) == (expr, description):
            return old
        if _FAMILIES.get(name) == (expr, params, description):
            return Divergence(name, expr, description)
        raise DivergenceError(f"a divergence named {name!r} exists with another generator or "
                              "description; pass overwrite=True to replace it")
    if not params and check:
        _generators.check_generator(name, expr)
    # What the name meant before goes: an alias of that spelling, and a family's members
    # (each made from the old generator when first asked for).
    if _ALIASES.get(name.lower()) not in (None, name):
        del _ALIASES[name.lower()]
    for member in [k for k, d in _REGISTRY_MEMBERS.items() if d.family == name]:
        del _REGISTRY_MEMBERS[member]
    if params:
        _FAMILIES[name] = (expr, params, description)
        _REGISTRY.pop(name, None)
        return Divergence(name, expr, description)
    div = Divergence(name, expr, description)
    _REGISTRY[name] = div
    _FAMILIES.pop(name, None)
    return div


def available(families: bool = True) -> list[str]:
    """Names accepted by :func:`get` (families listed by their base name; ``families=False``:
    the divergences registered by name alone).

    >>> import fbands
    >>> [n for n in fbands.available() if n in ("kl", "tv", "alpha")]
    ['kl', 'tv', 'alpha']
    """
    return list(_REGISTRY) + (list(_FAMILIES) if families else [])


def _family_member(name: str, values: dict[str, Any]) -> Divergence:
    expr, params, description = _FAMILIES[name]
    missing = [k for k in params if k not in values]
    unknown = [k for k in values if k not in params]
    if missing or unknown:
        raise DivergenceError(f"{name} takes parameters {list(params)}; missing {missing}, "
                              f"unknown {unknown}")
    subs = {sp.Symbol(k, real=True): _generators.param_value(name, k, values[k]) for k in params}
    f = expr.subs(subs)
    if not f.has(sp.nan, sp.zoo):
        _expr.check_nodes(f)  # e.g. alpha(a=1e6): u**1000000 is refused, not expanded
    if f.has(sp.nan, sp.zoo) or sp.simplify(sp.denom(sp.together(f))) == 0:
        # A removable singularity of the family (alpha at a = 0 or 1): take the limit.
        f = expr
        for sym, v in subs.items():
            f = sp.limit(f, sym, v)
    label = ", ".join(f"{k}={subs[sp.Symbol(k, real=True)]}" for k in params)
    full = f"{name}({label})"
    if full not in _REGISTRY_MEMBERS:
        _generators.check_generator(full, f)
        chosen = {k: subs[sp.Symbol(k, real=True)] for k in params}
        _REGISTRY_MEMBERS[full] = Divergence(full, f, description, family=name, params=chosen)
    return _REGISTRY_MEMBERS[full]


_REGISTRY_MEMBERS: dict[str, Divergence] = {}


def get(name: str | Divergence, **params: Any) -> Divergence:
    """Look up a divergence.

    Parameters
    ----------
    name : str or Divergence
        A registered name or alias (``"kl"``, ``"tv"``, ...), a family with its parameters
        in the name (``"alpha(a=0.5)"`` or ``"alpha(0.5)"``), or a :class:`Divergence`
        (returned as is).
    **params
        Parameters of a family: ``get("alpha", a=0.5)``.

    Raises
    ------
    DivergenceError
        For an unknown name (the message lists the available ones) or bad parameters.

    Examples
    --------
    >>> import fbands
    >>> fbands.get("kl").f
    u - log(u) - 1
    >>> fbands.get("alpha", a=2).f
    u**2/2 - u + 1/2
    """
    if isinstance(name, Divergence):
        if params:
            raise DivergenceError("parameters can only be given with a family name")
        return name
    if not isinstance(name, str):
        raise DivergenceError(f"a divergence is named by a string, got {type(name).__name__}")
    found = None if params or name in _FAMILIES else _REGISTRY.get(name)
    if found is not None:  # a registered name as spelt (every band call): no parsing
        return found
    try:
        base, args, kwargs = _expr.parse_spec(name)
    except DivergenceError:
        if _NAME_LIKE.fullmatch(name.strip()) or _preset_divergence(name.strip()):
            raise _unknown(name.strip()) from None  # a name, not a malformed spec
        raise
    if args or kwargs or name.rstrip().endswith(")"):
        if base not in _FAMILIES:
            raise DivergenceError(f"{base!r} is not a family; families: {list(_FAMILIES)}")
        fam_params = _FAMILIES[base][1]
        if len(args) > len(fam_params):
            raise DivergenceError(f"{base} takes {len(fam_params)} parameter(s) "
                                  f"{list(fam_params)}, got {len(args)}: {name!r}")
        values: dict[str, Any] = dict(zip(fam_params, args, strict=False))
        for key, value in (*kwargs.items(), *params.items()):
            if key in values:
                raise DivergenceError(f"{base}: parameter {key!r} given twice")
            values[key] = value
        return _family_member(base, values)
    name = base
    # A registered name as spelt, else a built-in or alias in any case ("KL", "Pearson").
    key = name if name in _REGISTRY or name in _FAMILIES else _ALIASES.get(name.lower(),
                                                                           name.lower())
    if key in _FAMILIES:
        return _family_member(key, params)
    if key in _REGISTRY:
        if params:
            raise DivergenceError(f"{name} takes no parameters, got {sorted(params)}")
        return _REGISTRY[key]
    raise _unknown(name)


#: What a misspelt name looks like: a spec that does not parse is reported as an unknown name
_NAME_LIKE = re.compile(r"[A-Za-z0-9_-]+")


def _preset_divergence(name: str) -> tuple[str | None] | None:
    """``(divergence,)`` when ``name`` is a loss preset (``divergence`` None for one
    without a band), else None.  ``band-reverse-kl`` is the preset of ``reverse_kl``."""
    found = _presets.fields(name)
    return None if found is None else (found.get("div"),)


def _unknown(name: str) -> DivergenceError:
    """The error for a name that is no divergence: the available names, the closest ones,
    and, for a loss preset's name, the divergence that preset uses."""
    names = available()
    preset = _preset_divergence(name)
    if preset is not None:
        (div,) = preset
        if div is None:
            return DivergenceError(f"{name!r} is a loss preset (fbands.losses.preset), not a "
                                   f"divergence, and has no band; divergences: "
                                   f"{', '.join(names)}")
        try:
            return DivergenceError(f"{name!r} is a loss preset (fbands.losses.preset); its "
                                   f"divergence is {get(div).name!r}")
        except DivergenceError as err:
            return DivergenceError(f"{name!r} looks like a loss preset (band-<div>), but its "
                                   f"divergence {div!r} is refused: {err}")
    message = f"unknown divergence {name!r}"
    key = name.lower().replace("-", "_")
    close = difflib.get_close_matches(key, [*names, *_ALIASES], n=2, cutoff=0.6)
    close = list(dict.fromkeys(_ALIASES.get(c, c) for c in close))
    if close:
        message += f" (did you mean {' or '.join(map(repr, close))}?)"
    return DivergenceError(f"{message}; available: {', '.join(names)}")


#: The built-in divergences' names (families apart).
BUILTINS: list[str] = list(BUILTIN_GENERATORS)


def registry_snapshot() -> tuple[dict, ...]:
    """Copies of the registry's tables (names, families, members, aliases), for tests."""
    return tuple(dict(t) for t in (_REGISTRY, _FAMILIES, _REGISTRY_MEMBERS, _ALIASES))


def restore_registry(snapshot: tuple[dict, ...]) -> None:
    """Put the registry back as :func:`registry_snapshot` saw it."""
    for live, old in zip((_REGISTRY, _FAMILIES, _REGISTRY_MEMBERS, _ALIASES), snapshot,
                         strict=True):
        live.clear()
        live.update(old)


def _builtins() -> None:
    for name, (f, description) in BUILTIN_GENERATORS.items():
        _REGISTRY[name] = Divergence(name, f, description)
    _FAMILIES.update(BUILTIN_FAMILIES)


_builtins()
