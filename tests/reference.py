"""An independent high-precision reference for band edges (mpmath, 60 digits).

Written from THEORY's definitions only: each generator is typed in again here as a plain
mpmath function (not taken from fbands), and the edges come from plain bisection on
``g(p, r) = p f(r) + (1 - p) f((1 - r p) / (1 - p))``, which is monotone on each side of 1.
"""

from __future__ import annotations

import mpmath as mp

DPS = 60

GENERATORS = {
    "kl": lambda u: u - 1 - mp.log(u),
    "reverse_kl": lambda u: u * mp.log(u) - u + 1 if u > 0 else mp.mpf(1),
    "tv": lambda u: abs(u - 1) / 2,
    "chi2": lambda u: (u - 1) ** 2,
    "neyman_chi2": lambda u: (u - 1) ** 2 / u,
    "hellinger": lambda u: (mp.sqrt(u) - 1) ** 2,
    "js": lambda u: (
        (u * mp.log(u) - (1 + u) * mp.log((1 + u) / 2)) / 2 if u > 0 else mp.log(2) / 2
    ),
}


def alpha(a):
    a = mp.mpf(a)
    return lambda u: (mp.power(u, a) - 1 - a * (u - 1)) / (a * (a - 1))


def g(f, p, r):
    q = 1 - p
    c = (1 - r * p) / q
    left = p * f(r) if r > 0 else p * _at_zero(f)
    right = q * f(c) if c > 0 else q * _at_zero(f)
    return left + right


def _at_zero(f):
    """``f(0+)``: ``f(0)``, inf where that divides by zero, and where it is nan (``0 log 0``
    typed as such) ``f`` at ``10**-240``, which is ``f(0+)`` to far more than 60 digits for the
    generators of the tests (their ``f(u) - f(0+)`` is ``O(u log u)`` or ``O(sqrt u)``)."""
    try:
        value = f(mp.mpf(0))
    except (ZeroDivisionError, ValueError):
        return mp.inf
    return f(mp.mpf(10) ** (-4 * DPS)) if mp.isnan(value) else value


#: How far the lower edge's bracket may be widened: down to exp(-2**1100), whose log is
#: below -float64's largest number, so that an edge beyond it is 0 (log: -inf) as a float.
_MAX_DOUBLINGS = 1100


def edges(f, p, delta, iterations=400):
    """``(lower, upper)`` of the band, as mpmath numbers (``p < 1``)."""
    with mp.workdps(DPS):
        p, delta = mp.mpf(p), mp.mpf(delta)
        top = 1 / p
        if g(f, p, top) <= delta:
            upper = top
        else:
            # Bisect in log r as well: r up to 1/p = 1e300 would need more halvings in r.
            lo, hi = mp.mpf(0), -mp.log(p)
            for _ in range(iterations):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if g(f, p, mp.exp(mid)) <= delta else (lo, mid)
                if hi - lo <= mp.mpf(10) ** (-DPS + 5) * max(1, abs(hi)):
                    break
            upper = mp.exp((lo + hi) / 2)
        if g(f, p, mp.mpf(0)) <= delta:
            lower = mp.mpf(0)
        else:
            # Bisect in log r: the lower edge can be far below the smallest float.
            lo, hi = mp.mpf(-1), mp.mpf(0)
            for _ in range(_MAX_DOUBLINGS):
                if g(f, p, mp.exp(lo)) > delta:
                    break
                lo *= 2
            else:  # the edge is below exp(-2**1100): 0, and its log -inf, as floats
                return mp.mpf(0), upper
            for _ in range(iterations):
                mid = (lo + hi) / 2
                lo, hi = (lo, mid) if g(f, p, mp.exp(mid)) <= delta else (mid, hi)
                if hi - lo <= mp.mpf(10) ** (-DPS + 5) * max(1, abs(hi)):
                    break
            lower = mp.exp((lo + hi) / 2)
        return lower, upper


#: Divergences the tests run over: every built-in, members of the alpha family on both sides
#: of its special values, and one user-registered generator.
USER_F = "(u - 1)**2 / (u + 1)"
TABLE = {
    **GENERATORS,
    "alpha(a=0.5)": alpha(0.5),
    "alpha(a=3)": alpha(3),
    "alpha(a=-1)": alpha(-1),
    "alpha(a=3/2)": alpha(1.5),
    "triangular": lambda u: (u - 1) ** 2 / (u + 1),
}


def fprime_inf(name):
    """lim f(u)/u, from the generator typed above (mpmath's limit at 60 digits)."""
    f = TABLE[name]
    with mp.workdps(DPS):
        big, bigger = mp.mpf(10) ** 40, mp.mpf(10) ** 80
        v1, v2 = f(big) / big, f(bigger) / bigger
        return mp.inf if v2 > 1.5 * v1 + 1 else v2


def lower_at_one(name, delta):
    """r* = root of f(r) + (1 - r) f'(inf) = delta in [0, 1] (0 if none; 1 if f'(inf) = inf)."""
    f = TABLE[name]
    slope = fprime_inf(name)
    if slope == mp.inf:
        return mp.mpf(1)
    with mp.workdps(DPS):
        delta = mp.mpf(delta)

        def h(r):
            return (f(r) if r > 0 else _at_zero(f)) + (1 - r) * slope - delta

        if h(mp.mpf(0)) <= 0:
            return mp.mpf(0)
        lo, hi = mp.mpf(0), mp.mpf(1)
        for _ in range(300):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if h(mid) > 0 else (lo, mid)
        return (lo + hi) / 2
