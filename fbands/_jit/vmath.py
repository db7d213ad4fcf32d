"""Arithmetic without libm calls, for element loops that must vectorise.

:func:`vexp` and :func:`vlog` replace ``math.exp`` and ``math.log`` (a libm call keeps a
loop from vectorising), and :func:`p_and_z` gives ``p = exp(log p)`` and
``z = min(p, 1 - p)`` from one polynomial, without cancellation.  Plain Python compiled by
numba (inlined into the loops that call them).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from fbands._jit import disk_cache
from fbands._jit.prims import INLINE
from fbands.tables.layout import EXP_BIAS, MANT_BITS

__all__ = ["vexp", "vlog", "p_and_z", "LN2"]


# ----------------------------------------------------------------------------- float64 format
# Constants of the float64 bit tricks in vexp and vlog (the float format's own, MANT_BITS and
# EXP_BIAS, are the table layout's, fbands.tables.layout, which reads its cells from them).

#: ln 2 split in two so that ``k * LN2_HI`` is exact for the ``|k| <= 1100`` of vexp.
LN2_HI = 6.93147180369123816490e-01
LN2_LO = 1.90821492927058770002e-10
LN2 = math.log(2.0)
INV_LN2 = 1.0 / LN2
SQRT2 = math.sqrt(2.0)
#: Smallest normal float64: vlog scales subnormal input up before reading its exponent.
TINY = float(np.finfo(np.float64).tiny)
#: 2^54: the scale of subnormal input in vlog (any power of 2 that makes them normal).
SUBNORMAL_SCALE_BITS = 54
#: Mask of a float64's exponent field (after the shift by MANT_BITS).
EXP_FIELD = (1 << 11) - 1
#: Mask of a float64's mantissa field.
MANT_FIELD = (1 << MANT_BITS) - 1
#: Above this exp overflows float64, below EXP_ZERO it rounds to 0.
EXP_OVER = 709.782712893384
EXP_ZERO = -745.2
#: Bound on |k| of exp's 2^k, past both ends of the float64 range (kept finite for the
#: integer conversion; the results there are set to inf or 0 above).
EXP_K_MAX = 1100.0

#: (exp(r) - 1) / r = sum r^j / (j + 1)! to r^12, highest power first (|r| <= ln2 / 2:
#: error below 1e-17).
EXPM1_SERIES = tuple(1.0 / math.factorial(k + 1) for k in range(12, -1, -1))
#: Taylor coefficients, highest power first: exp on [-ln2/2, ln2/2] to degree 13 (error
#: below 1e-17), and 2 atanh(s) / (2 s) for |s| <= 0.172 to s^22.
EXP_TAYLOR = tuple(1.0 / math.factorial(k) for k in range(13, -1, -1))
ATANH_SERIES = tuple(1.0 / (2 * k + 1) for k in range(11, -1, -1))


# Horner chains written out: a loop over the tuple stays a loop when it is long (20
# terms), and the element loops around it then do not vectorise.


@njit(**INLINE)
def exp_taylor(x):
    """Horner's rule for EXP_TAYLOR at x."""
    c = EXP_TAYLOR
    a = c[0]
    a = a * x + c[1]
    a = a * x + c[2]
    a = a * x + c[3]
    a = a * x + c[4]
    a = a * x + c[5]
    a = a * x + c[6]
    a = a * x + c[7]
    a = a * x + c[8]
    a = a * x + c[9]
    a = a * x + c[10]
    a = a * x + c[11]
    a = a * x + c[12]
    a = a * x + c[13]
    return a


@njit(**INLINE)
def expm1_series(x):
    """EXPM1_SERIES at x by Estrin's scheme: four levels of multiply-adds instead of a
    chain of twelve (the loops around it are bound by such chains' latency)."""
    c = EXPM1_SERIES  # highest power first: c[12 - j] multiplies x^j
    x2 = x * x
    x4 = x2 * x2
    x8 = x4 * x4
    b0 = c[12] + c[11] * x
    b1 = c[10] + c[9] * x
    b2 = c[8] + c[7] * x
    b3 = c[6] + c[5] * x
    b4 = c[4] + c[3] * x
    b5 = c[2] + c[1] * x
    d0 = b0 + b1 * x2
    d1 = b2 + b3 * x2
    d2 = b4 + b5 * x2
    return (d0 + d1 * x4) + (d2 + c[0] * x4) * x8


