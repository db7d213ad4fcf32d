"""A band call leaves the caller's threads as they were (issue 24).

numba's worker pool, started by a band call, used to set the calling thread's OpenMP thread
count to numba's: a trainer that had asked torch for one thread ran on two from then on,
and on a busy 2-core machine each step took several times longer.  These tests run in a
fresh interpreter, where the pool has not started yet, so that they see the first call.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numba
import numpy as np
import pytest

import fbands
from fbands._jit import threads as _threads

torch = pytest.importorskip("torch")

FRESH = textwrap.dedent("""
    import os, threading, time
    import numpy as np, torch
    torch.set_num_threads(1)
    import fbands, numba

    def cpu_ticks():  # CPU time (clock ticks) of this thread and of all the others
        me, others = 0, 0
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks = int(fields[11]) + int(fields[12])
            if int(tid) == threading.get_native_id():
                me += ticks
            else:
                others += ticks
        return me, others

    gen = np.random.default_rng(0)
    small = torch.log(torch.from_numpy(gen.uniform(1e-4, 1, 8192)).float())
    exact_p, exact_delta = gen.uniform(0.01, 1, 800), np.linspace(0.01, 0.2, 800)
    large = gen.uniform(1e-6, 1, 2_000_000)
    for delta in (0.05, 0.07):  # compile or load, build the cells and tables
        fbands.log_bounds(small, delta, "kl", logp=True)
        fbands.bounds(exact_p, exact_delta, "kl", backend="numba")
    time.sleep(0.5)  # (workers that spin after a region stop within milliseconds)

    def run(calls, seconds=0.6):
        start, t = cpu_ticks(), time.perf_counter()
        while time.perf_counter() - t < seconds:
            calls()
        end = cpu_ticks()
        return end[0] - start[0], end[1] - start[1]

    def trainer_sized():
        fbands.log_bounds(small, 0.05, "kl", logp=True)  # a known radius: tables
        fbands.bounds(exact_p, exact_delta, "kl", backend="numba")  # per-token radii: exact

    print("small", torch.get_num_threads(), *run(trainer_sized), numba.threading_layer())
    print("large", torch.get_num_threads(),
          *run(lambda: fbands.bounds(large, 0.05, "kl", backend="numba")))
""")


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads /proc/self/task")
def test_a_band_call_keeps_torch_threads_and_small_calls_stay_serial():
    proc = subprocess.run([sys.executable, "-c", FRESH], capture_output=True, text=True,
                          timeout=600, env={k: v for k, v in os.environ.items()
                                            if k not in ("OMP_WAIT_POLICY", "NUMBA_NUM_THREADS")})
    assert proc.returncode == 0, proc.stderr
    small, large = (line.split() for line in proc.stdout.split("\n")[:2])
    assert small[1] == "1" and large[1] == "1", proc.stdout  # torch's count as the user set it
    if numba.config.NUMBA_NUM_THREADS > 1:
        # trainer-sized calls run on the caller alone: the other threads stay idle (ticks of
        # 10 ms: a margin for the interpreter's own threads) while the caller works
        assert int(small[3]) <= 2 < int(small[2]), proc.stdout
        # a call worth threads uses them
        assert int(large[3]) >= 10, proc.stdout


def test_sized_runs_small_work_serially_and_restores_the_count():
    start = numba.get_num_threads()
    with _threads.sized(10, "pass"):
        assert numba.get_num_threads() == 1
    assert numba.get_num_threads() == start
    big = int(2 * _threads.PARALLEL_FROM_S / _threads.COST_S["pass"])
    with _threads.sized(big, "pass"):
        assert numba.get_num_threads() == start
    numba.set_num_threads(1)  # the user's own limit stays the upper bound
    try:
        with _threads.sized(big, "exact"):
            assert numba.get_num_threads() == 1
    finally:
        numba.set_num_threads(start)


@pytest.mark.parametrize("n", [5000, 600_000])  # serial and parallel kernels
def test_concurrent_calls_from_threads_agree(n):
    gen = np.random.default_rng(n)
    p = gen.uniform(1e-6, 1, n)
    for _ in range(2):  # the radius is known (and its cells final) before the threads start
        want = fbands.bounds(p, 0.05, "kl", backend="numba")
    exact_p, exact_delta = p[:500], np.linspace(0.01, 0.2, 500)
    want_exact = fbands.bounds(exact_p, exact_delta, "kl", backend="numba")
    got, errors = [None] * 4, []

    def work(k):
        try:
            got[k] = (fbands.bounds(p, 0.05, "kl", backend="numba"),
                      fbands.bounds(exact_p, exact_delta, "kl", backend="numba"))
        except Exception as err:  # noqa: BLE001 (reported below)
            errors.append(err)

    workers = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors
    for table, exact in got:
        for a, b in zip((*table, *exact), (*want, *want_exact), strict=True):
            np.testing.assert_array_equal(a, b)


TENSORS_ONLY = textwrap.dedent("""
    import sys
    import numpy as np, torch
    import fbands
    from fbands.losses import policy_loss, precompute_band, preset

    gen = torch.Generator().manual_seed(0)
    logp_old = torch.log(torch.rand(4, 64, generator=gen, dtype=torch.float64))
    mask = (torch.rand(4, 64, generator=gen) > 0.3).float()
    for delta in (0.05, 0.05, 0.05, 0.07):  # a new radius, its complete tables, a change
        fbands.log_bounds(logp_old.float(), delta, "kl", logp=True)
        fbands.bounds(logp_old.exp(), delta, "tv")
    fbands.bounds(logp_old.exp(), torch.full((4, 64), 0.05), "chi2")  # a radius per token
    fbands.bounds(np.array([0.001, 0.05, 0.5]), 0.05, div="kl")  # the quick tour's first call
    fbands.log_bounds(np.log(np.linspace(0.01, 1, 5000)), 0.05, "js", logp=True)
    p = logp_old.exp().requires_grad_()
    sum(fbands.bounds(p, 0.05, "hellinger")).sum().backward()  # gradients
    for name in ("band-kl", "band-mask-tv", "clip"):
        cfg = preset(name, delta=0.05)
        logp = (logp_old + 0.1).clamp(max=0).requires_grad_()
        loss, _ = policy_loss(logp_old, logp, torch.ones(4, 1), mask, cfg,
                              precompute_band(logp_old, cfg, mask=mask))
        loss.backward()
    print(sorted(m for m in sys.modules if m == "numba" or m.startswith("numba.")))
""")


def test_tensors_and_small_arrays_never_load_numba():
    """Every torch path runs torch's operations and numpy on the host: a training process
    (the losses, bands of every kind on CPU tensors, gradients) loads no numba, so it has
    no worker pool of fbands' to compete with its own threads, and no compiler in memory.
    Small arrays (backend "auto") take the numpy solver: a first call compiles nothing."""
    proc = subprocess.run([sys.executable, "-c", TENSORS_ONLY], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout
