"""Controlled experiments that can decide BandPO's three claims, and their report.

The claims (arXiv 2603.04918): a band of ratios from an f-divergence trust region, in place
of PPO's fixed clip, (1) reaches higher accuracy, (2) keeps entropy from collapsing and
(3) lets rewarded low-probability (tail) tokens learn faster.  Every experiment here pairs
its runs: the same seed gives every loss the same prompts, and at step 1 the same rollout
and weights.  Each experiment is a list of runs; each run is one call of
:func:`fbands.rl.train.train` whose per-step metrics are kept in
``benchmarks/results/claims/<experiment>/<run>.json``.  A run whose file exists is not run
again, so the command resumes where it stopped; ``report`` reads only those files.

Experiments (``--only`` picks some):

``pilot``
    2 steps of every real-model configuration: the go / no-go numbers of the design.
``width``
    built-in model, ``tail`` task: PPO clip at eps 0.1 ... 1.0 against band-kl at delta
    0.01 ... 0.2, 10 paired seeds; steps to 0.8 held-out accuracy against the measured
    per-step KL.  The band's *shape* matters only if it beats the whole clip family at
    equal KL.
``dose``
    ``tail`` with the rewarded answer's warm-start share 0.01 ... 0.3, clip against band.
``two``
    ``tail`` with two rewarded answers, the rare reversal and the commoner rotation: which
    one does each loss keep?
``addition``
    a negative control without a tail: no difference is expected.
``T``
    SmolLM2-135M, ``verify`` with every statement true behind a skeptical system prompt,
    so that the rewarded first word "Yes" is a real tail token: held-out log P(Yes).
``S``
    SmolLM2-135M, ``sum`` free-form: reward, pass@1 / pass@8 and entropy.
``E1``, ``E2``, ``E3``, ``E1-edge``
    band against Clip-Higher on the toy, in the regime of one PPO epoch, from more than
    one warm start, and with upper edges wider than E1's grid: the runs and their analysis
    plan are in ``controls.py``.  E2 and E3 run the Clip-Higher width that E1's selection
    seeds chose.
``E4-pilot``, ``E4``
    SmolLM2-135M, T's set-up for one step, replayed exactly for five losses (clip, band,
    two Clip-Highers, a clip without lower edge): which edge does the band's work?  E4
    runs at the rate the pilot chose (plan in ``controls.py``).

Run, one process per core (``--jobs``, default 2), nothing else on the machine::

    make bench-claims                            # everything missing, then the report
    PYTHONPATH=. python benchmarks/claims.py run --only pilot T
    PYTHONPATH=. python benchmarks/claims.py report
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import controls

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "claims"
WORK = HERE.parent / "runs" / "claims"

# --- the experiments --------------------------------------------------------------------------
TOY = dict(model="tiny", task="tail", steps=30, eval_prompts=64)
SKEPTIC = "You are a skeptical assistant. Most claims are false."
#: the real-model experiments (full fine-tuning, 3 of 4 updates a step off-policy)
LLM = dict(model="smollm2-135m", warm_start_steps=0, lora_rank=0, lr=1e-5, prompts_per_step=4,
           group_size=8, ppo_epochs=1, minibatches=4, temperature=1.0, eval_prompts=32)
# S's learning rate is the pilot's adjustment of the design's 1e-5 (results/claims/
# pilot-lr1e-5): there 3.7 % of S's off-policy tokens left [0.8, 1.2] against the 5-40 % the
# design asks for (T's 32-41 %: kept), and the share grows about in proportion to the rate.
REAL_T = dict(LLM, task="verify", verify_true_share=1.0, system_prompt=SKEPTIC,
              max_new_tokens=4, steps=10, eval_every=1)
REAL_S = dict(LLM, task="sum", max_new_tokens=32, steps=20, eval_every=5, eval_samples=8,
              lr=3e-5)
#: experiment S at scale on one large GPU, float32 throughout (run only when named; its
#: launcher, gpu_claims.sh, was retired: it did not fit the GPU machine lent to the project)
REAL_S_GPU = dict(REAL_S, prompts_per_step=32, group_size=16, max_new_tokens=64,
                  minibatches=8, steps=60, eval_every=10, device="cuda", bf16=False)
#: ``--scale tiny``: the same runs, shrunk until a CPU finishes them in a minute or two
TINY = dict(prompts_per_step=2, group_size=2, max_new_tokens=4, minibatches=2, steps=2,
            eval_every=1, eval_samples=2, eval_prompts=2, device="cpu")
#: losses of the real-model experiments: PPO clip, the band, and a clip as wide as the band
#: is for mid-probability tokens (the width control)
REAL_LOSSES = {"clip": dict(loss="clip"), "band-kl": dict(loss="band-kl", delta=0.05),
               "clip-wide": dict(loss="clip", eps_low=0.5, eps_high=0.5)}
CLIP_EPS = (0.1, 0.2, 0.3, 0.5, 1.0)
BAND_DELTA = (0.01, 0.02, 0.05, 0.1, 0.2)
TAIL_SHARES = (0.01, 0.03, 0.06, 0.15, 0.3)
TARGET = 0.8  # held-out greedy accuracy of the toy task


def experiments(seeds: int = 10, real_seeds: int = 3) -> dict[str, list[dict]]:
    """Every run, by experiment: ``{"name", "family", "width", "seed", "config"}``."""
    def run(family, width, seed, **config):
        return {"name": f"{family}-{width:g}-s{seed}" if width is not None
                else f"{family}-s{seed}", "family": family, "width": width, "seed": seed,
                "config": dict(config, seed=seed)}

    width = [run("clip", e, s, **TOY, loss="clip", eps_low=e, eps_high=e)
             for e in CLIP_EPS for s in range(seeds)]
    width += [run("band-kl", d, s, **TOY, loss="band-kl", delta=d)
              for d in BAND_DELTA for s in range(seeds)]
    dose = [run(family, share, s, **TOY, tail_share=share, **loss)
            for share in TAIL_SHARES for s in range(seeds)
            for family, loss in (("clip", dict(loss="clip")),
                                 ("band-kl", dict(loss="band-kl", delta=0.05)))]
    two = [run(family, None, s, **TOY, tail_rewarded="reverse+rotate", **loss)
           for s in range(seeds)
           for family, loss in (("clip", dict(loss="clip")),
                                ("band-kl", dict(loss="band-kl", delta=0.05)))]
    addition = [run(family, None, s, model="tiny", task="addition", steps=40,
                    add_digits_min=2, add_digits_max=2, warm_start_steps=500, lr=5e-5,
                    eval_prompts=128, **loss)
                for s in range(seeds)
                for family, loss in (("clip", dict(loss="clip")),
                                     ("band-kl", dict(loss="band-kl", delta=0.05)))]
    real = {exp: [run(family, None, s, **base, **REAL_LOSSES[family])
                  for s in range(real_seeds) for family in families]
            for exp, base, families in (("T", REAL_T, REAL_LOSSES),
                                        ("S", REAL_S, ("clip", "band-kl")),
                                        ("S-gpu", REAL_S_GPU, REAL_LOSSES))}
    pilot = [dict(r, name=f"{exp}-{r['name']}", config=dict(r["config"], steps=2,
                                                            eval_every=1))
             for exp in ("T", "S") for r in real[exp] if r["seed"] == 0]
    return {"pilot": pilot, "T": real["T"], "width": width, "addition": addition,
            "S": real["S"], "two": two, "dose": dose, "S-gpu": real["S-gpu"],
            "E1": controls.e1_runs(), "E2": [], "E3": [],
            "E1-edge": controls.edge_runs(), "E4-pilot": controls.e4_pilot_runs(REAL_T),
            "E4": []}


def _controls(name: str, results: Path) -> list[dict]:
    """E2's or E3's runs, with the Clip-Higher that E1's selection seeds chose at 0.06;
    E4's at the learning rate its pilot chose."""
    if name == "E4":
        try:
            lr = controls.e4_learning_rate(load(results).get("E4-pilot", []))
        except ValueError as err:
            raise SystemExit(f"E4 runs at the rate its pilot chooses: {err}; run E4-pilot "
                             "first") from None
        print(f"== E4: the pilot chose lr {lr:g}", flush=True)
        return controls.e4_runs(REAL_T, lr)
    e1 = load(results).get("E1", [])
    try:
        selected = controls.select_clip_higher(e1, 0.06)
    except ValueError as err:
        raise SystemExit(f"{name} runs E1's choice of Clip-Higher, not made yet: {err}; "
                         "run E1 first") from None
    print(f"== {name}: E1's selection seeds chose {selected}", flush=True)
    return controls.e2_runs(selected) if name == "E2" else controls.e3_runs(selected)


