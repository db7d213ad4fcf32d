"""Throughput of the band solvers: ns per token, per backend x divergence x dtype x N.

Two references are timed in the same run, on the same data:

* ``bisection``: the published algorithm's shape, written from its description -- a
  vectorised torch bisection on ``g(p, r) = delta``, 50 iterations per edge, with a host
  synchronisation in every iteration to test a 1e-6 tolerance (``.item()`` on the largest
  bracket width).  It computes in the input's dtype, as such code does.
* ``copy``: a plain memory copy of the same array (numpy ``copy``), the physical floor.

Beside the ``chi2`` rows, ``div+sqrt`` times a loop that does only the arithmetic chi2's
closed form cannot avoid, one float64 division and one square root per element (both edges
stored, in parallel): the floor of that divergence on this CPU, which waits on its
floating-point divider rather than on memory.

Each result reports ``speedup_vs_bisection`` (bisection time / backend time, same
divergence, dtype and N) and ``x_copy`` (backend time / copy time).  The copy of ``x_copy``
is timed in the same loop as the backend, call for call (see :func:`timeit`): on a shared
virtual machine the speed of both drifts by up to 1.5x from one second to the next, and a
ratio of two times taken at different moments would measure that drift.

Three more blocks measure where the time of one solver could hide (the targets of issue 15),
all with the numba backend, KL unless stated, on 1M tokens and delta 0.05:

* **p distributions**: float32 and float64 over six distributions of ``p`` (see
  :data:`DISTRIBUTIONS`), with the bisection and a copy on the same data; ``x_best`` is the
  time over the fastest distribution of the same dtype (target: at most 2).
* **delta schedule**: float32, a new scalar delta every call (a linear ramp around 0.05
  shifted by a random offset, so that every value is new to the process and to the disk)
  against as many calls with one fixed delta, each as the mean time a call; the ratio's
  target is at most 2.  For that block ``FBANDS_CACHE_DIR`` points to a fresh temporary
  directory: no stored table can serve a delta, and the user's table cache is not flushed
  by the schedule's tables.
* **log_bounds**: ``log_bounds(log p, delta, div, logp=True)`` against ``bounds(p, delta,
  div)`` for every divergence of :func:`fbands.available` (a family through the member in
  :data:`FAMILY_MEMBERS`), float32 and float64, timed call for call; target at most 1.5.
  Beside them, the time of ``exp(log p)`` alone (:func:`exp_floor`): the least that
  log-probability input adds, which for the closed forms exceeds half of ``bounds``.

The markdown opens with a summary of the three judged numbers.

Run::

    python benchmarks/bench_bounds.py            # N in {32k, 1M, 16M}, about 5 minutes
    python benchmarks/bench_bounds.py --quick    # N in {32k, 1M}, fewer cases and repeats
    python benchmarks/bench_bounds.py --quick --tokens 100000 --blocks dist,delta,log
                                                 # a smoke test of the three blocks

``--tokens`` sets N of the three blocks (default 1M), ``--blocks`` picks blocks among
``main`` (the backend table), ``dist``, ``delta`` and ``log`` (default: all).  Results go to
``benchmarks/results/bench_bounds.json`` and ``bench_bounds.md`` (``--out`` for another
directory: do that for a partial run).

Two environments.  The script's own numbers are taken with ``OMP_WAIT_POLICY=PASSIVE``
(unless set already): torch and numba each keep an OpenMP thread pool, and with the default
policy the idle threads of one spin while the other works, which here measures the
scheduler as much as the solvers.  A user has no such setting, so the backend table is
timed a second time in a child process with the default environment (``--env default``,
``OMP_WAIT_POLICY`` removed), and each row reports both: ``default ns/token`` and
``default / own``.  ``--env own`` skips that second run.
"""

from __future__ import annotations

import os
import sys

#: "own" (the script's setting), "default" (a user's environment), "both" (own, then the
#: backend table again in a child with the default environment)
ENV = sys.argv[sys.argv.index("--env") + 1] if "--env" in sys.argv[:-1] else "both"
if ENV != "default":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before numpy, torch or numba load

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

import fbands  # noqa: E402

