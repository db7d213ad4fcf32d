"""The band-against-Clip-Higher controls (benchmarks/controls.py): plan, selection, tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
pytest.importorskip("scipy")
controls = pytest.importorskip("controls")


def fake(family, seed, accuracy, steps=40, **width):
    rows = [{"step": s, "accuracy": a} for s, a in enumerate(accuracy, 1)]
    return {"family": family, "seed": seed, "width": width, "config": {"steps": steps},
            "rows": rows}


def e1_results(score):
    """Fake E1 runs at share 0.06 whose accuracy is ``score(family, seed)`` at every step."""
    return [fake(f, s, [score(f, s)] * 3, share=0.06) for f in controls.E1_LOSSES
            for s in controls.SELECT_SEEDS + controls.TEST_SEEDS]


def test_the_plan_runs_every_loss_on_the_same_fresh_seeds():
    from fbands.rl.config import TrainConfig

    e1 = controls.e1_runs()
    assert len(e1) == len(controls.E1_LOSSES) * 2 * 20 == 360
    assert len({r["name"] for r in e1}) == len(e1)
    for share in controls.SHARES:
        seeds = {}
        for r in e1:
            if r["width"]["share"] == share:
                seeds.setdefault(r["family"], set()).add(r["seed"])
        assert all(s == set(range(10, 30)) for s in seeds.values())
    assert set(controls.SELECT_SEEDS).isdisjoint(controls.TEST_SEEDS)
    assert {r["config"]["tail_held_out"] for r in e1} == {0.2}
    e2, e3 = controls.e2_runs("ch-1.2"), controls.e3_runs("ch-1.2")
    assert len(e2) == 2 * 3 * 10 * 3 and len(e3) == 4 * 10 * 3
    assert {r["family"] for r in e2} == {"clip", "band-kl", "ch-1.2"}
    assert {r["config"]["warm_start_seed"] for r in e3} == {1, 2, 3, 4}
    for r in e1[:len(controls.E1_LOSSES)] + e2[:9] + e3[:3]:  # every loss's config is valid
        TrainConfig(**r["config"], run_dir="runs/x").validate()


def test_selection_reads_only_the_selection_seeds():
    def score(family, seed):  # ch-0.6 best on selection seeds, ch-4 on the test seeds
        if family == "ch-0.6" and seed in controls.SELECT_SEEDS:
            return 0.9
        if family == "ch-4" and seed in controls.TEST_SEEDS:
            return 1.0
        return 0.5

    runs = e1_results(score)
    assert controls.select_clip_higher(runs, 0.06) == "ch-0.6"
    # whatever the test seeds hold, the choice stays
    scrambled = [dict(r, rows=[{"step": 1, "accuracy": 1.0 - i / 1000}])
                 if r["seed"] in controls.TEST_SEEDS else r for i, r in enumerate(runs)]
    assert controls.select_clip_higher(scrambled, 0.06) == "ch-0.6"
    # ties go to the smaller upper edge; a missing selection seed is an error
    assert controls.select_clip_higher(e1_results(lambda f, s: 0.5), 0.06) == "ch-0.28"
    gap = [r for r in runs if not (r["family"] == "ch-2" and r["seed"] == 12)]
    with pytest.raises(ValueError, match="ch-2 .* lacks selection seeds \\[12\\]"):
        controls.select_clip_higher(gap, 0.06)


def test_primary_family_tests_band_against_the_selected_clip_on_test_seeds_only():
    def score(family, seed):
        if seed in controls.SELECT_SEEDS:
            return 0.9 if family == "ch-1.2" else 0.5
        return {"band-kl": 0.7, "ch-1.2": 0.6 + 0.01 * (seed % 3)}.get(family, 0.4)

    tests = controls.primary_family({"E1": e1_results(score)})
    ch = tests["E1 share 0.06: band - best Clip-Higher"]
    assert ch["n"] == len(controls.TEST_SEEDS)
    expected = [0.7 - (0.6 + 0.01 * (s % 3)) for s in controls.TEST_SEEDS]
    assert ch["values"] == pytest.approx(expected)
    assert tests["E1 share 0.03: band - clip 0.2"] is None  # no runs at 0.03
    assert set(tests) == set(controls.PRIMARY)


def test_paired_t_test_and_holm_against_independent_values():
    from scipy import stats

    diffs = [0.3, -0.1, 0.25, 0.4, 0.05, 0.2]
    test = controls.paired_test(diffs)
    ref = stats.ttest_1samp(diffs, 0.0)
    assert test["p"] == pytest.approx(ref.pvalue, rel=1e-12)
    ci = ref.confidence_interval(0.95)
    assert (test["lo"], test["hi"]) == pytest.approx((ci.low, ci.high), rel=1e-12)
    # Holm by hand: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1, kept non-decreasing
    adjusted = controls.holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.005})
    assert adjusted == pytest.approx({"d": 0.02, "a": 0.03, "c": 0.06, "b": 0.06})
    assert controls.verdict(test, 0.01) == "band better"
    assert controls.verdict(dict(test, mean=-1.0), 0.01) == "band worse"
    assert controls.verdict(test, 0.2) == "no difference shown"


def test_endpoints():
    run = fake("clip", 0, [0.5, 0.85, 0.7], steps=3)
    assert controls.mean_accuracy(run) == pytest.approx(2.05 / 3)
    assert controls.steps_to(run) == 2
    assert controls.steps_to(fake("clip", 0, [0.5, 0.6], steps=40)) == 41  # never: steps + 1
    run["rows"][0]["kl/update"] = 0.02
    assert controls.step1("kl/update")(run) == 0.02


def test_the_report_holds_the_primary_family_with_holm():
    report = pytest.importorskip("controls_report")

    def score(family, seed):
        if seed in controls.SELECT_SEEDS:
            return 0.9 if family == "ch-2" else 0.5
        return 0.8 + 0.01 * (seed % 4) if family == "band-kl" else 0.5

    rows = report.primary_rows({"E1": e1_results(score)})
    by = {name: (test, adjusted, verdict) for name, test, adjusted, verdict in rows}
    test, adjusted, verdict = by["E1 share 0.06: band - best Clip-Higher"]
    assert test["n"] == 10 and verdict == "band better"
    # five pending tests count as p = 1: Holm multiplies the smallest p by 7
    assert adjusted == pytest.approx(min(1.0, 7 * min(t["p"] for t, _, _ in by.values() if t)))
    assert by["E2 1 epoch, lr 0.001: band - Clip-Higher"][2] == "pending"
    text = "\n".join(report.section({"E1": e1_results(score)}))
    assert "| ch-2 (selected) |" in text and "Selected Clip-Higher: ch-2." in text


# --- E1-edge and E4 -------------------------------------------------------------------------
def test_the_edge_check_changes_neither_the_selection_nor_the_primary_family():
    from fbands.rl.config import TrainConfig

    edge = controls.edge_runs()
    assert len(edge) == 2 * 20 * len(controls.EDGE_HIGH)
    assert {r["config"]["eps_high"] for r in edge} == set(controls.EDGE_HIGH)
    assert set(controls.EDGE_HIGH).isdisjoint(controls.CH_HIGH)
    for r in edge[:2]:
        TrainConfig(**r["config"], run_dir="runs/x").validate()
    # edge families best everywhere: E1's choice, read from E1's grid, is unchanged
    runs = e1_results(lambda f, s: 0.9 if f == "ch-0.6" else 0.5)
    runs += [fake(r["family"], r["seed"], [1.0] * 3, share=r["width"]["share"])
             for r in edge]
    assert controls.select_clip_higher(runs, 0.06) == "ch-0.6"


def pilot(shares):
    """Fake pilot runs: ``shares`` maps a rate to its off-policy updates' outside shares."""
    return [{"family": "clip", "seed": controls.E4_PILOT_SEED, "width": {"lr": lr},
             "rows": [{"step": 1, "update/outside": [0.0, *values]}]}
            for lr, values in shares.items()]