#: what ``run`` does by default: everything that a CPU machine can run
CPU_EXPERIMENTS = ("pilot", "T", "width", "addition", "S", "two", "dose", "E1", "E2", "E3",
                   "E1-edge", "E4-pilot", "E4")


# --- running ------------------------------------------------------------------------------
#: per-step metrics a result file keeps (prefixes end with "/")
KEEP = ("step", "reward", "accuracy", "p_correct", "logp_correct", "entropy", "entropy/first",
        "response_len", "kl/update", "kl/cumulative", "band/clipfrac",
        "band/tail_clipfrac_upper", "answer/start_p", "time/rollout_s", "time/update_s",
        "time/after_update_s", "eval/", "update/", "dlogp/", "tokens/", "solution/")


def _kept(row: dict) -> dict:
    def short(v, digits=6):
        if isinstance(v, float):
            return float(f"{v:.{digits}g}") if math.isfinite(v) else None
        if isinstance(v, list):  # per-update and per-prompt lists: 4 digits are plenty
            return [short(x, 4) for x in v]
        return v

    return {k: short(v) for k, v in row.items()
            if k in KEEP or any(k.startswith(p) for p in KEEP if p.endswith("/"))}


def run_one(experiment: str, spec: dict, results: Path, work: Path) -> dict:
    """Train one run in this process (1 torch thread) and write its result file.

    A real-model run saves a checkpoint every step, so a run stopped half-way (the command
    killed) resumes from its last step; the checkpoint is deleted once the result is kept.
    """
    from fbands.rl.compare import load_run
    from fbands.rl.config import ConfigError, TrainConfig
    from fbands.rl.train import CHECKPOINT, train

    run_dir = work / experiment / spec["name"]
    real = spec["config"].get("model", "tiny") != "tiny"
    cfg = TrainConfig(**spec["config"], run_dir=str(run_dir), threads=1, progress=False,
                      checkpoint_every=1 if real else 0)
    t0 = time.perf_counter()
    try:
        if not (run_dir / CHECKPOINT).is_file():
            raise ConfigError("nothing to resume")
        train(cfg, resume=True, log=lambda _m: None)
    except ConfigError:  # no usable checkpoint, or another configuration: start afresh
        for name in ("metrics.jsonl", CHECKPOINT, "config.json"):
            (run_dir / name).unlink(missing_ok=True)
        train(cfg, log=lambda _m: None)
    seconds = time.perf_counter() - t0
    _, rows = load_run(run_dir)
    out = {k: spec[k] for k in ("name", "family", "width", "seed")} | {
        "experiment": experiment, "config": cfg.to_dict(), "seconds": round(seconds, 1),
        "rows": [_kept(r) for r in rows]}
    path = results / experiment / f"{spec['name']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    os.replace(tmp, path)
    (run_dir / CHECKPOINT).unlink(missing_ok=True)  # up to 1.6 GB for the real model
    return out


