"""First-call costs: what a fresh process pays before its first band, cold and warm.

Each number comes from a new Python process (the state a Ray worker, a CLI call or a test
run starts from).  For each call

* ``bounds`` of a float64 numpy array of LLM-like probabilities,
* ``bounds`` of the same as a CPU torch tensor,
* ``log_bounds(..., logp=True)`` of float32 log-probabilities (a numpy array),

a **cold** process runs on a fresh ``HOME``, ``FBANDS_CACHE_DIR`` and ``NUMBA_CACHE_DIR``
(empty directories: what the first call of a new machine pays, with what the wheel ships:
the built-in derivations), and **warm** processes run next on the same directories (what
every later process of that machine pays).  Reported: ``import fbands``, the first call,
the next call, the whole process, and the notices (stderr lines) the cold process printed.

Then large arrays (2^20 probabilities of the first divergence), each dtype: the first call
of ``auto`` on a cold cache, ``fbands compile``, ``auto`` again (now numba's passes), and on
a second cold cache ``backend="numba"`` for float64 then float32 (each compiles on its first
call): what a user meets who never compiles ahead, and what compiling ahead buys.

Run::

    python benchmarks/bench_startup.py            # every built-in divergence, 3 warm runs
    python benchmarks/bench_startup.py --quick    # kl only, small array, 1 warm run

Results go to ``benchmarks/results/bench_startup.json`` and ``bench_startup.md`` (``--out``:
another folder).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
KINDS = ("numpy", "torch", "log_bounds")
LABELS = {"numpy": "`bounds`, numpy float64", "torch": "`bounds`, CPU torch tensor",
          "log_bounds": "`log_bounds(logp=True)`, float32"}

#: Run in a child process: prints one JSON line of seconds.
CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import fbands
t1 = time.perf_counter()
kind, div, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = np.random.default_rng(0)
# LLM-like: most tokens near 1, a tail down to 1e-8
p = np.clip(np.exp(-rng.exponential(1.5, n) ** 2), 1e-8, 1.0)
if kind == "numpy":
    call = lambda: fbands.bounds(p, 0.05, div)
elif kind == "torch":
    import torch
    x = torch.tensor(p, dtype=torch.float64)
    call = lambda: fbands.bounds(x, 0.05, div)
elif kind == "log_bounds":
    x = np.log(p).astype(np.float32)
    call = lambda: fbands.log_bounds(x, 0.05, div, logp=True)
else:  # large arrays: "auto-float64", "numba-float32", ...
    backend, dtype = kind.split("-")
    x = p.astype(dtype)
    call = lambda: fbands.bounds(x, 0.05, div, backend)
t2 = time.perf_counter()
call()
t3 = time.perf_counter()
reps = 10
for _ in range(reps):
    call()
t4 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "setup": t2 - t1, "first": t3 - t2,
                  "next": (t4 - t3) / reps}))
"""
#: The large-array rows: 2^20 probabilities, each dtype, through ``auto`` before and after
#: ``fbands compile``, and through ``backend="numba"`` (which compiles on its first call).
LARGE_N = 1 << 20
LARGE_STEPS = ("auto-float64", "auto-float32", "compile", "auto-float64", "auto-float32")
NUMBA_STEPS = ("numba-float64", "numba-float32")


def _env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("FBANDS_QUIET",)}
    env["HOME"] = str(home)
    env["FBANDS_CACHE_DIR"] = str(home / "fbands-cache")
    env["NUMBA_CACHE_DIR"] = str(home / "numba-cache")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def child(home: Path, kind: str, div: str, n: int) -> dict:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CHILD, kind, div, str(n)], env=_env(home),
                         cwd=ROOT, capture_output=True, text=True, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["process"] = time.perf_counter() - t0
    res["notices"] = _notices(out.stderr)
    return res


def first_calls(kind: str, div: str, n: int, repeats: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="fbands-bench-home-") as tmp:
        home = Path(tmp)
        cold = child(home, kind, div, n)
        warm = [child(home, kind, div, n) for _ in range(repeats)]
    med = {k: statistics.median(w[k] for w in warm) for k in ("import", "first", "next",
                                                              "process")}
    return {"kind": kind, "div": div, "n": n,
            "cold_import_s": cold["import"], "cold_first_s": cold["first"],
            "cold_process_s": cold["process"], "cold_notices": cold["notices"],
            "warm_import_s": med["import"], "warm_first_s": med["first"],
            "warm_process_s": med["process"], "warm_notices": warm[-1]["notices"],
            "next_ms": 1e3 * med["next"]}


