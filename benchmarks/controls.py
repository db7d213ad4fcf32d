"""The controls that decide between the band and a higher upper clip: runs and analysis plan.

The toy's earlier result (``width`` in ``claims.py``) beats every *symmetric* clip at equal
KL, but on the toy the band's advantage consists of a loose upper edge for rare tokens and a
tight lower edge for common ones, and Clip-Higher (eps_low 0.2, a large eps_high) has both.
These experiments ask whether the band does better than the best such clip.  Everything
below (runs, endpoints, selection rule, tests, correction) was written and committed before
any of their results existed; ``git log benchmarks/controls.py`` shows the order.

E1, the decisive control
    Built-in model, ``tail`` at warm-start shares 0.03 and 0.06, 40 steps, evaluation on a
    held-out fifth of the prompts that neither the warm start nor RL ever trains on
    (``tail_held_out=0.2``).  Losses: clip 0.2; band-kl 0.05; Clip-Higher (eps_low 0.2,
    eps_high in ``CH_HIGH``); a clip without a lower edge (eps_low 1.0, eps_high 0.2); DCPO.
    Seeds 10-29: 10-19 *select*, 20-29 *test*.
E2, the regime bridge
    Share 0.06; 1 or 4 PPO epochs; learning rate 1e-4, 3e-4 or 1e-3; clip 0.2, band-kl 0.05
    and the Clip-Higher that E1 selected at share 0.06; seeds 30-39.  The real-model runs use
    one epoch: does the toy's lead survive it?
E3, more than one initial policy
    Share 0.06, warm-start seeds 1-4 (E1 used 0), seeds 40-49; clip 0.2, band-kl 0.05 and
    E1's Clip-Higher at share 0.06.
E1-edge, Clip-Higher wider than E1's grid (exploratory)
    E1's selection seeds chose the grid's widest upper edge, 4.0, at both shares, so a wider
    one might do better still.  The same runs as E1 with eps_high 8 and 100 (practically no
    upper edge: a token's probability may grow 101-fold), seeds 10-29, both shares.  They
    are reported beside E1 (mean accuracy on the selection and the test seeds, band minus
    each on the test seeds, raw intervals) and change neither E1's selection nor the
    primary family, which were fixed before they existed.
E4, the mechanism on a real vocabulary
    SmolLM2-135M, ``verify`` with every statement true behind the skeptical system prompt
    (experiment T's set-up, :data:`E4_SETUP` changing only its size), **one step**: for a
    seed, every loss starts from the same weights and updates on the same rollout, so the
    losses differ in nothing but the loss (an exact replay of step 1).  Seeds 50-55.
    Losses (:data:`E4_LOSSES`): clip 0.2, band-kl 0.05, Clip-Higher 0.2 / 0.28 (DAPO's) and
    0.2 / 4.0 (E1's choice), and the clip without a lower edge.  The learning rate comes
    from a pilot run before them (clip, seed 99, one step at each rate of
    :data:`E4_PILOT_LR`): the largest rate whose off-policy updates move 5-40 % of the
    tokens out of [0.8, 1.2] (:func:`e4_learning_rate`).

The analysis plan
-----------------
* **Primary endpoint**: held-out greedy accuracy averaged over the 40 steps (:func:`mean_accuracy`):
  uncensored, unlike a threshold that some runs never reach.
* **Secondary endpoints**: steps to 0.8 held-out accuracy, never counted as steps + 1
  (:func:`steps_to`); the KL of the step-1 update; the step-1 change of log p of sampled
  tokens by old-probability bin and sign of the advantage.
* **Selection (E1)**: for each share, the Clip-Higher width with the highest mean primary
  endpoint over the *selection* seeds 10-19 (:func:`select_clip_higher`; a tie goes to the
  smaller eps_high).  Only the test seeds 20-29 enter a test.
* **Tests**: paired by seed, band-kl minus the other loss, a two-sided paired t-test and
  its 95 % interval (:func:`paired_test`).  The primary family (:data:`PRIMARY`) is E1's
  band minus the selected Clip-Higher at each share, band minus clip 0.2 at each share, and
  E2's band minus Clip-Higher at one epoch for each learning rate: seven tests, Holm-
  corrected at 0.05 (:func:`holm`).  Everything else is reported with raw intervals and
  labelled exploratory.
* **Verdicts**: *band better* or *band worse* when the Holm-adjusted p is below 0.05 (by the
  sign of the mean), else *no difference shown* together with the interval, so that a
  reader sees how large a difference the data still allow.
* **E4** (its own family of two tests, Holm-corrected): per seed, the mean over prompts of
  the per-prompt paired difference (:func:`e4_paired`) of the step-1 change of log p of
  tail tokens (old p < 0.1), band-kl minus clip 0.2, once for tokens with A > 0 (the
  *upper* edge's work, the paper's mechanism) and once for A < 0 (the *lower* edge's).
  The t-interval runs over the six seeds, not over prompts: the prompts of a seed share
  one update.  Reading (:func:`e4_verdict`), at Holm-adjusted p < 0.05: the band acts
  through its upper edge if it raises A > 0 tail tokens more than clip (difference > 0),
  through its lower edge if it lowers A < 0 tail tokens more (difference < 0); both may
  hold, and a difference of the other sign is reported as such.  Exploratory, raw
  intervals: the same two endpoints against each Clip-Higher and the lower-free clip, the
  step's KL and the held-out
  log P(Yes) after the step (paired by seed).
* **E3**: per warm start, band minus clip and band minus Clip-Higher on 10 seeds; pooled,
  the mean of the four per-warm-start means with a t-interval over warm starts (3 degrees
  of freedom), because seeds that share a warm start are not independent replicates.
"""

