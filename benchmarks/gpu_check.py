"""The GPU check of the torch backend, as one short script (exits cleanly without CUDA).

1. Accuracy: bounds and log-bounds on CUDA (float64 and float32 inputs, p in [1e-12,
   1 - 1e-9], delta in {1e-4, 0.05, 1}) against the float64 numpy backend on the CPU, for
   both device paths: a per-token delta tensor (the fixed-count solver) and a scalar delta
   (the interpolation tables read on the device).
2. No host synchronisation on the hot path: the call with ``check=False`` runs under
   ``torch.cuda.set_sync_debug_mode("error")``, which raises on any synchronising CUDA call
   (``.item()``, ``.any()`` into Python, a blocking copy to the host).
3. Throughput at 16M tokens (float32, KL, delta 0.05) against a device copy of the same
   tensor: ns per token, and the fraction of copy bandwidth (copy time / band time), for
   the sync-free solver (``check=False``) and the validated table path (one sync).

Run::

    python benchmarks/gpu_check.py [--n 16000000] [--out benchmarks/results]

Writes ``gpu_check.json`` (and prints a summary) when a GPU is present.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

import fbands  # noqa: E402

DIVS = ["kl", "reverse_kl", "tv", "chi2", "neyman_chi2", "hellinger", "js", "alpha(a=0.5)"]
DELTAS = [1e-4, 0.05, 1.0]


def rel_err(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    with np.errstate(invalid="ignore"):
        err = np.abs(a - b) / np.maximum(np.abs(b), 1e-6)
    return float(np.max(np.where(same, 0.0, err)))


def ulp_err(a32, b64) -> int:
    a = np.asarray(a32, dtype=np.float32)
    b = np.asarray(b64, dtype=np.float64).astype(np.float32)
    d = np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32).astype(np.int64))
    same = (a == b) | (np.isnan(a) & np.isnan(b)) | ((np.abs(a) < 1e-30) & (np.abs(b) < 1e-30))
    return int(np.max(np.where(same, 0, d)))


def accuracy(torch, dev) -> list[dict]:
    p = np.concatenate([np.logspace(-12, -0.31, 200), 1 - np.logspace(-9, -0.31, 150)])
    grid_p = np.broadcast_to(p, (len(DELTAS), p.size))
    grid_d = np.broadcast_to(np.array(DELTAS)[:, None], grid_p.shape)
    rows = []
    for div in DIVS:
        for log in (False, True):
            fn = fbands.log_bounds if log else fbands.bounds
            ref = fn(grid_p, grid_d, div, backend="numpy")
            got = fn(torch.tensor(grid_p, device=dev), torch.tensor(grid_d, device=dev), div)
            err64 = max(rel_err(g.cpu().numpy(), r) for g, r in zip(got, ref, strict=True))
            for i, d in enumerate(DELTAS):  # scalar delta: the tables on the device
                got = fn(torch.tensor(p, device=dev), d, div)
                err64 = max([err64] + [rel_err(g.cpu().numpy(), r[i])
                                       for g, r in zip(got, ref, strict=True)])
            p32 = grid_p.astype(np.float32)
            ok = p32 < 1
            ref32 = fn(p32.astype(np.float64), grid_d, div, backend="numpy")
            got32 = fn(torch.tensor(p32, device=dev), torch.tensor(grid_d, device=dev), div)
            err32 = max(ulp_err(g.cpu().numpy()[ok], r[ok])
                        for g, r in zip(got32, ref32, strict=True))
            rows.append({"div": div, "log": log, "float64_rel_err": err64,
                         "float32_max_ulp": err32, "float64_ok": err64 <= 1e-12,
                         "float32_ok": err32 <= 4})
            print(f"{div:>13} {'log' if log else 'ratio':>5}: float64 rel err {err64:.2e}  "
                  f"float32 {err32} ulp", flush=True)
    return rows


def no_sync(torch, dev) -> dict:
    lp = torch.log(torch.rand(1 << 16, device=dev, dtype=torch.float32).clamp_min(1e-30))
    delta = torch.full_like(lp, 0.05)
    fbands.log_bounds(lp, delta, "kl", logp=True, check=False)  # warm-up outside the check
    fbands.log_bounds(lp, 0.05, "tv", logp=True, check=False)
    torch.cuda.synchronize()
    result = {}
    for name, d, div in (("kl, per-token delta", delta, "kl"), ("tv, scalar delta", 0.05, "tv")):
        torch.cuda.set_sync_debug_mode("error")
        try:
            lo, hi = fbands.log_bounds(lp, d, div, logp=True, check=False)
            result[name] = "no sync"
        except RuntimeError as err:
            result[name] = f"SYNC: {err}"
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        print(f"host sync check ({name}): {result[name]}", flush=True)
    return result


def throughput(torch, dev, n: int) -> dict:
    p = torch.rand(n, device=dev, dtype=torch.float32).clamp_(1e-7, 1.0)

    def timed(fn, repeat=5):
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeat):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / repeat

    copy_s = timed(lambda: p.clone())
    out = {"n": n, "copy_ns_per_token": copy_s / n * 1e9}
    for div in ("kl", "tv"):
        for name, check in (("sync_free", False), ("tables", True)):
            secs = timed(lambda d=div, c=check: fbands.bounds(p, 0.05, d, check=c))
            out[f"{div}_{name}_ns_per_token"] = secs / n * 1e9
            out[f"{div}_{name}_fraction_of_copy_bandwidth"] = copy_s / secs
    print(json.dumps(out, indent=1), flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=16_000_000)
    ap.add_argument("--out", type=Path, default=ROOT / "results")
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("gpu_check: torch is not installed; nothing to check.")
        return 0
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; nothing to check (run it on a GPU machine).")
        return 0
    dev = torch.device("cuda")
    t0 = time.time()
    report = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "accuracy": accuracy(torch, dev),
        "host_sync": no_sync(torch, dev),
        "throughput": throughput(torch, dev, args.n),
    }
    report["seconds"] = time.time() - t0
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    bad = [r for r in report["accuracy"] if not (r["float64_ok"] and r["float32_ok"])]
    synced = [k for k, v in report["host_sync"].items() if v != "no sync"]
    print(f"accuracy failures: {len(bad)}; host syncs: {synced or 'none'}; "
          f"wrote {args.out / 'gpu_check.json'}")
    return 1 if bad or synced else 0


if __name__ == "__main__":
    raise SystemExit(main())
