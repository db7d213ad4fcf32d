"""The paper's claims on a real pretrained model: SmolLM2-135M-Instruct on this CPU.

Two parts, both written to ``benchmarks/results/``:

``passrates``
    For every chat task of :mod:`fbands.rl.tasks`, the untrained model's sampled pass rate
    (``--prompts`` training prompts x ``--samples`` answers at the trainer's temperature and
    answer length), its greedy accuracy on the held-out split, and, over the rewarded
    samples, the old probability of the token where the answer starts (the share below
    0.1 is the share of rewarded answers that start in the tail).
    -> ``llm_passrates.json`` / ``.md``.
``runs``
    GRPO with clip (eps 0.2), band-kl (delta 0.05) and Clip-Higher (0.2 / 0.28) on one task
    (``verify`` by default), ``--seeds`` seeds each, LoRA, through
    :func:`fbands.rl.train.train`.  Finished runs are reused (a longer one counts up to
    ``--steps``), a shorter or killed one is resumed from its checkpoint, so the command can
    be re-run after an interruption.
    -> ``llm_bench.json`` (summaries and curves), ``llm_bench_table.md`` (table),
    ``llm_bench.png`` (held-out accuracy, entropy, the share of tail tokens with A > 0
    whose gain the upper edge stopped, share of rewarded answers that start in the tail;
    mean over seeds).
``table``
    Rebuilds the table, the summaries and the figure from the curves in ``llm_bench.json``
    (after a change of what they show; nothing is trained).

    PYTHONPATH=. python benchmarks/llm_bench.py passrates
    PYTHONPATH=. python benchmarks/llm_bench.py runs      # 20-60 min on 2 cores, by load
    make bench-llm                                        # both

Progress goes to stderr, one line per step.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = "smollm2-135m"
METHODS = {"clip": dict(loss="clip", eps_low=0.2, eps_high=0.2),
           "band-kl": dict(loss="band-kl", delta=0.05),
           "clip-higher": dict(loss="clip-higher", eps_low=0.2, eps_high=0.28),
           "dcpo": dict(loss="dcpo")}
#: what ``runs`` compares by default (the others with --methods)
DEFAULT_METHODS = ("clip", "band-kl", "clip-higher")
CHAT_TASKS = ("sum", "larger", "word", "verify")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- untrained pass rates ------------------------------------------------------------------
def passrates(args) -> dict:
    import numpy as np
    import torch

    from fbands.rl.config import PRETRAINED_DEFAULTS, TrainConfig
    from fbands.rl.model import load_policy, token_logprobs
    from fbands.rl.rollout import answer_start_columns, greedy_accuracy, sample
    from fbands.rl.tasks import make_task

    torch.set_num_threads(args.threads)
    base = TrainConfig(**{**PRETRAINED_DEFAULTS, "model": MODEL, "lora_rank": 0})
    t0 = time.perf_counter()
    model, codec = load_policy(base.validate(), None, log=log)
    load_s = time.perf_counter() - t0
    model.eval()
    nothing = __import__("contextlib").nullcontext
    out = {"model": MODEL, "load_s": load_s, "prompts": args.prompts, "samples": args.samples,
           "temperature": base.temperature, "max_new_tokens": base.max_new_tokens,
           "chat_template": True, "system_prompt": "(template default)", "tasks": {}}
    saved = RESULTS / "llm_passrates.json"
    if saved.is_file():  # keep the tasks not measured this time
        out["tasks"] = {k: v for k, v in json.loads(saved.read_text())["tasks"].items()
                        if k in CHAT_TASKS}
    for name in args.tasks:
        task = make_task(TrainConfig(**{**base.to_dict(), "task": name}))
        prompts = task.prompts(np.random.default_rng([0, 1234]), args.prompts)
        gen = torch.Generator().manual_seed(0)
        t = time.perf_counter()
        batch = sample(model, codec, [p.text for p in prompts], args.samples,
                       base.max_new_tokens, base.temperature, gen, "cpu", nothing)
        rows_prompts = [prompts[i // args.samples] for i in range(len(batch.completions))]
        rewards = [task.reward(p, c) for p, c in zip(rows_prompts, batch.completions,
                                                     strict=True)]
        with torch.no_grad():
            logp_old, _ = token_logprobs(model, batch.input_ids, batch.attention_mask,
                                         batch.prompt_width, temperature=base.temperature)
        rows, cols = answer_start_columns(codec, task, rows_prompts, batch, rewards)
        p_start = logp_old[rows, cols].exp().tolist() if rows else []
        held_out = task.prompts(np.random.default_rng([0, 99]), args.eval_prompts,
                                split="eval")
        greedy = greedy_accuracy(model, codec, task, held_out, base.max_new_tokens, "cpu",
                                 nothing)
        seconds = time.perf_counter() - t
        n_tokens = float(batch.response_mask.sum())
        out["tasks"][name] = {
            "pass_rate": sum(rewards) / len(rewards),
            "rewarded": int(sum(rewards)),
            "held_out_greedy_accuracy": greedy,
            "answer_start_p_median": statistics.median(p_start) if p_start else None,
            "answer_start_tail_share": (sum(p < 0.1 for p in p_start) / len(p_start)
                                        if p_start else None),
            "mean_answer_tokens": n_tokens / len(rewards),
            "seconds": seconds,
            "example": {"prompt": prompts[0].text, "answer": prompts[0].answer,
                        "sampled": batch.completions[:args.samples]},
        }
        log(f"{name}: pass rate {sum(rewards) / len(rewards):.3f}, greedy held-out "
            f"{greedy:.3f}, tail share {out['tasks'][name]['answer_start_tail_share']} "
            f"({seconds:.0f} s)")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "llm_passrates.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = [f"# Untrained {MODEL}: pass rates per task", "",
             f"{args.prompts} training prompts x {args.samples} samples at temperature "
             f"{base.temperature}, up to {base.max_new_tokens} new tokens, chat template with "
             f"its default system turn; greedy accuracy on {args.eval_prompts} held-out "
             "prompts. *start p*: old probability (at the sampling temperature) of the token "
             "where a rewarded answer starts; *tail share*: share of rewarded answers whose "
             "start token has p < 0.1.", "",
             "| task | sampled pass rate | greedy held-out | rewarded | start p (median) | "
             "tail share | answer tokens |", "|---|---|---|---|---|---|---|"]

    def fmt(v):
        return "-" if v is None else f"{v:.3f}"

    for name, r in out["tasks"].items():
        lines.append(f"| {name} | {r['pass_rate']:.3f} | {r['held_out_greedy_accuracy']:.3f} "
                     f"| {r['rewarded']} | {fmt(r['answer_start_p_median'])} | "
                     f"{fmt(r['answer_start_tail_share'])} | {r['mean_answer_tokens']:.1f} |")
    lines += ["", f"Model load: {load_s:.1f} s. Machine: {platform.machine()}, "
              f"{platform.python_version()}; 2 cores shared with other jobs.", ""]
    (RESULTS / "llm_passrates.md").write_text("\n".join(lines))
    return out


# --- GRPO runs -------------------------------------------------------------------------
#: what every benchmark run shares (see llm_bench.md for why)
RUN = dict(model=MODEL, warm_start_steps=0, prompts_per_step=4, group_size=4,
           max_new_tokens=24, temperature=0.7, ppo_epochs=1, minibatches=2, lr=2e-4,
           lora_rank=16, lora_alpha=32.0, eval_every=2, eval_prompts=16, checkpoint_every=4,
           threads=1, progress=True)
CURVE_KEYS = ("reward", "accuracy", "entropy", "answer/start_tail_share", "answer/start_p",
              "band/tail_clipfrac_upper", "tokens_per_s", "time/band_share",
              "time/rollout_s", "time/update_s")
#: saved curves under a metric's earlier name, by that name: the name they are read as
RENAMED = {"loss/tail_clipfrac_upper": "band/tail_clipfrac_upper"}


def one_run(method: str, seed: int, args) -> dict:
    from fbands.rl.compare import load_run
    from fbands.rl.config import TrainConfig
    from fbands.rl.train import CHECKPOINT, train

    run_dir = Path(args.out) / f"{args.task}-{method}-s{seed}"
    cfg = TrainConfig(**{**RUN, **METHODS[method], "task": args.task, "seed": seed,
                         "steps": args.steps, "run_dir": str(run_dir)})
    done = 0
    if (run_dir / "metrics.jsonl").is_file():
        done = len(load_run(run_dir)[1])
    if done < args.steps:
        resume = (run_dir / CHECKPOINT).is_file()
        if not resume and run_dir.exists():  # a run killed before its first checkpoint
            for f in run_dir.iterdir():
                f.unlink()
        t0 = time.perf_counter()

        def progress(msg):
            log(f"{method} seed {seed}: {msg}")

        train(cfg, resume=resume, log=progress)
        log(f"{method} seed {seed}: {args.steps} steps in {time.perf_counter() - t0:.0f} s")
    _, rows = load_run(run_dir)  # a longer earlier run counts up to --steps
    return {"method": method, "seed": seed, "rows": rows[:args.steps]}


def _stats(values):
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return None
    return {"mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0, "n": len(values)}


def summarize_runs(runs: list[dict], args, untrained: float | None) -> dict:
    def mean_of(rows, key):
        v = [r[key] for r in rows if key in r]
        return statistics.fmean(v) if v else None

    def last_of(rows, key):
        v = [r[key] for r in rows if key in r]
        return v[-1] if v else None

    def first_step(rows):  # a run that never gets there counts as steps + 2 (next eval)
        return next((r["step"] for r in rows if r.get("accuracy", -1) >= args.target),
                    args.steps + 2)

    table = {}
    for method in args.methods:
        mine = [r["rows"] for r in runs if r["method"] == method]
        table[method] = {
            "seeds": len(mine),
            "steps_to_target": _stats([first_step(rows) for rows in mine]),
            "final_accuracy": _stats([last_of(rows, "accuracy") for rows in mine]),
            "mean_accuracy": _stats([mean_of(rows, "accuracy") for rows in mine]),
            "mean_reward": _stats([mean_of(rows, "reward") for rows in mine]),
            "last4_reward": _stats([statistics.fmean([r["reward"] for r in rows[-4:]])
                                    for rows in mine]),
            "final_entropy": _stats([last_of(rows, "entropy") for rows in mine]),
            "first_entropy": _stats([rows[0]["entropy"] for rows in mine]),
            "tail_clip_upper": _stats([mean_of(rows, "band/tail_clipfrac_upper")
                                       for rows in mine]),
            "start_tail_share": _stats([mean_of(rows, "answer/start_tail_share")
                                        for rows in mine]),
            "tokens_per_s": _stats([mean_of(rows, "tokens_per_s") for rows in mine]),
            "band_share": _stats([mean_of(rows, "time/band_share") for rows in mine]),
            "step_s": _stats([mean_of(rows, "time/rollout_s") + mean_of(rows, "time/update_s")
                              for rows in mine]),
        }
    return {"untrained_greedy_accuracy": untrained, "methods": table}


def plot(runs: list[dict], path: Path, title: str, untrained: float | None = None,
         methods=tuple(METHODS)) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("accuracy", "held-out greedy accuracy"), ("entropy", "token entropy (nats)"),
              ("band/tail_clipfrac_upper", "upper edge hit, tail tokens (p<0.1) with A > 0"),
              ("answer/start_tail_share", "rewarded answers starting in the tail"),
              ("reward", "mean sampled reward"))
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    axes = list(axes.flat)
    colors = {"clip": "tab:red", "band-kl": "tab:blue", "clip-higher": "tab:orange",
              "dcpo": "tab:green"}
    axes[-1].axis("off")
    for ax, (key, label) in zip(axes, panels, strict=False):
        for method in methods:
            start = [(0, untrained)] if key == "accuracy" and untrained is not None else []
            curves = [start + [(r["step"], r[key]) for r in run["rows"] if key in r]
                      for run in runs if run["method"] == method]
            for c in curves:
                if c:
                    ax.plot(*zip(*c, strict=True), color=colors[method], alpha=0.25, lw=0.8)
            steps = sorted({s for c in curves for s, _ in c})
            mean = [statistics.fmean([v for c in curves for s2, v in c if s2 == s])
                    for s in steps]
            if steps:
                ax.plot(steps, mean, color=colors[method], lw=2, label=method)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_table(summary: dict, args, path: Path) -> None:
    def cell(s, digits=3):
        if s is None:
            return "-"
        return f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f}"

    keys = (("steps_to_target", f"first eval step with held-out acc. >= {args.target:g}"),
            ("final_accuracy", "final held-out acc."), ("mean_accuracy", "mean held-out acc."),
            ("last4_reward", "reward, last 4 steps"), ("first_entropy", "entropy, step 1"),
            ("final_entropy", "entropy, last step"),
            ("tail_clip_upper", "upper edge hit, tail tokens with A > 0"),
            ("start_tail_share", "rewarded answers starting in tail"),
            ("tokens_per_s", "tokens/s"), ("step_s", "step time (s)"),
            ("band_share", "band's share of step time"))
    methods = list(summary["methods"])
    lines = ["| metric (mean ± std over seeds) | " + " | ".join(methods) + " |",
             "|---|" + "---|" * len(methods)]
    for key, label in keys:
        lines.append(f"| {label} | " + " | ".join(cell(summary["methods"][m][key])
                                                 for m in methods) + " |")
    path.write_text("\n".join(lines) + "\n")


def runs(args) -> dict:
    import torch

    torch.set_num_threads(1)
    results = []
    t0 = time.perf_counter()
    for seed in args.seeds:  # seed-major: an early stop still leaves both methods compared
        for method in args.methods:
            results.append(one_run(method, seed, args))
            log(f"done {method} seed {seed} ({time.perf_counter() - t0:.0f} s so far)")
    untrained = None
    rates = RESULTS / "llm_passrates.json"
    if rates.is_file():
        untrained = json.loads(rates.read_text())["tasks"].get(args.task, {}).get(
            "held_out_greedy_accuracy")
    config = {**RUN, "task": args.task, "steps": args.steps, "seeds": list(args.seeds),
              "methods": {m: METHODS[m] for m in args.methods}, "target": args.target}
    runs = [{"method": r["method"], "seed": r["seed"],
             "curves": {k: [row.get(k) for row in r["rows"]] for k in CURVE_KEYS}}
            for r in results]
    return write_outputs(config, runs, untrained, time.perf_counter() - t0)


def write_outputs(config: dict, runs: list[dict], untrained: float | None,
                  wall_s: float) -> dict:
    """``llm_bench.json``, its table and its figure from the runs' curves (a saved curve
    that the summaries no longer read is kept as it is)."""
    args = argparse.Namespace(methods=list(config["methods"]), target=config["target"],
                              steps=config["steps"])
    results = [{"method": r["method"], "seed": r["seed"],
                "rows": [{"step": i + 1, **{RENAMED.get(k, k): v[i]
                                            for k, v in r["curves"].items()
                                            if RENAMED.get(k, k) in CURVE_KEYS
                                            and v[i] is not None}}
                         for i in range(config["steps"])]} for r in runs]
    summary = summarize_runs(results, args, untrained)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "llm_bench.json").write_text(json.dumps(
        {"config": config, "summary": summary,
         "runs": runs, "wall_s": wall_s}, indent=2) + "\n")
    write_table(summary, args, RESULTS / "llm_bench_table.md")
    plot(results, RESULTS / "llm_bench.png",
         f"{MODEL}, task {config['task']}, LoRA r{config['lora_rank']}, {config['steps']} "
         f"steps, {len(config['seeds'])} seeds (thin: seeds, thick: mean)", untrained,
         args.methods)
    log(f"wrote {RESULTS / 'llm_bench.json'}, llm_bench_table.md, llm_bench.png")
    return summary


def table(args) -> dict:
    """Rebuild the outputs of ``runs`` from the curves ``llm_bench.json`` keeps."""
    saved = json.loads((RESULTS / "llm_bench.json").read_text())
    untrained = saved["summary"].get("untrained_greedy_accuracy")
    return write_outputs(saved["config"], saved["runs"], untrained, saved["wall_s"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="part", required=True)
    p = sub.add_parser("passrates", help="untrained pass rates per task")
    p.add_argument("--tasks", nargs="+", default=list(CHAT_TASKS), choices=CHAT_TASKS)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--eval-prompts", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    p.set_defaults(func=passrates)
    p = sub.add_parser("runs", help="clip, band-kl and Clip-Higher, several seeds")
    p.add_argument("--task", default="verify", choices=CHAT_TASKS)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", default="runs/llm_bench", help="folder of the run folders")
    p.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS),
                   choices=list(METHODS))
    p.add_argument("--target", type=float, default=0.75,
                   help="held-out greedy accuracy whose first step the table reports")
    p.set_defaults(func=runs)
    p = sub.add_parser("table", help="rebuild the table and figure from llm_bench.json")
    p.set_defaults(func=table)
    args = parser.parse_args(argv)
    args.func(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
