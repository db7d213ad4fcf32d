"""What a generator ``f`` must be: read from text by the grammar, checked to make an
f-divergence; and the built-in generators.

:func:`parse_f` turns a string into a sympy expression through :mod:`fbands._expr` (never
evaluated as Python) and keeps a given expression to ``u`` and the declared parameters;
:func:`param_value` reads a family's parameter as an exact rational; :func:`check_generator`
refuses an ``f`` that is not 0 at 1, not real and finite on ``(0, inf)``, not convex, or
growing faster than a power of ``u``.
"""

from __future__ import annotations

import math
from typing import Any

import sympy as sp

from fbands import _checks, _expr, symbolic
from fbands.errors import DivergenceError

__all__ = ["BUILTIN_FAMILIES", "BUILTIN_GENERATORS", "check_generator", "param_value",
           "parse_f"]

_u, _a = symbolic.U, sp.Symbol("a", real=True)
#: The built-in generators (THEORY's conventions), name -> (f, description): the one table
#: that the registry and the cvxpy reference read (the reference matches a divergence's
#: ``f`` against these, never its name).  Their derivations ship in the package
#: (fbands/_derived.py, scripts/ship_derivations.py).
BUILTIN_GENERATORS: dict[str, tuple[sp.Expr, str]] = {
    "kl": (_u - 1 - sp.log(_u), "KL(pi_old || pi), BandPO's BandKL and TRPO's constraint"),
    "reverse_kl": (_u * sp.log(_u) - _u + 1, "KL(pi || pi_old)"),
    "tv": (sp.Abs(_u - 1) / 2, "total variation"),
    "chi2": ((_u - 1) ** 2, "Pearson chi-square (no factor 1/2)"),
    "neyman_chi2": ((_u - 1) ** 2 / _u, "Neyman chi-square"),
    "hellinger": ((sp.sqrt(_u) - 1) ** 2, "squared Hellinger distance (no factor 1/2)"),
    "js": ((_u * sp.log(_u) - (1 + _u) * sp.log((1 + _u) / 2)) * sp.Rational(1, 2),
           "Jensen-Shannon divergence (natural log)"),
}
#: The built-in family: name -> (f in u and its parameters, the parameters, description).
BUILTIN_FAMILIES: dict[str, tuple[sp.Expr, tuple[str, ...], str]] = {
    "alpha": ((_u**_a - 1 - _a * (_u - 1)) / (_a * (_a - 1)), ("a",),
              "Amari alpha family (a -> 0: kl, a -> 1: reverse_kl, 2: chi2/2, 1/2: 2 hellinger)"),
}


def parse_f(f: str | sp.Expr, params: tuple[str, ...]) -> sp.Expr:
    if isinstance(f, str):
        names = {"u": symbolic.U, **{k: sp.Symbol(k, real=True) for k in params}}
        try:
            return _expr.parse_expression(f, names)
        except DivergenceError as err:
            raise DivergenceError(f"cannot parse f = {f!r}: {err}") from None
    if not isinstance(f, sp.Expr):
        raise DivergenceError(f"f must be a sympy expression or a string, got {type(f).__name__}")
    _check_size(f)
    # Accept any symbol named u, whatever its assumptions.
    f = f.xreplace({s: symbolic.U for s in f.free_symbols if s.name == "u"})
    f = f.xreplace({s: sp.Symbol(s.name, real=True) for s in f.free_symbols if s.name in params})
    extra = {s.name for s in f.free_symbols} - {"u", *params}
    if extra:
        raise DivergenceError(
            f"f may only depend on u and the declared parameters {list(params)}, "
            f"but it uses {sorted(extra)}"
        )
    _expr.check_nodes(f)
    return f


def _check_size(f: sp.Expr) -> None:
    """The limits of a generator given as a string, for one given as a sympy expression:
    printed, it is at most :data:`fbands._expr.MAX_LENGTH` characters long, and it nests
    functions and powers at most :data:`fbands._expr.MAX_DEPTH` deep (sympy's derivations
    take time that grows fast with either)."""
    size, stack = 0, [(f, 0)]
    while stack:
        node, depth = stack.pop()
        size += 1
        if size > 4 * _expr.MAX_LENGTH:  # (printing a huge tree is itself slow)
            break
        depth += isinstance(node, (sp.Function, sp.Pow))
        if depth > _expr.MAX_DEPTH:
            raise DivergenceError(f"f nests functions and powers more than "
                                  f"{_expr.MAX_DEPTH} deep")
        stack.extend((arg, depth) for arg in node.args)
    length = len(sp.sstr(f)) if size <= 4 * _expr.MAX_LENGTH else math.inf
    if length > _expr.MAX_LENGTH:
        raise DivergenceError(f"f is longer than {_expr.MAX_LENGTH} characters when printed; "
                              "a generator is a line, not a program")