RESULTS = ROOT / "results"
DELTA = 0.05
SIZES = {"32k": 32_768, "1M": 1_000_000, "16M": 16_000_000}


# ----------------------------------------------------------------------------- data


#: The p distributions of the ``dist`` block: name -> (kind, low, high).  ``uniform``: p
#: uniform on (low, high); ``near-one``: 1 - p log-uniform on [low, high]; ``log``: p
#: log-uniform on [low, high).
DISTRIBUTIONS = {
    "uniform": ("uniform", 1e-7, 1.0),
    "1-p log[1e-7,0.1]": ("near-one", 1e-7, 0.1),
    "log[1e-3,1)": ("log", 1e-3, 1.0),
    "log[1e-6,1)": ("log", 1e-6, 1.0),
    "log[1e-6,1e-3)": ("log", 1e-6, 1e-3),
    "log[1e-12,1e-6)": ("log", 1e-12, 1e-6),
}

#: The member timed for a family of :func:`fbands.available` (a family has no default).
FAMILY_MEMBERS = {"alpha": "alpha(a=0.3)"}


def make_p(n: int, dtype, dist: str = "llm", seed: int = 0) -> np.ndarray:
    """Token probabilities.  ``llm``: shaped like a language model's, half uniform on
    (0, 1) and half close to 1 (``1 - p`` log-uniform on [1e-7, 0.1]); else a name of
    :data:`DISTRIBUTIONS`."""
    rng = np.random.default_rng(seed)
    if dist in DISTRIBUTIONS:
        kind, low, high = DISTRIBUTIONS[dist]
        if kind == "uniform":
            p = rng.uniform(low, high, n)
        elif kind == "near-one":
            p = 1.0 - 10.0 ** rng.uniform(np.log10(low), np.log10(high), n)
        else:
            p = 10.0 ** rng.uniform(np.log10(low), np.log10(high), n)
        return p.astype(dtype)
    half = n // 2
    p = np.empty(n)
    p[:half] = rng.uniform(1e-7, 1.0, half)
    p[half:] = 1.0 - 10.0 ** rng.uniform(-7, -1, n - half)
    rng.shuffle(p)
    return p.astype(dtype)


# ----------------------------------------------------------------------------- references


def _torch_f(div: str):
    import torch

    if div == "kl":
        return lambda u: u - 1 - torch.log(u)
    if div == "tv":
        return lambda u: 0.5 * torch.abs(u - 1)
    if div == "chi2":
        return lambda u: (u - 1) ** 2
    raise KeyError(div)


def bisection_reference(p, delta: float, div: str, iters: int = 50, tol: float = 1e-6):
    """Vectorised torch bisection on g(p, r) = delta, 50 iterations per edge, one host sync
    per iteration (the tolerance test), in the input's dtype."""
    import torch

    f = _torch_f(div)
    q = 1 - p

    def g(r):
        c = torch.clamp((1 - r * p) / q, min=1e-30)
        return p * f(torch.clamp(r, min=1e-30)) + q * f(c)

    edges = []
    for lo, hi, increasing in ((torch.ones_like(p), 1 / p, True),
                               (torch.zeros_like(p), torch.ones_like(p), False)):
        for _ in range(iters):
            mid = 0.5 * (lo + hi)
            inside = g(mid) <= delta
            if increasing:
                lo, hi = torch.where(inside, mid, lo), torch.where(inside, hi, mid)
            else:
                lo, hi = torch.where(inside, lo, mid), torch.where(inside, mid, hi)
            if (hi - lo).max().item() < tol:  # the host sync of every iteration
                break
        edges.append(0.5 * (lo + hi))
    return edges[1], edges[0]


_DIV_SQRT = None


def div_sqrt_floor(p: np.ndarray, delta: float):
    """chi2's edges 1 -/+ sqrt(delta (1 - p) / p) and nothing else: no validation, no
    saturation, no refinement (see the module's docstring)."""
    global _DIV_SQRT
    if _DIV_SQRT is None:
        import math

        import numba

        @numba.njit(parallel=True, error_model="numpy")
        def kernel(x, delta, lo, hi):
            for i in numba.prange(x.size):
                v = np.float64(x[i])
                y = math.sqrt(delta * (1.0 - v) / v)
                lo[i] = 1.0 - y
                hi[i] = 1.0 + y

        _DIV_SQRT = kernel
    lo, hi = np.empty_like(p), np.empty_like(p)
    _DIV_SQRT(p, delta, lo, hi)
    return lo, hi