def test_e4_takes_the_largest_pilot_rate_in_the_window():
    small, large = controls.E4_PILOT_LR
    assert controls.e4_learning_rate(pilot({small: [0.1, 0.2, 0.3], large: [0.3, 0.5, 0.6]})) \
        == small  # the large rate's mean 0.47 leaves the window
    assert controls.e4_learning_rate(pilot({small: [0.1] * 3, large: [0.3] * 3})) == large
    # the first update is on-policy and does not count: with it, 0.06 would be 0.045
    assert controls.e4_learning_rate(pilot({small: [0.06] * 3, large: [0.5] * 3})) == small
    with pytest.raises(ValueError, match="no pilot rate"):
        controls.e4_learning_rate(pilot({small: [0.04] * 3, large: [0.41] * 3}))
    with pytest.raises(ValueError, match="lacks"):
        controls.e4_learning_rate(pilot({small: [0.1] * 3}))


def replay(family, seed, up, down):
    return {"family": family, "seed": seed, "width": None,
            "rows": [{"step": 1, "dlogp/tail_A+_per_prompt": up,
                      "dlogp/tail_A-_per_prompt": down}]}


def test_e4_pairs_prompts_within_a_seed_and_tests_over_seeds():
    from fbands.rl.config import TrainConfig

    plan = controls.e4_runs({"model": "smollm2-135m", "task": "verify"}, 1e-5)
    assert len(plan) == len(controls.E4_SEEDS) * len(controls.E4_LOSSES)
    assert {r["config"]["steps"] for r in plan} == {1}
    assert {r["config"]["lr"] for r in plan} == {1e-5}
    TrainConfig(**plan[0]["config"], run_dir="runs/x").validate()
    runs = []
    for k, seed in enumerate(controls.E4_SEEDS):
        runs.append(replay("clip", seed, [1.0, None, 2.0], [-1.0, -1.0, None]))
        # the band: +0.5 on the first paired prompt, +0.1 * k on the other; lower -0.2
        runs.append(replay("band-kl", seed, [1.5, 3.0, 2.0 + 0.1 * k], [-1.2, None, -5.0]))
    runs.append(replay("band-kl", 99, [9.0], [9.0]))  # not an E4 seed: never read
    up = controls.e4_paired(runs, "clip", "A+")
    want = [(0.5 + 0.1 * k) / 2 for k in range(len(controls.E4_SEEDS))]
    assert up == pytest.approx(want)
    assert controls.e4_paired(runs, "clip", "A-") == pytest.approx([-0.2] * 6)
    family = controls.e4_family(runs)
    assert family["E4 tail A+: band - clip 0.2"]["n"] == 6
    test = family["E4 tail A-: band - clip 0.2"]
    assert controls.e4_verdict("A-", test, 0.01) == \
        "band lowers A < 0 tail tokens more than clip"
    assert controls.e4_verdict("A+", test, 0.2) == "no difference shown"


def test_entropy_is_read_at_the_first_step_that_reaches_the_accuracy():
    run = {"rows": [{"step": 1, "accuracy": 0.3, "entropy": 0.9},
                    {"step": 2, "entropy": 0.8},  # not evaluated
                    {"step": 3, "accuracy": 0.7, "entropy": 0.6},
                    {"step": 4, "accuracy": 0.9, "entropy": 0.4}]}
    assert controls.entropy_at(0.65)(run) == 0.6
    assert controls.entropy_at(0.7)(run) == 0.6
    assert controls.entropy_at(0.8)(run) == 0.4
    assert controls.entropy_at(0.95)(run) is None
    assert controls.offpolicy_outside({"rows": [{"update/outside": [0.0, 0.2, 0.4]},
                                                {"update/outside": [0.0, 0.6]}]}) \
        == pytest.approx(0.4)
    assert controls.offpolicy_outside({"rows": [{"update/outside": [0.0]}]}) is None