def _warm(spec: dict, work: Path) -> None:
    """Build the warm start (or convert the model) once, before parallel runs need it."""
    from fbands.rl.config import TrainConfig
    from fbands.rl.model import load_policy, warm_start
    from fbands.rl.tasks import make_task

    cfg = TrainConfig(**spec["config"], run_dir=str(work / "warm"), progress=False).validate()
    task = make_task(cfg)
    model, codec = load_policy(cfg, task, log=lambda _m: None)
    warm_start(model, codec, task, cfg, "cpu", log=lambda _m: None)


def run(names: list[str], jobs: int, seeds: int, real_seeds: int, results: Path,
        work: Path, scale: str = "full") -> None:
    from fbands.rl.config import TrainConfig

    plan = experiments(seeds, real_seeds)
    if scale == "tiny":
        plan = {e: [dict(s, config=dict(s["config"], **TINY)) for s in specs]
                for e, specs in plan.items()}
    for experiment in names:
        if experiment in ("E2", "E3", "E4"):
            plan[experiment] = _controls(experiment, results)
            if scale == "tiny":
                plan[experiment] = [dict(s, config=dict(s["config"], **TINY))
                                    for s in plan[experiment]]
        todo = [s for s in plan[experiment]
                if not (results / experiment / f"{s['name']}.json").is_file()]
        done = len(plan[experiment]) - len(todo)
        print(f"== {experiment}: {len(todo)} runs to go ({done} done)", flush=True)
        if not todo:
            continue
        warm_keys = {}
        for s in todo:  # one warm start per distinct set-up, serially
            key = TrainConfig(**s["config"]).warm_start_key()
            warm_keys.setdefault(key, s)
        for s in warm_keys.values():
            _warm(s, work)
        t0 = time.perf_counter()
        # spawned workers: a forked one would inherit a CUDA context it cannot use
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(run_one, experiment, s, results, work): s for s in todo}
            for i, future in enumerate(as_completed(futures), 1):
                out = future.result()
                last = out["rows"][-1] if out["rows"] else {}
                elapsed = time.perf_counter() - t0
                print(f"  [{i}/{len(todo)}] {out['name']}: {out['seconds']:.0f} s, "
                      f"reward {last.get('reward', float('nan')):.3f}, "
                      f"accuracy {last.get('accuracy', float('nan')):.3f}; "
                      f"{elapsed / i * (len(todo) - i) / 60:.0f} min to go", flush=True)