_EXP = None


def exp_floor(lp: np.ndarray) -> np.ndarray:
    """``exp(log p)`` and nothing else, by the passes' own vectorising exp: the work that
    ``log_bounds(logp=True)`` must do and ``bounds(p)`` need not (see ``run_log_bounds``)."""
    global _EXP
    if _EXP is None:
        import numba

        from fbands._jit.vmath import vexp

        @numba.njit(parallel=True, error_model="numpy")
        def kernel(x, out):
            for i in numba.prange(x.size):
                out[i] = vexp(np.float64(x[i]))

        _EXP = kernel
    out = np.empty_like(lp)
    _EXP(lp, out)
    return out


# ----------------------------------------------------------------------------- timing


def round_robin(fns, repeat: int) -> list[float]:
    """Best of ``repeat`` timed calls of each of ``fns`` after a warm-up call of each
    (compilation, table building), the functions taking turns call for call: on a shared
    virtual machine the minimum is what the code costs, the rest is the neighbours, and
    taking turns puts every function at the same moments of a speed that drifts."""
    times = [[] for _ in fns]
    for f in fns:
        f()
    for _ in range(repeat):
        for f, t in zip(fns, times, strict=True):
            t0 = time.perf_counter()
            f()
            t.append(time.perf_counter() - t0)
    return [float(np.min(t)) for t in times]


def timeit(fn, repeat: int, beside=None):
    """:func:`round_robin` of ``fn`` (its best time), or of ``fn`` and ``beside`` (both)."""
    if beside is None:
        return round_robin([fn], repeat)[0]
    return tuple(round_robin([fn, beside], repeat))


def machine() -> dict:
    import numba
    import torch

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "numba_threads": numba.get_num_threads(),
        "load_average_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "numba": numba.__version__,
        "fbands": fbands.__version__,
        "platform": platform.platform(),
    }


# ----------------------------------------------------------------------------- main table


def cases(quick: bool):
    """(backend, divergence, dtype, size, data) in a budget of a few minutes on 2 cores."""
    divs = ["kl", "tv", "chi2"]
    sizes = ["32k", "1M"] if quick else ["32k", "1M", "16M"]
    for size in sizes:
        for div in divs:
            for dtype in ("float32", "float64"):
                if quick and (div != "kl" and dtype == "float64"):
                    continue
                for backend in ("numba", "torch", "torch-table", "torch-native", "numpy",
                                "div+sqrt"):
                    if backend == "div+sqrt" and div != "chi2":
                        continue
                    if backend == "torch-native" and size != "32k":
                        continue  # about a minute per million tokens on 2 CPU cores
                    if backend == "numpy" and (size == "16M" or (
                            size == "1M" and (div != "kl" or dtype != "float32"))):
                        continue
                    yield backend, div, dtype, size, "llm"


#: The torch backend's path that a ``torch-*`` row forces (``torch`` takes the automatic
#: choice, which hands CPU tensors to numba).
TORCH_PATHS = {"torch-table": "device-table", "torch-native": "device-solver"}


def _torch_call(backend: str, t, div: str):
    """The call a ``torch*`` row times, on the CPU tensor ``t``."""
    if backend == "torch":
        return lambda: fbands.bounds(t, DELTA, div)
    from fbands._dispatch import compute

    d = fbands.get(div)
    return lambda: compute("edges", d, t, DELTA, "torch", logp=False, invalid="raise",
                           check=True, path=TORCH_PATHS[backend])


def _print_row(row: dict) -> None:
    sp = row.get("speedup_vs_bisection")
    print(f"{row['backend']:>13} {row['div']:>5} {row['dtype']:>8} {row['size']:>4} "
          f"{row['data']:>7}: {row['ns_per_token']:9.2f} ns/token"
          + (f"  {sp:7.1f}x vs bisection" if sp else "")
          + (f"  {row['x_copy']:8.1f}x copy" if "x_copy" in row else ""), flush=True)


