"""cvxpy backend: the band as a convex program over the whole probability simplex.

This is the reference the two-point reduction is checked against, so it deliberately shares
nothing with the solver: each divergence is written again here as a DCP expression of the
new distribution ``pi`` (an n-vector), and the edges are the optimal values of

.. math::

    \\max / \\min\\ \\pi_a \\quad\\text{s.t.}\\quad
    \\sum_x \\pi_{\\mathrm{old}}(x)\\, f\\!\\left(\\frac{\\pi(x)}{\\pi_{\\mathrm{old}}(x)}\\right)
    \\le \\delta,\\ \\ \\sum_x \\pi(x) = 1,\\ \\ \\pi \\ge 0,

divided by ``pi_old(a)``.  Each band costs two to six conic solves: use it to check, not to
train.

Each solution is checked: the constraint must hold at the returned ``pi``, the edges must
bracket 1 (``pi = pi_old`` is feasible) and the upper one may not give ``pi(a)`` more than
1, to :data:`CONSTRAINT_TOLERANCE` and :data:`TOLERANCE` relative; edges within the latter
of 1 (or of ``1 / p``) are set to it.

**Accuracy.**  An interior-point solver is accurate to about 1e-8 *absolute* in its variables,
so a lower edge ``r`` with ``p r`` near that is not resolved at all (kl's ``exp(-delta / p)``
is 1e-44 at ``p = 1e-3``, ``delta = 0.1``; such edges used to come back finite and up to 1e80
times too large).  Two-token problems (the backend's, and :func:`reference_band` with two
tokens) are therefore certified edge by edge (:func:`_certified_edge`): the sampled token's
variable is its ratio, so the objective is the edge itself, and the edge is accepted only
when the divergence, evaluated at the two-token distributions of ratios
``e (1 -+ EDGE_TOLERANCE)``, puts them on the two sides of ``delta``; a saturated edge (0 or
``1 / p``) is certified exactly.  Every edge the backend returns is thus within
:data:`EDGE_TOLERANCE` (1e-5) relative of the band's, or exact where saturated.  Programs
over more tokens keep the checks above only (accuracy about 1e-6 of ``pi``).

A solve that fails a check or its certificate, or that the solver gives up on, raises
:class:`~fbands.errors.SolverError` in :func:`reference_band`; in the backend that edge is NaN
(each edge apart) and a :class:`RuntimeWarning` counts the NaN edges and gives the first
reason.  Measured over the built-ins and alpha(1/2, 3, -1), ``p`` from 1e-12 to 1 - 1e-9 and
``delta`` from 1e-6 to 10, about one edge in six is NaN (tiny lower edges, most edges at
``p <= 1e-8``, alpha(3) and alpha(-1) at ``delta = 1e-6``), and none is wrong.

Near ``p = 1`` the other token's mass ``1 - p`` falls below what the solver resolves
(:data:`SMALLEST_MASS`).  There the backend returns the band at that mass when the band
has visibly converged, i.e. agrees to :data:`TOLERANCE` with the band at ten times that
mass (kl, tv: the edges move by ``O(1 - p)``), and NaN when it has not (chi2's lower edge
opens like ``sqrt(1 - p)``): a limit is taken only where the solver shows one.
"""

from __future__ import annotations

import math
import operator
import warnings
from collections.abc import Callable

import numpy as np
import sympy

from fbands import _checks, symbolic
from fbands._generators import BUILTIN_FAMILIES, BUILTIN_GENERATORS
from fbands._inputs import NumpyInputs, Request
from fbands._optional import require
from fbands.divergences import Divergence, get
from fbands.errors import BandError, DivergenceError, SolverError

#: Relative tolerance of the checks on each solution (see the module docstring).
TOLERANCE = 1e-6
#: ... and on the constraint: loose, as terms weigh 1 / pi_old and amplify the residual.
CONSTRAINT_TOLERANCE = 0.05
#: Relative accuracy certified for each edge of a two-token problem (see :func:`_certified`).
EDGE_TOLERANCE = 1e-5
#: The smallest mass of the second token that the backend hands to the solver.
SMALLEST_MASS = 1e-9