from __future__ import annotations

import math
import statistics

#: the decision's widths of Clip-Higher's upper edge (eps_low stays 0.2)
CH_HIGH = (0.28, 0.6, 1.2, 2.0, 4.0)
SHARES = (0.03, 0.06)
SELECT_SEEDS = tuple(range(10, 20))
TEST_SEEDS = tuple(range(20, 30))
E2_SEEDS = tuple(range(30, 40))
E3_SEEDS = tuple(range(40, 50))
E2_LR = (1e-4, 3e-4, 1e-3)
E2_EPOCHS = (1, 4)
E3_WARM = (1, 2, 3, 4)
TARGET = 0.8
ALPHA = 0.05
BASE = dict(model="tiny", task="tail", steps=40, eval_every=1, eval_prompts=64,
            tail_held_out=0.2)
E1_LOSSES = {"clip": dict(loss="clip", eps_low=0.2, eps_high=0.2),
             "band-kl": dict(loss="band-kl", delta=0.05),
             **{f"ch-{e:g}": dict(loss="clip", eps_low=0.2, eps_high=e) for e in CH_HIGH},
             "clip-nolow": dict(loss="clip", eps_low=1.0, eps_high=0.2),
             "dcpo": dict(loss="dcpo")}
BAND = "band-kl"
#: E1-edge's upper edges, beyond :data:`CH_HIGH`
EDGE_HIGH = (8.0, 100.0)
#: E4: experiment T's set-up (``claims.REAL_T``) with these changes: one step, and four
#: times the prompts so that a seed has tail tokens of both signs on several prompts
E4_SETUP = dict(steps=1, eval_every=1, prompts_per_step=16)
E4_SEEDS = tuple(range(50, 56))
E4_PILOT_SEED = 99
E4_PILOT_LR = (3e-6, 1e-5)
E4_OUTSIDE = (0.05, 0.40)
E4_LOSSES = {"clip": dict(loss="clip", eps_low=0.2, eps_high=0.2),
             "band-kl": dict(loss="band-kl", delta=0.05),
             "ch-0.28": dict(loss="clip", eps_low=0.2, eps_high=0.28),
             "ch-4": dict(loss="clip", eps_low=0.2, eps_high=4.0),
             "clip-nolow": dict(loss="clip", eps_low=1.0, eps_high=0.2)}
