"""The report of the controls E1-E4 (plan and statistics in ``controls.py``).

Every number is computed from the result files; the primary family's p-values are Holm-
corrected together, a test whose runs are missing counting as p = 1 (the correction never
grows less strict while runs are pending).
"""

from __future__ import annotations

import statistics

import controls as c


def _mean(values) -> float | None:
    v = [x for x in values if x is not None]
    return statistics.fmean(v) if v else None


def _num(x, spec=".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def _ci(test: dict | None, digits: int = 3) -> str:
    if not test:
        return "pending"
    return (f"{test['mean']:+.{digits}f} [{test['lo']:+.{digits}f}, {test['hi']:+.{digits}f}]"
            f" (n = {test['n']})")


def _bins() -> list[tuple[str, str]]:
    """The (sign of A, old-p bin) columns of the step-1 log-p change tables."""
    from fbands.rl.diagnostics import P_OLD_BINS

    return [(side, b) for side in ("A+", "A-") for b in P_OLD_BINS]


def _bin_head() -> str:
    return " | ".join(f"A{'>' if side == 'A+' else '<'}0 {b}" for side, b in _bins())


def _bin_cells(runs: list[dict]) -> str:
    """The mean step-1 change of log p of ``runs``' sampled tokens, per column of
    :func:`_bins`."""
    return " | ".join(_num(_mean(c.step1(f"dlogp/{side}/{b}")(r) for r in runs), "+.3f")
                      for side, b in _bins())


def primary_rows(results: dict[str, list[dict]]) -> list[tuple[str, dict | None, float, str]]:
    """``(name, test, Holm-adjusted p, verdict)`` for each test of the primary family."""
    tests = c.primary_family(results)
    adjusted = c.holm({k: (t["p"] if t else 1.0) for k, t in tests.items()})
    return [(k, tests[k], adjusted[k],
             c.verdict(tests[k], adjusted[k]) if tests[k] else "pending")
            for k in c.PRIMARY]


def _e1(runs: list[dict]) -> list[str]:
    lines = ["## E1: the band against Clip-Higher (built-in model, `tail`)", "",
             "40 steps; evaluation on the fifth of the prompts that neither the warm start "
             "nor RL trains on; seeds 10-19 choose the Clip-Higher width, seeds 20-29 test. "
             "Held-out greedy accuracy averaged over the steps (the primary endpoint), steps "
             "to 0.8 (never: 41) and the KL of the step-1 update, means per loss:", ""]
    for share in c.SHARES:
        cell = c._cell(runs, share=share)
        if not cell:
            continue
        try:
            chosen = c.select_clip_higher(runs, share)
        except ValueError as err:
            chosen, why = None, str(err)
        lines += [f"### Warm-start share {share:g}", "",
                  "| loss | mean accuracy, selection seeds | mean accuracy, test seeds | "
                  "steps to 0.8, test seeds | step-1 KL | band minus loss, test seeds |",
                  "|---|---|---|---|---|---|"]
        for family in c.E1_LOSSES:
            mine = [r for r in cell if r["family"] == family]
            sel = [r for r in mine if r["seed"] in c.SELECT_SEEDS]
            test = [r for r in mine if r["seed"] in c.TEST_SEEDS]
            diff = None if family == c.BAND else c.paired_test(
                c.paired_diffs(cell, family, c.mean_accuracy, c.TEST_SEEDS))
            mark = " (selected)" if family == chosen else ""
            lines.append(
                f"| {family}{mark} | {_num(_mean(map(c.mean_accuracy, sel)))} | "
                f"{_num(_mean(map(c.mean_accuracy, test)))} | "
                f"{_num(_mean(map(c.steps_to, test)), '.1f')} | "
                f"{_num(_mean(map(c.step1('kl/update'), mine)), '.4f')} | "
                f"{'' if family == c.BAND else _ci(diff)} |")
        lines += ["", f"Selected Clip-Higher: {chosen or 'not yet (' + why + ')'}.", ""]
        others = [f for f in ("clip", chosen) if f]
        lines += ["Token entropy of the samples at the first step whose held-out accuracy "
                  "reaches a level, band minus each loss, paired on the test seeds that reach "
                  "it under both (raw 95 % intervals; exploratory):", "",
                  "| accuracy | " + " | ".join(f"band - {f}" for f in others) + " |",
                  "|---|" + "---|" * len(others)]
        for level in c.ENTROPY_LEVELS:
            lines.append(f"| {level:g} | " + " | ".join(
                _ci(c.paired_test(c.paired_diffs(cell, f, c.entropy_at(level), c.TEST_SEEDS)))
                for f in others) + " |")
        lines.append("")
        shown = [f for f in ("clip", c.BAND, chosen, "clip-nolow", "dcpo") if f]
        lines += ["Step-1 change of log p of the sampled tokens by old probability and sign "
                  "of the advantage (mean over all 20 seeds; exploratory):", "",
                  f"| loss | {_bin_head()} |", "|---|" + "---|" * len(_bins())]
        for family in shown:
            mine = [r for r in cell if r["family"] == family]
            lines.append(f"| {family} | {_bin_cells(mine)} |")
        lines.append("")
    return lines


def _edge(runs: list[dict], e1: list[dict]) -> list[str]:
    lines = ["## E1-edge: Clip-Higher wider than E1's grid (exploratory)", "",
             "The same runs as E1 with eps_high 8 and 100; E1's selection and the primary "
             "family were fixed without them. Mean held-out accuracy over the steps, and band "
             "minus each on the test seeds (raw 95 % intervals):", "",
             "| share | loss | selection seeds | test seeds | band minus loss, test seeds |",
             "|---|---|---|---|---|"]
    for share in c.SHARES:
        cell = c._cell(runs, share=share) + [r for r in c._cell(e1, share=share)
                                             if r["family"] in (c.BAND, "ch-4")]
        for family in (c.BAND, "ch-4", *(f"ch-{e:g}" for e in c.EDGE_HIGH)):
            mine = [r for r in cell if r["family"] == family]
            if not mine:
                continue
            sel = [r for r in mine if r["seed"] in c.SELECT_SEEDS]
            test = [r for r in mine if r["seed"] in c.TEST_SEEDS]
            diff = "" if family == c.BAND else _ci(c.paired_test(
                c.paired_diffs(cell, family, c.mean_accuracy, c.TEST_SEEDS)))
            lines.append(f"| {share:g} | {family} | {_num(_mean(map(c.mean_accuracy, sel)))} | "
                         f"{_num(_mean(map(c.mean_accuracy, test)))} | {diff} |")
    return lines + [""]


def _e4(runs: list[dict], pilot: list[dict]) -> list[str]:
    rates = ", ".join(f"lr {(r['width'] or {}).get('lr'):g}: "
                      f"{_num(c.offpolicy_outside(r), '.3f')}" for r in pilot)
    try:
        chosen = f"{c.e4_learning_rate(pilot):g}"
    except ValueError as err:
        chosen = f"none ({err})"
    lines = ["## E4: which edge does the band's work? (SmolLM2-135M, `verify`, step 1)", "",
             "Experiment T's set-up with 16 prompts, one step; for a seed every loss starts "
             "from the same weights and updates on the same rollout. The pilot's share of "
             f"off-policy tokens outside [0.8, 1.2]: {rates}; chosen rate: {chosen}.", "",
             "Band-kl minus each loss, per seed the mean over prompts of the paired per-prompt "
             "difference in the step's change of log p of the prompt's tail tokens (old p < "
             "0.1), interval over seeds. The two rows against clip 0.2 are E4's family "
             "(Holm over two tests); the rest is exploratory (raw intervals):", "",
             "| tail tokens | vs | band minus loss (95 %) | p | p, Holm | reading |",
             "|---|---|---|---|---|---|"]
    family = c.e4_family(runs)
    adjusted = c.holm({k: (t["p"] if t else 1.0) for k, t in family.items()})
    for side in c.E4_SIDES:
        name = f"E4 tail A{side[1]}: band - clip 0.2"
        test = family[name]
        lines.append(f"| A {'>' if side == 'A+' else '<'} 0 | clip | {_ci(test)} | "
                     f"{_num(test and test['p'], '.3g')} | {_num(adjusted[name], '.3g')} | "
                     f"{c.e4_verdict(side, test, adjusted[name])} |")
        for other in (f for f in c.E4_LOSSES if f not in ("clip", c.BAND)):
            test = c.paired_test(c.e4_paired(runs, other, side))
            lines.append(f"| A {'>' if side == 'A+' else '<'} 0 | {other} | {_ci(test)} | "
                         f"{_num(test and test['p'], '.3g')} | exploratory | |")
    lines += ["", "Per loss, means over the seeds: the step's KL, held-out log P(Yes) after the "
              "step, and the change of log p of the sampled tokens by old probability and sign "
              "of A; band minus loss, paired by seed, for KL and log P(Yes):", "",
              "| loss | step KL | log P(Yes) | band - loss: KL | band - loss: log P(Yes) | "
              f"{_bin_head()} |", "|---|---|---|---|---|" + "---|" * len(_bins())]
    kl, logp = c.step1("kl/update"), c.step1("logp_correct")
    for family in c.E4_LOSSES:
        mine = [r for r in runs if r["family"] == family]
        if not mine:
            continue
        diffs = ["", ""] if family == c.BAND else [
            _ci(c.paired_test(c.paired_diffs(runs, family, f, c.E4_SEEDS)), 4)
            for f in (kl, logp)]
        lines.append(f"| {family} | {_num(_mean(map(kl, mine)), '.4f')} | "
                     f"{_num(_mean(map(logp, mine)), '.3f')} | " + " | ".join(diffs) + " | "
                     f"{_bin_cells(mine)} |")
    return lines + [""]


def _chosen(runs: list[dict]) -> str:
    """The Clip-Higher family that E2's or E3's runs ran (E1's choice)."""
    return next((r["family"] for r in runs if r["family"].startswith("ch-")), "Clip-Higher")


def _e2(runs: list[dict]) -> list[str]:
    chosen = _chosen(runs)
    lines = ["## E2: one PPO epoch against four (share 0.06)", "",
             f"Seeds 30-39; {chosen} is E1's choice at share 0.06. Mean held-out accuracy "
             "over the steps, and band minus each other loss (paired, raw 95 % intervals; "
             "the one-epoch rows against Clip-Higher belong to the primary family):", "",
             f"| epochs | lr | clip | band-kl | {chosen} | band - clip | band - {chosen} |",
             "|---|---|---|---|---|---|---|"]
    for epochs in c.E2_EPOCHS:
        for lr in c.E2_LR:
            cell = c._cell(runs, epochs=epochs, lr=lr)
            if not cell:
                continue
            means = [_num(_mean(c.mean_accuracy(r) for r in cell if r["family"] == f))
                     for f in ("clip", c.BAND, chosen)]
            diffs = [_ci(c.paired_test(c.paired_diffs(cell, f, c.mean_accuracy, c.E2_SEEDS)))
                     for f in ("clip", chosen)]
            lines.append(f"| {epochs} | {lr:g} | " + " | ".join(means + diffs) + " |")
    return lines + [""]


def _e3(runs: list[dict]) -> list[str]:
    chosen = _chosen(runs)
    lines = ["## E3: four more warm starts (share 0.06)", "",
             f"Seeds 40-49 on each warm start; band minus clip and band minus {chosen} (E1's "
             "choice), mean held-out accuracy over the steps. Pooled: the mean of the "
             "per-warm-start means, its interval over warm starts (exploratory):", "",
             f"| warm start | band - clip | band - {chosen} |", "|---|---|---|"]
    per = {"clip": [], chosen: []}
    for w in c.E3_WARM:
        cell = c._cell(runs, warm=w)
        if not cell:
            continue
        row = []
        for f in ("clip", chosen):
            test = c.paired_test(c.paired_diffs(cell, f, c.mean_accuracy, c.E3_SEEDS))
            row.append(_ci(test))
            if test:
                per[f].append(test["mean"])
        lines.append(f"| {w} | " + " | ".join(row) + " |")
    pooled = [_ci(c.pooled(per[f])) for f in ("clip", chosen)]
    return lines + ["| pooled | " + " | ".join(pooled) + " |", ""]


def section(results: dict[str, list[dict]]) -> list[str]:
    """The report's lines on E1-E4 (empty when none of their runs exists)."""
    if not any(results.get(e) for e in ("E1", "E2", "E3", "E4-pilot")):
        return []
    lines = ["## Band or higher upper clip? The primary tests", "",
             "The plan, committed before the runs, is in `benchmarks/controls.py`. Band-kl "
             "0.05 minus the other loss, held-out accuracy averaged over the steps, paired by "
             "seed on seeds no choice has seen; Holm's correction over the seven tests "
             "(pending ones count as p = 1):", "",
             "| test | band minus other (95 %) | p | p, Holm | verdict |", "|---|---|---|---|---|"]
    for name, test, adjusted, verdict in primary_rows(results):
        p = _num(test["p"], ".3g") if test else "pending"
        lines.append(f"| {name} | {_ci(test)} | {p} | {_num(adjusted, '.3g')} | {verdict} |")
    lines.append("")
    if results.get("E1"):
        lines += _e1(results["E1"])
    if results.get("E2"):
        lines += _e2(results["E2"])
    if results.get("E3"):
        lines += _e3(results["E3"])
    if results.get("E1-edge"):
        lines += _edge(results["E1-edge"], results.get("E1", []))
    if results.get("E4-pilot"):
        lines += _e4(results.get("E4", []), results["E4-pilot"])
    return lines
