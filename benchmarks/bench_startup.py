"""First-call costs: what a fresh process pays before its first band.

Every number comes from a new Python process (the state a Ray worker, a CLI call or a test
run starts from), with its own ``FBANDS_CACHE_DIR``:

* ``import fbands`` (inside the process), and the whole ``python -c "import fbands"``;
* per divergence, the first ``fbands.bounds`` call (float64 array of 4096 LLM-like
  probabilities, scalar delta, ``backend="auto"``: numba) on a **cold** cache (an empty
  directory: sympy derives, numba compiles, the tables are built) and on a **warm** one
  (the same directory again: the derivation and the machine code come from disk), then
  the steady-state cost of the next call;
* the same first calls on the numpy backend (``backend="numpy"``: no compiling, no
  tables), where the cold cost is sympy's derivation and the warm one reads it from disk;
* a **fresh worker**: ``import fbands`` + ``import torch`` + the first
  ``log_bounds(logp, 0.05, "kl", logp=True)`` on a CPU tensor of 4096 float32
  log-probabilities, cold and warm: what each new Ray worker of a verl job pays (the
  cache directory is per machine, so only the first worker of a node sees it cold).

Run::

    python benchmarks/bench_startup.py            # every divergence, 3 warm repeats
    python benchmarks/bench_startup.py --quick    # kl and tv, 1 repeat

Results go to ``benchmarks/results/bench_startup.json`` and ``bench_startup.md``.
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

#: Run in a child process: prints one JSON line of seconds.
CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import fbands
t1 = time.perf_counter()
kind, div = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(0)
# LLM-like: most tokens near 1, a tail down to 1e-8
p = np.clip(np.exp(-rng.exponential(1.5, 4096) ** 2), 1e-8, 1.0)
if kind == "bounds":
    call = lambda: fbands.bounds(p, 0.05, div)
elif kind == "numpy":
    call = lambda: fbands.bounds(p, 0.05, div, backend="numpy")
else:
    import torch
    t_torch = time.perf_counter()
    x = torch.tensor(np.log(p), dtype=torch.float32)
    call = lambda: fbands.log_bounds(x, 0.05, div, logp=True)
t2 = time.perf_counter()
call()
t3 = time.perf_counter()
reps = 20
for _ in range(reps):
    call()
t4 = time.perf_counter()
out = {"import": t1 - t0, "first": t3 - t2, "next": (t4 - t3) / reps}
if kind == "worker":
    out["torch"] = t2 - t1
print(json.dumps(out))
"""


def _env(cache: Path) -> dict:
    env = dict(os.environ)
    env["FBANDS_CACHE_DIR"] = str(cache)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def child(cache: Path, kind: str, div: str) -> dict:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CHILD, kind, div], env=_env(cache), cwd=ROOT,
                         capture_output=True, text=True, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["process"] = time.perf_counter() - t0
    return res


def import_only(cache: Path, repeats: int) -> dict:
    code = "import time; t = time.perf_counter(); import fbands; print(time.perf_counter() - t)"
    inside, whole = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", code], env=_env(cache), cwd=ROOT,
                             capture_output=True, text=True, check=True)
        whole.append(time.perf_counter() - t0)
        inside.append(float(out.stdout))
    bare = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        bare.append(time.perf_counter() - t0)
    return {"import_s": statistics.median(inside), "process_s": statistics.median(whole),
            "python_alone_s": statistics.median(bare)}


def first_calls(kind: str, div: str, repeats: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="fbands-bench-") as tmp:
        cache = Path(tmp)
        cold = child(cache, kind, div)
        warm = [child(cache, kind, div) for _ in range(repeats)]
    med = {k: statistics.median(w[k] for w in warm) for k in warm[0]}
    row = {"kind": kind, "div": div, "cold_first_s": cold["first"],
           "warm_first_s": med["first"], "next_ms": 1e3 * med["next"],
           "cold_process_s": cold["process"], "warm_process_s": med["process"],
           "import_s": med["import"]}
    if "torch" in med:
        row["import_torch_s"] = med["torch"]
    return row