#: the two tests of E4's family: the per-prompt endpoint of each sign of A
E4_SIDES = ("A+", "A-")


def _run(experiment, family, seed, config, **labels):
    tag = "".join(f"-{k}{v:g}" for k, v in labels.items())
    return {"name": f"{family}{tag}-s{seed}", "family": family, "width": labels or None,
            "seed": seed, "experiment": experiment, "config": dict(config, seed=seed)}


def e1_runs() -> list[dict]:
    return [_run("E1", family, seed, dict(BASE, tail_share=share, **loss), share=share)
            for share in SHARES for seed in SELECT_SEEDS + TEST_SEEDS
            for family, loss in E1_LOSSES.items()]


def edge_runs() -> list[dict]:
    return [_run("E1-edge", f"ch-{e:g}", seed,
                 dict(BASE, tail_share=share, loss="clip", eps_low=0.2, eps_high=e),
                 share=share)
            for share in SHARES for seed in SELECT_SEEDS + TEST_SEEDS for e in EDGE_HIGH]


def e2_runs(selected: str) -> list[dict]:
    """E2 with ``selected`` (a key of :data:`E1_LOSSES`) as its Clip-Higher."""
    losses = {f: E1_LOSSES[f] for f in ("clip", BAND, selected)}
    return [_run("E2", family, seed, dict(BASE, tail_share=0.06, ppo_epochs=epochs, lr=lr,
                                          **loss), epochs=epochs, lr=lr)
            for epochs in E2_EPOCHS for lr in E2_LR for seed in E2_SEEDS
            for family, loss in losses.items()]


def e3_runs(selected: str) -> list[dict]:
    losses = {f: E1_LOSSES[f] for f in ("clip", BAND, selected)}
    return [_run("E3", family, seed, dict(BASE, tail_share=0.06, warm_start_seed=w, **loss),
                 warm=w)
            for w in E3_WARM for seed in E3_SEEDS for family, loss in losses.items()]


def e4_pilot_runs(base: dict) -> list[dict]:
    """The pilot: clip, one step, at each rate of :data:`E4_PILOT_LR` (``base`` is T's
    set-up)."""
    return [_run("E4-pilot", "clip", E4_PILOT_SEED,
                 dict(base, **E4_SETUP, **E4_LOSSES["clip"], lr=lr), lr=lr)
            for lr in E4_PILOT_LR]


def offpolicy_outside(run: dict) -> float | None:
    """The mean share of tokens outside [0.8, 1.2] in the off-policy updates of a run's
    steps (updates 2, 3, ...: the first sees the weights that sampled)."""
    values = [v for r in run["rows"] for v in (r.get("update/outside") or [])[1:]]
    return statistics.fmean(values) if values else None


def e4_learning_rate(pilot: list[dict]) -> float:
    """The largest pilot rate whose off-policy share outside [0.8, 1.2] lies in
    :data:`E4_OUTSIDE`; raises when a pilot run is missing or no rate qualifies."""
    shares = {(r["width"] or {}).get("lr"): offpolicy_outside(r) for r in pilot}
    missing = [lr for lr in E4_PILOT_LR if shares.get(lr) is None]
    if missing:
        raise ValueError(f"the pilot lacks the rates {missing}")
    low, high = E4_OUTSIDE
    good = [lr for lr in E4_PILOT_LR if low <= shares[lr] <= high]
    if not good:
        raise ValueError(f"no pilot rate moves {low:.0%}-{high:.0%} of the off-policy tokens "
                         f"out of [0.8, 1.2]: {shares}")
    return max(good)


def e4_runs(base: dict, lr: float) -> list[dict]:
    return [_run("E4", family, seed, dict(base, **E4_SETUP, **loss, lr=lr))
            for seed in E4_SEEDS for family, loss in E4_LOSSES.items()]


