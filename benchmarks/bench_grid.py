"""The grid (``device-grid``, what a GPU's loss reads) beside the other ways to the same band,
on CPU tensors, in one run.

For float32 log-probabilities shaped like an LLM's (half uniform p on (0, 1), half with
1 - p log-uniform on [1e-7, 0.1], and 1 in 1000 tokens from the far tail, log p in
[-400, -20]), ``log_bounds(logp=True, check=False)`` as the losses call it:

* ``grid``: ``path="device-grid"``, forced on CPU tensors (on a GPU it is the default);
* ``table``: the CPU tensor's default path (``device-table``: the tables read by torch
  operations, the elements they leave solved on the host);
* ``numba``: the same values as a numpy array, the numba backend (its table pass);
* ``bisection``: the published-style torch bisection of ``bench_bounds.py`` (kl only).

Also: aten ops and host reads of one warm call of each torch path (a
``TorchDispatchMode``), and how long a radius's first two calls on the grid's path take in
a fresh process with an empty disk cache (the first reads the tables, the second builds
the grid).

Each time is the best of several calls after a warm-up, numba, the grid and the tables
taking turns call for call, in ns per token; ratios are numba time / path time (above 1:
faster than numba).  Run::

    python benchmarks/bench_grid.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import fbands
from fbands._dispatch import DEVICE_GRID, compute

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
DIVS = ("kl", "tv", "chi2", "js", "reverse_kl")
DELTA = 0.05


def llm_logp(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    half = n // 2
    p = rng.uniform(1e-9, 1.0, half)
    q = 10.0 ** rng.uniform(-7, -1, n - half)
    lp = np.concatenate((np.log(p), np.log1p(-q)))
    tail = rng.random(n) < 1e-3
    lp[tail] = rng.uniform(-400.0, -20.0, int(tail.sum()))
    return rng.permutation(lp).astype(np.float32)


def best(fn, repeats: int) -> float:
    return best_of({"fn": fn}, repeats)["fn"]


def best_of(fns: dict, repeats: int) -> dict:
    """The least time of each function over ``repeats`` rounds after a warm-up call, the
    functions taking turns call for call: the drift of a shared machine falls on all."""
    for fn in fns.values():
        fn()
    least = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            least[name] = min(least[name], time.perf_counter() - t)
    return least


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops, self.reads = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        if func.overloadpacket in (torch.ops.aten._local_scalar_dense, torch.ops.aten.nonzero):
            self.reads += 1
        return func(*args, **(kwargs or {}))


def _torch_call(x, div, path):
    return compute("log_edges", div, x, DELTA, "torch", logp=True, check=False, path=path)


def ops_and_reads(div: str, path: str | None) -> tuple[int, int]:
    x = torch.from_numpy(llm_logp(4096))
    _torch_call(x, div, path)
    _torch_call(x, div, path)
    with _Count() as c:
        _torch_call(x, div, path)
    return c.ops, c.reads


def first_calls(div: str) -> tuple[float, float]:
    """Seconds of a radius's first and second calls on the grid's path, in a fresh process
    with an empty disk cache: the first reads the tables (the cells its tokens reach), the
    second builds the grid."""
    code = ("import time, torch, fbands; from fbands._dispatch import compute; "
            "x = torch.log(torch.rand(4096))\n"
            "for _ in range(2):\n"
            "    t = time.perf_counter()\n"
            f"    compute('log_edges', {div!r}, x, {DELTA}, 'torch', logp=True, check=False, "
            f"path={DEVICE_GRID!r})\n"
            "    print(time.perf_counter() - t)")
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "FBANDS_CACHE_DIR": cache, "PYTHONPATH": str(HERE.parent)}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True)
    first, second = (float(v) for v in out.stdout.split()[-2:])
    return first, second


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="65k tokens, fewer repeats")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    n, repeats = (1 << 16, 5) if args.quick else (1 << 20, 9)
    from bench_bounds import bisection_reference  # (benchmarks/ is the script's folder)

    lp = llm_logp(n)
    x = torch.from_numpy(lp)
    rows = []
    for div in DIVS:
        times = best_of({
            "numba": lambda div=div: fbands.log_bounds(lp, DELTA, div, logp=True,
                                                       backend="numba", check=False),
            "grid": lambda div=div: _torch_call(x, div, DEVICE_GRID),
            "table": lambda div=div: _torch_call(x, div, None)}, repeats)
        t_num = times["numba"]
        row = {"div": div, "n": n, "numba_ns": t_num / n * 1e9}
        for name, path in (("grid", DEVICE_GRID), ("table", None)):
            t = times[name]
            ops, reads = ops_and_reads(div, path)
            row |= {f"{name}_ns": t / n * 1e9, f"{name}_vs_numba": t_num / t,
                    f"{name}_ops": ops, f"{name}_host_reads": reads}
        if div == "kl":
            p = torch.exp(x.double())
            t = best(lambda p=p: bisection_reference(p, DELTA, "kl"), max(1, repeats // 3))
            row |= {"bisection_ns": t / n * 1e9,
                    "grid_vs_bisection": t / (row["grid_ns"] * n / 1e9)}
        first, second = first_calls(div)
        row |= {"first_call_s": first, "second_call_s": second}
        rows.append(row)
        print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"torch": torch.__version__, "threads": torch.get_num_threads(),
            "cpus": os.cpu_count(), "quick": args.quick}
    (args.out / "bench_grid.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = ["# The grid beside the tables and numba (CPU tensors)", "",
             f"torch {meta['torch']}, {meta['threads']} threads, {n} float32 log-probabilities "
             f"(LLM-shaped, 1e-3 from the far tail), delta {DELTA}; ns per token, best of "
             f"{repeats}, the three taking turns call for call; `x numba` = numba's time / the "
             "path's.", "",
             "| div | grid ns | x numba | ops | host reads | table ns | x numba | ops | "
             "host reads | numba ns | a radius's 1st call s | 2nd s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['div']} | {r['grid_ns']:.1f} | {r['grid_vs_numba']:.3f} | {r['grid_ops']} | "
            f"{r['grid_host_reads']} | {r['table_ns']:.1f} | {r['table_vs_numba']:.3f} | "
            f"{r['table_ops']} | {r['table_host_reads']} | {r['numba_ns']:.1f} | "
            f"{r['first_call_s']:.2f} | {r['second_call_s']:.2f} |")
    kl = rows[0]
    lines += ["", f"kl, published-style torch bisection: {kl['bisection_ns']:.0f} ns per token; "
              f"the grid is {kl['grid_vs_bisection']:.1f} x faster.", ""]
    (args.out / "bench_grid.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
