"""Compare runs: reward, accuracy and entropy curves in one PNG, and a summary table."""

from __future__ import annotations

import json
import math
from pathlib import Path

CURVES = (("reward", "mean sampled reward"), ("accuracy", "greedy accuracy (held out)"),
          ("p_correct", "P(rewarded answer), held out"), ("entropy", "token entropy (nats)"))


def load_run(run_dir: str | Path) -> tuple[dict, list[dict]]:
    """``(config, metrics rows)`` of a run folder written by :func:`fbands.rl.train.train`."""
    run_dir = Path(run_dir)
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise ValueError(f"{str(run_dir)!r} is not a run folder (no metrics.jsonl)")
    config_path = run_dir / "config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    if not isinstance(config, dict):
        raise ValueError(f"{str(config_path)!r} holds no table of options")
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as err:
            raise ValueError(f"{path}, line {number}: not valid JSON ({err})") from None
        rows.append(_checked_row(current_names(row), f"{path}, line {number}"))
    return config, rows


#: Names that runs of earlier versions wrote -> the names of the metric vocabulary
#: (``docs/guides/metrics.md``), under which :func:`load_run` reads them.
LEGACY_NAMES = {"delta": "band/delta", "delta/measured_kl": "band/measured_kl",
                "delta/next": "band/delta_next", "gate/weight": "band/gate_weight"}


#: The ``loss/`` names that are losses, not :func:`fbands.losses.policy_loss` metrics: they
#: keep their names.
LOSS_NAMES = ("loss/total", "loss/pg", "loss/kl_ref")


def current_names(row: dict) -> dict:
    """``row`` with the metric names of earlier versions replaced by today's: every other
    ``loss/<key>`` (a metric of :func:`fbands.losses.policy_loss`) became ``band/<key>``, and
    :data:`LEGACY_NAMES`.  (No torch needed: ``fbands compare`` runs in a core install.)"""
    if not isinstance(row, dict):
        return row

    def new(key):
        if key.startswith("loss/") and key not in LOSS_NAMES:
            return "band/" + key.removeprefix("loss/")
        return LEGACY_NAMES.get(key, key)

    return {new(k): v for k, v in row.items()}


#: the metrics that the plot and the table read, besides ``step``
READ_KEYS = (*(key for key, _ in CURVES), "band/tail_clipfrac_upper", "tokens_per_s")


