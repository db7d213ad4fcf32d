"""The torch backend's closed-form path (``device-closed``, issue 40): ratio edges of the
divergences whose edges are unsquared closed forms reaching 0 (tv and chi2 among the
built-ins) computed from those forms on the tensor's device, with no table.

Checked against the 60-digit reference of :mod:`tests.reference`, never against fbands'
own solver; the device's sync-free variant on CPU and ``meta`` tensors.
"""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import fbands  # noqa: E402
from fbands._dispatch import DEVICE_CLOSED, compute, plan  # noqa: E402
from fbands.divergences import get  # noqa: E402

from .. import reference as ref  # noqa: E402
from .._sync import SyncDetector  # noqa: E402

NAMES = ["tv", "chi2"]
DELTA = 0.05


def _reference(name, p, delta):
    """60-digit ``(lower, upper)`` ratio edges at ``p`` (a float, exactly)."""
    with mp.workdps(ref.DPS):
        if p == 1.0:
            return float(ref.lower_at_one(name, delta)), 1.0
        lower, upper = ref.edges(ref.TABLE[name], mp.mpf(p), delta)
        return float(lower), float(upper)


def _points(name, delta):
    """p over the whole range: the tail, LLM-like values, 1 - p down to 1e-12, p = 1, and
    both sides of the lower edge's saturation (where r = 0 is reached)."""
    pts = list(np.logspace(-30, -0.01, 40)) + list(1 - np.logspace(-12, -1, 12)) + [1.0]
    lo_edge = [_reference(name, p, delta)[0] for p in np.logspace(-4, -0.01, 200)]
    first = next(i for i, r in enumerate(lo_edge) if r > 0)  # saturation between two points
    pts += list(np.logspace(-4, -0.01, 200)[max(first - 2, 0):first + 3])
    return np.array(sorted(set(pts)))


def _ulps(got, want, dtype):
    """Distance in units in the last place of ``dtype`` between ``got`` and ``want``
    rounded to it (both finite, non-negative)."""
    it = np.int64 if dtype == np.float64 else np.int32
    a = np.asarray(got, dtype).view(it).astype(np.int64)
    b = np.asarray(want, np.float64).astype(dtype).view(it).astype(np.int64)
    return np.abs(a - b)


def test_the_plan_takes_it_for_ratios_of_closed_form_divergences():
    for x in (torch.zeros(3), torch.zeros(3, dtype=torch.float64),
              torch.zeros(3).bfloat16(), torch.zeros(3, device="meta")):
        for name in NAMES:
            assert plan(get(name), x, DELTA, logp=False, log=False).path == DEVICE_CLOSED
            assert plan(get(name), x, DELTA, logp=True, log=False).path != DEVICE_CLOSED
            assert plan(get(name), x, DELTA, logp=False, log=True).path != DEVICE_CLOSED
            assert plan(get(name), x, 1e300, logp=False, log=False).path != DEVICE_CLOSED
        # kl has no closed form; neyman_chi2's lower edge only tends to 0 (the tables)
        for name in ("kl", "neyman_chi2"):
            assert plan(get(name), x, DELTA, logp=False, log=False).path != DEVICE_CLOSED
    per_token = torch.full((3,), DELTA)
    assert plan(get("tv"), torch.zeros(3), per_token, logp=False, log=False).path \
        != DEVICE_CLOSED
    with pytest.raises(fbands.BandError, match="not both unsquared closed forms"):
        compute("edges", "kl", torch.rand(3), DELTA, "torch", path=DEVICE_CLOSED)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", NAMES)
