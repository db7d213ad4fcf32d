"""calibrate_delta: against 60-digit values of g, and round trips through bounds."""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest

import fbands

from .. import reference as ref
from .._speed import registry

pytestmark = pytest.mark.usefixtures("user_divergence")  # tests/_user.py


EPS = np.array([1e-6, 1e-3, 0.05, 0.1, 0.2, 0.28, 0.5, 0.9])
P = np.array([1e-12, 1e-6, 0.01, 0.1, 0.3, 0.5, 0.8, 0.99, 1 - 1e-9])


def _reference(div: str, eps: float, p: float, side: str):
    f = ref.TABLE[div]
    with mp.workdps(ref.DPS):
        r = 1 + mp.mpf(eps) if side == "upper" else 1 - mp.mpf(eps)
        if r * mp.mpf(p) > 1:
            return math.inf
        return ref.g(f, mp.mpf(p), r)


@pytest.mark.parametrize("side", ["upper", "lower"])
@pytest.mark.parametrize("div", registry(list(ref.TABLE)))
def test_against_60_digits(div, side):
    e, p = np.meshgrid(EPS, P)
    got = fbands.calibrate_delta(e, p, div, side)
    assert got.shape == e.shape
    for i in np.ndindex(e.shape):
        want = _reference(div, float(e[i]), float(p[i]), side)
        if math.isinf(want):
            assert got[i] == math.inf, (div, side, e[i], p[i])
        else:
            assert got[i] == pytest.approx(float(want), rel=1e-12, abs=0), (div, e[i], p[i])


def test_judged_example():
    # KL's two-point divergence at r = 1.2, p = 0.5, written out by hand.
    want = 0.5 * (0.2 - math.log(1.2)) + 0.5 * (-0.2 - math.log(0.8))
    with mp.workdps(60):
        exact = 0.5 * (mp.mpf("0.2") - mp.log(mp.mpf("1.2"))) + 0.5 * (
            -mp.mpf("0.2") - mp.log(mp.mpf("0.8")))
    got = fbands.calibrate_delta(0.2, 0.5, "kl")
    assert isinstance(got, float)
    assert got == pytest.approx(float(exact), rel=1e-12)
    assert got == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("side", ["upper", "lower"])
@pytest.mark.parametrize("div", registry(list(ref.TABLE)))
def test_round_trip(div, side):
    eps = np.array([0.01, 0.1, 0.2, 0.28, 0.6])
    p = np.array([[1e-4], [0.05], [0.3], [0.5], [0.7]])
    delta = fbands.calibrate_delta(eps, p, div, side)
    ok = np.isfinite(delta) & (delta > 0)
    e, pp = np.broadcast_arrays(eps, p)
    lo, hi = fbands.bounds(pp[ok], delta[ok], div, backend="numpy")
    edge = hi if side == "upper" else lo
    want = 1 + e[ok] if side == "upper" else 1 - e[ok]
    np.testing.assert_allclose(edge, want, rtol=1e-11)
    assert ok.sum() >= 15


def test_unreachable_and_limits():
    # 1 + eps beyond 1/p: no radius reaches it.
    assert fbands.calibrate_delta(0.2, 0.9) == math.inf
    with pytest.raises(fbands.BandError, match="1 \\+ eps <= 1/p"):
        fbands.calibrate_delta(0.2, 0.9, unreachable="raise")
    # 1 + eps = 1/p exactly: the radius at which the band reaches 1/p, g(p, 1/p).
    got = fbands.calibrate_delta(1.0, 0.5, "chi2")
    assert got == pytest.approx(0.5 * 1 + 0.5 * 1)  # p (2-1)^2 + q (0-1)^2
    assert fbands.bounds(0.5, got, "chi2")[1] == pytest.approx(2.0)
    # lower edge r = 0: g(p, 0) = p f(0) + q f(1/q); infinite for KL.
    assert fbands.calibrate_delta(1.0, 0.5, "kl", "lower") == math.inf
    assert fbands.calibrate_delta(1.0, 0.5, "tv", "lower") == pytest.approx(0.5)
    # eps = 0 is delta = 0; p = 1 on the lower side is the q -> 0 limit.
    assert fbands.calibrate_delta(0.0, 0.3) == 0.0
    assert fbands.calibrate_delta(0.2, 1.0, "kl", "lower") == pytest.approx(math.log(1.25))
    assert fbands.calibrate_delta(0.2, 1.0, "reverse_kl", "lower") == math.inf
    assert fbands.calibrate_delta(0.2, 1.0, "kl", "upper") == math.inf


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        ((-0.1, 0.5), {}, "eps must lie in"),
        ((1.5, 0.5), {"side": "lower"}, "eps must lie in \\[0, 1\\]"),
        ((0.2, 0.0), {}, "p must lie in \\(0, 1\\]"),
        ((0.2, [0.5, 1.2]), {}, "at index \\(1,\\)"),
        ((float("nan"), 0.5), {}, "eps must lie in"),
        ((0.2, 0.5), {"side": "both"}, "side must be one of"),
        ((0.2, 0.5), {"unreachable": "nan"}, "unreachable must be one of"),
        ((True, 0.5), {}, "bool"),
        (("x", 0.5), {}, "eps must be a number"),
        (([0.1, 0.2], [0.5, 0.5, 0.5]), {}, "does not broadcast"),
    ],
)
def test_bad_input(args, kwargs, match):
    with pytest.raises(fbands.BandError, match=match):
        fbands.calibrate_delta(*args, **kwargs)


def test_unknown_divergence():
    with pytest.raises(fbands.DivergenceError):
        fbands.calibrate_delta(0.2, 0.5, "nope")


def test_monotone_in_p():
    # The same PPO edge costs a rare token a smaller radius: the band is wider there.
    p = np.geomspace(1e-6, 0.8, 50)
    d = fbands.calibrate_delta(0.2, p, "kl")
    assert np.all(np.diff(d) > 0)


# --- fbands plot --compare-clip: the allowed gain of PPO and of the bands -------------------
def test_compare_clip_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from fbands.cli import main

    out = tmp_path / "gain.png"
    assert main(["plot", "--compare-clip", "0.2", "--div", "kl,tv", "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    matched = tmp_path / "matched.png"
    assert main(["plot", "--compare-clip", "0.2", "--match-p", "0.3", "-o", str(matched)]) == 0
    assert matched.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    for argv, fragment in [
        (["--compare-clip", "-0.1"], "--compare-clip must be a finite number > 0"),
        (["--compare-clip", "nan"], "--compare-clip must be a finite number > 0"),
        (["--match-p", "0.3"], "--match-p needs --compare-clip"),
        (["--compare-clip", "0.2", "--match-p", "0.9"], "1 + eps <= 1/p"),
    ]:
        assert main(["plot", *argv, "-o", str(tmp_path / "x.png")]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("fbands: error: ") and fragment in err and "\n" not in err, err
