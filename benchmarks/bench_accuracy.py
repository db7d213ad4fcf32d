"""Accuracy of the band edges against 60-digit references, per backend and dtype.

For every built-in divergence and a grid of old probabilities ``p`` (powers of two and 1.5
times them, from 2**-40 to 1, plus values next to 1; every one exactly representable in
bfloat16, hence in float32 and float64), the exact edges come from the independent mpmath
bisection of ``tests/reference.py`` (60 digits, generators typed in again from their
definitions). Each backend and dtype then computes ``fbands.bounds(p, delta, div)`` and the
relative error of each edge is measured in units of that dtype's machine epsilon. Edges whose
exact value is outside the dtype's normal range (a lower edge of 1e-500, say) are left out
here: ``log_bounds`` is the function for those.

Writes ``benchmarks/results/accuracy.md`` (the table) and ``benchmarks/results/accuracy.png``
(the worst relative error over divergences and edges against ``p``, per backend and dtype).

Run::

    python benchmarks/bench_accuracy.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import fbands  # noqa: E402
from tests import reference  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
DIVERGENCES = ("kl", "reverse_kl", "tv", "chi2", "neyman_chi2", "hellinger", "js")
DELTA = 0.05


def p_grid(quick: bool) -> np.ndarray:
    ks = np.arange(1, 41, 3 if quick else 1)
    small = np.concatenate([2.0**-ks, 1.5 * 2.0**-ks])
    near_one = 1 - 2.0 ** -np.arange(2, 8)
    p = np.unique(np.concatenate([small, near_one, [1.0]]))
    return p[(p > 0) & (p <= 1)]


def references(p: np.ndarray) -> dict[str, np.ndarray]:
    """(len(p), 2) exact edges per divergence, as float64 (mpmath at 60 digits)."""
    out = {}
    for name in DIVERGENCES:
        f = reference.TABLE[name]
        rows = []
        for x in p:
            if x == 1.0:
                rows.append((float(reference.lower_at_one(name, DELTA)), 1.0))
            else:
                lo, hi = reference.edges(f, float(x), DELTA)
                rows.append((float(lo), float(hi)))
        out[name] = np.array(rows)
        print(f"  reference {name}: {len(p)} values", flush=True)
    return out


def configurations():
    """(label, dtype name, function p -> (lo, hi) as float64 arrays)."""
    configs = []

    def numpy_like(backend, dtype):
        def run(p, name):
            lo, hi = fbands.bounds(p.astype(dtype), DELTA, name, backend=backend)
            return np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)

        return run

    configs.append(("numpy", "float64", numpy_like("numpy", np.float64)))
    try:
        import numba  # noqa: F401

        configs.append(("numba", "float64", numpy_like("numba", np.float64)))
        configs.append(("numba", "float32", numpy_like("numba", np.float32)))
    except ImportError:
        pass
    try:
        import torch

        def torch_run(dtype):
            def run(p, name):
                t = torch.tensor(p, dtype=torch.float64).to(dtype)
                lo, hi = fbands.bounds(t, DELTA, name, backend="torch")
                return lo.double().numpy(), hi.double().numpy()

            return run

        for dt in (torch.float64, torch.float32, torch.bfloat16):
            configs.append(("torch (CPU)", str(dt).replace("torch.", ""), torch_run(dt)))
    except ImportError:
        pass
    return configs


EPS = {"float64": 2.0**-52, "float32": 2.0**-23, "bfloat16": 2.0**-7}
TINY = {"float64": 2.2250738585072014e-308, "float32": 1.1754944e-38, "bfloat16": 1.1754944e-38}
HUGE = {"float64": 1.7976931348623157e308, "float32": 3.4028235e38, "bfloat16": 3.3895314e38}


def measure(p, refs, configs):
    """Per (backend, dtype, divergence): worst and median relative error in eps, raw and
    divided by max(1, |log r|), the condition number of r = exp(log r) (an edge of 1e-200 is
    exp(-460), and a relative error eps in its logarithm is 460 eps in the edge, whatever the
    algorithm)."""
    rows, curves, adjusted = [], {}, {}
    for label, dtype, run in configs:
        worst_p = np.zeros(len(p))
        worst_adj = np.zeros(len(p))
        for name in DIVERGENCES:
            lo, hi = run(p, name)
            errs, adjs = [], []
            for got, exact in ((lo, refs[name][:, 0]), (hi, refs[name][:, 1])):
                keep = (exact == 0) | ((exact >= TINY[dtype]) & (exact <= HUGE[dtype]))
                safe = np.where(exact == 0, 1, exact)
                rel = np.where(exact == 0, np.abs(got), np.abs(got - exact) / safe)
                rel = np.where(keep, rel, 0.0)
                errs.append(rel)
                adjs.append(rel / np.maximum(1.0, np.abs(np.log(safe))))
            rel = np.maximum(*errs) / EPS[dtype]
            adj = np.maximum(*adjs) / EPS[dtype]
            worst_p = np.maximum(worst_p, rel)
            worst_adj = np.maximum(worst_adj, adj)
            rows.append((label, dtype, name, float(rel.max()), float(np.median(rel)),
                         float(adj.max())))
        curves[f"{label} {dtype}"] = worst_p
        adjusted[f"{label} {dtype}"] = worst_adj
        print(f"  {label} {dtype}: worst {worst_p.max():.2f} eps, "
              f"{worst_adj.max():.2f} eps x max(1, |log r|)", flush=True)
    return rows, curves, adjusted


def write(p, rows, curves, adjusted, seconds, quick):
    RESULTS.mkdir(parents=True, exist_ok=True)
    lines = [
        "# Accuracy of the band edges",
        "",
        "Relative error of `fbands.bounds(p, 0.05, div)` against the 60-digit mpmath bisection "
        "of `tests/reference.py`, in units of the output dtype's machine epsilon "
        "(float64 2^-52, float32 2^-23, bfloat16 2^-7): the worst and the median over "
        f"{len(p)} values of p from {p.min():.1e} to 1 (each exactly representable in "
        "bfloat16) and both edges. Rounding the exact edge to the dtype alone costs up to "
        "0.5 eps. Edges whose exact value lies outside the dtype's normal range are left out "
        "(use `log_bounds` for those). The last column divides each error by "
        "max(1, |log r|), the condition number of r = exp(log r): a `kl` lower edge of "
        "1e-238 is exp(-547), and an error of one eps in its logarithm is already 547 eps "
        "in the edge, for any algorithm; that column is what the solver itself adds.",
        "",
        "| backend | dtype | divergence | worst (eps) | median (eps) "
        "| worst / max(1, abs(log r)) (eps) |",
        "|---|---|---|---|---|---|",
    ]
    for label, dtype, name, worst, median, adj in rows:
        lines.append(
            f"| {label} | {dtype} | `{name}` | {worst:.2f} | {median:.2f} | {adj:.2f} |"
        )
    lines += [
        "",
        "![worst relative error against p](accuracy.png)",
        "",
        f"{platform.machine()}, {platform.system()}, python {platform.python_version()}, "
        f"numpy {np.__version__}; {seconds:.0f} s; command: "
        f"`python benchmarks/bench_accuracy.py{' --quick' if quick else ''}`.",
        "",
    ]
    (RESULTS / "accuracy.md").write_text("\n".join(lines), encoding="utf-8")
    (RESULTS / "accuracy.json").write_text(
        json.dumps(
            {
                "delta": DELTA,
                "p": p.tolist(),
                "rows": [dict(zip(("backend", "dtype", "div", "worst_eps", "median_eps",
                                   "worst_eps_per_log"), r, strict=True)) for r in rows],
                "curves": {k: v.tolist() for k, v in curves.items()},
                "curves_per_log": {k: v.tolist() for k, v in adjusted.items()},
            },
            indent=1,
        ),
        encoding="utf-8",
    )

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), dpi=100, sharey=True)
    for ax, data, title in (
        (axes[0], curves, "relative error of the edge"),
        (axes[1], adjusted, "divided by max(1, |log r|)"),
    ):
        for label, worst in data.items():
            ax.plot(p, np.maximum(worst, 1e-3), marker="o", ms=2.5, lw=1.2, label=label)
        ax.axhline(0.5, color="0.4", lw=0.8, ls="--", label="rounding of the exact edge")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("old probability p")
        ax.set_title(title, fontsize=10)
        ax.grid(True, lw=0.4, alpha=0.6)
    axes[0].set_ylabel("worst over divergences / eps of dtype")
    axes[1].legend(fontsize=7)
    fig.suptitle(f"band edges against 60-digit references (delta = {DELTA})", fontsize=11)
    fig.tight_layout()
    fig.savefig(RESULTS / "accuracy.png")
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a coarser grid of p")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    p = p_grid(args.quick)
    print(f"accuracy: {len(p)} values of p, {len(DIVERGENCES)} divergences", flush=True)
    refs = references(p)
    rows, curves, adjusted = measure(p, refs, configurations())
    write(p, rows, curves, adjusted, time.perf_counter() - start, args.quick)
    print(f"wrote {RESULTS / 'accuracy.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