def test_closed_path_matches_the_60_digit_reference(name, dtype):
    p = _points(name, DELTA).astype(dtype)
    lo, hi = fbands.bounds(torch.from_numpy(p), DELTA, name)
    assert lo.dtype == getattr(torch, np.dtype(dtype).name)
    want = np.array([_reference(name, float(x), DELTA) for x in p])
    if dtype == np.float64:
        for got, w in ((lo.numpy(), want[:, 0]), (hi.numpy(), want[:, 1])):
            scale = np.maximum(np.abs(w), 1e-300)
            assert np.all(np.abs(got - w) <= 1e-12 * scale), (name, np.abs(got - w) / scale)
    else:  # within one float32 ulp of the truth rounded once
        assert _ulps(lo.numpy(), want[:, 0], dtype).max() <= 1
        assert _ulps(hi.numpy(), want[:, 1], dtype).max() <= 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(NAMES), p=st.floats(1e-60, 1.0),
       delta=st.floats(1e-4, 4.0))
def test_closed_path_holds_for_any_p_and_radius(name, p, delta):
    lo, hi = fbands.bounds(torch.tensor([p], dtype=torch.float64), delta, name)
    w_lo, w_hi = _reference(name, p, delta)
    # (1e-40 absolute: where the lower edge is exactly 0, at p = delta for tv, the
    # reference's g(p, 0) rounds at 60 digits to just above delta and it bisects to ~1e-60)
    assert abs(lo.item() - w_lo) <= 1e-12 * max(w_lo, 1e-40)
    assert abs(hi.item() - w_hi) <= 1e-12 * w_hi


def test_elements_the_forms_cannot_vouch_for_are_solved_and_invalid_ones_flagged():
    """p below exp(-150) (the forms' coefficients underflow) goes to the exact solver;
    nan, 0 and p > 1 are invalid: nan with invalid="nan", an error naming p otherwise."""
    p = torch.tensor([1e-70, 0.3, math.nan, 0.0, 1.5, 1.0], dtype=torch.float64)
    lo, hi = compute("edges", "tv", p, DELTA, "torch", path=DEVICE_CLOSED, invalid="nan")
    for i in (0, 1, 5):
        w_lo, w_hi = _reference("tv", p[i].item(), DELTA)
        assert lo[i].item() == pytest.approx(w_lo, rel=1e-12, abs=0)
        assert hi[i].item() == pytest.approx(w_hi, rel=1e-12)
    assert torch.isnan(lo[2:5]).all() and torch.isnan(hi[2:5]).all()
    with pytest.raises(fbands.BandError, match="p"):
        compute("edges", "tv", p, DELTA, "torch", path=DEVICE_CLOSED)


@pytest.mark.parametrize("name", NAMES)
def test_sync_free_call_reads_nothing_back_and_agrees_with_the_eager_one(name):
    """Traced or captured (``sync_free``), the leftovers go to the device's fixed-count
    solver through a static buffer: no host read, the eager call's edges to 1e-12; on a
    meta tensor (a GPU stand-in: any host read fails) as well."""
    p = torch.from_numpy(np.concatenate((_points(name, DELTA), [1e-80, 1e-200])))
    eager = compute("edges", name, p, DELTA, "torch", path=DEVICE_CLOSED, check=False)
    for x in (p, p.to("meta")):
        compute("edges", name, x, DELTA, "torch", check=False, sync_free=True)
        with SyncDetector() as det:
            got = compute("edges", name, x, DELTA, "torch", check=False, sync_free=True)
        assert det.syncs == [] and det.uploads == [], det.report()
        assert got[0].shape == p.shape and got[0].device == x.device
    for g, e in zip(got if not got[0].is_meta else
                    compute("edges", name, p, DELTA, "torch", check=False, sync_free=True),
                    eager, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=0)


def test_an_eager_call_waits_once_and_builds_no_table():
    """A radius new to the process costs no table: one wait (to count the leftovers), and
    the process's table cache is left as it was."""
    from fbands.tables.cache import TABLES

    p = torch.rand(4096, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    before = len(TABLES)
    with SyncDetector() as det:
        fbands.bounds(p, 0.0734, "chi2", check=False)
    assert len(det.syncs) == 1 and det.uploads == [], det.report()
    assert len(TABLES) == before