def run_main(quick: bool) -> list[dict]:
    """The backend table: every backend against the bisection and a copy."""
    import torch

    rows = []
    refs: dict = {}
    data: dict = {}
    for backend, div, dtype, size, dist in cases(quick):
        n = SIZES[size]
        key = (dtype, size, dist)
        if key not in data:
            data[key] = make_p(n, np.dtype(dtype), dist)
        p = data[key]
        t_p = torch.from_numpy(p)
        repeat = 25 if n <= 32_768 else (15 if n <= 1_000_000 else 5)
        if (div, dtype, size, dist) not in refs:
            copy_s = timeit(lambda p=p: p.copy(), max(repeat, 3))
            # bisection costs about 3 us per token here: at 16M only the headline case
            slow = (n > 1_000_000 and (div, dtype) != ("kl", "float32")) or (
                quick and n == 1_000_000 and (div, dtype) != ("kl", "float32"))
            bis_s = None if slow else timeit(
                lambda t=t_p, d=div: bisection_reference(t, DELTA, d), 1 if n > 1_000_000 else 3)
            refs[(div, dtype, size, dist)] = (copy_s, bis_s)
            for name, secs in (("copy", copy_s), ("bisection", bis_s)):
                if secs is not None:
                    rows.append({"backend": name, "div": div, "dtype": dtype, "n": n,
                                 "size": size, "data": dist, "ns_per_token": secs / n * 1e9})
                    _print_row(rows[-1])
        _, bis_s = refs[(div, dtype, size, dist)]
        if backend in ("numba", "numpy"):
            fn = lambda p=p, d=div, b=backend: fbands.bounds(p, DELTA, d, backend=b)  # noqa: E731
        elif backend == "div+sqrt":
            fn = lambda p=p: div_sqrt_floor(p, DELTA)  # noqa: E731
        else:
            fn = _torch_call(backend, t_p, div)
        secs, copy_beside = timeit(fn, 1 if backend in ("numpy", "torch-native") else repeat,
                                   beside=lambda p=p: p.copy())
        row = {"backend": backend, "div": div, "dtype": dtype, "n": n, "size": size,
               "data": dist, "ns_per_token": secs / n * 1e9, "x_copy": secs / copy_beside}
        if bis_s is not None:
            row["speedup_vs_bisection"] = bis_s / secs
        rows.append(row)
        _print_row(row)
    return rows


# ----------------------------------------------------------------------------- the blocks


def run_distributions(n: int, quick: bool) -> list[dict]:
    """numba, KL, float32 and float64: ns/token over each of :data:`DISTRIBUTIONS`."""
    import torch

    rows = []
    for dtype in ("float32", "float64"):
        data = [make_p(n, np.dtype(dtype), dist) for dist in DISTRIBUTIONS]
        fns = []
        for p in data:  # the solver and a copy of each distribution, taking turns
            fns += [lambda p=p: fbands.bounds(p, DELTA, "kl", backend="numba"),
                    lambda p=p: p.copy()]
        best = round_robin(fns, 5 if quick else 15)
        fastest = min(best[0::2])
        for dist, p, secs, copy_s in zip(DISTRIBUTIONS, data, best[0::2], best[1::2],
                                         strict=True):
            t0 = time.perf_counter()  # one call: about a second each, 12 of them
            bisection_reference(torch.from_numpy(p), DELTA, "kl")
            bis_s = time.perf_counter() - t0
            rows.append({"dist": dist, "dtype": dtype, "n": n,
                         "ns_per_token": secs / n * 1e9, "x_best": secs / fastest,
                         "x_copy": secs / copy_s, "bisection_ns_per_token": bis_s / n * 1e9,
                         "speedup_vs_bisection": bis_s / secs})
            print(f"{'numba kl':>13} {dtype:>8} {dist:>18}: {secs / n * 1e9:9.2f} ns/token"
                  f"  {secs / fastest:6.2f}x best  {bis_s / secs:7.1f}x vs bisection"
                  f"  {secs / copy_s:6.1f}x copy", flush=True)
    return rows


def _mean_call(fn, calls: int) -> float:
    """Mean seconds of ``fn(i)`` over ``i`` in ``range(calls)`` (no warm-up here)."""
    t0 = time.perf_counter()
    for i in range(calls):
        fn(i)
    return (time.perf_counter() - t0) / calls