def markdown(res: dict) -> str:
    imp = res["import"]
    lines = [
        "# First-call costs",
        "",
        f"{res['machine']}; each number from a new process with its own cache directory "
        f"(medians of {res['repeats']} warm runs; one cold run); load average "
        f"{res['load_average'][0]:.1f} at the start and {res['load_average'][1]:.1f} at the "
        "end (a load above the core count slows every number in proportion).",
        "",
        f"`import fbands`: {imp['import_s']:.2f} s inside the process; "
        f"`python -c \"import fbands\"` {imp['process_s']:.2f} s "
        f"(the interpreter alone {imp['python_alone_s']:.2f} s).",
        "",
        "First `fbands.bounds` of a process (4096 float64 probabilities, scalar delta, "
        "numba), on a cold cache (empty directory) and a warm one:",
        "",
        "| divergence | cold first call (s) | warm first call (s) | next call (ms) "
        "| whole warm process (s) |",
        "|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        if r["kind"] == "bounds":
            lines.append(f"| {r['div']} | {r['cold_first_s']:.2f} | {r['warm_first_s']:.2f} "
                         f"| {r['next_ms']:.2f} | {r['warm_process_s']:.2f} |")
    lines += [
        "",
        "The same on the numpy backend (no compiling, no tables): a cold first call pays "
        "sympy's derivation on top of the computation itself (about the next call's time), "
        "a warm one reads the derivation from a JSON file instead:",
        "",
        "| divergence | cold first call (s) | warm first call (s) | next call (ms) |",
        "|---|---|---|---|",
    ]
    for r in res["rows"]:
        if r["kind"] == "numpy":
            lines.append(f"| {r['div']} | {r['cold_first_s']:.2f} | {r['warm_first_s']:.2f} "
                         f"| {r['next_ms']:.2f} |")
    worker = [r for r in res["rows"] if r["kind"] == "worker"]
    if worker:
        w = worker[0]
        lines += [
            "",
            "A fresh worker (`import fbands`, `import torch`, first `log_bounds` of 4096 "
            "float32 log-probabilities on a CPU tensor, kl):",
            "",
            "| cache | import fbands (s) | import torch (s) | first call (s) "
            "| whole process (s) |",
            "|---|---|---|---|---|",
            f"| cold | | | {w['cold_first_s']:.2f} | {w['cold_process_s']:.2f} |",
            f"| warm | {w['import_s']:.2f} | {w['import_torch_s']:.2f} "
            f"| {w['warm_first_s']:.2f} | {w['warm_process_s']:.2f} |",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="kl and tv only, one warm repeat")
    ap.add_argument("--divs", help="comma-separated divergences (default: the registry)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import fbands

    divs = args.divs.split(",") if args.divs else (
        ["kl", "tv"] if args.quick else
        [n if n != "alpha" else "alpha(a=0.5)" for n in fbands.available()]
    )
    repeats = 1 if args.quick else 3
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="fbands-bench-") as tmp:
        imp = import_only(Path(tmp), max(repeats, 3))
    print(f"import fbands {imp['import_s']:.2f} s (process {imp['process_s']:.2f} s)", flush=True)
    rows = []
    for kind in ("bounds", "numpy"):
        for div in divs:
            rows.append(first_calls(kind, div, repeats))
            r = rows[-1]
            print(f"{kind:>6} {div:>14}: cold {r['cold_first_s']:6.2f} s  "
                  f"warm {r['warm_first_s']:5.2f} s  next {r['next_ms']:.2f} ms", flush=True)
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch not installed: no fresh-worker row")
    else:
        rows.append(first_calls("worker", "kl", repeats))
        r = rows[-1]
        print(f"fresh worker (kl, torch CPU): cold {r['cold_process_s']:.2f} s, "
              f"warm {r['warm_process_s']:.2f} s (whole process)", flush=True)
    res = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                      f"Python {platform.python_version()}",
           "repeats": repeats, "import": imp, "rows": rows,
           "load_average": [load_before, os.getloadavg()[0]],
           "when": time.strftime("%Y-%m-%d %H:%M")}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_startup.json").write_text(json.dumps(res, indent=1) + "\n")
    (RESULTS / "bench_startup.md").write_text(markdown(res))
    print(f"wrote {RESULTS / 'bench_startup.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