def e4_paired(runs: list[dict], other: str, side: str) -> list[float]:
    """Per seed of :data:`E4_SEEDS`, the mean over prompts of band minus ``other`` in the
    step-1 change of log p of the prompt's tail tokens with A of ``side`` ("A+" or "A-");
    a prompt enters when both runs have such tokens, a seed when one prompt does."""
    key = f"dlogp/tail_{side}_per_prompt"
    by = {(r["family"], r["seed"]): r for r in runs}
    out = []
    for seed in E4_SEEDS:
        a, b = by.get((BAND, seed)), by.get((other, seed))
        if a is None or b is None:
            continue
        diffs = [x - y for x, y in zip(step1(key)(a) or [], step1(key)(b) or [], strict=True)
                 if x is not None and y is not None]
        if diffs:
            out.append(statistics.fmean(diffs))
    return out


def e4_family(runs: list[dict]) -> dict[str, dict | None]:
    """E4's two tests (band minus clip 0.2, per-seed means of paired prompts), by name."""
    return {f"E4 tail A{side[1]}: band - clip 0.2": paired_test(e4_paired(runs, "clip", side))
            for side in E4_SIDES}


def e4_verdict(side: str, test: dict | None, p_adjusted: float | None) -> str:
    if test is None or p_adjusted is None:
        return "too few runs"
    if p_adjusted >= ALPHA:
        return "no difference shown"
    verb = "raises" if test["mean"] > 0 else "lowers"
    sign = "A > 0" if side == "A+" else "A < 0"
    return f"band {verb} {sign} tail tokens more than clip"


# --- endpoints ------------------------------------------------------------------------------
def mean_accuracy(run: dict) -> float | None:
    """The primary endpoint: held-out accuracy averaged over the steps that evaluated."""
    values = [r["accuracy"] for r in run["rows"] if r.get("accuracy") is not None]
    return statistics.fmean(values) if values else None


def steps_to(run: dict, target: float = TARGET) -> int:
    """First step whose held-out accuracy reaches ``target``; never counts as steps + 1."""
    for r in run["rows"]:
        if r.get("accuracy") is not None and r["accuracy"] >= target:
            return r["step"]
    return run["config"]["steps"] + 1


#: accuracies at which the entropy endpoints compare losses (exploratory)
ENTROPY_LEVELS = (0.5, 0.65, 0.8)


def entropy_at(level: float, key: str = "entropy"):
    """The endpoint ``key`` (the token entropy of the samples by default) at the first step
    whose accuracy (on the evaluation prompts) reaches ``level``: losses compared at equal
    accuracy, not at equal step (None for a run that never reaches it)."""
    def value(run: dict) -> float | None:
        return next((r.get(key) for r in run["rows"]
                     if r.get("accuracy") is not None and r["accuracy"] >= level), None)
    value.__name__ = f"{key} at accuracy {level:g}"
    return value


def step1(key: str):
    """The endpoint ``key`` of the step-1 row (e.g. ``"kl/update"``)."""
    def value(run: dict) -> float | None:
        rows = [r for r in run["rows"] if r.get("step") == 1]
        return rows[0].get(key) if rows else None
    value.__name__ = f"step-1 {key}"
    return value


# --- selection and tests --------------------------------------------------------------------
def _cell(runs: list[dict], **labels) -> list[dict]:
    return [r for r in runs if all((r["width"] or {}).get(k) == v for k, v in labels.items())]


def select_clip_higher(runs: list[dict], share: float) -> str:
    """The Clip-Higher family with the best mean primary endpoint on the selection seeds.

    Reads only runs whose seed is in :data:`SELECT_SEEDS`; raises when one of the widths
    lacks any of them (a choice from part of the data would not be the planned one).
    """
    scores = {}
    for e in CH_HIGH:
        family = f"ch-{e:g}"
        values = {r["seed"]: mean_accuracy(r) for r in _cell(runs, share=share)
                  if r["family"] == family and r["seed"] in SELECT_SEEDS}
        missing = set(SELECT_SEEDS) - set(values)
        if missing:
            raise ValueError(f"{family} at share {share:g} lacks selection seeds "
                             f"{sorted(missing)}")
        scores[family] = statistics.fmean(values.values())
    return max(scores, key=lambda f: (scores[f], -float(f[3:])))