def _checked_row(row, where: str) -> dict:
    """A metrics line whose step is an integer and whose metrics read here are numbers
    (nan and the infinities pass, as ``train`` writes them); else a ValueError naming the
    line and the key."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: a metrics line is a JSON object, got "
                         f"{type(row).__name__}")
    step = row.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        raise ValueError(f"{where}: 'step' must be an integer, got {step!r:.40}")
    for key in READ_KEYS:
        value = row.get(key, 0.0)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ValueError(f"{where}: {key!r} must be a number, got "
                             f"{json.dumps(value)[:40]}")
    return row


def steps_to(rows: list[dict], key: str, target: float) -> int | None:
    """First step whose ``key`` reaches ``target`` (None if never).

    Example
    -------
    >>> steps_to([{"step": 1, "accuracy": 0.2}, {"step": 2, "accuracy": 0.9}], "accuracy", 0.8)
    2
    """
    for row in rows:
        if key in row and row[key] >= target:
            return int(row["step"])
    return None


def summarize(rows: list[dict], target: float = 0.8) -> dict:
    """Final reward, accuracy and entropy, mean entropy, steps to ``target`` accuracy.

    ``tail_clip_up`` is the mean over steps of ``band/tail_clipfrac_upper``: the share of
    tokens with old probability below 0.1 and a positive advantage whose ratio was clipped
    at the upper edge (the gradient the band is meant to keep).
    """
    def last(key):
        values = [r[key] for r in rows if key in r]
        return values[-1] if values else math.nan

    def mean(key):
        values = [r[key] for r in rows if key in r]
        return sum(values) / len(values) if values else math.nan

    return {"steps": len(rows), "final_reward": last("reward"),
            "final_accuracy": last("accuracy"), "final_p_correct": last("p_correct"),
            "final_entropy": last("entropy"), "mean_entropy": mean("entropy"),
            f"steps_to_acc_{target:g}": steps_to(rows, "accuracy", target),
            "tail_clip_up": mean("band/tail_clipfrac_upper"),
            "tokens_per_s": mean("tokens_per_s")}


def summarize_seeds(summaries: list[dict]) -> dict:
    """One summary of several seeds' :func:`summarize` rows: the mean of each number (an
    integer stays one when every seed has the same); a steps-to count is a mean only when
    every seed reached the target, else it says how many seeds never did.

    Example
    -------
    >>> summarize_seeds([{"steps": 30, "to_0.8": 9}, {"steps": 30, "to_0.8": 12}])
    {'steps': 30, 'to_0.8': 10.5}
    >>> summarize_seeds([{"steps": 30, "to_0.8": 9}, {"steps": 30, "to_0.8": None}])
    {'steps': 30, 'to_0.8': '1/2 never'}
    """
    out: dict = {}
    for key in summaries[0]:
        values = [s[key] for s in summaries]
        if any(v is None for v in values):
            out[key] = f"{values.count(None)}/{len(values)} never"
        elif all(isinstance(v, int) for v in values) and len(set(values)) == 1:
            out[key] = values[0]
        else:
            out[key] = sum(values) / len(values)
    return out


def mean_curve(runs: list[list[dict]]) -> list[dict]:
    """Step by step, the mean over ``runs`` of each metric the plot draws (over the runs that
    logged it at that step)."""
    by_step: dict[int, list[dict]] = {}
    for rows in runs:
        for row in rows:
            by_step.setdefault(row["step"], []).append(row)
    curve = []
    for step in sorted(by_step):
        point = {"step": step}
        for key, _ in CURVES:
            values = [r[key] for r in by_step[step] if key in r]
            if values:
                point[key] = sum(values) / len(values)
        curve.append(point)
    return curve


def format_table(names: list[str], summaries: list[dict]) -> str:
    """A plain-text table, one line per run."""
    keys = list(summaries[0])
    width = max(8, *(len(n) for n in names))
    head = f"{'run':<{width}} " + " ".join(f"{k:>16}" for k in keys)

    def cell(v):
        if v is None:
            return f"{'never':>16}"
        if isinstance(v, float):
            return f"{v:>16.3f}"
        return f"{v!s:>16}"

    lines = [head, "-" * len(head)]
    lines += [f"{n:<{width}} " + " ".join(cell(s[k]) for k in keys)
              for n, s in zip(names, summaries, strict=True)]
    return "\n".join(lines)


def plot_runs(runs: dict[str, list[dict]], out: str | Path, title: str = "") -> Path:
    """Draw the reward, accuracy, P(correct) and entropy curves of ``runs`` into ``out``.

    ``runs`` maps a name to the metric rows of one run.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(CURVES), figsize=(4.5 * len(CURVES), 3.6))
    for ax, (key, label) in zip(axes, CURVES, strict=True):
        for name, rows in runs.items():
            pts = [(r["step"], r[key]) for r in rows if key in r]
            if pts:
                ax.plot(*zip(*pts, strict=True), label=name, lw=1.6)
        ax.set_xlabel("RL step")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    if axes[0].get_legend_handles_labels()[0]:  # (no curve at all: no legend to draw)
        axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def compare(run_dirs: list[str | Path], out: str | Path, target: float = 0.8) -> str:
    """Plot ``run_dirs`` into ``out`` and return the summary table as text.

    Runs are named by their folder name (or ``loss`` from their config when folder names
    collide).
    """
    runs, summaries = {}, []
    for d in run_dirs:
        config, rows = load_run(d)
        name = Path(d).name
        if name in runs:
            name = f"{name} ({config.get('loss', '?')} seed {config.get('seed', '?')})"
        runs[name] = rows
        summaries.append(summarize(rows, target))
    plot_runs(runs, out)
    return format_table(list(runs), summaries)


def compare_seeds(groups: dict[str, list[str | Path]], seeds: list[int], out: str | Path,
                  target: float = 0.8) -> str:
    """The demo's comparison: ``groups`` maps a name (a loss) to its run folders, one per
    seed of ``seeds``, in the same order for every name (paired seeds: the same warm start,
    prompts and first rollouts).

    Plots each group's mean curves into ``out`` and returns the table of each group's mean
    over the seeds (:func:`summarize_seeds`), then the steps to ``target`` accuracy seed by
    seed, and for every group after the first its difference from the first, seed by seed.
    """
    curves, summaries, reached = {}, [], {}
    for name, dirs in groups.items():
        if len(dirs) != len(seeds):
            raise ValueError(f"{name!r} has {len(dirs)} runs for {len(seeds)} seeds")
        runs = [load_run(d)[1] for d in dirs]
        label = name if len(seeds) == 1 else f"{name} (mean of {len(seeds)} seeds)"
        curves[label] = mean_curve(runs)
        summaries.append(summarize_seeds([summarize(rows, target) for rows in runs]))
        reached[name] = [steps_to(rows, "accuracy", target) for rows in runs]
    plot_runs(curves, out)
    lines = [format_table(list(groups), summaries), "",
             f"steps to {target:g} accuracy, seed by seed (seeds {' '.join(map(str, seeds))}):"]
    first, *others = groups
    width = max(len(n) for n in [*groups, *(f"{n} - {first}" for n in others)])

    def cells(values):
        return " ".join(f"{'never' if v is None else v:>5}" for v in values)

    for name in groups:
        lines.append(f"  {name:<{width}} {cells(reached[name])}")
    for name in others:
        diff = [None if a is None or b is None else b - a
                for a, b in zip(reached[first], reached[name], strict=True)]
        lines.append(f"  {name + ' - ' + first:<{width}} "
                     + " ".join(f"{'n/a' if d is None else f'{d:+d}':>5}" for d in diff))
    return "\n".join(lines)