@njit(**INLINE)
def atanh_series(x):
    """Horner's rule for ATANH_SERIES at x."""
    c = ATANH_SERIES
    a = c[0]
    a = a * x + c[1]
    a = a * x + c[2]
    a = a * x + c[3]
    a = a * x + c[4]
    a = a * x + c[5]
    a = a * x + c[6]
    a = a * x + c[7]
    a = a * x + c[8]
    a = a * x + c[9]
    a = a * x + c[10]
    a = a * x + c[11]
    return a


@njit(**INLINE)
def pow2(k):
    """2^k for an integer-valued float64 k in the normal exponent range, from its bits."""
    return np.int64((np.int64(k) + EXP_BIAS) << MANT_BITS).view(np.float64)


@njit(**INLINE)
def vexp(x):
    """exp(x) without a libm call, so that loops over it vectorise (error < 1 ulp + 1e-16).

    exp(x) = 2^k exp(r), r = x - k ln 2 in [-ln2/2, ln2/2]: Taylor to degree 13; 2^k is
    built from its bits in two halves so that subnormal results come out right.
    """
    k = math.floor(x * INV_LN2 + 0.5)
    k = min(max(k, -EXP_K_MAX), EXP_K_MAX)
    r = (x - k * LN2_HI) - k * LN2_LO
    e = exp_taylor(r)
    k1 = math.floor(k * 0.5)
    out = e * pow2(k1) * pow2(k - k1)
    out = math.inf if x > EXP_OVER else out
    return 0.0 if x < EXP_ZERO else out


@njit(**INLINE)
def vlog(x):
    """log(x) for x > 0 (subnormals included) without a libm call (error about 1 ulp).

    x = 2^e m with m in [sqrt(1/2), sqrt(2)); log m = 2 atanh(s), s = (m - 1) / (m + 1),
    |s| <= 0.172, by its series to s^23.
    """
    tiny = x < TINY
    y = x * pow2(SUBNORMAL_SCALE_BITS) if tiny else x
    bits = np.float64(y).view(np.int64)
    e = ((bits >> MANT_BITS) & EXP_FIELD) - EXP_BIAS
    m = np.int64((bits & MANT_FIELD) | (np.int64(EXP_BIAS) << MANT_BITS)).view(np.float64)
    big = m > SQRT2
    m = m * 0.5 if big else m
    e = e + 1 if big else e
    e = e - SUBNORMAL_SCALE_BITS if tiny else e
    f = m - 1.0
    s = f / (2.0 + f)
    w = atanh_series(s * s)
    fe = np.float64(e)
    return fe * LN2_HI + (2.0 * s * w + fe * LN2_LO)


@njit(**INLINE)
def p_and_z(lp):
    """``(p, z)`` of a log-probability ``lp`` in ``[LP_CLOSED, 0]``: ``p = exp(lp)`` and
    ``z = min(p, 1 - p)``, 1 - p without cancellation, from one polynomial.

    lp = k ln 2 + r with |r| <= ln2 / 2 and ``em = expm1(r)`` (r times a Taylor series),
    so p = 2^k (1 + em); above p = 1/2, k is 0 (1 - p = -em) or -1 (1 - p = (1 - em) / 2).
    """
    k = math.floor(lp * INV_LN2 + 0.5)
    r = (lp - k * LN2_HI) - k * LN2_LO
    em = r * expm1_series(r)
    p = (1.0 + em) * pow2(k)
    q = -em if k == 0 else 0.5 - 0.5 * em
    return p, (q if lp > -LN2 else p)


disk_cache.tolerate(globals())  # (a damaged cache file costs a compile, not a call)
