"""The symbolic side of fbands: everything a divergence needs, derived from ``f`` by sympy.

A divergence is given by its generator ``f(u)``.  The band solvers never see ``f`` itself;
they use what :func:`derive` computes from it once:

* ``F(s) = f(exp(s))``, the generator in the log-ratio ``s = log u``, with its first derivative.
  Working in ``s`` makes huge upper edges and tiny lower edges ordinary numbers, and the
  expression is rewritten with ``expm1``/``log1p`` so that it has no cancellation near
  ``s = 0``: a *near* form for ``|s| < NEAR`` (every exponential written through one
  ``t = expm1(k s)`` and expanded, logs of ``1 + O(t)`` through ``log1p``) and a *far* form for
  the rest.
* The constants ``f(0)``, ``f'(inf) = lim f(u)/u`` and ``f''(1)``.
* Closed-form edges, when the band equation ``g(p, r) = delta`` reduces (after clearing
  denominators and, if needed, radicals) to a polynomial of degree <= 2: its coefficients as
  expressions in ``p``, ``q = 1 - p`` and ``delta``.  The upper edge is solved for
  ``y = r - 1`` and the lower one for ``r`` itself, so that the root that matters is never a
  difference of nearly equal numbers; the roots are then taken by the cancellation-free
  quadratic formula (:func:`fbands._solver.real_roots`).

:func:`compile_expr` turns an expression into Python source over bare function names
(``exp``, ``expm1``, ``log``, ``log1p``, ``sqrt``, ``sinh``, ``cosh``, ``tanh``, ``sign``,
``abs``),
which each backend binds to its own functions (numpy, torch, math for numba).  That is how
the maths of a divergence is written once and serves every backend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import reduce

import sympy as sp
from sympy.codegen.cfunctions import expm1, log1p
from sympy.printing.pycode import PythonCodePrinter

from fbands import _stable

U = sp.Symbol("u", positive=True)
S = sp.Symbol("s", real=True)
T = sp.Symbol("t", real=True)
P = sp.Symbol("p", positive=True)
Q = sp.Symbol("q", positive=True)
D = sp.Symbol("delta", positive=True)
Y = sp.Symbol("y", positive=True)
R = sp.Symbol("r", positive=True)

#: Below this |s| the near form of F is used.
NEAR = 0.5

_FUNCTIONS = ("exp", "expm1", "log", "log1p", "sqrt", "sinh", "cosh", "tanh", "sign", "where")


@dataclass(frozen=True)
class ClosedForm:
    """Polynomial form of ``g(p, r) = delta`` for one edge.

    ``coeffs`` are (a2, a1, a0) of ``a2 v**2 + a1 v + a0 = 0`` in ``v = r - 1`` (upper edge),
    ``v = r`` (lower edge) or ``v = 1 - r`` (lower edge, :attr:`Derivation.lower_y`: the form
    without cancellation when the edge is near 1), as expressions in ``p``, ``q``, ``delta``.
    ``squared`` is True when radicals were cleared by squaring, so that a root may be
    extraneous and must be checked against ``g`` itself.
    """

    coeffs: tuple[sp.Expr, sp.Expr, sp.Expr]
    squared: bool

    @property
    def zero(self) -> tuple[bool, bool]:
        """Whether ``a2`` and ``a1`` vanish identically (a linear form; one with no linear
        term, such as chi2's in ``y``): the solvers' formula for the roots follows."""
        return bool(self.coeffs[0] == 0), bool(self.coeffs[1] == 0)


@dataclass(frozen=True)
class Derivation:
    """What the solvers need, derived from ``f`` (see the module docstring)."""

    f: sp.Expr
    F_near: sp.Expr  # in S; equal to F_far when no rewriting was needed
    F_far: sp.Expr
    dF: sp.Expr  # dF/ds
    f0: float  # f(0+), may be inf
    fpinf: float  # lim f(u)/u as u -> inf, may be inf
    fpp1: float  # f''(1)
    upper: ClosedForm | None
    lower: ClosedForm | None
    tail0: tuple[float, float, int, float] | None = None  # f ~ u**k (A (log u)**m + B), u -> 0
    tail_inf: tuple[float, float, int, float] | None = None  # ... as u -> inf
    lower_y: ClosedForm | None = None  # the lower edge's polynomial in y = 1 - r
    f0_text: str = "nan"  # f(0+) to 30 digits (for arithmetic finer than float64)
    # lim f(c) - f'(inf) (c - 1) as c -> inf: nan where f'(inf) is infinite or sympy finds none
    offset_inf: float = math.nan


# ----------------------------------------------------------------------------- derivation


def _to_float(x: sp.Expr) -> float:
    if x is sp.oo or x == sp.oo:
        return math.inf
    if x is sp.nan or not x.is_number:
        raise ValueError(f"not a number: {x}")
    return float(x)


def _exp_atoms(expr: sp.Expr) -> list[sp.Expr]:
    return [a for a in expr.atoms(sp.exp) if a.args[0].has(S)]


def _rational_gcd(values: list[Fraction]) -> Fraction:
    num = reduce(math.gcd, (v.numerator for v in values))
    den = reduce(lambda a, b: a * b // math.gcd(a, b), (v.denominator for v in values))
    return Fraction(num, den)


#: Largest degree in ``1 + t`` the near form may expand to (``alpha(a=0.123)`` would need
#: 1000): beyond it sympy's expansion takes seconds to minutes, and ``F`` keeps its far form
#: near ``s = 0`` too (log-edges of size ``|s|`` then carry an error of about
#: ``1e-16 / |s|`` relative, the edges themselves stay within a few ulp).
_NEAR_MAX_DEGREE = 48


def _near_form(F: sp.Expr) -> sp.Expr:
    """Rewrite ``F(s)`` so that it has no cancellation for small ``s``.

    Every ``exp(c s)`` (c rational) becomes ``(1 + t)**(c/k)`` with ``t = expm1(k s)`` and ``k``
    the rational gcd of the ``c``; logs of arguments equal to 1 at ``t = 0`` become ``log1p``;
    the result is expanded so that the terms of order 0 and 1 in ``t`` cancel exactly, in
    algebra rather than in floating point.  Returns ``F`` unchanged when that is not possible
    or would expand past :data:`_NEAR_MAX_DEGREE`.
    """
    if F.has(sp.sinh, sp.cosh, sp.tanh):
        F = F.rewrite(sp.exp)
    slopes = _exp_slopes(F)
    if not slopes or _exp_degree(slopes) > _NEAR_MAX_DEGREE:
        return F
    k = _rational_gcd([abs(c) for c in slopes.values()])
    k_sym = sp.Rational(k.numerator, k.denominator)
    W = sp.Symbol("w", positive=True)  # w = exp(k s) = 1 + t > 0
    G = F.xreplace({a: W ** sp.Rational(c / k) for a, c in slopes.items()})
    G = sp.powsimp(sp.powdenest(G, force=True)).subs(W, 1 + T)

    def as_log1p(arg):
        c = sp.simplify(arg.subs({T: 0, S: 0}))
        if c.is_positive and c.is_finite:
            return sp.log(c) + log1p(sp.expand(arg / c - 1))
        return sp.log(arg)

    G = G.replace(lambda e: isinstance(e, sp.log), lambda e: as_log1p(e.args[0]))
    # Over a common denominator, so that negative powers of 1 + t cancel too.
    num, den = sp.fraction(sp.together(sp.expand(G)))
    G = sp.expand(num) / sp.factor(den)
    return G.subs(T, expm1(k_sym * S))


def _exp_slopes(F: sp.Expr) -> dict[sp.Expr, Fraction] | None:
    """Each ``exp(c s)`` of ``F`` with its rational ``c``; None if some ``c`` is not rational."""
    out = {}
    for a in _exp_atoms(F):
        c = sp.simplify(a.args[0] / S)
        if not c.is_Rational or c.has(S):
            return None
        out[a] = Fraction(int(c.p), int(c.q))
    return out


def _exp_degree(slopes: dict[sp.Expr, Fraction]) -> Fraction:
    """Degree of ``F`` as a polynomial in ``exp(k s)``, ``k`` the rational gcd of the slopes."""
    if not slopes:
        return Fraction(0)
    k = _rational_gcd([abs(c) for c in slopes.values()])
    return max(abs(c) / k for c in slopes.values())


def _optimize(expr: sp.Expr) -> sp.Expr:
    """``expm1``/``log1p`` rewriting of sympy's C99 optimisations; skipped for an ``expr`` of
    high degree in ``exp(k s)``, where they factor a polynomial of that degree (minutes)."""
    from sympy.codegen.rewriting import optimize, optims_c99

    slopes = _exp_slopes(expr)
    if slopes is None or _exp_degree(slopes) > _NEAR_MAX_DEGREE:
        return expr
    return optimize(expr, optims_c99)


def _in_q(e: sp.Expr) -> sp.Expr:
    """``e`` (a sum) written in ``q = 1 - p`` where that has fewer terms: ``1 - p`` is ``q``,
    and ``delta + 4 p - 4`` is ``delta - 4 q``, whose float value keeps every digit of a
    ``delta`` far below 1 when ``p`` is next to 1 (``(delta + 4 p) - 4`` loses them)."""
    if not (e.is_Add and e.has(P)):
        return e
    in_q = sp.expand(e.subs(P, 1 - Q))
    terms = len(in_q.args) if in_q.is_Add else 1
    return in_q if terms < len(e.args) else e


def _in_p_and_q(c: sp.Expr) -> sp.Expr:
    """Simplify a coefficient using ``p + q = 1``, then write each factor that is shorter in
    ``q = 1 - p`` so (:func:`_in_q`).

    The solvers receive ``q`` computed accurately (``-expm1(log p)`` for log-inputs), so
    keeping it as a symbol avoids forming ``1 - p`` again in floating point.
    """
    c = sp.factor(sp.expand(c.subs(Q, 1 - P)))
    return c.replace(lambda e: e.is_Add and e.has(P), _in_q)


#: Largest integer power of ``u`` that can still give a band equation of degree <= 2; a
#: higher one is not tried, which keeps sympy's work small.
_CLOSED_MAX_POWER = 4


def _may_have_closed_form(f: sp.Expr) -> bool:
    """Whether the powers of ``u`` in ``f`` (expanded) leave a quadratic band equation
    possible: integers of small size, and ``sqrt(u)`` as the only radical.

    Linear terms of ``f`` add up to a constant in ``p f(r) + q f(c)``, so a radical whose
    coefficient is constant, ``sqrt(u)``, squares (twice, for ``r`` and ``c``) into degree 2.
    Any other radical, ``u**(3/2) = u sqrt(u)`` or ``u**(-1/2)``, has a coefficient of degree
    1 or more after clearing denominators, and squaring it gives degree 3 or more: sympy's
    ``unrad`` would spend seconds to minutes (``alpha(a=-7/2)``: about a minute) only to find
    that.
    """
    for node in sp.expand(f).atoms(sp.Pow):
        if node.base.has(U):
            e = node.exp
            if not e.is_Rational or e.q > 2 or abs(e) > _CLOSED_MAX_POWER:
                return False
            if e.q == 2 and e != sp.Rational(1, 2):
                return False
    return True


def _closed_form(f: sp.Expr, edge: str) -> ClosedForm | None:
    """Polynomial form of the band equation for one edge, or None (see :class:`ClosedForm`)."""
    from sympy.solvers.solvers import unrad

    if not _may_have_closed_form(f):
        return None
    if edge == "upper":  # r = 1 + y, c = 1 - p y / q
        g = P * f.subs(U, 1 + Y) + Q * f.subs(U, 1 - P * Y / Q)
        var = Y
    else:  # r = 1 - y, c = 1 + p y / q; then y = 1 - r (edge "lower"), or kept ("lower_y")
        g = P * f.subs(U, 1 - Y) + Q * f.subs(U, 1 + P * Y / Q)
        var = Y
    if g.has(sp.Abs):  # with y > 0 every |.| has a known sign once expanded
        g = g.replace(lambda e: isinstance(e, sp.Abs), lambda e: sp.Abs(sp.expand(e.args[0])))
    if g.has(sp.Abs, sp.log, sp.exp, sp.LambertW, sp.Piecewise):
        return None
    if edge == "lower":
        g = g.subs(Y, 1 - R)
        var = R
    num = sp.numer(sp.together(g - D))
    squared = False
    radicals = [
        a for a in num.atoms(sp.Pow) if a.has(var) and not sp.sympify(a.exp).is_Integer
    ]
    if radicals:
        try:
            res = unrad(num, var)
        except Exception:  # noqa: BLE001 - sympy raises assorted errors here
            return None
        if res is None or res[1]:
            return None
        num, squared = res[0], True
    try:
        poly = sp.Poly(sp.expand(num), var)
    except sp.PolynomialError:
        return None
    if poly.degree() > 2 or poly.degree() < 1 or any(c.has(var) for c in poly.all_coeffs()):
        return None
    coeffs = [_in_p_and_q(c) for c in poly.all_coeffs()]
    if coeffs[0].could_extract_minus_sign():
        # One sign for the leading coefficient of every form (roots do not change): tv's
        # three forms then all divide by p, and the closed-form pass computes 1 / p once.
        coeffs = [-c for c in coeffs]
    coeffs = [sp.Integer(0)] * (2 - poly.degree()) + coeffs
    return ClosedForm(tuple(coeffs), squared)


def _curvature_at_one(f: sp.Expr) -> float:
    """``f''(1)``; ``inf`` at a kink (``f'(1+) > f'(1-)``, as for total variation)."""
    d1 = sp.diff(f, U)
    d2 = sp.diff(d1, U)
    if not d2.has(sp.DiracDelta, sp.Derivative, sp.Subs):
        value = sp.limit(d2, U, 1)
        if value.is_finite:
            return float(value)
    jump = sp.limit(d1, U, 1, "+") - sp.limit(d1, U, 1, "-")
    return math.inf if jump.is_positive else float("nan")


def _tail(f: sp.Expr, point) -> tuple[float, float, int, float] | None:
    """``(A, k, m, B)`` with ``f(u) = u**k (A (log u)**m + B) + o(u**k)`` as ``u -> point``.

    ``m`` is 0 or 1 (``B = 0`` when ``m = 0``).  Used only where ``p`` is so small
    (``log p < LP_TINY``) that the band follows from this behaviour of ``f`` alone.  None when
    sympy cannot find such a form.
    """
    direction = "+" if point == 0 else "-"
    try:
        k = sp.limit(U * sp.diff(f, U) / f, U, point, direction)
        if not (k.is_real and k.is_finite):
            return None
        for m in (0, 1):
            A = sp.limit(f / (U**k * sp.log(U) ** m), U, point, direction)
            if A.is_real and A.is_finite and A != 0:
                B = sp.limit(f / U**k - A * sp.log(U), U, point, direction) if m else 0
                if not (B.is_real and B.is_finite) if m else False:
                    return None
                return float(A), float(k), m, float(B)
    except Exception:  # noqa: BLE001 - sympy's limit raises assorted errors
        return None
    return None


def derive(f: sp.Expr, *, closed_forms: bool = True) -> Derivation:
    """Derive the solver's ingredients from a generator ``f`` in the symbol :data:`U`."""
    F = sp.simplify(sp.expand_log(_stable.recognise(f).subs(U, sp.exp(S)), force=True))
    F_far = _optimize(F)
    F_near = _optimize(_near_form(F))
    dF = sp.diff(F, S)
    # simplify() turns sign(x) into x / |x|, which overflows for large x: keep sign then.
    dF = _optimize(dF if dF.has(sp.sign, sp.Abs) else sp.simplify(dF))
    f0_exact = sp.limit(f, U, 0, "+")
    f0 = _to_float(f0_exact)
    fpinf_exact = sp.limit(f / U, U, sp.oo)
    fpinf = _to_float(fpinf_exact)
    fpp1 = _curvature_at_one(f)
    upper = _closed_form(f, "upper") if closed_forms else None
    lower = _closed_form(f, "lower") if closed_forms else None
    tail0 = _tail(f, 0) if math.isinf(f0) else None
    tail_inf = _tail(f, sp.oo)
    lower_y = _closed_form(f, "lower_y") if lower is not None else None
    f0_text = str(sp.N(f0_exact, 30)) if math.isfinite(f0) else repr(f0)
    return Derivation(f, F_near, F_far, dF, f0, fpinf, fpp1, upper, lower, tail0, tail_inf,
                      lower_y, f0_text, _offset_at_inf(f, fpinf_exact))


def _offset_at_inf(f: sp.Expr, slope: sp.Expr) -> float:
    """``lim f(c) - slope (c - 1)`` as ``c -> inf`` for a finite ``slope = f'(inf)``
    (``-inf`` for kl and hellinger; nan where the slope is infinite or sympy finds none)."""
    if not slope.is_finite:
        return math.nan
    try:
        return _to_float(sp.limit(f - slope * (U - 1), U, sp.oo))
    except (TypeError, ValueError, NotImplementedError):
        return math.nan


# ----------------------------------------------------------------------------- code generation


class _Printer(PythonCodePrinter):
    """Python source over bare function names, for arrays, tensors and numba scalars.

    ``numbers``: write every number that is not an integer as ``from_decimal("<30 digits>")``, for
    a namespace whose ``from_decimal`` makes a value of a precision finer than float64.
    """

    def __init__(self, numbers: bool = False):
        super().__init__({"fully_qualified_modules": False, "standard": "python3"})
        self.numbers = numbers

    def _number(self, x: sp.Expr) -> str:
        return f'from_decimal("{sp.N(x, 30)}")' if self.numbers else f"({float(x)!r})"

    def _call(self, name, expr):
        return f"{name}({', '.join(self._print(a) for a in expr.args)})"

    def _print_exp(self, e):
        return self._call("exp", e)

    def _print_log(self, e):
        return self._call("log", e)

    def _print_expm1(self, e):
        return self._call("expm1", e)

    def _print_log1p(self, e):
        return self._call("log1p", e)

    def _print_sinh(self, e):
        return self._call("sinh", e)

    def _print_cosh(self, e):
        return self._call("cosh", e)

    def _print_tanh(self, e):
        return self._call("tanh", e)

    def _print_softplus(self, e):
        return f"({self._print(_numeric_constants(e.stable()))})"

    _print_sigmoid = _print_logcosh = _print_softplus

    def _print_sign(self, e):
        return self._call("sign", e)

    def _print_Abs(self, e):
        return self._call("abs", e)

    def _print_Pow(self, expr, rational=False):
        base, ex = expr.as_base_exp()
        if ex == sp.Rational(1, 2):
            return f"sqrt({self._print(base)})"
        if ex == -1:
            return f"(1/{self.parenthesize(base, 1000)})"
        return f"{self.parenthesize(base, 1000)}**{self.parenthesize(ex, 1000)}"

    def _print_Piecewise(self, expr):
        # where(c1, e1, where(c2, e2, ...)): branch-free, for arrays and tensors alike.
        out = "nan"
        for e, c in reversed(expr.args):
            if c == sp.true:
                out = self._print(e)
            else:
                out = f"where({self._print(c)}, {self._print(e)}, {out})"
        return out

    def _print_Rational(self, expr):
        return self._number(expr)

    def _print_Integer(self, expr):
        # Python's ints are unbounded but numba's are int64 (a Rational's numerator and
        # denominator, e.g. of 0.1234567890123456789, are printed as two Integers): an integer
        # beyond float64's exact range is written as a number.
        return self._number(expr) if abs(int(expr)) > 2**53 else super()._print_Integer(expr)

    def _print_Float(self, expr):
        return self._number(expr)


def _numeric_constants(expr: sp.Expr) -> sp.Expr:
    """Replace constant sub-expressions such as ``log(2)`` by floats (tensors need that)."""
    return expr.replace(
        lambda e: e.is_number and not e.is_Rational and not e.is_Float and e.is_finite,
        lambda e: sp.Float(e.evalf(30), 30),
    )


#: The functions the printer writes, each bound by every backend (:data:`_FUNCTIONS`, ``abs``):
#: the derivatives of the grammar's functions (:data:`fbands._expr.FUNCTIONS`) and the
#: rewritings of sympy stay in this set, and anything else is refused by
#: :func:`compile_expr`, never printed as a name that a backend lacks.
_PRINTED = (sp.exp, sp.log, expm1, log1p, sp.sinh, sp.cosh, sp.tanh, sp.sign, sp.Abs,
            sp.Piecewise, *_stable.CLASSES)
#: Hyperbolic functions sympy may write, as those of :data:`_PRINTED` (no overflow: the
#: reciprocal of an infinite cosh or sinh is 0).
_RECIPROCALS = {sp.coth: sp.tanh, sp.sech: sp.cosh, sp.csch: sp.sinh}


def _printable(expr: sp.Expr) -> sp.Expr:
    """``expr`` over :data:`_PRINTED` only, or a :class:`fbands.DivergenceError`."""
    from fbands.errors import DivergenceError

    for cls, inverse in _RECIPROCALS.items():
        expr = expr.replace(cls, lambda x, inverse=inverse: 1 / inverse(x))
    bad = sorted({type(f).__name__ for f in expr.atoms(sp.Function)
                  if not isinstance(f, _PRINTED)})
    if bad:
        raise DivergenceError(f"the derived formulas need {bad}, which fbands' generated "
                              f"kernels do not provide (they know exp, log, sqrt, sinh, cosh, "
                              f"tanh, abs and sign)")
    return expr


def compile_expr(expr: sp.Expr, args: tuple[sp.Symbol, ...], *, numbers: bool = False) -> str:
    """Python source of a function ``_fn(*args)`` evaluating ``expr`` (``numbers``: see
    :class:`_Printer`); a :class:`fbands.DivergenceError` where ``expr`` needs a function
    that the backends lack (see :data:`_PRINTED`)."""
    body = _Printer(numbers).doprint(_numeric_constants(_printable(expr)))
    return f"def _fn({', '.join(a.name for a in args)}):\n    return {body}\n"


def bind(source: str, namespace: dict) -> callable:
    """Execute ``source`` from :func:`compile_expr` with the given function bindings."""
    missing = [n for n in _FUNCTIONS if n not in namespace]
    if missing:
        raise KeyError(f"namespace lacks {missing}")
    glb = dict(namespace)
    exec(compile(source, "<fbands-generated>", "exec"), glb)  # noqa: S102 - our own source
    return glb["_fn"]