def run_delta_schedule(n: int, quick: bool) -> dict:
    """numba, KL, float32: a new scalar delta every call against one fixed delta.

    Blocks of ``calls`` calls: fixed, schedule, fixed.  The VM's speed drifts between
    seconds: the fixed blocks on either side bracket the schedule, and the faster of them
    is the reference (the stricter ratio).  Each block starts with one untimed call (for
    the schedule, with a delta of its own), so one-off loading of kernels and tables is not
    counted."""
    calls = 5 if quick else 20
    p = make_p(n, np.float32, "llm")
    offset = np.random.default_rng().uniform(0.0, 1.0)  # fresh entropy: new to this run
    schedule = [0.04 + 0.02 * (i + offset) / (calls + 1) for i in range(calls + 1)]
    assert DELTA not in schedule and len(set(schedule)) == len(schedule)

    def fixed(_i):
        fbands.bounds(p, DELTA, "kl", backend="numba")

    def changing(i):
        fbands.bounds(p, schedule[i + 1], "kl", backend="numba")

    fixed(0)
    before = _mean_call(fixed, calls)
    saved = os.environ.get("FBANDS_CACHE_DIR")
    tmp = tempfile.mkdtemp(prefix="fbands-bench-")
    os.environ["FBANDS_CACHE_DIR"] = tmp
    try:
        fbands.bounds(p, schedule[0], "kl", backend="numba")
        sched = _mean_call(changing, calls)
    finally:
        if saved is None:
            os.environ.pop("FBANDS_CACHE_DIR", None)
        else:
            os.environ["FBANDS_CACHE_DIR"] = saved
        shutil.rmtree(tmp, ignore_errors=True)
    fixed(0)
    after = _mean_call(fixed, calls)
    fixed_s = min(before, after)
    out = {"div": "kl", "dtype": "float32", "n": n, "calls": calls,
           "deltas": [min(schedule), max(schedule)], "fixed_delta": DELTA,
           "fixed_ms_per_call": fixed_s * 1e3, "fixed_before_ms": before * 1e3,
           "fixed_after_ms": after * 1e3, "schedule_ms_per_call": sched * 1e3,
           "ratio": sched / fixed_s}
    print(f"{'delta':>13} schedule {sched * 1e3:8.2f} ms/call, fixed {fixed_s * 1e3:8.2f} "
          f"ms/call (before {before * 1e3:.2f}, after {after * 1e3:.2f}): "
          f"{out['ratio']:.2f}x", flush=True)
    return out


def run_log_bounds(n: int, quick: bool) -> list[dict]:
    """numba: ``log_bounds(log p, logp=True)`` against ``bounds(p)``, every divergence.

    Beside them, ``exp_ns_per_token``: :func:`exp_floor` on the same ``log p`` (timed call
    for call with a copy, once per dtype), what any ``log_bounds(logp=True)`` pays on top
    of the work of ``bounds``: where ``bounds`` costs less than that exp (closed forms),
    no implementation can reach a ratio of 1.5."""
    rows = []
    exp_ns = {}
    for dtype in ("float32", "float64"):
        lp = np.log(make_p(n, np.dtype(dtype), "llm"))
        t_exp, _ = timeit(lambda lp=lp: exp_floor(lp), 3 if quick else 9,
                          beside=lambda lp=lp: lp.copy())
        exp_ns[dtype] = t_exp / n * 1e9
        print(f"{'log_bounds':>13} {'exp alone':>12} {dtype:>8}: {exp_ns[dtype]:7.2f} ns/token",
              flush=True)
    for name in fbands.available():
        div = FAMILY_MEMBERS.get(name, name)
        try:
            fbands.get(div)
        except fbands.DivergenceError as exc:  # a family without a member chosen here
            print(f"{'log_bounds':>13} {name}: skipped ({exc})", flush=True)
            continue
        for dtype in ("float32", "float64"):
            p = make_p(n, np.dtype(dtype), "llm")
            lp = np.log(p)
            t_log, t_b = timeit(
                lambda lp=lp, d=div: fbands.log_bounds(lp, DELTA, d, backend="numba",
                                                       logp=True),
                3 if quick else 9,
                beside=lambda p=p, d=div: fbands.bounds(p, DELTA, d, backend="numba"))
            rows.append({"div": div, "dtype": dtype, "n": n,
                         "bounds_ns_per_token": t_b / n * 1e9,
                         "log_bounds_ns_per_token": t_log / n * 1e9, "ratio": t_log / t_b,
                         "exp_ns_per_token": exp_ns[dtype],
                         "floor_ratio": (t_b / n * 1e9 + exp_ns[dtype]) / (t_b / n * 1e9)})
            print(f"{'log_bounds':>13} {div:>12} {dtype:>8}: bounds {t_b / n * 1e9:7.2f}, "
                  f"log_bounds(logp) {t_log / n * 1e9:7.2f} ns/token: {t_log / t_b:5.2f}x",
                  flush=True)
    return rows


