"""Three functions that floating point evaluates badly in their textbook form.

A user's generator may hold ``log(1 + exp(x))`` or ``log(cosh(x))``.  Both are about ``|x|`` for
large ``x``, but their textbook forms overflow once ``exp(x)`` or ``cosh(x)`` does (``x > 710``),
and the derivative of the first, ``exp(x) / (1 + exp(x))``, is then ``inf / inf``.  So
:func:`recognise` names them before sympy derives anything, as :class:`softplus` and
:class:`logcosh` (derivatives :class:`sigmoid` and ``tanh``), and each class knows a form
(:meth:`stable`) without overflow or cancellation, which is what the code printer writes.

Symbolic work (limits, closed forms) keeps the textbook ``f``; only the formulas that the
kernels evaluate (``F``, ``F'``) go through :func:`recognise`.
"""

from __future__ import annotations

import sympy as sp
from sympy.codegen.cfunctions import log1p


class _Stable(sp.Function):
    """A function of one argument with a textbook form and a stable form."""

    @classmethod
    def eval(cls, x):
        if x.is_Number:  # constants stay plain expressions, for the printer's number pass
            return cls.textbook(x)
        return None

    @staticmethod
    def textbook(x):
        raise NotImplementedError

    def stable(self) -> sp.Expr:
        raise NotImplementedError

    def _eval_evalf(self, prec):
        return self.textbook(self.args[0])._eval_evalf(prec)

    def _eval_is_real(self):
        return self.args[0].is_real


class softplus(_Stable):  # noqa: N801 - named like sympy's functions
    """``log(1 + exp(x))``, written ``max(x, 0) + log1p(exp(-|x|))``."""

    @staticmethod
    def textbook(x):
        return sp.log(1 + sp.exp(x))

    def fdiff(self, argindex=1):
        return sigmoid(self.args[0])

    def stable(self):
        x = self.args[0]
        return (x + sp.Abs(x)) / 2 + log1p(sp.exp(-sp.Abs(x)))


class sigmoid(_Stable):  # noqa: N801
    """``exp(x) / (1 + exp(x))``, written ``1 / (1 + exp(-x))`` (0, not nan, as ``x -> -inf``)."""

    @staticmethod
    def textbook(x):
        return 1 / (1 + sp.exp(-x))

    def fdiff(self, argindex=1):
        s = sigmoid(self.args[0])
        return s * (1 - s)

    def stable(self):
        return self.textbook(self.args[0])


class logcosh(_Stable):  # noqa: N801
    """``log(cosh(x))``: ``log1p(2 sinh(x/2)**2)`` for ``|x| < 1`` (no cancellation near 0),
    ``|x| - log 2 + log1p(exp(-2|x|))`` beyond (no overflow)."""

    @staticmethod
    def textbook(x):
        return sp.log(sp.cosh(x))

    def fdiff(self, argindex=1):
        return sp.tanh(self.args[0])

    def stable(self):
        x = self.args[0]
        near = sp.Abs(x) < 1
        small = sp.Piecewise((x, near), (0, True))  # the unused branch never overflows
        return sp.Piecewise(
            (log1p(2 * sp.sinh(small / 2) ** 2), near),
            (sp.Abs(x) - sp.log(2) + log1p(sp.exp(-2 * sp.Abs(x))), True),
        )


#: The classes, by name (the derivation cache's vocabulary includes them).
CLASSES = (softplus, sigmoid, logcosh)


def _softplus_argument(arg: sp.Expr):
    """``x`` when ``arg`` is ``1 + exp(x)``, else None."""
    rest = arg - 1
    return rest.args[0] if isinstance(rest, sp.exp) else None


def recognise(f: sp.Expr) -> sp.Expr:
    """``f`` with each ``log(1 + exp(x))`` and ``log(cosh(x))`` replaced by its named function."""

    def rewrite(e):
        (arg,) = e.args
        if isinstance(arg, sp.cosh):
            return logcosh(arg.args[0])
        x = _softplus_argument(arg)
        return e if x is None else softplus(x)

    return f.replace(lambda e: isinstance(e, sp.log), rewrite)