def _cp():
    return require("cvxpy", "the cvxpy reference solver")


def _alpha(a: float) -> Callable:
    """sum (old^(1-a) pi^a - old - a (pi - old)) / (a (a - 1)); pi^a is convex for a > 1 or
    a < 0 and concave for 0 < a < 1, where the weight 1 / (a (a - 1)) is negative: DCP either
    way."""

    def expr(cp, pi, old):
        w = old ** (1.0 - a) / (a * (a - 1.0))
        affine = cp.sum(-old - a * (pi - old)) / (a * (a - 1.0))
        return cp.sum(cp.multiply(w, cp.power(pi, a))) + affine

    return expr


#: name -> DCP expression of D_f(pi || old), for a cvxpy variable pi and a numpy vector old.
_EXPRESSIONS: dict[str, Callable] = {
    "kl": lambda cp, pi, old: cp.sum(pi - old) - old @ cp.log(pi) + float(old @ np.log(old)),
    "reverse_kl": lambda cp, pi, old: cp.sum(cp.kl_div(pi, old)),
    "tv": lambda cp, pi, old: cp.sum(cp.abs(pi - old)) / 2,
    "chi2": lambda cp, pi, old: cp.sum(cp.multiply(1.0 / old, cp.square(pi - old))),
    "neyman_chi2": lambda cp, pi, old: cp.sum(
        [cp.quad_over_lin(pi[i] - old[i], pi[i]) for i in range(old.size)]
    ),
    "hellinger": lambda cp, pi, old: cp.sum(pi + old) - 2 * np.sqrt(old) @ cp.sqrt(pi),
    "js": lambda cp, pi, old: (
        cp.sum(cp.rel_entr(pi, (pi + old) / 2)) + cp.sum(cp.rel_entr(old, (pi + old) / 2))
    )
    / 2,
}




def _same(f: sympy.Expr, g: sympy.Expr) -> bool:
    return f == g or sympy.expand(f - g) == 0


def expression(div: Divergence) -> Callable:
    """The DCP builder for a divergence, chosen by its generator ``f``, or a
    :class:`DivergenceError` naming those known.  Each expression above is written for a
    built-in generator (:data:`fbands._generators.BUILTIN_GENERATORS`); ``f`` is matched
    against those, never the name, so that a re-registered name can never select another
    divergence's program."""
    u = symbolic.U
    f = div.f.xreplace({s: u for s in div.f.free_symbols if s.name == "u"})
    for name, build in _EXPRESSIONS.items():
        if _same(f, BUILTIN_GENERATORS[name][0]):
            return build
    a = div.params.get("a")
    if a is not None and a not in (0, 1):
        family, (param,), _ = BUILTIN_FAMILIES["alpha"]
        alpha = family.xreplace({s: a for s in family.free_symbols if s.name == param})
        if _same(f, alpha):
            return _alpha(float(a))
    raise DivergenceError(
        f"the cvxpy reference has no DCP form for {div.name!r} (f = {div.f}); it knows the "
        f"generators of {sorted(_EXPRESSIONS)} and alpha(a=...)"
    )


