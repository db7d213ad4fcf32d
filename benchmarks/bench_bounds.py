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

Run::

    python benchmarks/bench_bounds.py            # N in {32k, 1M, 16M}
    python benchmarks/bench_bounds.py --quick    # N in {32k, 1M}, fewer cases

Results go to ``benchmarks/results/bench_bounds.json`` and ``bench_bounds.md``.

The script sets ``OMP_WAIT_POLICY=PASSIVE`` (unless set already): torch and numba each
keep an OpenMP thread pool, and with the default policy the idle threads of one spin while
the other works; on a small machine that made every parallel call here 10-20x slower
(bisection included), which would measure the scheduler rather than the solvers.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before numpy, torch or numba load

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
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


def make_p(n: int, dtype, dist: str = "llm", seed: int = 0) -> np.ndarray:
    """Token probabilities.  ``llm``: shaped like a language model's, half uniform on
    (0, 1) and half close to 1 (``1 - p`` log-uniform on [1e-7, 0.1]); ``uniform``: uniform
    on (0, 1)."""
    rng = np.random.default_rng(seed)
    if dist == "uniform":
        return rng.uniform(1e-7, 1.0, n).astype(dtype)
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


# ----------------------------------------------------------------------------- timing


def timeit(fn, repeat: int, beside=None):
    """Best of ``repeat`` timed calls after a warm-up call (compilation, table building):
    on a shared virtual machine the minimum is what the code costs, the rest is the
    neighbours.  With ``beside``, that function is timed too, alternating with ``fn``
    call for call, and both best times are returned."""
    fns = (fn,) if beside is None else (fn, beside)
    times = [[] for _ in fns]
    for f in fns:
        f()
    for _ in range(repeat):
        for f, t in zip(fns, times, strict=True):
            t0 = time.perf_counter()
            f()
            t.append(time.perf_counter() - t0)
    best = [float(np.min(t)) for t in times]
    return best[0] if beside is None else tuple(best)


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
                    if backend == "torch-table" and size == "16M":
                        continue
                    if backend == "numpy" and (size == "16M" or (
                            size == "1M" and (div != "kl" or dtype != "float32"))):
                        continue
                    yield backend, div, dtype, size, "llm"
    for backend in ("numba", "torch"):  # the headline case on plain uniform data too
        yield backend, "kl", "float32", "1M", "uniform"


def run(quick: bool) -> dict:
    import torch

    from fbands.backends import torch_backend

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
        _, bis_s = refs[(div, dtype, size, dist)]
        if backend == "numba":
            fn = lambda p=p, d=div: fbands.bounds(p, DELTA, d, backend="numba")  # noqa: E731
        elif backend == "numpy":
            fn = lambda p=p, d=div: fbands.bounds(p, DELTA, d, backend="numpy")  # noqa: E731
        elif backend == "div+sqrt":
            fn = lambda p=p: div_sqrt_floor(p, DELTA)  # noqa: E731
        else:
            torch_backend.CPU_KERNEL = "numba" if backend == "torch" else "torch"
            torch_backend.USE_TABLES = backend != "torch-native"
            fn = lambda t=t_p, d=div: fbands.bounds(t, DELTA, d)  # noqa: E731
        secs, copy_beside = timeit(fn, 1 if backend in ("numpy", "torch-native") else repeat,
                                   beside=lambda p=p: p.copy())
        torch_backend.CPU_KERNEL, torch_backend.USE_TABLES = "numba", True
        row = {"backend": backend, "div": div, "dtype": dtype, "n": n, "size": size,
               "data": dist, "ns_per_token": secs / n * 1e9, "x_copy": secs / copy_beside}
        if bis_s is not None:
            row["speedup_vs_bisection"] = bis_s / secs
        rows.append(row)
        print(f"{backend:>13} {div:>5} {dtype:>8} {size:>4} {dist:>7}: "
              f"{row['ns_per_token']:9.2f} ns/token"
              + (f"  {row['speedup_vs_bisection']:7.1f}x vs bisection" if bis_s else "")
              + f"  {row['x_copy']:8.1f}x copy", flush=True)
    return {"delta": DELTA, "machine": machine(), "quick": quick, "results": rows}


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [
        "# Band solver throughput",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores (torch {m['torch_threads']} threads, numba "
        f"{m['numba_threads']}), load average at start {m['load_average_at_start']}; "
        f"python {m['python']}, numpy {m['numpy']}, torch {m['torch']}, numba {m['numba']}.",
        "",
        f"delta = {report['delta']}; data `llm`: p half uniform on (0, 1), half with 1 - p "
        "log-uniform on [1e-7, 0.1]; `uniform`: p uniform on (0, 1). "
        "`torch` = CPU tensors through the torch backend (handed to numba); "
        "`torch-table` = the tables read by torch operations (the path of validated calls "
        "on a GPU); `torch-native` = the torch solver itself (fixed Newton count, no host "
        "sync). "
        "`bisection` = the published algorithm's shape (torch, 50 iterations per edge, a "
        "host sync per iteration); `copy` = numpy copy of the same array; `div+sqrt` "
        "(chi2) = a loop doing only one float64 division and one square root per element, "
        "the arithmetic floor of chi2's closed form. Each time is the "
        "best of 25 (32k), 15 (1M) or 5 (16M) calls after a warm-up call (the bisection: 3, "
        "and 1 at 16M; numpy and torch-native: 1). `x copy` divides by a copy timed in the "
        "same loop, call for call with the backend; the `copy` rows are timed alone.",
        "",
        "| backend | div | dtype | N | data | ns/token | speed-up vs bisection | x copy |",
        "|---|---|---|---|---|---:|---:|---:|",
    ]
    for r in report["results"]:
        sp = r.get("speedup_vs_bisection")
        xc = r.get("x_copy")
        lines.append(
            f"| {r['backend']} | {r['div']} | {r['dtype']} | {r['size']} | {r['data']} | "
            f"{r['ns_per_token']:.2f} | {'' if sp is None else f'{sp:.1f}'} | "
            f"{'' if xc is None else f'{xc:.1f}'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="N in {32k, 1M} and fewer cases")
    ap.add_argument("--out", type=Path, default=RESULTS, help="directory for the results")
    args = ap.parse_args(argv)
    report = run(args.quick)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_bounds.json").write_text(json.dumps(report, indent=1))
    (args.out / "bench_bounds.md").write_text(markdown(report))
    print(f"wrote {args.out / 'bench_bounds.json'} and bench_bounds.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

