"""The two forms of the one solver take the same steps.

:mod:`fbands._solver` writes the method twice in form: over arrays (:func:`solve`, numpy and
torch) and one element at a time (:func:`solve_one`, compiled by numba from the same file).
Here both run on the same elements, over every regime (closed forms, Newton, saturation at
either end, ``log p`` below ``LP_CLOSED`` and ``LP_TINY``, ``p = 1``), and must report the
same way of finding each edge, the same number of Newton iterations, and the same edges.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import fbands
from fbands import _solver

from .. import reference as ref
from .._speed import registry

pytest.importorskip("numba")
from fbands._jit import loader  # noqa: E402

DIVS = list(ref.TABLE)
pytestmark = pytest.mark.usefixtures("user_divergence")  # tests/_user.py


def inputs(seed: int = 0) -> _solver.Inputs:
    """log p over every regime of the method, crossed with radii small to large."""
    rng = np.random.default_rng(seed)
    lp = np.concatenate((
        -np.exp(rng.uniform(math.log(1e-12), math.log(700.0), 300)),  # down past LP_TINY
        np.log(rng.uniform(0.0, 1.0, 100)),
        [0.0, -1e-300, -1e-17, _solver.LP_CLOSED * (1 + 1e-12), _solver.LP_TINY * 1.001],
    ))
    deltas = np.array([1e-5, 1e-2, 0.2, 3.0])
    lp, delta = (a.reshape(-1) for a in np.meshgrid(lp, deltas))
    with np.errstate(all="ignore"):
        p, q = np.exp(lp), np.maximum(-np.expm1(lp), _solver.Q_FLOOR)
    return _solver.Inputs(lp, np.log(q), p, q, delta)


@pytest.mark.parametrize("div", registry(DIVS))
def test_array_and_scalar_forms_take_the_same_steps(div):
    d = fbands.get(div)
    x = inputs()
    with np.errstate(all="ignore"):
        a_lo, a_hi, (how_lo, how_hi, n_lo, n_hi) = _solver.solve(
            d, _solver.NUMPY, x, trace=True)
    n = x.lp.size
    s_lo, s_hi = np.empty(n), np.empty(n)
    how, iters = np.empty((n, 2), np.int64), np.empty((n, 2), np.int64)
    loader.kernels(d).trace_arrays(x.lp, x.lq, x.p, x.q, x.delta, s_lo, s_hi, how,
                                          iters)
    # The regimes every divergence has occur (saturation, closed forms: where it has them).
    seen = set(how_lo.astype(int)) | set(how_hi.astype(int))
    assert {_solver.TINY, _solver.AT_ONE} <= seen
    assert seen & {_solver.NEWTON, _solver.CLOSED, _solver.POLISHED}
    np.testing.assert_array_equal(how[:, 0], how_lo, err_msg="branch, lower edge")
    np.testing.assert_array_equal(how[:, 1], how_hi, err_msg="branch, upper edge")
    np.testing.assert_array_equal(iters[:, 0], n_lo, err_msg="iterations, lower edge")
    np.testing.assert_array_equal(iters[:, 1], n_hi, err_msg="iterations, upper edge")
    # Same steps, same edges (up to the last bits the two libms may round differently).
    for got, want in ((s_lo, a_lo), (s_hi, a_hi)):
        same = (got == want) | (np.isnan(got) & np.isnan(want))
        with np.errstate(all="ignore"):
            close = np.abs(got - want) <= 1e-13 * np.maximum(np.abs(want), 1e-300)
        assert (same | close).all(), (x.lp[~(same | close)], got[~(same | close)])


def test_newton_counts_its_iterations():
    """The count is the number of evaluations of g: a Newton that starts on the root
    converges at its first evaluation, one that starts far takes more."""
    d = fbands.get("kl")
    x = inputs()
    fun = _solver.BandFunction(d, _solver.NUMPY, x)
    with np.errstate(all="ignore"):
        s, n = _solver.newton_edge(fun, "upper", 0.0 * x.lp + 1e-3, 0.0 * x.lp, -x.lp)
        again, n_again = _solver.newton_edge(fun, "upper", s, 0.0 * x.lp, -x.lp)
    ok = np.isfinite(s) & (s < -x.lp)
    assert ok.sum() > 100
    assert (n[ok] >= 2).all() and (n_again[ok] <= n[ok]).all()
    assert np.mean(n_again[ok] == 1) > 0.9
    np.testing.assert_allclose(again[ok], s[ok], rtol=1e-10)


@pytest.mark.parametrize("div", ["kl", "js", "reverse_kl"])
@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_upper_edge_next_to_saturation_is_exact(div, backend):
    """Just below r = 1/p, g climbs like -log(1/p - r): Newton in s there crawls, and its
    short steps once stopped it 1e-11 short; the solver steps in log c instead."""
    rng = np.random.default_rng(7)
    p = 1.0 - np.exp(rng.uniform(np.log(1e-3), np.log(5e-2), 12))
    p = np.concatenate((p, [0.96844067865694661, 0.99799588314057408]))
    delta = np.concatenate((rng.choice([0.05, 0.3, 0.7], 12), [0.7, 0.05]))
    _, hi = fbands.bounds(p, delta, div, backend=backend)
    f = ref.GENERATORS[div]
    want = np.array([float(ref.edges(f, pi, di)[1]) for pi, di in zip(p, delta, strict=True)])
    np.testing.assert_allclose(hi, want, rtol=1e-12, atol=0)


@pytest.mark.parametrize("div", ["kl", "chi2", "tv", "hellinger"])
def test_the_numba_modules_run_as_plain_python(div):
    """The scalar solver and the closed-form pass are ordinary modules: run from their own
    files as plain Python (what NUMBA_DISABLE_JIT=1 runs), against the same generated
    leaves, they take the steps the compiled kernels take and give their edges."""
    d = fbands.get(div)
    rng = np.random.default_rng(5)
    p = np.concatenate((np.exp(rng.uniform(np.log(1e-6), np.log(0.5), 60)),
                        1.0 - np.exp(rng.uniform(np.log(1e-6), np.log(0.5), 40)), [1.0]))
    delta = np.full(p.shape, 0.05)
    with np.errstate(all="ignore"):
        x = _solver.Inputs(np.log(p), np.log(np.maximum(1.0 - p, _solver.Q_FLOOR)), p,
                           np.maximum(1.0 - p, _solver.Q_FLOOR), delta)
    out = {}
    def quiet():  # (plain Python meets the nan and inf that the kernels do)
        return np.errstate(all="ignore")

    for name, k in (("python", loader.python_kernels(d)), ("jit", loader.kernels(d))):
        assert k.name.endswith("_python") == (name == "python")
        lo, hi = np.empty(p.size), np.empty(p.size)
        how, iters = np.empty((p.size, 2), np.int64), np.empty((p.size, 2), np.int64)
        with quiet():
            k.trace_arrays(x.lp, x.lq, x.p, x.q, x.delta, lo, hi, how, iters)
        out[name] = [lo, hi, how, iters]
        if k.closed_pass is not None:
            c_lo, c_hi = np.empty(p.size), np.empty(p.size)
            with quiet():
                k.closed_pass(p, 0.05, 1e-60, 0.5, 1e-3, c_lo, c_hi, np.empty(1, np.int64))
            out[name] += [c_lo, c_hi]
    assert (loader.kernels(d).closed_pass is None) == (div in ("kl", "hellinger"))
    np.testing.assert_array_equal(out["python"][2], out["jit"][2])  # the same branches
    np.testing.assert_array_equal(out["python"][3], out["jit"][3])  # and iterations
    for got, want in zip(out["python"][:2] + out["python"][4:],
                         out["jit"][:2] + out["jit"][4:], strict=True):
        same = (got == want) | (np.isnan(got) & np.isnan(want))
        with quiet():
            assert (same | (np.abs(got - want) <= 1e-13 * np.abs(want))).all()