def load(results: Path = RESULTS) -> dict[str, list[dict]]:
    """Every result file, by experiment."""
    out: dict[str, list[dict]] = {}
    for path in sorted(results.glob("*/*.json")):
        out.setdefault(path.parent.name, []).append(json.loads(path.read_text()))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="?", default="all", choices=("all", "run", "report"))
    parser.add_argument("--only", nargs="+", choices=list(experiments()), default=None,
                        help="experiments to run (default: every CPU one, in the listed "
                             "order; S-gpu only when named)")
    parser.add_argument("--scale", choices=("full", "tiny"), default="full",
                        help="tiny: every run shrunk to a minute on a CPU (to test the set-up)")
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel (1 thread each)")
    parser.add_argument("--seeds", type=int, default=10, help="paired seeds of a toy experiment")
    parser.add_argument("--real-seeds", type=int, default=3,
                        help="paired seeds of a real-model experiment")
    parser.add_argument("--results", default=str(RESULTS), help="folder of the result files")
    parser.add_argument("--work", default=str(WORK), help="folder for the run folders")
    args = parser.parse_args(argv)
    results, work = Path(args.results), Path(args.work)
    if args.command in ("all", "run"):
        run(args.only or list(CPU_EXPERIMENTS), args.jobs, args.seeds, args.real_seeds,
            results, work, args.scale)
    if args.command in ("all", "report"):
        from claims_report import write_report

        machine = f"{platform.machine()}, {os.cpu_count()} cpus, python " \
                  f"{platform.python_version()}"
        path = write_report(load(results), results.parent, machine)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    raise SystemExit(main())