def large_calls(div: str, n: int) -> list[dict]:
    """The first call of a new process on ``n`` probabilities, in the order of
    :data:`LARGE_STEPS` on one cold cache (``compile``: ``fbands compile`` of ``div``), then
    :data:`NUMBA_STEPS` on another."""
    rows = []
    for steps in (LARGE_STEPS, NUMBA_STEPS):
        with tempfile.TemporaryDirectory(prefix="fbands-bench-home-") as tmp:
            home, compiled = Path(tmp), False
            for step in steps:
                if step == "compile":
                    t0 = time.perf_counter()
                    out = subprocess.run([sys.executable, "-m", "fbands", "compile", "--div",
                                          div], env=_env(home), cwd=ROOT, capture_output=True,
                                         text=True, check=True)
                    rows.append({"step": "`fbands compile --div " + div + "` (both dtypes)",
                                 "process_s": time.perf_counter() - t0, "first_s": None,
                                 "next_ms": None, "notices": _notices(out.stderr)})
                    compiled = True
                    continue
                r = child(home, step, div, n)
                backend, dtype = step.split("-")
                when = ("after `fbands compile`" if compiled else "cold cache") \
                    if backend == "auto" else "cold cache, in this order"
                rows.append({"step": f"`{backend}`, {dtype} ({when})",
                             "process_s": r["process"], "first_s": r["first"],
                             "next_ms": 1e3 * r["next"], "notices": r["notices"]})
    return rows


def _notices(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("fbands: ")]


def markdown(res: dict) -> str:
    lines = [
        "# First-call costs",
        "",
        f"{res['machine']}; {res['n']} probabilities, delta 0.05.  Cold: a new process on a "
        "fresh `HOME`, `FBANDS_CACHE_DIR` and `NUMBA_CACHE_DIR` (one run); warm: new "
        f"processes on the same directories afterwards (median of {res['repeats']}).  Load "
        f"average {res['load_average'][0]:.1f} at the start and {res['load_average'][1]:.1f} "
        "at the end (a load above the core count slows every number in proportion).",
        "",
        "| call | divergence | cold import (s) | cold first call (s) | cold process (s) "
        "| warm import (s) | warm first call (s) | warm process (s) | next call (ms) "
        "| cold notices |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        lines.append(
            f"| {LABELS[r['kind']]} | {r['div']} | {r['cold_import_s']:.2f} "
            f"| {r['cold_first_s']:.2f} | {r['cold_process_s']:.2f} | {r['warm_import_s']:.2f} "
            f"| {r['warm_first_s']:.2f} | {r['warm_process_s']:.2f} | {r['next_ms']:.2f} "
            f"| {len(r['cold_notices'])} |")
    if res.get("large"):
        lines += ["", f"## Large arrays: {res['large_n']} probabilities of {res['large_div']}",
                  "", "Each row a new process, in this order on one cold cache (the numba rows"
                  " on a second one); `auto` answers with the numpy solver until the kernels "
                  "are compiled ahead.", "",
                  "| step | first call (s) | process (s) | next call (ms) | notices |",
                  "|---|---|---|---|---|"]
        for r in res["large"]:
            first = "" if r["first_s"] is None else f"{r['first_s']:.2f}"
            nxt = "" if r["next_ms"] is None else f"{r['next_ms']:.1f}"
            lines.append(f"| {r['step']} | {first} | {r['process_s']:.2f} | {nxt} "
                         f"| {len(r['notices'])} |")
    said = sorted({ln for r in [*res["rows"], *[{"cold_notices": x["notices"]}
                                                for x in res.get("large", [])]]
                   for ln in r["cold_notices"]})
    if said:
        lines += ["", "What the cold processes announced (stderr):", ""]
        lines += [f"* `{ln}`" for ln in said]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="kl only, 256 probabilities, one warm run (a check that it works)")
    ap.add_argument("--divs", help="comma-separated divergences (default: the built-ins)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder of the results")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from fbands import divergences

    divs = args.divs.split(",") if args.divs else (["kl"] if args.quick
                                                   else list(divergences.BUILTINS))
    repeats, n = (1, 256) if args.quick else (3, 4096)
    kinds = list(KINDS)
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch not installed: no CPU tensor rows")
        kinds.remove("torch")
    load_before = os.getloadavg()[0]
    rows = []
    for kind in kinds:
        for div in divs:
            r = first_calls(kind, div, n, repeats)
            rows.append(r)
            print(f"{kind:>10} {div:>12}: cold {r['cold_first_s']:6.2f} s  "
                  f"warm {r['warm_first_s']:5.2f} s  next {r['next_ms']:.2f} ms  "
                  f"({len(r['cold_notices'])} notices)", flush=True)
    large_n = 1 << 12 if args.quick else LARGE_N
    large = large_calls(divs[0], large_n)
    for r in large:
        print(f"{r['step']}: process {r['process_s']:.2f} s", flush=True)
    res = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                      f"Python {platform.python_version()}",
           "repeats": repeats, "n": n, "rows": rows, "large": large, "large_n": large_n,
           "large_div": divs[0],
           "load_average": [load_before, os.getloadavg()[0]],
           "when": time.strftime("%Y-%m-%d %H:%M")}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_startup.json").write_text(json.dumps(res, indent=1) + "\n")
    (args.out / "bench_startup.md").write_text(markdown(res))
    print(f"wrote {args.out / 'bench_startup.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
