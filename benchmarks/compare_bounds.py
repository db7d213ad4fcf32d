"""``bench_bounds.py`` on two versions of fbands, in one sitting, row by row.

A refactoring must not slow the band down: this runs the backend table of
``benchmarks/bench_bounds.py`` (``--blocks main``) for a git revision (``--before``, checked
out into a temporary worktree, with its own copy of the benchmark) and for the working tree,
alternating the two ``--rounds`` times so that the drift of a shared machine falls on both,
and reports for every row the best of each side and their ratio, for the time per token
and for ``x copy`` (the time over a memory copy timed in the same loop, call for call).  Each
side's figure is its best round: the least time is the one a busy machine disturbed least.
Run it alone on the machine.

Run::

    python benchmarks/compare_bounds.py --before 9c3b703            # 3 rounds, --quick rows
    python benchmarks/compare_bounds.py --before 9c3b703 --full     # N up to 16M too

Results: ``benchmarks/results/compare_bounds.json`` and ``compare_bounds.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
#: What identifies a row of the backend table.
KEY = ("backend", "div", "dtype", "size", "data")


def run_bench(tree: Path, out: Path, full: bool) -> list[dict]:
    """The backend table of ``tree``'s own ``bench_bounds.py``, importing ``tree``'s fbands."""
    cmd = [sys.executable, str(tree / "benchmarks" / "bench_bounds.py"), "--blocks", "main",
           "--env", "own", "--out", str(out), *([] if full else ["--quick"])]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "bench_bounds.json").read_text())["results"]


def compare(before: list[list[dict]], after: list[list[dict]]) -> list[dict]:
    """Per row: the best (least) ns/token and x copy of each side over its rounds, and
    after / before.  The least time is the one a busy machine disturbed least."""
    def best(rounds):
        rows = {}
        for results in rounds:
            for r in results:
                rows.setdefault(tuple(r[k] for k in KEY), []).append(r)
        return {k: {m: min(r[m] for r in v if r.get(m) is not None)
                    for m in ("ns_per_token", "x_copy") if any(r.get(m) for r in v)}
                for k, v in rows.items()}

    b, a = best(before), best(after)
    out = []
    for key in b:
        if key not in a or key[0] in ("copy", "bisection"):
            continue
        row = dict(zip(KEY, key, strict=True))
        for m in ("ns_per_token", "x_copy"):
            if m in b[key] and m in a[key]:
                row[f"{m}_before"], row[f"{m}_after"] = b[key][m], a[key][m]
                row[f"{m}_ratio"] = a[key][m] / b[key][m]
        out.append(row)
    return out


def markdown(rows: list[dict], before: str, rounds: int, full: bool) -> str:
    def worst(metric):
        row = max((r for r in rows if metric in r), key=lambda r: r[metric])
        return f"{row[metric]:.3f} ({', '.join(str(row[k]) for k in KEY[:4])})"

    lines = [
        "# bench_bounds before and after",
        "",
        f"`{before}` against the working tree, `bench_bounds.py --blocks main --env own"
        f"{'' if full else ' --quick'}`, {rounds} rounds each, the two taking turns; "
        "the best round of each side per row.  `x copy`: the backend's time over a numpy "
        "copy of the same array timed call for call.",
        "",
        f"Worst row, after / before: {worst('ns_per_token_ratio')} in ns/token, "
        f"{worst('x_copy_ratio')} in x copy; target at most 1.1.  (For the slow rows, numpy "
        "and torch-native, x copy divides by a copy a thousand times shorter than the call, "
        "and is noise.)",
        "",
        "| backend | div | dtype | N | ns/token before | after | ratio | x copy before | after "
        "| ratio |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    def cell(r, m, fmt):
        return format(r[m], fmt) if m in r else ""

    for r in rows:
        lines.append(
            f"| {r['backend']} | {r['div']} | {r['dtype']} | {r['size']} | "
            f"{cell(r, 'ns_per_token_before', '.2f')} | {cell(r, 'ns_per_token_after', '.2f')} | "
            f"{cell(r, 'ns_per_token_ratio', '.3f')} | {cell(r, 'x_copy_before', '.1f')} | "
            f"{cell(r, 'x_copy_after', '.1f')} | {cell(r, 'x_copy_ratio', '.3f')} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="git revision to compare against")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--full", action="store_true", help="the full table (N up to 16M)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fbands-compare-") as tmp:
        tmp = Path(tmp)
        subprocess.run(["git", "worktree", "add", "--detach", str(tmp / "before"), args.before],
                       cwd=ROOT, check=True, capture_output=True)
        try:
            before, after = [], []
            for r in range(args.rounds):
                order = (("before", tmp / "before", before), ("after", ROOT, after))
                for name, tree, sink in (order if r % 2 == 0 else order[::-1]):
                    print(f"round {r + 1}: {name}", flush=True)
                    out = tmp / f"{name}-{r}"
                    out.mkdir()
                    sink.append(run_bench(tree, out, args.full))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tmp / "before")],
                           cwd=ROOT, capture_output=True)
    rows = compare(before, after)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compare_bounds.json").write_text(json.dumps(
        {"before": args.before, "rounds": args.rounds, "full": args.full, "rows": rows},
        indent=1))
    text = markdown(rows, args.before, args.rounds, args.full)
    (args.out / "compare_bounds.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