def param_value(family: str, key: str, value: Any) -> sp.Rational:
    """A family parameter as an exact rational: from a number, or a string in the grammar of
    :mod:`fbands._expr` (``"1/2"``, ``"-1e-3"``); anything else is refused."""
    if isinstance(value, str):
        return _expr.parse_number(value)
    if isinstance(value, sp.Rational):
        return value
    # what is no number is told so; a number, that it must be finite
    x = _checks.number(f"{family}: {key}", value, DivergenceError,
                       finite=_checks.is_real(value))
    if isinstance(value, float):
        return _expr.number(repr(x))  # the decimal a user wrote: 0.1 -> 1/10
    return sp.Rational(value)


def check_generator(name: str, f: sp.Expr) -> None:
    """Reject an ``f`` that is not 0 at 1, not finite on (0, inf), or visibly not convex."""
    at_one = sp.simplify(f.subs(symbolic.U, 1))
    if at_one != 0:
        raise DivergenceError(f"{name}: f(1) must be 0, but f(1) = {at_one}")
    fn = sp.lambdify(symbolic.U, f, "mpmath")
    import mpmath

    grid = [mpmath.mpf(10) ** (k / 4) for k in range(-40, 41)]
    with mpmath.workdps(30):
        try:
            vals = [fn(x) for x in grid]
        except (ValueError, ZeroDivisionError, TypeError) as err:
            raise DivergenceError(f"{name}: f cannot be evaluated on (0, inf): {err}") from err
        if any(not mpmath.isfinite(v) or mpmath.im(v) != 0 for v in vals):
            raise DivergenceError(f"{name}: f must be real and finite on (0, inf)")
        vals = [mpmath.re(v) for v in vals]
        # Convexity: slopes of consecutive chords must not decrease.
        slopes = [(vals[i + 1] - vals[i]) / (grid[i + 1] - grid[i]) for i in range(len(grid) - 1)]
        for i in range(len(slopes) - 1):
            if slopes[i + 1] < slopes[i] - mpmath.mpf(10) ** -20 * (1 + abs(slopes[i])):
                raise DivergenceError(
                    f"{name}: f is not convex (its chord slope decreases near u = "
                    f"{float(grid[i + 1]):.3g})"
                )
    left = sp.limit(sp.diff(f, symbolic.U), symbolic.U, 1, "-")
    right = sp.limit(sp.diff(f, symbolic.U), symbolic.U, 1, "+")
    if left == right and not sp.diff(f, symbolic.U, 2).subs(symbolic.U, 1).is_positive:
        raise DivergenceError(f"{name}: f must be strictly convex at u = 1 (f''(1) > 0)")
    _check_growth(name, f)


#: The largest power of u (or of 1/u at 0) a generator may grow like: beyond it the growth
#: is taken for exponential, which the solver's search in log r cannot bracket.
_MAX_GROWTH = 1000


def _growth(f: sp.Expr, point) -> float:
    """``lim u f'(u) / f(u)`` at ``point`` (0 or oo): the power of ``u`` that ``f`` grows
    like there (inf for exponential growth), by sympy, else estimated with mpmath."""
    import mpmath

    u = symbolic.U
    ratio = u * sp.diff(f, u) / f
    try:
        k = sp.limit(ratio, u, point, "+" if point == 0 else "-")
        if k.is_extended_real and k.is_number:
            return float(k)
    except Exception:  # noqa: BLE001 - sympy's limit raises assorted errors
        pass
    fn = sp.lambdify(u, ratio, "mpmath")
    with mpmath.workdps(30):
        return float(abs(fn(mpmath.mpf(10) ** (-60 if point == 0 else 60))))


def _check_growth(name: str, f: sp.Expr) -> None:
    """Refuse a generator that grows faster than every power of ``u`` (or of ``1/u`` as
    ``u -> 0``, where ``f`` is unbounded), such as ``cosh(u - 1) - 1``: the solver works in
    ``s = log r`` and relies on power-law tails."""
    checks = [(sp.oo, "u -> inf", "u")]
    if _unbounded_at_zero(f):
        checks.append((0, "u -> 0", "1/u"))
    for point, where, var in checks:
        k = _growth(f, point)
        if abs(k) > _MAX_GROWTH:  # (nan: undecided, and the grid check above passed)
            raise DivergenceError(
                f"{name}: f grows faster than any power of {var} as {where} "
                f"(u f'(u) / f(u) -> {k}); fbands supports generators with power-law "
                f"growth (at most {var}**{_MAX_GROWTH})"
            )


def _unbounded_at_zero(f: sp.Expr) -> bool:
    """Whether ``f(0+)`` is infinite (or sympy cannot tell: then the check runs anyway)."""
    try:
        return not sp.limit(f, symbolic.U, 0, "+").is_finite
    except Exception:  # noqa: BLE001 - sympy's limit raises assorted errors
        return True