def reference_band(
    p_old, index: int, delta: float, div: str | Divergence = "kl", *, solver: str | None = None
) -> tuple[float, float]:
    """Band of token ``index`` by convex optimisation over the whole simplex.

    Parameters
    ----------
    p_old : array-like
        The old distribution (n >= 2 positive entries summing to 1).
    index : int
        The sampled token.
    delta : float
        Radius of the trust region ``D_f(pi || p_old) <= delta``.
    div : str or Divergence
        One of kl, reverse_kl, tv, chi2, neyman_chi2, hellinger, js, alpha(a=...).
    solver : str, optional
        A cvxpy solver name (default: cvxpy's choice, Clarabel when installed).

    Returns
    -------
    (lower, upper) : tuple of float
        ``min pi(index) / p_old[index]`` and ``max pi(index) / p_old[index]``.

    Examples
    --------
    >>> import fbands
    >>> lo, hi = fbands.reference_band([0.2, 0.3, 0.5], 0, 0.05, "tv")
    >>> round(lo, 5), round(hi, 5)
    (0.75, 1.25)
    """
    cp = _cp()
    d = get(div)
    build = expression(d)
    old = np.asarray(p_old, dtype=np.float64)
    if old.ndim != 1 or old.size < 2 or np.any(~(old > 0)) or abs(old.sum() - 1) > 1e-9:
        raise BandError("p_old must be a vector of n >= 2 positive probabilities summing to 1")
    try:
        index = operator.index(index)
    except TypeError:
        raise BandError(f"index must be an integer; got {index!r}") from None
    if not 0 <= index < old.size:
        raise BandError(f"index {index} out of range for {old.size} tokens")
    delta = _checks.positive("delta", delta, BandError)
    if old.size == 2:  # each edge certified (see _certified_edge)
        return tuple(_certified_edge(cp, build, old, index, delta, solver, lower=lower)
                     for lower in (True, False))
    return _program(cp, build, old, index, delta, solver, scaled=False)


def _problem(cp, build, old, index, delta, *, scaled: bool):
    """``(x, objective, constraints, divergence, unit)``: the convex program in the
    variable ``x``, whose edge is ``objective.value / unit``.

    ``scaled``: the sampled token's variable is its ratio ``r = pi(a) / p``, so that the
    objective is the edge itself, of order 1, where ``pi(a) = p r`` is as small as ``p`` and
    the solver's absolute tolerance swamps it; the others stay probabilities (their ratios
    reach ``1 / q``).  Otherwise every variable is a probability (better near ``p = 1``).
    """
    scale = np.ones(old.size)
    if scaled:
        scale[index] = old[index]
    x = cp.Variable(old.size, nonneg=True)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        divergence = build(cp, cp.multiply(scale, x), old)
    constraints = [scale @ x == 1, divergence <= delta]
    return x, constraints, divergence, 1.0 if scaled else float(old[index])


def _program(cp, build, old, index, delta, solver, *, scaled: bool) -> tuple[float, float]:
    """Both edges of the program over ``old.size`` tokens, checked (module docstring)."""
    x, constraints, divergence, unit = _problem(cp, build, old, index, delta, scaled=scaled)
    lo, hi = (_optimum(cp, sense, x, index, constraints, divergence, delta, solver) / unit
              for sense in (cp.Minimize, cp.Maximize))
    top = 1.0 / old[index]
    if lo > 1 + TOLERANCE or hi < 1 - TOLERANCE or hi > top * (1 + TOLERANCE):
        raise SolverError(f"cvxpy's band [{lo:.6g}, {hi:.6g}] does not contain 1 or leaves "
                          f"[0, 1 / p] (p = {old[index]:.3g} is beyond the solver's precision)")
    return min(lo, 1.0), min(max(hi, 1.0), top)


def _certified_edge(cp, build, old, index, delta, solver, *, lower: bool) -> float:
    """One edge of a two-token problem, certified to :data:`EDGE_TOLERANCE` relative, or a
    :class:`SolverError`.

    With two tokens the distribution of ratio ``r`` is fixed, ``(p r, 1 - p r)``, so the
    divergence's own DCP expression, evaluated there, says on which side of ``delta`` a ratio
    lies.  A saturated edge (0 or ``1 / p``) is certified by the divergence there being
    within ``delta``, without a solve.  Otherwise the edge ``e`` the program gives (scaled
    first, then plain: see :func:`_problem`) is accepted when the ratios
    ``e (1 -+ EDGE_TOLERANCE)`` lie on the two sides of the band's boundary, so that the true
    edge lies between them.  An interior-point answer that only looks feasible (a tiny edge
    below the solver's resolution, or one it stopped short of) fails.
    """
    p = float(old[index])
    point = cp.Variable(2, nonneg=True)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        expr = build(cp, point, old)

    def inside(r):
        v = np.empty(2)
        v[index], v[1 - index] = p * r, max(1.0 - p * r, 0.0)
        point.value = v
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            value = expr.value
        return value is not None and value <= delta

    tol, top = EDGE_TOLERANCE, 1.0 / p
    if inside(0.0 if lower else top):
        return 0.0 if lower else top
    reasons = []
    for scaled in (True, False):
        x, constraints, divergence, unit = _problem(cp, build, old, index, delta,
                                                    scaled=scaled)
        sense = cp.Minimize if lower else cp.Maximize
        try:
            e = _optimum(cp, sense, x, index, constraints, divergence, delta, solver) / unit
        except SolverError as exc:
            reasons.append(str(exc))
            continue
        if lower:
            e = min(e, 1.0)
            if e > 0 and inside(min(e * (1 + tol), 1.0)) and not inside(e * (1 - tol)):
                return e
        else:
            e = min(max(e, 1.0), top)
            if inside(max(e * (1 - tol), 1.0)) and not inside(min(e * (1 + tol), top)):
                return e
        reasons.append(f"its edge {e:.9g} fails the certificate")
    edge = "lower" if lower else "upper"
    raise SolverError(f"cvxpy's {edge} edge is not within {tol:g} of the band's boundary "
                      f"(p = {p:.3g}, delta = {delta:g}): {'; '.join(reasons)}")


