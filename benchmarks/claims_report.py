"""``claims.md`` and its plots from the result files of ``benchmarks/claims.py``.

Every number of the report is computed here from the committed JSON files; nothing is
typed in.  Paired differences are band minus the other loss, seed by seed (or prompt by
prompt for the step-1 replay), with 95 % t-intervals (bootstrap percentiles for the
replay).  A verdict reads an interval: *shown* when it excludes 0 on the side the claim
predicts, *refuted* when it excludes 0 on the other side, *not shown* otherwise.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import controls_report
import numpy as np
from controls import ENTROPY_LEVELS, TARGET, entropy_at, holm, offpolicy_outside, steps_to

#: the band radius of the presets: the width-control verdict reads this one, not the best
PRESET_DELTA = 0.05
#: step-1 reward each real-model design expects (issue 28: P(Yes) near 0.04 behind the
#: skeptical prompt; the untrained model's sampled pass rate on `sum`, llm_passrates.md)
ESTIMATES = {"T": 0.04, "S": 0.22}


# --- statistics -----------------------------------------------------------------------------
def t_interval(values) -> dict | None:
    """Mean, 95 % t-interval and n of ``values`` (None entries dropped)."""
    from scipy import stats

    v = [x for x in values if x is not None and math.isfinite(x)]
    if len(v) < 2:
        return None if not v else {"mean": v[0], "lo": None, "hi": None, "n": 1, "sd": None,
                                   "values": v}
    mean, sd = statistics.fmean(v), statistics.stdev(v)
    half = stats.t.ppf(0.975, len(v) - 1) * sd / math.sqrt(len(v))
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "n": len(v), "sd": sd,
            "values": v}


def detectable(ci: dict | None) -> float | None:
    """Smallest true paired effect this many seeds detect with 80 % power (two-sided 5 %),
    at the spread that was seen."""
    from scipy import stats

    if not ci or not ci.get("sd"):
        return None
    n = ci["n"]
    return (stats.t.ppf(0.975, n - 1) + stats.t.ppf(0.8, n - 1)) * ci["sd"] / math.sqrt(n)


def bootstrap(values, draws: int = 4000, seed: int = 0) -> dict | None:
    v = np.array([x for x in values if x is not None], dtype=float)
    if len(v) < 2:
        return None
    rng = np.random.default_rng(seed)
    means = v[rng.integers(len(v), size=(draws, len(v)))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return {"mean": float(v.mean()), "lo": float(lo), "hi": float(hi), "n": len(v),
            "values": v.tolist()}


#: fewest paired differences a verdict reads (the designs' 3 seeds): with 2, two values that
#: agree by chance give a narrow interval
MIN_PAIRS = 3


def verdict(ci: dict | None, sign: int = 1) -> str:
    if not ci or ci.get("lo") is None or ci["n"] < MIN_PAIRS:
        return f"not decided (fewer than {MIN_PAIRS} pairs)"
    if ci["lo"] > 0 or ci["hi"] < 0:  # the interval excludes 0
        return "shown" if sign * ci["mean"] > 0 else "refuted"
    return "not shown"


def fmt(ci: dict | None, digits: int = 3) -> str:
    if not ci:
        return "n/a"
    if ci.get("lo") is None:
        return f"{ci['mean']:.{digits}f} (n = 1)"
    return f"{ci['mean']:+.{digits}f} [{ci['lo']:+.{digits}f}, {ci['hi']:+.{digits}f}] " \
           f"(n = {ci['n']})"


def num(x, spec: str = ".3f") -> str:
    """``x`` formatted, or "n/a" for a missing value."""
    return "n/a" if x is None else format(x, spec)


# --- reading runs ---------------------------------------------------------------------------
def series(run: dict, key: str) -> list:
    return [r.get(key) for r in run["rows"]]


def last(run: dict, key: str):
    values = [v for v in series(run, key) if v is not None]
    return values[-1] if values else None


def mean_of(values):
    v = [x for x in values if x is not None]
    return statistics.fmean(v) if v else None


def paired(runs: list[dict], a: str, b: str, value) -> list:
    """``value(run of a) - value(run of b)`` for each seed both have (same width key)."""
    by = {(r["family"], r["width"], r["seed"]): r for r in runs}
    out = []
    for (family, width, seed), run in sorted(by.items(), key=lambda kv: str(kv[0])):
        other = by.get((b, width, seed))
        if family == a and other is not None:
            x, y = value(run), value(other)
            out.append(None if x is None or y is None else x - y)
    return out


# --- the experiments ------------------------------------------------------------------------
def pilot_section(name: str, runs: list[dict]) -> list[str]:
    lr = sorted({f"{r['config']['lr']:g}" for r in runs if "lr" in r["config"]})
    lines = [f"## {name.capitalize()}: 2 steps per real-model configuration "
             f"(learning rate {', '.join(lr)})", "",
             "Go when 5-40 % of the off-policy tokens leave [0.8, 1.2], the step-1 reward is "
             "within two binomial standard errors of its estimate, and the step time fits the "
             "budget.", "",
             "| run | off-policy tokens outside [0.8, 1.2] | step-1 reward (estimate) | "
             "s / step (without evaluation) | go |", "|---|---|---|---|---|"]
    for run in sorted(runs, key=lambda r: r["name"]):
        exp = run["name"].split("-")[0]
        outside = offpolicy_outside(run)
        reward = run["rows"][0]["reward"] if run["rows"] else None
        est = ESTIMATES.get(exp)
        n = run["config"]["prompts_per_step"] * run["config"]["group_size"]
        ok_reward = est is not None and reward is not None and \
            abs(reward - est) <= 2 * math.sqrt(est * (1 - est) / n) + 1 / n
        ok_outside = outside is not None and 0.05 <= outside <= 0.40
        per_step = mean_of(sum(r.get(k) or 0.0 for k in ("time/rollout_s", "time/update_s",
                                                           "time/after_update_s"))
                           for r in run["rows"]) or 0.0
        lines.append(f"| {run['name']} | {outside:.3f} | {reward:.3f} ({est}) | "
                     f"{per_step:.1f} | {'yes' if ok_reward and ok_outside else 'no'} |"
                     if outside is not None and reward is not None else
                     f"| {run['name']} | n/a | n/a | {per_step:.1f} | no |")
    return lines


def real_section(exp: str, runs: list[dict], plots: Path, out: dict) -> list[str]:
    families = sorted({r["family"] for r in runs})
    key = "logp_correct" if exp == "T" else "reward"
    lines = [f"## Experiment {exp}", ""]
    if exp == "T":
        lines += ["SmolLM2-135M, `verify` with every statement true and a skeptical system "
                  "prompt, so the rewarded first word \"Yes\" starts as a tail token. Endpoint: "
                  "held-out log P(Yes), teacher-forced, summed over the spellings the grading "
                  "accepts (Yes, yes, YES), at the last step and as its mean over the steps "
                  "(the area under the curve over the steps).", ""]
    else:
        lines += ["SmolLM2-135M, `sum` free-form. Endpoints: mean sampled reward over the "
                  "steps (area under the reward curve / steps), final held-out pass@1 and "
                  "pass@8 (8 samples per held-out prompt), held-out first-position entropy.",
                  ""]
    lines += ["| loss | runs | " + ("final log P(Yes) | mean log P(Yes) | mean reward | "
                                     "final greedy accuracy | " if exp == "T"
                                     else "mean reward | final pass@1 | final pass@8 | ")
              + "final first-token entropy | cumulative KL | off-policy outside [0.8, 1.2] |",
              "|---|---|---|---|---|---|---|" + ("---|---|" if exp == "T" else "---|")]
    for f in families:
        mine = [r for r in runs if r["family"] == f]
        cells = ([mean_of(last(r, "logp_correct") for r in mine),
                  mean_of(mean_of(series(r, "logp_correct")) for r in mine),
                  mean_of(mean_of(series(r, "reward")) for r in mine),
                  mean_of(last(r, "accuracy") for r in mine)] if exp == "T" else
                 [mean_of(mean_of(series(r, "reward")) for r in mine),
                  mean_of(last(r, "eval/pass@1") for r in mine),
                  mean_of(last(r, "eval/pass@8") for r in mine)])
        cells += [mean_of(last(r, "entropy/first") for r in mine),
                  mean_of(last(r, "kl/cumulative") for r in mine),
                  mean_of(offpolicy_outside(r) for r in mine)]
        lines.append(f"| {f} | {len(mine)} | " + " | ".join(num(c, ".4f") for c in cells) + " |")
    lines += ["", "Paired differences, band-kl minus the other loss, seed by seed "
              "(95 % t-interval):", "",
              "| endpoint | vs | difference | smallest detectable effect | verdict |",
              "|---|---|---|---|---|"]
    endpoints = ([("final log P(Yes)", lambda r: last(r, "logp_correct"), 1),
                  ("mean log P(Yes)", lambda r: mean_of(series(r, "logp_correct")), 1),
                  ("mean reward", lambda r: mean_of(series(r, "reward")), 1)]
                 if exp == "T" else
                 [("mean reward", lambda r: mean_of(series(r, "reward")), 1),
                  ("final pass@1", lambda r: last(r, "eval/pass@1"), 1),
                  ("final pass@8", lambda r: last(r, "eval/pass@8"), 1),
                  ("final first-token entropy", lambda r: last(r, "entropy/first"), 1),
                  ("final token entropy of the samples", lambda r: last(r, "entropy"), 1),
                  ("first-token entropy at equal pass@1", _entropy_at(runs), 1)])
    for name, value, sign in endpoints:
        for other in (f for f in families if f != "band-kl"):
            ci = t_interval(paired(runs, "band-kl", other, value))
            out[f"{exp}: {name} vs {other}"] = (ci, verdict(ci, sign))
            mde = detectable(ci)
            lines.append(f"| {name} | {other} | {fmt(ci)} | "
                         f"{'n/a' if mde is None else f'{mde:.3f}'} | {verdict(ci, sign)} |")
    if exp == "T":
        replay = []
        by = {(r["family"], r["seed"]): r for r in runs}
        for (family, seed), run in by.items():
            clip = by.get(("clip", seed))
            if family == "band-kl" and clip and run["rows"] and clip["rows"]:
                a = run["rows"][0].get("dlogp/tail_A+_per_prompt") or []
                b = clip["rows"][0].get("dlogp/tail_A+_per_prompt") or []
                replay += [x - y for x, y in zip(a, b, strict=False)
                           if x is not None and y is not None]
        ci = bootstrap(replay)
        out["T: step-1 replay, tail log-p gain vs clip"] = (ci, verdict(ci))
        lines += ["", "Step 1 replayed exactly (same rollout and weights for every loss): the "
                  "log-p gain of tail tokens (p < 0.1) with A > 0, band-kl minus clip, per "
                  f"prompt (bootstrap 95 %): {fmt(ci, 4)}; {verdict(ci)}."]
    lines += ["", _mechanism_table(runs), "", f"![{exp}](claims_{exp}.png)"]
    _plot_real(exp, runs, key, plots / f"claims_{exp}.png")
    return lines


def _entropy_at(runs: list[dict]):
    """A function of a run: its held-out first-token entropy interpolated at one pass@1
    level shared by every run (the median of the runs' mean pass@1 over the evaluations),
    from its evaluation steps ordered by pass@1; None when the run never straddles it."""
    means = [v for v in (mean_of(series(r, "eval/pass@1")) for r in runs) if v is not None]
    level = statistics.median(means) if means else None

    def value(run):
        pts = sorted((r["eval/pass@1"], r["entropy/first"]) for r in run["rows"]
                     if r.get("eval/pass@1") is not None and r.get("entropy/first") is not None)
        if level is None or len(pts) < 2 or not pts[0][0] <= level <= pts[-1][0]:
            return None
        return float(np.interp(level, [p[0] for p in pts], [p[1] for p in pts]))

    return value


def _mechanism_table(runs: list[dict]) -> str:
    """Mean change of log p over a step, by old probability and sign of A, per loss."""
    from fbands.rl.diagnostics import P_OLD_BINS

    head = "| loss | " + " | ".join(f"A>0 {b}" for b in P_OLD_BINS) + " | " + \
        " | ".join(f"A<0 {b}" for b in P_OLD_BINS) + " |"
    lines = ["Change of log p of the sampled tokens over a step (mean over steps and seeds; "
             "tokens per step in brackets):", "", head,
             "|---|" + "---|" * (2 * len(P_OLD_BINS))]
    for f in sorted({r["family"] for r in runs}):
        mine = [r for r in runs if r["family"] == f]
        cells = []
        for side in ("A+", "A-"):
            for b in P_OLD_BINS:
                d = mean_of(v for r in mine for v in series(r, f"dlogp/{side}/{b}"))
                n = mean_of(v for r in mine for v in series(r, f"tokens/{side}/{b}"))
                cells.append("n/a" if d is None else f"{d:+.3f} ({n:.1f})")
        lines.append(f"| {f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_mechanism(groups: dict[str, list[dict]], path: Path) -> None:
    """Bars of the mean change of log p by old-probability bin and sign of A, per loss."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fbands.rl.diagnostics import P_OLD_BINS

    fig, axes = plt.subplots(1, len(groups), figsize=(5.5 * len(groups), 3.8), squeeze=False)
    for ax, (title, runs) in zip(axes[0], groups.items(), strict=True):
        families = sorted({r["family"] for r in runs})
        slots = [(side, b) for side in ("A+", "A-") for b in P_OLD_BINS]
        width = 0.8 / max(len(families), 1)
        for k, f in enumerate(families):
            mine = [r for r in runs if r["family"] == f]
            heights = [mean_of(v for r in mine for v in series(r, f"dlogp/{side}/{b}")) or 0.0
                       for side, b in slots]
            ax.bar(np.arange(len(slots)) + k * width, heights, width, label=f)
        ax.set_xticks(np.arange(len(slots)) + 0.4 - width / 2,
                      [f"{side}\n{b}" for side, b in slots], fontsize=7)
        ax.axhline(0, color="k", lw=0.6)
        ax.set(title=title, ylabel="mean change of log p over a step")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_paired(verdicts: dict[str, tuple], path: Path) -> None:
    """Every verdict's paired differences (one dot per seed or prompt) and its interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    items = [(k, ci) for k, (ci, _) in verdicts.items() if ci and ci.get("values")]
    if not items:
        return
    fig, axes = plt.subplots(len(items), 1, figsize=(8, 0.9 * len(items) + 0.6),
                             squeeze=False)
    for ax, (name, ci) in zip(axes[:, 0], items, strict=True):
        ax.scatter(ci["values"], np.zeros(len(ci["values"])), s=14, alpha=0.7)
        if ci.get("lo") is not None:
            ax.plot([ci["lo"], ci["hi"]], [0.25, 0.25], color="tab:red", lw=2)
        ax.scatter([ci["mean"]], [0.25], color="tab:red", s=20)
        ax.axvline(0, color="k", lw=0.6)
        ax.set_yticks([])
        ax.set_ylim(-0.5, 0.7)
        ax.set_title(name, fontsize=8, loc="left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_real(exp: str, runs: list[dict], key: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"clip": "tab:blue", "band-kl": "tab:red", "clip-wide": "tab:green",
              "clip-higher": "tab:purple"}
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    label = "held-out log P(Yes)" if exp == "T" else "sampled reward"
    for run in runs:
        c = colors.get(run["family"], "k")
        steps = series(run, "step")
        axes[0].plot(steps, series(run, key), color=c, alpha=0.7, lw=1.2)
        axes[1].plot(series(run, "kl/cumulative"), series(run, key), color=c, alpha=0.7,
                     lw=1.2)
        if exp == "T":
            for key, marker in (("update/ratio_q05", "o"), ("update/ratio_q95", "^")):
                pts = [(k + 1, v) for r in run["rows"] for k, v in enumerate(r.get(key) or [])
                       if k > 0 and v is not None and v > 0]  # update 1 is on-policy
                if pts:
                    axes[2].scatter(*zip(*pts, strict=True), color=c, s=6, marker=marker)
        else:
            pts = [(r.get("reward"), r.get("entropy/first")) for r in run["rows"]
                   if r.get("entropy/first") is not None]
            axes[2].plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=c, ms=3)
    for f, c in colors.items():
        if any(r["family"] == f for r in runs):
            axes[0].plot([], [], color=c, label=f)
    axes[0].legend(fontsize=8)
    axes[0].set(xlabel="RL step", ylabel=label, title=f"{exp}: {label} by step")
    axes[1].set(xlabel="cumulative KL(old || new)", ylabel=label, title="against KL")
    if exp == "T":
        axes[2].set(xlabel="update within the step (1 is on-policy)",
                    ylabel="ratio (5 % dots, 95 % triangles)", title="off-policy ratios by "
                    "minibatch, every step")
        if axes[2].collections:  # a log scale needs points
            axes[2].set_yscale("log")
        axes[2].xaxis.get_major_locator().set_params(integer=True)
    else:
        axes[2].set(xlabel="sampled reward (evaluation steps)",
                    ylabel="first-token entropy (held out)", title="entropy against reward")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def width_section(runs: list[dict], plots: Path, out: dict) -> list[str]:
    """Steps to 0.8 against KL, clip family against band family, paired by seed."""
    def kl(run):
        return mean_of(series(run, "kl/update"))

    fam = {}
    for r in runs:
        fam.setdefault((r["family"], r["width"]), []).append(r)
    lines = ["## Width control (built-in model, `tail`)", "",
             "Each loss at five widths, paired seeds. For each band radius, the clip family's "
             "steps to 0.8 are interpolated (linearly in log KL, seed by seed) at the band's "
             "mean per-step KL; a negative difference means the band learns faster than a clip "
             "of the same KL.", "",
             "| loss | width | reached 0.8 | steps to 0.8 (never = 31) | per-step KL | final "
             "first-token entropy |", "|---|---|---|---|---|---|"]
    for (f, w), mine in sorted(fam.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        steps = [steps_to(r) for r in mine]
        reached = sum(s <= r["config"]["steps"] for s, r in zip(steps, mine, strict=True))
        entropy = mean_of(last(r, "entropy/first") for r in mine)
        lines.append(f"| {f} | {w:g} | {reached}/{len(mine)} | {statistics.fmean(steps):.1f} | "
                     f"{num(mean_of(kl(r) for r in mine), '.4f')} | {num(entropy)} |")
    clip_widths = sorted({w for f, w in fam if f == "clip"})
    clip_kl = [mean_of(kl(r) for r in fam[("clip", w)]) for w in clip_widths]
    order = np.argsort(clip_kl)
    lines += ["", "| band delta | band KL | inside the clip family's KL range | steps, band minus "
              "clip at equal KL | verdict |", "|---|---|---|---|---|"]
    best = None
    for d in sorted({w for f, w in fam if f == "band-kl"}):
        band_kl = mean_of(kl(r) for r in fam[("band-kl", d)])
        inside = min(clip_kl) <= band_kl <= max(clip_kl)
        diffs = []
        for r in fam[("band-kl", d)]:
            by_seed = [next((x for x in fam[("clip", w)] if x["seed"] == r["seed"]), None)
                       for w in clip_widths]
            if any(x is None for x in by_seed):
                continue
            ys = [steps_to(by_seed[i]) for i in order]
            xs = [math.log(clip_kl[i]) for i in order]
            diffs.append(steps_to(r) - float(np.interp(math.log(band_kl), xs, ys)))
        ci = t_interval(diffs)
        v = verdict(ci, -1) if inside else "outside the range (extrapolated)"
        lines.append(f"| {d:g} | {band_kl:.4f} | {'yes' if inside else 'no'} | {fmt(ci, 2)} | "
                     f"{v} |")
        if d == PRESET_DELTA:  # the verdict reads the preset's radius, chosen before the runs
            best = (ci, v if inside else "not decided (outside the range)")
    if best:
        out[f"width: band-kl {PRESET_DELTA:g} vs the clip family at equal KL (steps)"] = best

    pair = [r for r in runs if (r["family"], r["width"]) in (("band-kl", PRESET_DELTA),
                                                             ("clip", 0.2))]
    unlabelled = [dict(r, width=None) for r in pair]
    ci = t_interval(paired(unlabelled, "band-kl", "clip", entropy_at(TARGET, "entropy/first")))
    out["width: first-token entropy at 0.8 accuracy, band-kl 0.05 vs clip 0.2"] = (
        ci, verdict(ci))
    token = t_interval(paired(unlabelled, "band-kl", "clip",
                              lambda r: mean_of(series(r, "entropy"))))
    out["width: token entropy of the samples, mean over steps, band-kl 0.05 vs clip 0.2"] = (
        token, verdict(token))
    lines += ["", "At equal accuracy (the first step at 0.8), the first-token entropy on the "
              "evaluation prompts (which training also draws), "
              f"band-kl {PRESET_DELTA:g} minus clip 0.2, paired by seed: {fmt(ci)}; "
              f"{verdict(ci)} (claim 2 predicts a higher entropy for the band). The token "
              "entropy of the samples at the first step reaching each accuracy level, paired "
              "on the seeds that reach it under both losses:", ""]
    for level in ENTROPY_LEVELS:
        at = t_interval(paired(unlabelled, "band-kl", "clip", entropy_at(level)))
        out[f"width: token entropy at accuracy {level:g}, band-kl 0.05 vs clip 0.2"] = (
            at, verdict(at))
        lines.append(f"* accuracy {level:g}: {fmt(at)}; {verdict(at)}")
    _plot_width(fam, kl, plots / "claims_width.png")
    lines += ["", "![width](claims_width.png)"]
    return lines


def _plot_width(fam, kl, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for f, c in (("clip", "tab:blue"), ("band-kl", "tab:red")):
        pts = sorted((mean_of(kl(r) for r in mine), statistics.fmean(steps_to(r) for r in mine),
                      statistics.stdev(steps_to(r) for r in mine) / math.sqrt(len(mine))
                      if len(mine) > 1 else 0.0, w)
                     for (g, w), mine in fam.items() if g == f)
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts],
                    color=c, marker="o", label=f, capsize=3)
        for x, y, _, w in pts:
            ax.annotate(f"{w:g}", (x, y), textcoords="offset points", xytext=(4, 4),
                        fontsize=7, color=c)
    ax.set_xscale("log")
    ax.set(xlabel="mean per-step KL(old || new)", ylabel="steps to 0.8 accuracy",
           title="tail task: speed against trust-region size")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def toy_pair_section(name: str, runs: list[dict], out: dict) -> list[str]:
    """dose, two, addition: band-kl 0.05 against clip 0.2, paired by seed."""
    lines = []
    if name == "dose":
        lines += ["## Dose-response over the tail share (built-in model, `tail`)", "",
                  "The rewarded answer's share of the warm-start data sets how rare its first "
                  "token is. band-kl (0.05) minus clip (0.2), paired by seed:", "",
                  "| tail share | steps to 0.8 (never = steps + 1), band minus clip | accuracy "
                  "averaged over the steps (uncensored), band minus clip | final P(correct), "
                  "band minus clip | verdict (steps) |", "|---|---|---|---|---|"]
        for share in sorted({r["width"] for r in runs}):
            mine = [r for r in runs if r["width"] == share]
            ci = t_interval(paired(mine, "band-kl", "clip", steps_to))
            ca = t_interval(paired(mine, "band-kl", "clip",
                                   lambda r: mean_of(series(r, "accuracy"))))
            cp = t_interval(paired(mine, "band-kl", "clip", lambda r: last(r, "p_correct")))
            out[f"dose: steps to 0.8 at tail share {share:g}"] = (ci, verdict(ci, -1))
            lines.append(f"| {share:g} | {fmt(ci, 2)} | {fmt(ca)} | {fmt(cp)} | "
                         f"{verdict(ci, -1)} |")
    elif name == "two":
        def rare_share(run):
            tail = run["rows"][-5:]
            rev = mean_of(r.get("solution/reverse") for r in tail)
            rot = mean_of(r.get("solution/rotate") for r in tail)
            return None if rev is None or rot is None or rev + rot == 0 else rev / (rev + rot)

        def reward(run):
            return mean_of(r.get("reward") for r in run["rows"][-5:])

        ci = t_interval(paired(runs, "band-kl", "clip", rare_share))
        cr = t_interval(paired(runs, "band-kl", "clip", reward))
        out["two: rare solution's share of the rewarded answers"] = (ci, verdict(ci))
        lines += ["## Two rewarded solutions (built-in model, `tail`)", "",
                  "The reversal (rare in the warm start) and the rotation (commoner) both earn "
                  "reward 1. Over the last 5 steps: the reversal's share of the rewarded "
                  "samples, and the sampled reward; band-kl (0.05) minus clip (0.2), paired:",
                  "", f"* rare solution's share: {fmt(ci)}; {verdict(ci)}",
                  f"* sampled reward: {fmt(cr)}"]
        for f in sorted({r["family"] for r in runs}):
            mine = [r for r in runs if r["family"] == f]
            lines.append(f"* {f}: rare share {num(mean_of(rare_share(r) for r in mine))}, "
                         f"reward {num(mean_of(reward(r) for r in mine))}")
    else:
        def acc(run):
            return mean_of(r.get("accuracy") for r in run["rows"][-5:])

        endpoints = {"accuracy, last 5 steps": acc,
                     "mean sampled reward": lambda r: mean_of(series(r, "reward")),
                     "mean per-step KL": lambda r: mean_of(series(r, "kl/update")),
                     "mean token entropy": lambda r: mean_of(series(r, "entropy"))}
        lines += ["## Negative control: `addition` (built-in model, no tail)", "",
                  "No rare rewarded token: a difference here would come from the loss's width "
                  "alone (expected: not shown). Band-kl minus clip, paired by seed, every "
                  "endpoint the runs logged:", ""]
        for name, value in endpoints.items():
            ci = t_interval(paired(runs, "band-kl", "clip", value))
            out[f"addition (negative control): {name}"] = (ci, verdict(ci))
            lines.append(f"* {name}: {fmt(ci, 4)}; {verdict(ci)}")
        for f in sorted({r["family"] for r in runs}):
            mine = [r for r in runs if r["family"] == f]
            lines.append(f"* {f}: accuracy on the evaluation prompts (which training also "
                         "draws) at step 1 "
                         f"{num(mean_of(series(r, 'accuracy')[0] for r in mine))}, over the "
                         f"last 5 steps {num(mean_of(acc(r) for r in mine))}")
    return lines


#: The summary's questions, each with the verdict keys (prefixes) that answer it; every key
#: answers one question only, and each endpoint is named for what it measures (the toy's
#: steps to 0.8 measure speed, not a higher level of accuracy).
QUESTIONS = (
    ("higher final accuracy or reward (SmolLM2 `sum`)",
     ("S: final pass@1 vs clip", "S: mean reward vs clip")),
    ("faster learning of a rewarded rare answer (toy `tail`)",
     ("width: band-kl", "dose:", "two:")),
    ("higher entropy", ("S: final first-token entropy vs clip",
                        "S: final token entropy of the samples vs clip",
                        "S: first-token entropy at equal pass@1 vs clip",
                        "width: first-token entropy", "width: token entropy")),
    ("a real tail token gains more (SmolLM2 `verify`)", ("T:",)),
    ("negative control: no difference expected (toy `addition`)", ("addition",)),
)
#: The dose runs at the width control's share (0.06) are the width control's own runs of
#: clip 0.2 and band-kl 0.05, bit for bit: not separate evidence, so no verdict of their own.
DUPLICATE = "dose: steps to 0.8 at tail share 0.06"


def t_pvalue(ci: dict | None) -> float | None:
    """Two-sided p of a paired t-interval's mean against 0 (None without a spread)."""
    from scipy import stats

    if not ci or not ci.get("sd") or ci.get("n", 0) < 2:
        return None
    t = abs(ci["mean"]) / (ci["sd"] / math.sqrt(ci["n"]))
    return float(2 * stats.t.sf(t, ci["n"] - 1))


def summary_rows(verdicts: dict[str, tuple]) -> list[str]:
    """The summary table: one block per question, each verdict once, with its raw 95 %
    interval and its Holm-adjusted p over every t-tested row of the table."""
    rows = []
    for question, prefixes in QUESTIONS:
        for key, (ci, v) in verdicts.items():
            if key != DUPLICATE and any(key.startswith(p) for p in prefixes):
                rows.append((question, key, ci, v))
    raw = {key: t_pvalue(ci) for _, key, ci, _ in rows}
    adjusted = holm({k: p for k, p in raw.items() if p is not None})
    lines = ["| question | test | band minus other (95 %) | p | p, Holm | verdict |",
             "|---|---|---|---|---|---|"]
    for question, key, ci, v in rows:
        lines.append(f"| {question} | {key} | {fmt(ci)} | {num(raw[key], '.3g')} | "
                     f"{num(adjusted.get(key), '.3g')} | {v} |")
    return lines


def write_report(results: dict[str, list[dict]], out_dir: Path, machine: str) -> Path:
    """Write ``claims.md`` (and the PNGs beside it) from the result files; return its path."""
    verdicts: dict[str, tuple] = {}
    body: list[str] = []
    for name in sorted(n for n in results if n.startswith("pilot")):
        body += pilot_section(name, results[name]) + [""]
    # the adjusted design's pilot is the first 2 steps of its seed-0 runs
    adjusted = [dict(r, name=f"{exp}-{r['name']}", rows=r["rows"][:2])
                for exp in ("T", "S") for r in results.get(exp, []) if r["seed"] == 0]
    if adjusted:
        body += pilot_section("pilot of the adjusted design (steps 1-2 of the seed-0 runs)",
                              adjusted) + [""]
    for exp in ("T", "S", "S-gpu"):
        if exp in results:
            body += real_section(exp, results[exp], out_dir, verdicts) + [""]
    if "width" in results:
        body += width_section(results["width"], out_dir, verdicts) + [""]
    for name in ("dose", "two", "addition"):
        if name in results:
            body += toy_pair_section(name, results[name], verdicts) + [""]
    body += controls_report.section(results)
    groups = {f"{exp} (SmolLM2-135M)": results[exp] for exp in ("T", "S") if exp in results}
    if "width" in results:
        groups["width control, clip 0.2 and band-kl 0.05"] = [
            r for r in results["width"] if (r["family"], r["width"]) in (("clip", 0.2),
                                                                      ("band-kl", 0.05))]
    if groups:
        plot_mechanism(groups, out_dir / "claims_mechanism.png")
        body += ["## Where the probability moved", "",
                 "The mean change of log p of the sampled tokens over a step, by old "
                 "probability and sign of the advantage (tables above).", "",
                 "![mechanism](claims_mechanism.png)", ""]
    plot_paired(verdicts, out_dir / "claims_paired.png")
    summary = summary_rows(verdicts)
    counts = {e: len(r) for e, r in results.items()}
    text = ["# BandPO's claims, tested (generated by `benchmarks/claims.py`)", "",
            f"Runs per experiment: {counts}; {machine}. Regenerate with `make bench-claims` "
            "(runs only what is missing, then this report).", "",
            "## Verdicts", "",
            "A verdict reads a 95 % interval of a paired difference: *shown* when it excludes "
            "0 on the side the claim predicts, *refuted* when it excludes 0 on the other side, "
            "*not shown* otherwise (which at 3 seeds often means the design is too small; the "
            "smallest detectable effect is given where it applies). The verdicts read the raw "
            "intervals of these exploratory tests; beside them, each p-value adjusted by Holm's "
            "method over every t-tested row of this table, which says which would survive a "
            "correction for testing many at once. Each test answers one question only. The "
            f"dose runs at share 0.06 are the width control's runs, so `{DUPLICATE}` is not "
            "counted. The decisive control of band against Clip-Higher and the step-1 "
            "replay on SmolLM2 (E4), each planned before its runs, have their own tests and "
            "corrections (sections *Band or higher upper clip?* and *E4* below).", "",
            *summary, "",
            "Per seed (or, for the step-1 replay, per prompt), the differences behind each "
            "verdict:", "", "![paired differences](claims_paired.png)", "", *body]
    path = out_dir / "claims.md"
    path.write_text("\n".join(text).rstrip() + "\n")
    return path