def summary(report: dict) -> list[dict]:
    """The three judged numbers (issue 15), each with its target."""
    out = []
    for dtype in ("float32", "float64"):
        rows = [r for r in report.get("distributions", []) if r["dtype"] == dtype]
        if rows:
            worst = max(rows, key=lambda r: r["x_best"])
            best = min(rows, key=lambda r: r["x_best"])
            out.append({"measure": f"worst x best over p distributions, KL {dtype}",
                        "value": worst["x_best"], "target": 2.0,
                        "where": f"{worst['dist']} ({worst['ns_per_token']:.2f} ns/token; "
                                 f"best {best['dist']}, {best['ns_per_token']:.2f})"})
    d = report.get("delta_schedule")
    if d:
        out.append({"measure": "new delta every call / fixed delta, KL float32",
                    "value": d["ratio"], "target": 2.0,
                    "where": f"{d['schedule_ms_per_call']:.2f} against "
                             f"{d['fixed_ms_per_call']:.2f} ms a call"})
    rows = report.get("log_bounds", [])
    if rows:
        worst = max(rows, key=lambda r: r["ratio"])
        out.append({"measure": "worst log_bounds(logp=True) / bounds",
                    "value": worst["ratio"], "target": 1.5,
                    "where": f"{worst['div']} {worst['dtype']} "
                             f"({worst['log_bounds_ns_per_token']:.2f} against "
                             f"{worst['bounds_ns_per_token']:.2f} ns/token; the exp of "
                             f"log p alone brings bounds to {worst['floor_ratio']:.2f}x)"})
    for s in out:
        s["met"] = s["value"] <= s["target"]
    return out


BLOCKS = ("main", "dist", "delta", "log")


def run(quick: bool, tokens: int = 1_000_000, blocks=BLOCKS) -> dict:
    report = {"delta": DELTA, "machine": machine(), "quick": quick, "tokens": tokens,
              "seconds": {}}
    steps = {"main": ("results", lambda: run_main(quick)),
             "dist": ("distributions", lambda: run_distributions(tokens, quick)),
             "delta": ("delta_schedule", lambda: run_delta_schedule(tokens, quick)),
             "log": ("log_bounds", lambda: run_log_bounds(tokens, quick))}
    for block in BLOCKS:
        if block in blocks:
            t0 = time.perf_counter()
            field, step = steps[block]
            report[field] = step()
            report["seconds"][block] = time.perf_counter() - t0
    report["summary"] = summary(report)
    return report


# ----------------------------------------------------------------------------- output


