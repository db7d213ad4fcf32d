"""The closed-form edges: the real roots of a divergence's band polynomial, without
cancellation (written once for every array namespace ``xp``; the scalar twins are in
:mod:`fbands._jit.scalar`).  :func:`fbands._solver.solve` chooses and checks them."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fbands._band_function import BandFunction

#: A discriminant above ``-NEGATIVE_DISC a1^2`` is a double root rounded below zero.
NEGATIVE_DISC = 1e-12
#: Roots are ill-conditioned (polished by a Newton step on g) when the discriminant is below
#: ``NEAR_DOUBLE a1^2`` (they agree to about a decimal digit).
NEAR_DOUBLE = 1e-2
#: A lower edge ``r = 1 - y`` this close to 0 is below the resolution of ``y``: Newton on the
#: form in ``r`` starts from 0 (one step is exact to ``O(r)``; neyman_chi2 at ``p = 1e-17``).
Y_RESOLUTION = 4 * 2.0**-52
#: An upper closed-form root up to this factor past ``r = 1/p`` is kept (and clamped): the
#: rounding of the polynomial's coefficients can push an edge at saturation slightly past.
TOP_SLACK = 1.01


def real_roots(xp, a2, a1, a0, zero):
    """Both real roots of ``a2 v^2 + a1 v + a0`` without cancellation, and whether they are
    ill-conditioned (nearly equal: the discriminant below :data:`NEAR_DOUBLE` ``a1^2``).

    ``t = -(a1 + sign(a1) sqrt(disc)) / 2`` adds numbers of one sign; the roots are ``t / a2``
    and ``a0 / t`` (Vieta), nan where they are complex (a discriminant above
    ``-NEGATIVE_DISC a1^2`` is a double root rounded below zero).  ``zero``: which of
    ``(a2, a1)`` vanish identically in the form (:attr:`fbands.symbolic.ClosedForm.zero`),
    static facts: a linear form gives its root twice, an even one ``+-sqrt(-a0 / a2)``.
    Each division by ``a2`` or ``a1`` is a product with its reciprocal, which the compiled
    pass shares between the forms (``1 / p`` for tv and chi2).  The scalar form,
    :func:`fbands._jit.scalar.real_roots_one`, is the same formula.
    """
    if zero[0]:
        v = -a0 * (1.0 / a1)
        return v, v, v < v  # (all False)
    if zero[1]:
        v = xp.sqrt(-a0 * (1.0 / a2))
        return v, -v, v < v
    # Where a1^2 or a2 a0 overflows (a radius near the largest float), the roots are those
    # of the polynomial scaled by 1 / (|a2| + |a1| + |a0|); elsewhere the scale is 1, exactly.
    big = ~xp.isfinite(a1 * a1 - 4.0 * a2 * a0)
    scale = xp.where(big, 1.0 / (xp.abs(a2) + xp.abs(a1) + xp.abs(a0)), 1.0)
    a2, a1, a0 = a2 * scale, a1 * scale, a0 * scale
    disc = a1 * a1 - 4.0 * a2 * a0
    root = xp.sqrt(xp.where(disc >= -NEGATIVE_DISC * a1 * a1, xp.maximum(disc, 0.0 * disc),
                            math.nan))
    t = -0.5 * (a1 + xp.where(a1 >= 0, root, -root))
    return t * (1.0 / a2), a0 / t, disc < NEAR_DOUBLE * a1 * a1


def newton_step(a2, a1, a0, v, zero):
    """The Newton step ``P(v) / P'(v)`` of ``P = a2 v^2 + a1 v + a0`` (a linear ``P``: the
    distance to its root, through the reciprocal that :func:`real_roots` takes)."""
    if zero[0]:
        return (a1 * v + a0) * (1.0 / a1)
    return ((a2 * v + a1) * v + a0) / (2.0 * a2 * v + a1)


def smallest_positive(xp, v1, v2):
    """The smaller of the positive ones of ``v1``, ``v2`` (inf where neither is)."""
    return xp.minimum(xp.where(v1 > 0, v1, math.inf), xp.where(v2 > 0, v2, math.inf))


def upper_root(xp, form, p, q, delta):
    """The upper edge from its unsquared closed form in ``y = r - 1``: ``(y, ill)``, the
    smallest positive root (inf where there is none: saturated; a root past ``q / p`` is
    clamped by the caller), the one nearest ``r = 1``, where ``g`` increases from 0."""
    (c2, c1, c0), _, zero = form
    y1, y2, ill = real_roots(xp, c2(p, q, delta), c1(p, q, delta), c0(p, q, delta), zero)
    return smallest_positive(xp, y1, y2), ill


def lower_root(xp, form_y, form_r, p, q, delta, polish: bool = True):
    """The lower edge from its unsquared closed forms: ``(r, y, ill)``.

    The smallest positive root ``y`` of the form in ``y = 1 - r`` (none, or one at
    ``y >= 1``: saturated, ``r <= 0``) gives ``r`` without cancellation near 1, and
    ``log1p(-y)`` its log-edge with every digit of a small ``y``.  Below ``r = 1/2`` its
    absolute error of an ulp of 1 is too much for a small edge, and one Newton step on the
    form in ``r`` (``polish``) brings it to that form's own accuracy; from ``r = 0`` where
    ``y`` cannot tell the edge from 0 (:data:`Y_RESOLUTION`).  ``ill``: either form is
    ill-conditioned where it is used.  The closed-form pass uses the scalar form of this
    routine (:func:`fbands._jit.scalar.lower_root_one`), ``polish`` for float64 output only.
    """
    (b2, b1, b0), _, zero_y = form_y
    y1, y2, ill = real_roots(xp, b2(p, q, delta), b1(p, q, delta), b0(p, q, delta), zero_y)
    y = smallest_positive(xp, y1, y2)
    r = 1.0 - y
    if not polish:
        return r, y, ill
    (c2, c1, c0), _, zero = form_r
    a2, a1, a0 = (c(p, q, delta) + 0.0 * p for c in (c2, c1, c0))
    below_half, unresolved = r < 0.5, xp.abs(r) <= Y_RESOLUTION
    start = xp.where(unresolved, 0.0 * r, xp.where(r > 0, r, 0.25))
    step = below_half & ((r > 0) | unresolved)
    ill = ill | (below_half & real_roots(xp, a2, a1, a0, zero)[2])
    return xp.where(step, start - newton_step(a2, a1, a0, start, zero), r), y, ill


def squared_edge(fun: BandFunction, edge: str):
    """The log-edge of a squared form: of the roots inside the bracket, the one that solves
    ``g = delta`` best (squaring may have added an extraneous one).  The lower edge's
    candidates are the roots of its form in ``r`` and, where the divergence has it, of its
    form in ``y = 1 - r``: next to ``r = 1`` (``p`` next to 1, both roots within about
    ``delta`` of 1) the form in ``r`` rounds both to 1, the form in ``y`` keeps their digits."""
    xp, x = fun.xp, fun.x
    forms = ("upper",) if edge == "upper" else ("lower", "lower_y")
    best = have = best_e = None
    for name in forms:
        if name not in fun.closed:
            continue
        (c2, c1, c0), _, zero = fun.closed[name]
        a2, a1, a0 = (c(x.p, x.q, x.delta) + 0.0 * x.p for c in (c2, c1, c0))
        for v in real_roots(xp, a2, a1, a0, zero)[:2]:
            if name == "upper":  # v = r - 1 in (0, q/p]
                ok, s = (v > 0) & (v * fun.p_over_q <= TOP_SLACK), xp.log1p(v)
            elif name == "lower":  # v = r in [0, 1]
                ok, s = (v >= 0) & (v <= 1), xp.log(v)
            else:  # v = 1 - r in [0, 1]
                ok, s = (v >= 0) & (v <= 1), xp.log1p(-v)
            e = xp.abs(fun.value(xp.where(ok, s, 0.0)) - x.delta)
            e = xp.where(e == e, e, math.inf)
            if best is None:
                best, have, best_e = xp.where(ok, s, math.nan), ok, e
                continue
            take = ok & (~have | (e < best_e))
            best, best_e, have = xp.where(take, s, best), xp.where(take, e, best_e), have | ok
    return best


def closed_forms(derivation) -> dict:
    """The closed forms of a :class:`fbands.symbolic.Derivation` by name: the upper edge in
    ``r - 1``, the lower one in ``r`` and in ``1 - r`` (None where it has none)."""
    return {"upper": derivation.upper, "lower": derivation.lower,
            "lower_y": derivation.lower_y}


def squared_flags(derivation) -> dict[str, tuple]:
    """The closed forms a derivation has, as :func:`unsquared` reads them:
    ``{name: (None, squared)}``."""
    return {name: (None, cf.squared) for name, cf in closed_forms(derivation).items()
            if cf is not None}


def both_unsquared(derivation) -> bool:
    """Whether both edges of a :class:`fbands.symbolic.Derivation` are solved by unsquared
    closed forms: no root needs checking against ``g``."""
    forms = squared_flags(derivation)
    return unsquared(forms, "upper") and unsquared(forms, "lower")


def unsquared(closed: dict, edge: str) -> bool:
    """Whether ``edge`` is solved by its unsquared closed forms (:func:`upper_root`,
    :func:`lower_root`), rather than by checking the roots of a form against ``g``."""
    forms = ("upper",) if edge == "upper" else ("lower", "lower_y")
    return all(name in closed and not closed[name][1] for name in forms)


def closed_edge(fun: BandFunction, edge: str):
    """Log-edge from the closed forms, before saturation (nan where they give no valid
    root), and where it needs a polish: ill-conditioned roots, and every root of a squared
    form (which may have merged a root with its extraneous twin)."""
    xp, x = fun.xp, fun.x
    if not unsquared(fun.closed, edge):
        return squared_edge(fun, edge), x.p == x.p  # (all True)
    if edge == "upper":
        y, ill = upper_root(xp, fun.closed["upper"], x.p, x.q, x.delta)
        return xp.log1p(y), ill
    r, y, ill = lower_root(xp, fun.closed["lower_y"], fun.closed["lower"], x.p, x.q, x.delta)
    # A root at or below r = 0 (no positive root in y, or one at y >= 1) is the saturated
    # edge: g's own test at r = 0 may round the other way within an ulp of the threshold.
    return xp.where(r >= 0.5, xp.log1p(-xp.minimum(y, 0.5)), xp.log(xp.maximum(r, 0.0))), ill
