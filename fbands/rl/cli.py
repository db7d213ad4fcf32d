"""``fbands train``, ``fbands demo`` and ``fbands compare``.

:func:`register` only builds parsers (no torch, transformers or matplotlib import); the
command functions import what they need.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import typing
from pathlib import Path

from fbands.cli import image_path, positive_int
from fbands.errors import ConfigError
from fbands.rl.config import HELP, PRETRAINED_DEFAULTS, TrainConfig

#: the demo: clip (eps 0.2) against band-kl (delta 0.05) on the tail task
DEMO_RUNS = (("clip", {"loss": "clip", "eps_low": 0.2, "eps_high": 0.2}),
             ("band-kl", {"loss": "band-kl", "delta": 0.05}))
DEMO_CONFIG = dict(task="tail")
DEMO_STEPS = 30
#: paired seeds per loss: one run's numbers depend on the CPU's vector kernels (RL turns a
#: last-bit difference into other samples), the pattern over seeds much less
DEMO_SEEDS = 3
MAX_DEMO_SEEDS = 100
#: ``fbands demo --model NAME``: the pretrained defaults, smaller (a few minutes on a CPU)
DEMO_PRETRAINED = dict(PRETRAINED_DEFAULTS, prompts_per_step=2, max_new_tokens=24,
                       eval_every=2, eval_prompts=8)
DEMO_PRETRAINED_STEPS = 4
#: the files a demo run writes (all that ``--force`` may remove), and the note in its
#: config.json that tells a folder of the demo's own from any other
DEMO_FILES = ("config.json", "metrics.jsonl", "checkpoint.pt")
DEMO_MARK = {"written_by": "fbands demo"}


def _config_arguments(parser: argparse.ArgumentParser) -> None:
    """One ``--option`` per :class:`TrainConfig` field (default None: keep the file/default)."""
    hints = typing.get_type_hints(TrainConfig)
    defaults = TrainConfig()
    for f in dataclasses.fields(TrainConfig):
        if f.name == "extra":
            continue
        flag = "--" + f.name.replace("_", "-")
        kind = hints[f.name]
        help_ = f"{HELP.get(f.name, '')} (default: {getattr(defaults, f.name)!r})"
        if kind is bool:
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                                default=None, help=help_)
            continue
        base = next((t for t in typing.get_args(kind) if t is not type(None)), kind)
        parser.add_argument(flag, dest=f.name, type=base, default=None, metavar=base.__name__,
                            help=help_)


def _config_from_args(args: argparse.Namespace) -> TrainConfig:
    """Defaults, then --config (or, with --resume, the run's config.json), then options."""
    saved = Path(args.run_dir or "", "config.json")
    if args.config:
        cfg = TrainConfig.from_file(args.config)
    elif args.resume and args.run_dir and saved.is_file():
        cfg = TrainConfig.from_file(saved)
    else:
        cfg = TrainConfig()
    changes = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)
               if getattr(args, f.name, None) is not None}
    if not (args.config or args.resume) and changes.get("model", "tiny") != "tiny":
        cfg = dataclasses.replace(cfg, **PRETRAINED_DEFAULTS)  # a pretrained model's defaults
    return dataclasses.replace(cfg, **changes)


def demo_run_dir(out: Path, name: str, seed: int) -> Path:
    """The folder of the demo's run of loss ``name`` with ``seed`` under ``out``."""
    return out / f"{name}-s{seed}"


def _seed_count(text: str) -> int:
    """An argparse ``type``: the demo's number of seeds, 1 to :data:`MAX_DEMO_SEEDS`."""
    value = positive_int(text)
    if value > MAX_DEMO_SEEDS:
        raise argparse.ArgumentTypeError(f"at most {MAX_DEMO_SEEDS}, got {value}")
    return value


