"""The overflow-free forms of softplus, sigmoid and log(cosh), against mpmath at 60 digits."""

from __future__ import annotations

import mpmath as mp
import numpy as np
import pytest
import sympy as sp
import torch

from fbands import _stable, symbolic

NUMPY = {n: getattr(np, n) for n in ("exp", "expm1", "log", "log1p", "sqrt", "sinh", "cosh",
                                     "tanh", "sign", "where")}
TORCH = {n: getattr(torch, n) for n in ("exp", "expm1", "log", "log1p", "sqrt", "sinh", "cosh",
                                        "tanh", "sign", "where")}

TRUTH = {
    "softplus": lambda x: mp.log(1 + mp.exp(x)),
    "sigmoid": lambda x: 1 / (1 + mp.exp(-x)),
    "logcosh": lambda x: mp.log(mp.cosh(x)),
}
X = [-1e4, -800.0, -40.0, -1.0, -0.999, -1e-3, -1e-9, 0.0, 1e-12, 1e-5, 0.3, 0.999, 1.0, 1.001,
     5.0, 40.0, 709.0, 711.0, 1e4]


@pytest.mark.parametrize("cls", _stable.CLASSES, ids=lambda c: c.__name__)
def test_the_printed_form_is_accurate_where_the_textbook_form_overflows(cls):
    src = symbolic.compile_expr(cls(symbolic.S), (symbolic.S,))
    on_numpy, on_torch = symbolic.bind(src, NUMPY), symbolic.bind(src, TORCH)
    x = np.array(X)
    # no overflow, even in a branch thrown away; but sigmoid's 1 / (1 + exp(-x)) is meant to
    # overflow to 1 / inf = 0 below x = -709
    over = "ignore" if cls is _stable.sigmoid else "raise"
    with np.errstate(over=over, invalid="raise", divide="raise"):
        got = on_numpy(x)
    got_torch = on_torch(torch.tensor(X, dtype=torch.float64)).numpy()
    with mp.workdps(60):
        want = [float(TRUTH[cls.__name__](mp.mpf(v))) for v in X]
    for v, a, b, w in zip(X, got, got_torch, want, strict=True):
        assert a == pytest.approx(w, rel=4e-16, abs=1e-300), v
        assert b == pytest.approx(w, rel=4e-16, abs=1e-300), v


@pytest.mark.parametrize("cls", _stable.CLASSES, ids=lambda c: c.__name__)
def test_each_function_is_its_textbook_form_to_sympy(cls):
    x = sp.Symbol("x", real=True)
    f = cls(x)
    for v in (sp.Rational(-7, 3), sp.Rational(1, 5), 3):
        assert sp.N(f.subs(x, v) - cls.textbook(v), 40) == 0
        # the derivative sympy uses is the textbook one's
        assert abs(sp.N((sp.diff(f, x) - sp.diff(cls.textbook(x), x)).subs(x, v), 40)) < 1e-35


def test_recognise_names_the_two_patterns_and_leaves_the_rest():
    u = symbolic.U
    f = sp.log(1 + sp.exp(2 * u)) + sp.log(sp.cosh(u - 1)) + sp.log(u + 1) + sp.log(2 + sp.exp(u))
    out = _stable.recognise(f)
    assert out.has(_stable.softplus(2 * u), _stable.logcosh(u - 1))
    assert out.has(sp.log(u + 1), sp.log(2 + sp.exp(u)))
    assert sp.N((out - f).subs(u, sp.Rational(3, 7)), 40) == 0