def paired_diffs(runs: list[dict], other: str, value, seeds) -> list[float]:
    """``value(band) - value(other)`` for each seed of ``seeds`` that both losses ran."""
    by = {(r["family"], r["seed"]): r for r in runs}
    out = []
    for seed in seeds:
        a, b = by.get((BAND, seed)), by.get((other, seed))
        if a is not None and b is not None:
            x, y = value(a), value(b)
            if x is not None and y is not None:
                out.append(x - y)
    return out


def paired_test(diffs: list[float]) -> dict | None:
    """Mean, two-sided 95 % t-interval and p-value of paired differences (None below 2)."""
    from scipy import stats

    if len(diffs) < 2:
        return None
    mean, sd, n = statistics.fmean(diffs), statistics.stdev(diffs), len(diffs)
    if sd == 0:
        p = 1.0 if mean == 0 else 0.0
        return {"mean": mean, "lo": mean, "hi": mean, "n": n, "p": p, "values": diffs}
    se = sd / math.sqrt(n)
    half = stats.t.ppf(0.975, n - 1) * se
    p = 2 * stats.t.sf(abs(mean) / se, n - 1)
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "n": n, "p": float(p),
            "values": diffs}


def holm(pvalues: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjusted p-values (family-wise error), by the same keys."""
    order = sorted(pvalues, key=pvalues.get)
    adjusted, running = {}, 0.0
    for i, key in enumerate(order):
        running = max(running, min(1.0, (len(order) - i) * pvalues[key]))
        adjusted[key] = running
    return adjusted


def verdict(test: dict | None, p_adjusted: float | None) -> str:
    if test is None or p_adjusted is None:
        return "too few runs"
    if p_adjusted < ALPHA:
        return "band better" if test["mean"] > 0 else "band worse"
    return "no difference shown"


def primary_family(results: dict[str, list[dict]]) -> dict[str, dict | None]:
    """The seven tests of the primary family (see the module doc), by name; a test whose
    runs are not all there yet is None."""
    tests: dict[str, dict | None] = {}
    e1 = results.get("E1", [])
    for share in SHARES:
        cell = _cell(e1, share=share)
        try:
            selected = select_clip_higher(e1, share)
        except ValueError:
            selected = None
        tests[f"E1 share {share:g}: band - clip 0.2"] = paired_test(
            paired_diffs(cell, "clip", mean_accuracy, TEST_SEEDS))
        tests[f"E1 share {share:g}: band - best Clip-Higher"] = None if selected is None else \
            paired_test(paired_diffs(cell, selected, mean_accuracy, TEST_SEEDS))
    e2 = results.get("E2", [])
    selected = next((r["family"] for r in e2 if r["family"].startswith("ch-")), None)
    for lr in E2_LR:
        cell = _cell(e2, epochs=1, lr=lr)
        tests[f"E2 1 epoch, lr {lr:g}: band - Clip-Higher"] = None if selected is None else \
            paired_test(paired_diffs(cell, selected, mean_accuracy, E2_SEEDS))
    return tests


PRIMARY = ("E1 share 0.03: band - clip 0.2", "E1 share 0.03: band - best Clip-Higher",
           "E1 share 0.06: band - clip 0.2", "E1 share 0.06: band - best Clip-Higher",
           "E2 1 epoch, lr 0.0001: band - Clip-Higher", "E2 1 epoch, lr 0.0003: band - Clip-Higher",
           "E2 1 epoch, lr 0.001: band - Clip-Higher")


def pooled(means: list[float]) -> dict | None:
    """E3's pooled estimate: the mean of per-warm-start mean differences, with a t-interval
    over warm starts (they, not seeds, are the independent replicates)."""
    return paired_test(means)