def register(subparsers) -> None:
    """Add the ``train``, ``demo`` and ``compare`` sub-commands."""
    p = subparsers.add_parser(
        "train", help="GRPO training with any fbands loss (the reference trainer)",
        description="Train a policy with GRPO and a loss from fbands.losses. Options "
                    "override those of --config (a .json or .toml file of the same names).")
    p.add_argument("--config", help="JSON or TOML file of TrainConfig fields")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --run-dir from its last checkpoint (its saved "
                        "config.json is the base; changed options must be resumable)")
    _config_arguments(p)
    p.set_defaults(func=cmd_train, needs="rl")

    p = subparsers.add_parser(
        "demo", help="clip vs band-kl on the tail task with the built-in model, 3 paired seeds "
        "(about a minute on 2 idle CPU cores)",
        description="Train the built-in tiny model on the tail task with PPO clip (eps 0.2) "
                    "and with band-kl (delta 0.05) on paired seeds, then plot the mean "
                    "curves and print the means and the steps to 0.8 accuracy seed by seed.")
    p.add_argument("--out", default="runs/demo",
                   help="folder for the runs (one per loss and seed: LOSS-sSEED) and the plot")
    p.add_argument("--steps", type=positive_int, default=None,
                   help=f"RL steps per run (default: {DEMO_STEPS}; {DEMO_PRETRAINED_STEPS} with "
                        "--model)")
    p.add_argument("--model", default="tiny",
                   help="'tiny' (the built-in model on the tail task) or a pretrained model "
                        "(e.g. smollm2-135m: the sum task, LoRA, a few minutes on a CPU)")
    p.add_argument("--seed", type=int, default=0, help="the first seed (default: 0)")
    p.add_argument("--seeds", type=_seed_count, default=None,
                   help=f"paired seeds per loss: --seed, --seed + 1, ... (default: {DEMO_SEEDS}; "
                        "1 with --model)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    p.add_argument("--force", action="store_true",
                   help="replace runs in --out that the demo did not write (a previous demo's "
                        "are replaced anyway); only the run files (" + ", ".join(DEMO_FILES)
                        + ") are removed, never other files")
    p.set_defaults(func=cmd_demo, needs="rl")

    p = subparsers.add_parser(
        "compare", help="plot reward/accuracy/entropy of runs and print a table",
        description="Draw reward, accuracy and entropy curves of the given run folders into "
                    "one PNG and print a summary table.")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--out", type=image_path, default="compare.png",
                   help="image to write; .png is added to a name without extension "
                        "(default: %(default)s)")
    p.add_argument("--target", type=float, default=0.8,
                   help="accuracy whose first step the table reports (default: %(default)s)")
    p.set_defaults(func=cmd_compare)


def cmd_train(args: argparse.Namespace) -> int:
    # options first: a mistake is reported before torch and transformers load (seconds)
    cfg = _config_from_args(args).validate()  # (a ConfigError: one line, exit 2)
    from fbands.rl.train import NonFiniteLossError, train

    try:
        last = train(cfg, resume=args.resume)
    except NonFiniteLossError as err:
        print(f"fbands train: {err}", file=sys.stderr)
        return 1
    print({k: round(v, 4) if isinstance(v, float) else v for k, v in last.items()
           if k in ("step", "reward", "accuracy", "p_correct", "entropy")})
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from fbands.rl.compare import compare_seeds
    from fbands.rl.train import train

    out = Path(args.out).expanduser()
    tiny = args.model == "tiny"
    seeds = [args.seed + k for k in range(args.seeds or (DEMO_SEEDS if tiny else 1))]
    groups = {name: [demo_run_dir(out, name, seed) for seed in seeds] for name, _ in DEMO_RUNS}
    folders = [d for dirs in groups.values() for d in dirs]
    for run_dir in folders:  # every folder checked before any is cleared
        _demo_folder_free(run_dir, force=args.force)
    for run_dir in folders:
        for file in DEMO_FILES:
            (run_dir / file).unlink(missing_ok=True)
    base = DEMO_CONFIG if tiny else {**DEMO_PRETRAINED, "model": args.model}
    steps = args.steps  # None, or at least 1 (positive_int refuses --steps 0)
    if steps is None:
        steps = DEMO_STEPS if tiny else DEMO_PRETRAINED_STEPS
    t0 = time.perf_counter()
    for k, seed in enumerate(seeds):
        for name, options in DEMO_RUNS:
            cfg = TrainConfig(**{**base, **options}, steps=steps, seed=seed,
                              run_dir=str(groups[name][k]), progress=not args.no_progress,
                              extra=dict(DEMO_MARK))
            t_run = time.perf_counter()
            train(cfg)
            print(f"{name}, seed {seed}: {time.perf_counter() - t_run:.1f} s", file=sys.stderr)
    table = compare_seeds(groups, seeds, out / "compare.png")
    print(table)
    print(f"\nplot: {out / 'compare.png'}   total time {time.perf_counter() - t0:.0f} s")
    return 0


def _demo_folder_free(run_dir: Path, *, force: bool) -> None:
    """Refuse (a ConfigError) a run folder that holds a run the demo did not write, unless
    ``force``: a previous demo's folder (marked in its config.json, and holding only the
    demo's files) is the demo's to replace."""
    present = [f for f in DEMO_FILES if (run_dir / f).exists()]
    if not present or force:
        return
    try:
        mark = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))["extra"]
    except (OSError, ValueError, KeyError, TypeError):
        mark = None
    others = sorted(p.name for p in run_dir.iterdir() if p.name not in DEMO_FILES)
    if isinstance(mark, dict) and mark.get("written_by") == DEMO_MARK["written_by"] \
            and not others:
        return
    why = (f"it holds files the demo did not write ({', '.join(others[:3])}"
           f"{', ...' if len(others) > 3 else ''})" if others else
           "the demo did not write that run")
    raise ConfigError(f"{str(run_dir)!r} already holds a run and {why}: choose another --out, "
                      f"or pass --force to replace its {', '.join(present)} (other files are "
                      "kept)")


def cmd_compare(args: argparse.Namespace) -> int:
    from fbands.rl.compare import compare

    try:
        table = compare(args.run_dirs, args.out, target=args.target)
    except ValueError as err:
        print(f"fbands: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    print(table)
    print(f"\nplot: {args.out}")
    return 0