def _optimum(cp, sense, x, index, constraints, divergence, delta, solver) -> float:
    # One edge, its solution checked against the constraint (see the module docstring).
    problem = cp.Problem(sense(x[index]), constraints)
    try:
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            problem.solve(solver=solver)
    except (cp.error.SolverError, ValueError) as exc:
        raise SolverError(f"cvxpy could not solve the band problem: {exc}") from None
    if problem.status not in ("optimal", "optimal_inaccurate") or x.value is None:
        raise SolverError(f"cvxpy could not solve the band problem: {problem.status}")
    value = divergence.value
    if value is None or not value <= delta * (1 + CONSTRAINT_TOLERANCE):
        raise SolverError(f"cvxpy's solution breaks the constraint: D = {value} > {delta}")
    return max(float(x.value[index]), 0.0)


def _solve(div, x: NumpyInputs):
    cp, build = _cp(), expression(get(div))
    lo = np.full(x.p.shape, math.nan)
    hi = np.full(x.p.shape, math.nan)
    failed = []
    for i in np.ndindex(x.p.shape):
        if x.bad[i]:
            continue
        p, delta = float(x.p[i]), float(x.delta[i])
        for edges, lower in ((lo, True), (hi, False)):
            try:
                edges[i] = _edge(cp, build, p, delta, lower=lower)
            except SolverError as exc:  # beyond the solver (see the module docstring): nan
                failed.append(str(exc))
    if failed:
        warnings.warn(f"the cvxpy reference left {len(failed)} band edge(s) nan: it could "
                      f"not certify them to {EDGE_TOLERANCE:g} relative (first: {failed[0]})",
                      RuntimeWarning, stacklevel=5)
    return lo, hi


def _edge(cp, build, p: float, delta: float, *, lower: bool) -> float:
    """One certified edge of the two-token problem of ``p``; below :data:`SMALLEST_MASS`,
    the one at that mass where it has converged (see the module docstring)."""
    if 1.0 - p >= SMALLEST_MASS:
        return _certified_edge(cp, build, np.array([p, 1.0 - p]), 0, delta, None, lower=lower)
    e, e10 = (_certified_edge(cp, build, np.array([1.0 - q, q]), 0, delta, None, lower=lower)
              for q in (SMALLEST_MASS, 10 * SMALLEST_MASS))
    if abs(e - e10) > TOLERANCE * e10:
        raise SolverError(f"the {'lower' if lower else 'upper'} edge does not converge as "
                          f"p -> 1 within the solver's reach ({e10:.9g} -> {e:.9g})")
    return e if lower else min(e, 1.0 / p)


def run(plan, div, p, delta, request: Request):
    """The band of every element by two conic programs (the cvxpy backend's one path,
    :data:`~fbands._paths.EXACT`)."""
    x = NumpyInputs(p, delta, request)
    lo, hi = _solve(div, x)
    with np.errstate(divide="ignore"):
        return x.finish(np.log(lo), np.log(hi))
