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
    try:
        return f(mp.mpf(0))
    except (ZeroDivisionError, ValueError):
        return mp.inf


def edges(f, p, delta, iterations=400):
    """``(lower, upper)`` of the band, as mpmath numbers (``p < 1``)."""
    with mp.workdps(DPS):
        p, delta = mp.mpf(p), mp.mpf(delta)
        top = 1 / p
        if g(f, p, top) <= delta:
            upper = top
        else:
            lo, hi = mp.mpf(1), top
            for _ in range(iterations):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if g(f, p, mid) <= delta else (lo, mid)
                if hi - lo <= hi * mp.mpf(10) ** (-DPS + 5):
                    break
            upper = (lo + hi) / 2
        if g(f, p, mp.mpf(0)) <= delta:
            lower = mp.mpf(0)
        else:
            # Bisect in log r: the lower edge can be far below the smallest float.
            lo, hi = mp.mpf(-1), mp.mpf(0)
            while g(f, p, mp.exp(lo)) <= delta:
                lo *= 2
            for _ in range(iterations):
                mid = (lo + hi) / 2
                lo, hi = (lo, mid) if g(f, p, mp.exp(mid)) <= delta else (mid, hi)
                if hi - lo <= mp.mpf(10) ** (-DPS + 5) * max(1, abs(hi)):
                    break
            lower = mp.exp((lo + hi) / 2)
        return lower, upper
