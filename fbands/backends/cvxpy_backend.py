"""cvxpy backend: the band as a convex program over the whole probability simplex.

This is the reference the two-point reduction is checked against, so it deliberately shares
nothing with the solver: each divergence is written again here as a DCP expression of the
new distribution ``pi`` (an n-vector), and the edges are the optimal values of

.. math::

    \\max / \\min\\ \\pi_a \\quad\\text{s.t.}\\quad
    \\sum_x \\pi_{\\mathrm{old}}(x)\\, f\\!\\left(\\frac{\\pi(x)}{\\pi_{\\mathrm{old}}(x)}\\right)
    \\le \\delta,\\ \\ \\sum_x \\pi(x) = 1,\\ \\ \\pi \\ge 0,

divided by ``pi_old(a)``.  Interior-point accuracy is about 1e-7 relative, and each band
costs two conic solves: use it to check, not to train.

Each solution is checked: the constraint must hold at the returned ``pi``, the edges must
bracket 1 (``pi = pi_old`` is feasible) and the upper one may not give ``pi(a)`` more than
1, to :data:`CONSTRAINT_TOLERANCE` and :data:`TOLERANCE` relative; edges within the latter
of 1 (or of ``1 / p``) are set to it.  A solve that fails a check, or that the solver gives up
on (tiny ``p`` is beyond its precision), raises :class:`~fbands.errors.SolverError` in
:func:`reference_band` and gives NaN for that element in the backend.

Near ``p = 1`` the other token's mass ``1 - p`` falls below what the solver resolves
(:data:`SMALLEST_MASS`).  There the backend returns the band at that mass when the band
has visibly converged, i.e. agrees to :data:`TOLERANCE` with the band at ten times that
mass (kl, tv: the edges move by ``O(1 - p)``), and NaN when it has not (chi2's lower edge
opens like ``sqrt(1 - p)``): a limit is taken only where the solver shows one.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable

import numpy as np
import sympy

from fbands import _checks
from fbands._inputs import NumpyInputs
from fbands._optional import require
from fbands.divergences import Divergence, get
from fbands.errors import BandError, DivergenceError, SolverError

#: Relative tolerance of the checks on each solution (see the module docstring).
TOLERANCE = 1e-6
#: ... and on the constraint: loose, as terms weigh 1 / pi_old and amplify the residual.
CONSTRAINT_TOLERANCE = 0.05
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


_U = sympy.Symbol("u", positive=True)

#: The generator each DCP expression above is written for (THEORY's conventions).  A
#: divergence gets an expression when its ``f`` equals one of these, whatever its name, so
#: that a re-registered name can never select another divergence's program.
_GENERATORS = {
    "kl": _U - 1 - sympy.log(_U),
    "reverse_kl": _U * sympy.log(_U) - _U + 1,
    "tv": sympy.Abs(_U - 1) / 2,
    "chi2": (_U - 1) ** 2,
    "neyman_chi2": (_U - 1) ** 2 / _U,
    "hellinger": (sympy.sqrt(_U) - 1) ** 2,
    "js": (_U * sympy.log(_U) - (1 + _U) * sympy.log((1 + _U) / 2)) / 2,
}


def _same(f: sympy.Expr, g: sympy.Expr) -> bool:
    return f == g or sympy.expand(f - g) == 0


def expression(div: Divergence) -> Callable:
    """The DCP builder for a divergence, chosen by its generator ``f`` (not its name), or a
    :class:`DivergenceError` naming those known."""
    f = div.f.xreplace({s: _U for s in div.f.free_symbols if s.name == "u"})
    for name, g in _GENERATORS.items():
        if _same(f, g):
            return _EXPRESSIONS[name]
    a = div.params.get("a")
    if a is not None and a not in (0, 1):
        if _same(f, (_U**a - 1 - a * (_U - 1)) / (a * (a - 1))):
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
    pi = cp.Variable(old.size, nonneg=True)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        divergence = build(cp, pi, old)
    constraints = [cp.sum(pi) == 1, divergence <= delta]
    lo, hi = (_optimum(cp, sense, pi, index, old, constraints, divergence, delta, solver)
              for sense in (cp.Minimize, cp.Maximize))
    top = 1.0 / old[index]
    if lo > 1 + TOLERANCE or hi < 1 - TOLERANCE or hi > top * (1 + TOLERANCE):
        raise SolverError(f"cvxpy's band [{lo:.6g}, {hi:.6g}] does not contain 1 or leaves "
                          f"[0, 1 / p] (p = {old[index]:.3g} is beyond the solver's precision)")
    return min(lo, 1.0), min(max(hi, 1.0), top)


def _optimum(cp, sense, pi, index, old, constraints, divergence, delta, solver) -> float:
    # One edge, its solution checked against the constraint (see the module docstring).
    problem = cp.Problem(sense(pi[index]), constraints)
    try:
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            problem.solve(solver=solver)
    except (cp.error.SolverError, ValueError) as exc:
        raise SolverError(f"cvxpy could not solve the band problem: {exc}") from None
    if problem.status not in ("optimal", "optimal_inaccurate") or pi.value is None:
        raise SolverError(f"cvxpy could not solve the band problem: {problem.status}")
    value = divergence.value
    if value is None or not value <= delta * (1 + CONSTRAINT_TOLERANCE):
        raise SolverError(f"cvxpy's solution breaks the constraint: D = {value} > {delta}")
    return max(float(pi.value[index]), 0.0) / float(old[index])


def _solve(div, x: NumpyInputs):
    lo = np.full(x.p.shape, math.nan)
    hi = np.full(x.p.shape, math.nan)
    for i in np.ndindex(x.p.shape):
        if x.bad[i]:
            continue
        p, delta = float(x.p[i]), float(x.delta[i])
        try:
            if 1.0 - p >= SMALLEST_MASS:
                lo[i], hi[i] = reference_band([p, 1.0 - p], 0, delta, div)
            else:
                lo[i], hi[i] = _near_one(p, delta, div)
        except SolverError:  # beyond the solver (see the module docstring): nan
            continue
    return lo, hi


def _near_one(p: float, delta: float, div) -> tuple[float, float]:
    """The band at ``1 - p < SMALLEST_MASS``: the one at that mass where it has converged
    (see the module docstring), else a :class:`SolverError`."""
    bands = [reference_band([1.0 - q, q], 0, delta, div) for q in (SMALLEST_MASS,
                                                                  10 * SMALLEST_MASS)]
    (lo, hi), (lo10, hi10) = bands
    if abs(lo - lo10) > TOLERANCE * lo10 or abs(hi - hi10) > TOLERANCE * hi10:
        raise SolverError(f"the band does not converge as p -> 1 within the solver's reach "
                          f"(lower {lo10:.9g} -> {lo:.9g})")
    return lo, min(hi, 1.0 / p)


def exact(div, p, delta, *, logp, invalid, check, log):
    """The band of every element by two conic programs (the cvxpy backend's one path)."""
    x = NumpyInputs(p, delta, logp=logp, invalid=invalid, check=check)
    lo, hi = _solve(div, x)
    with np.errstate(divide="ignore"):
        return x.finish(np.log(lo), np.log(hi), log=log)
