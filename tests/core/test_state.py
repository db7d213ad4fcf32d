"""The process state (fbands._state): one owner for every cache, keyed by what decides the
numbers, with one ``clear()``; and the table-completion policy it names."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import fbands
from fbands._state import STATE, Memo, ProcessState
from fbands.tables.cache import COMPLETION, TableCache

from .. import reference as ref

P = np.array([1e-6, 0.003, 0.2, 0.7, 0.99])
DELTA = 0.05


def _reference(f) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = zip(*(ref.edges(f, p, DELTA) for p in P), strict=True)
    return np.array(lo, dtype=float), np.array(hi, dtype=float)


# ----------------------------------------------------------------------------- the memo


def test_a_memo_keeps_at_most_its_bound_dropping_the_oldest():
    memo = Memo("m", "a test memo", max_entries=3)
    for k in range(5):
        assert memo.put(k, str(k)) == str(k)
    assert [k for k in range(5) if k in memo] == [2, 3, 4] and len(memo) == 3
    memo.put(2, "again")  # a key written again is the newest
    memo.put(5, "5")
    assert [k for k in range(6) if k in memo] == [2, 4, 5]
    assert memo.get(2) == "again" and memo.get(0, "none") == "none"


def test_get_or_make_makes_once_and_every_thread_sees_the_first_value_kept():
    memo = Memo("m", "a test memo")
    made, start = [], threading.Barrier(8)

    def make():
        made.append(object())
        return made[-1]

    def worker(out):
        start.wait()
        out.append(memo.get_or_make("k", make))

    outs: list = []
    threads = [threading.Thread(target=worker, args=(outs,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(o) for o in outs}) == 1 and outs[0] is memo.get("k")
    assert memo.get_or_make("k", lambda: pytest.fail("made again")) is outs[0]


def test_a_state_owns_its_parts_by_unique_names_and_clears_them_all():
    state = ProcessState()
    a = state.memo("a", "the first")
    tables = TableCache()
    state.adopt("tables", tables, "a table cache")
    with pytest.raises(ValueError, match="'a' already"):
        state.memo("a", "again")
    a.put(1, 2)
    tables.table_set(fbands.get("kl"), DELTA)
    assert state.sizes() == {"a": 1, "tables": 1}
    assert state.describe() == {"a": "the first", "tables": "a table cache"}
    state.clear()
    assert state.sizes() == {"a": 0, "tables": 0}


# ----------------------------------------------------------------------------- the process


def test_every_cache_of_the_process_is_a_part_of_the_state():
    import fbands._constants  # noqa: F401  (the modules that make memos)
    import fbands.backends.torch_backend  # noqa: F401
    import fbands.integrations._verl_step  # noqa: F401
    from fbands._jit import loader  # noqa: F401

    parts = set(STATE.sizes())
    assert {"kernels", "torch kernels", "torch namespaces", "torch intercepts", "tables",
            "device tables", "device grids", "device constants",
            "numba kernels", "numba ready", "closed-form limits", "code digests",
            "package fingerprints", "table fitters", "verl schedules"} <= parts
    assert all(STATE.describe()[name] for name in parts)
    assert "captured grids" not in parts  # (a captured CUDA graph reads them: never cleared)


@pytest.mark.parametrize("backend", ["numpy", "torch", "numba"])
def test_a_cleared_state_answers_with_the_same_bits(backend):
    torch = pytest.importorskip("torch") if backend == "torch" else None
    x = torch.tensor(P) if torch is not None else P
    first = [np.asarray(e) for e in fbands.bounds(x, DELTA, "kl", backend=backend)]
    first_again = [np.asarray(e) for e in fbands.bounds(x, DELTA, "kl", backend=backend)]
    assert any(STATE.sizes().values())
    STATE.clear()
    assert not any(STATE.sizes().values())  # what a fresh process holds
    after = [np.asarray(e) for e in fbands.bounds(x, DELTA, "kl", backend=backend)]
    for a, b, c in zip(first, first_again, after, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize("backend", ["numpy", "torch", "numba"])
def test_a_name_given_a_new_generator_is_never_served_the_old_ones_numbers(backend):
    """Caches key a divergence by its name and generator, so a name registered again with
    another generator gets its own kernels and tables, not the first one's."""
    torch = pytest.importorskip("torch") if backend == "torch" else None
    x = torch.tensor(P) if torch is not None else P
    for expr, f in (("u - 1 - log(u)", ref.GENERATORS["kl"]),
                    ("(u - 1)**2", ref.GENERATORS["chi2"])):
        div = fbands.register("mine", expr, overwrite=True)
        lo, hi = (np.asarray(e) for e in fbands.bounds(x, DELTA, div, backend=backend))
        want_lo, want_hi = _reference(f)
        np.testing.assert_allclose(lo, want_lo, rtol=1e-12)
        np.testing.assert_allclose(hi, want_hi, rtol=1e-12)


def test_equal_divergences_made_apart_share_their_cached_kernels():
    a = fbands.divergences.Divergence("twin", fbands.get("kl").f)
    b = fbands.divergences.Divergence("twin", fbands.get("kl").f)
    assert a is not b and a == b and hash(a) == hash(b) and a.key == b.key
    assert a.kernels(np) is b.kernels(np)
    assert a != fbands.divergences.Divergence("twin", fbands.get("chi2").f)


# ----------------------------------------------------------------------------- completion


def _reached(kbits: int) -> np.ndarray:
    from fbands.tables import layout

    mask = np.zeros(layout.cell_count(kbits), dtype=bool)
    mask[layout.cell_count(kbits) // 2] = True  # one cell of the data
    return mask


def test_on_return_builds_what_a_first_call_reaches_and_completes_on_the_next():
    tables = TableCache(completion="on-return")
    kl = fbands.get("kl")
    first = tables.reading_set(kl, 0.0371, "float32", _reached)
    assert not first.is_complete and first.built.sum() == 3  # the cell, two catch-alls
    assert tables.reading_set(kl, 0.0371, "float32", _reached).is_complete
    # another radius is new again
    assert not tables.reading_set(kl, 0.0372, "float32", _reached).is_complete


def test_first_call_completes_at_once():
    tables = TableCache(completion="first-call")
    assert tables.reading_set(fbands.get("kl"), 0.0371, "float32", _reached).is_complete


def test_an_unknown_completion_policy_is_refused():
    with pytest.raises(ValueError, match="on-return, first-call"):
        TableCache(completion="sometimes")
    assert set(COMPLETION) == {"on-return", "first-call"}
