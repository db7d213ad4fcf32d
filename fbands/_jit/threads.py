"""How the numba kernels use threads, so that a band call costs nothing to the work around it.

fbands runs inside somebody else's training loop, where torch (and whatever else uses
OpenMP) has its own thread settings.  Two rules keep the band out of their way:

1. **Serial unless parallel pays.**  Each kernel call is sized (:func:`sized`): work
   expected to take less than :data:`PARALLEL_FROM_S` on one core (a trainer's batch of
   log-probabilities through the tables, a few thousand exact solves) runs on the calling
   thread alone, so numba's worker threads are never woken.  Waking them costs little on
   an idle machine, but on a busy one a parallel region waits for every worker to be
   scheduled, and a worker that spins after the region takes a core from the caller's
   next operations.  Larger calls use numba's thread count (``numba.set_num_threads``
   and ``NUMBA_NUM_THREADS`` are honoured as the upper bound).
2. **The caller's OpenMP settings survive.**  numba's ``omp`` threading layer shares the
   process's OpenMP runtime with torch, and starting its worker pool sets the calling
   thread's OpenMP thread count to numba's (``omp_set_num_threads``): a trainer that
   asked torch for one thread silently got two after its first band call, which on a
   busy 2-core machine made every later step several times slower.  :func:`start`
   starts the pool once, from a thread of its own, so no caller's count changes.

Nothing here sets an environment variable or a process-wide option; the thread count a
kernel runs with is numba's thread-local setting, restored after the call.
"""

from __future__ import annotations

import contextlib
import threading

import numba

__all__ = ["PARALLEL_FROM_S", "COST_S", "start", "sized"]

#: Serial work (seconds on one core) from which a kernel call uses numba's threads.
#: Below it the call is too short for threads to pay on a busy machine (a parallel region
#: there can wait a scheduler time slice, milliseconds, for a descheduled worker).  On an
#: idle 2-core machine two threads win from about 50 microseconds of work, so this gives
#: up some speed of mid-sized calls there (32k tokens through the tables) for calls that
#: never wait on the scheduler.
PARALLEL_FROM_S = 2e-3

#: Rough cost of one element on one core, per kind of kernel call (seconds): enough to
#: size a call (:func:`sized`), not a benchmark (``benchmarks/results/bench_bounds.md``).
COST_S = {
    "pass": 5e-9,  # table or closed-form pass, finding what it left
    "exact": 1.5e-6,  # the scalar solver on one element (both edges)
    "touch": 2e-9,  # marking the table cells the data reaches
}

_START_LOCK = threading.Lock()
_started = False


def start() -> None:
    """Start numba's worker pool once per process, from a short-lived thread of its own.

    Starting the pool sets the OpenMP thread count of the thread that starts it (numba's
    ``omp`` layer calls ``omp_set_num_threads``), and that count is per thread; torch's
    intra-op thread count is the same setting when torch uses OpenMP.  Started from a
    thread of its own, the pool leaves every caller's count as it was, whichever OpenMP
    runtime the process loaded.  (numba's parallel regions name their thread count
    themselves, so nothing later depends on the starting thread.)
    """
    global _started
    if _started:
        return
    with _START_LOCK:
        if not _started:
            starter = threading.Thread(target=numba.get_num_threads, name="fbands-numba-start")
            starter.start()
            starter.join()
            _started = True


@contextlib.contextmanager
def sized(items: int, kind: str):
    """Run the numba kernels called inside on the calling thread alone when ``items``
    elements of ``kind`` (a key of :data:`COST_S`) are less than :data:`PARALLEL_FROM_S`
    of serial work, else with the calling thread's numba thread count.  The count is
    numba's thread-local setting, put back afterwards."""
    start()
    before = numba.get_num_threads()
    want = 1 if items * COST_S[kind] < PARALLEL_FROM_S else before
    if want == before:
        yield
        return
    numba.set_num_threads(want)
    try:
        yield
    finally:
        numba.set_num_threads(before)