def _size(n: int) -> str:
    return next((k for k, v in SIZES.items() if v == n), str(n))


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [
        "# Band solver throughput",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores (torch {m['torch_threads']} threads, numba "
        f"{m['numba_threads']}), load average at start {m['load_average_at_start']}; "
        f"python {m['python']}, numpy {m['numpy']}, torch {m['torch']}, numba {m['numba']}.",
        f"delta = {report['delta']}" + ("; a `--quick` run" if report["quick"] else "") + ". "
        "`bisection` = the published algorithm's shape (torch, 50 iterations per edge, a "
        "host sync per iteration), on the same data; `copy` = numpy copy of the same array; "
        "`x copy` divides by a copy timed in the same loop, call for call with the solver.",
        "",
    ]
    if report["summary"]:
        lines += [
            "## Summary against the targets",
            "",
            "| measure | value | target | met | where |",
            "|---|---:|---:|---|---|",
        ]
        for s in report["summary"]:
            lines.append(f"| {s['measure']} | {s['value']:.2f}x | <= {s['target']:g}x | "
                         f"{'yes' if s['met'] else 'no'} | {s['where']} |")
        lines.append("")
    if "distributions" in report:
        lines += [
            f"## p distributions (numba, KL, {_size(report['tokens'])} tokens)",
            "",
            "`x best`: the time over the fastest distribution of the same dtype.  Best of 15 "
            "calls (quick: 5) after a warm-up call, the six distributions of a dtype and "
            "their copies taking turns call for call; the bisection: one call.",
            "",
            "| dtype | p | ns/token | x best | bisection ns/token | speed-up vs bisection "
            "| x copy |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for r in report["distributions"]:
            lines.append(f"| {r['dtype']} | {r['dist']} | {r['ns_per_token']:.2f} | "
                         f"{r['x_best']:.2f} | {r['bisection_ns_per_token']:.1f} | "
                         f"{r['speedup_vs_bisection']:.1f} | {r['x_copy']:.1f} |")
        lines += ["", "p: `uniform` on (1e-7, 1); `1-p log[a,b]`: 1 - p log-uniform on "
                  "[a, b]; `log[a,b)`: p log-uniform on [a, b).", ""]
    d = report.get("delta_schedule")
    if d:
        lines += [
            f"## A new delta every call (numba, KL, float32, {_size(d['n'])} tokens)",
            "",
            f"{d['calls']} calls, each with a delta not seen before (a ramp over "
            f"[{d['deltas'][0]:.5f}, {d['deltas'][1]:.5f}] shifted by a random offset; "
            "`FBANDS_CACHE_DIR` at a fresh directory), against as many calls with delta = "
            f"{d['fixed_delta']} (blocks before and after the schedule, the better one); the "
            "mean time a call.",
            "",
            "| fixed delta ms/call | new delta ms/call | ratio |",
            "|---:|---:|---:|",
            f"| {d['fixed_ms_per_call']:.2f} | {d['schedule_ms_per_call']:.2f} | "
            f"{d['ratio']:.2f} |",
            "",
        ]
    if "log_bounds" in report:
        lines += [
            f"## log_bounds(logp=True) against bounds (numba, {_size(report['tokens'])} "
            "tokens)",
            "",
            "`log_bounds(log p, delta, div, logp=True)` and `bounds(p, delta, div)` on the "
            "`llm` data, timed call for call, best of 9 (quick: 3).  `exp alone`: a loop "
            "that only computes p = exp(log p) with the passes' own vectorising exp, the "
            "work log-probability input adds to any implementation; `floor ratio` = "
            "(bounds + exp alone) / bounds, the best ratio such an implementation could "
            "reach.",
            "",
            "| div | dtype | bounds ns/token | log_bounds ns/token | ratio | exp alone "
            "ns/token | floor ratio |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for r in report["log_bounds"]:
            lines.append(f"| {r['div']} | {r['dtype']} | {r['bounds_ns_per_token']:.2f} | "
                         f"{r['log_bounds_ns_per_token']:.2f} | {r['ratio']:.2f} | "
                         f"{r['exp_ns_per_token']:.2f} | {r['floor_ratio']:.2f} |")
        lines.append("")
    if "results" in report:
        de = report.get("default_env")
        lines += [
            "## Backends",
            "",
            *([f"`default ns/token`: the same row timed again in a child process with a "
               f"user's environment (no `OMP_WAIT_POLICY`; load average at its start "
               f"{de['machine']['load_average_at_start']}); `default / own` over this "
               f"run's: median {de['median_ratio']:.2f}, from {de['min_ratio']:.2f} to "
               f"{de['max_ratio']:.2f}.", ""] if de else []),
            "Data `llm`: p half uniform on (0, 1), half with 1 - p "
            "log-uniform on [1e-7, 0.1]. "
            "`torch` = CPU tensors through the torch backend (its default path: the closed "
            "forms for tv and chi2, `device-closed`; the same as `torch-table` for kl); "
            "`torch-table` = `path=\"device-table\"` of the torch backend: the tables read by "
            "torch operations, the few elements they leave solved on the host after one "
            "synchronisation (an eager CUDA call's path, here on CPU tensors); "
            "`torch-native` = `path=\"device-solver\"`: the fixed-count torch solver on "
            "every element. `div+sqrt` "
            "(chi2) = a loop doing only one float64 division and one square root per element, "
            "the arithmetic floor of chi2's closed form. Each time is the "
            "best of 25 (32k), 15 (1M) or 5 (16M) calls after a warm-up call (the bisection: "
            "3, and 1 at 16M; numpy and torch-native: 1); the `copy` rows are timed alone.",
            "",
            "| backend | div | dtype | N | data | ns/token | speed-up vs bisection | x copy "
            "| default ns/token | default / own |",
            "|---|---|---|---|---|---:|---:|---:|---:|---:|",
        ]
        for r in report["results"]:
            sp = r.get("speedup_vs_bisection")
            xc = r.get("x_copy")
            dn, dr = r.get("default_ns_per_token"), r.get("default_over_own")
            lines.append(
                f"| {r['backend']} | {r['div']} | {r['dtype']} | {r['size']} | {r['data']} | "
                f"{r['ns_per_token']:.2f} | {'' if sp is None else f'{sp:.1f}'} | "
                f"{'' if xc is None else f'{xc:.1f}'} | {'' if dn is None else f'{dn:.2f}'} | "
                f"{'' if dr is None else f'{dr:.2f}'} |"
            )
    return "\n".join(lines) + "\n"


def add_default_env(report: dict, quick: bool) -> dict:
    """Time the backend table again in a child process with a user's environment (no
    ``OMP_WAIT_POLICY``) and put its ns/token beside each row of ``report``."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--env", "default", "--blocks",
               "main", "--out", tmp, *(["--quick"] if quick else [])]
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
        child = json.loads((Path(tmp) / "bench_bounds.json").read_text())
    key = ("backend", "div", "dtype", "size", "data")
    found = {tuple(r[k] for k in key): r for r in child["results"]}
    ratios = []
    for row in report["results"]:
        other = found.get(tuple(row[k] for k in key))
        if other is not None:
            row["default_ns_per_token"] = other["ns_per_token"]
            row["default_over_own"] = other["ns_per_token"] / row["ns_per_token"]
            ratios.append(row["default_over_own"])
    return {"machine": child["machine"], "median_ratio": float(np.median(ratios)),
            "max_ratio": float(np.max(ratios)), "min_ratio": float(np.min(ratios))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="N in {32k, 1M} and fewer cases")
    ap.add_argument("--tokens", type=int, default=1_000_000,
                    help="N of the dist, delta and log blocks (default 1M)")
    ap.add_argument("--blocks", default=",".join(BLOCKS),
                    help=f"comma-separated blocks to run among {', '.join(BLOCKS)}")
    ap.add_argument("--out", type=Path, default=RESULTS, help="directory for the results")
    ap.add_argument("--env", choices=("both", "own", "default"), default="both",
                    help="own: OMP_WAIT_POLICY=PASSIVE; default: a user's environment; both "
                         "(default): own, then the backend table in the default environment")
    args = ap.parse_args(argv)
    blocks = [b.strip() for b in args.blocks.split(",") if b.strip()]
    unknown = sorted(set(blocks) - set(BLOCKS))
    if unknown or not blocks:
        ap.error(f"--blocks takes a comma-separated subset of {', '.join(BLOCKS)}; "
                 f"got {args.blocks!r}")
    if args.tokens < 1:
        ap.error("--tokens must be at least 1")
    report = run(args.quick, args.tokens, blocks)
    if args.env == "both" and "main" in blocks:
        report["default_env"] = add_default_env(report, args.quick)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_bounds.json").write_text(json.dumps(report, indent=1))
    (args.out / "bench_bounds.md").write_text(markdown(report))
    took = ", ".join(f"{b} {t:.0f} s" for b, t in report["seconds"].items())
    print(f"wrote {args.out / 'bench_bounds.json'} and bench_bounds.md ({took})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
