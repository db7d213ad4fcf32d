"""The claims experiments (benchmarks/claims.py): the plan, the statistics, the report."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
pytest.importorskip("scipy")
claims = pytest.importorskip("claims")
report = pytest.importorskip("claims_report")


def test_the_plan_pairs_every_loss_on_the_same_seeds():
    plan = claims.experiments(seeds=10, real_seeds=3)
    for name, runs in plan.items():
        assert len({r["name"] for r in runs}) == len(runs), name  # one file per run
        by_family: dict = {}
        for r in runs:
            by_family.setdefault((r["family"], r["width"] if name == "dose" else None),
                                 set()).add(r["seed"])
        seeds = {frozenset(s) for s in by_family.values()}
        assert len(seeds) == (1 if runs else 0), name  # every loss: same seeds
    assert len(plan["width"]) == 100 and len(plan["T"]) == 9 and len(plan["S"]) == 6
    t = plan["T"][0]["config"]
    assert t["verify_true_share"] == 1.0 and t["lora_rank"] == 0 and t["minibatches"] == 4
    assert all(r["config"]["steps"] == 2 for r in plan["pilot"])
    from fbands.rl.config import TrainConfig

    for runs in plan.values():  # every configuration is valid
        for r in runs[:3]:
            TrainConfig(**r["config"], run_dir="runs/x").validate()


def test_a_stopped_run_resumes_and_its_result_is_kept(tmp_path):
    """run_one continues a run from its checkpoint (a killed command) and then drops it."""
    from fbands.rl.config import TrainConfig
    from fbands.rl.train import train

    config = dict(model="tiny", task="tail", steps=3, prompts_per_step=4, group_size=4,
                  ppo_epochs=1, minibatches=2, warm_start_steps=20, tiny_d_model=32,
                  eval_prompts=4, cache_dir=str(tmp_path / "cache"), loss="band-kl", seed=0)
    spec = {"name": "band-kl-s0", "family": "band-kl", "width": None, "seed": 0,
            "config": config}
    run_dir = tmp_path / "work" / "toy" / "band-kl-s0"
    train(TrainConfig(**config, run_dir=str(run_dir), progress=False, checkpoint_every=1),
          stop_after=2, log=lambda _m: None)
    out = claims.run_one("toy", spec, tmp_path / "results", tmp_path / "work")
    assert [r["step"] for r in out["rows"]] == [1, 2, 3]
    assert (tmp_path / "results" / "toy" / "band-kl-s0.json").is_file()
    assert not (run_dir / "checkpoint.pt").exists()
    fresh = claims.run_one("toy", dict(spec, name="again"), tmp_path / "results",
                           tmp_path / "work")
    assert [r["reward"] for r in fresh["rows"]] == [r["reward"] for r in out["rows"]]


def test_t_interval_against_the_t_table():
    ci = report.t_interval([1.0, 2.0, 3.0, None])
    p = 0.975  # Student t with 2 degrees of freedom has the quantile (2p - 1) / sqrt(2p(1-p))
    t_975_2 = (2 * p - 1) / np.sqrt(2 * p * (1 - p))
    assert ci["n"] == 3 and ci["mean"] == 2.0
    assert ci["hi"] - ci["mean"] == pytest.approx(t_975_2 / np.sqrt(3), rel=1e-12)


@pytest.mark.parametrize("lo, hi, sign, expected", [
    (0.1, 0.5, 1, "shown"), (-0.5, -0.1, 1, "refuted"), (-0.1, 0.5, 1, "not shown"),
    (-0.5, -0.1, -1, "shown"), (0.1, 0.5, -1, "refuted"), (-0.5, 0.3, -1, "not shown"),
    (-0.3, 0.5, -1, "not shown")])
def test_verdicts_read_the_interval(lo, hi, sign, expected):
    assert report.verdict({"mean": (lo + hi) / 2, "lo": lo, "hi": hi, "n": 3}, sign) == expected
    two = report.verdict({"mean": (lo + hi) / 2, "lo": lo, "hi": hi, "n": 2}, sign)
    assert two.startswith("not decided")  # two pairs decide nothing


def test_bootstrap_interval_covers_the_mean_and_shrinks_with_n():
    rng = np.random.default_rng(0)
    small = report.bootstrap(rng.normal(1.0, 1.0, 10))
    large = report.bootstrap(rng.normal(1.0, 1.0, 1000))
    assert small["lo"] < small["mean"] < small["hi"]
    assert large["hi"] - large["lo"] < (small["hi"] - small["lo"]) / 5
    assert large["lo"] < 1.0 < large["hi"]


def _write(results: Path, experiment: str, family: str, seed: int, rows: list[dict],
           width=None, steps: int = 10) -> None:
    name = f"{family}-s{seed}" if width is None else f"{family}-{width:g}-s{seed}"
    out = {"name": name, "family": family, "width": width, "seed": seed,
           "experiment": experiment, "seconds": 1.0, "rows": rows,
           "config": {"steps": steps, "prompts_per_step": 4, "group_size": 8}}
    (results / experiment).mkdir(parents=True, exist_ok=True)
    (results / experiment / f"{name}.json").write_text(json.dumps(out))


def test_the_report_decides_from_the_result_files(tmp_path):
    """A band that gains 0.5 nats more than clip is shown; one level with the wide clip is
    not; a toy band that needs fewer steps than every clip at equal KL is shown."""
    results = tmp_path / "claims"
    rng = np.random.default_rng(1)
    for seed in range(3):
        base = rng.normal(-3.0, 0.3)
        for family, gain in (("clip", 0.0), ("band-kl", 0.5), ("clip-wide", 0.5)):
            noise = rng.normal(0, 0.02) if family == "clip-wide" else 0.0
            rows = [{"step": k, "reward": 0.1, "logp_correct": base + gain * k / 10 + noise,
                     "kl/cumulative": 0.1 * k, "update/outside": [0.0, 0.2, 0.3, 0.3],
                     "dlogp/tail_A+_per_prompt": [gain + 0.1, gain, None, gain - 0.1]}
                    for k in range(1, 11)]
            _write(results, "T", family, seed, rows)
        for eps, kl, steps in ((0.1, 0.01, 20), (0.2, 0.02, 15), (0.5, 0.05, 10)):
            _write(results, "width", "clip", seed, [
                {"step": k, "kl/update": kl, "accuracy": float(k >= steps)}
                for k in range(1, 31)], width=eps, steps=30)
        _write(results, "width", "band-kl", seed, [
            {"step": k, "kl/update": 0.02, "accuracy": float(k >= 8 + seed)}
            for k in range(1, 31)], width=0.05, steps=30)
    path = report.write_report(claims.load(results), tmp_path, "test machine")
    text = path.read_text()
    summary = text[text.index("| question |"):text.index("Per seed")]
    rows = {line.split("|")[2].strip(): line for line in summary.splitlines()
            if line.startswith("| ") and not line.startswith("| question")}
    assert rows["T: final log P(Yes) vs clip"].rstrip(" |").endswith("shown")
    assert "not shown" in rows["T: final log P(Yes) vs clip-wide"]
    assert rows["T: step-1 replay, tail log-p gain vs clip"].rstrip(" |").endswith("shown")
    width = next(v for k, v in rows.items() if k.startswith("width: band-kl 0.05"))
    assert "-6.00" in width and width.rstrip(" |").endswith("shown")  # 9 vs 15 steps at KL 0.02
    assert (tmp_path / "claims_T.png").is_file() and (tmp_path / "claims_width.png").is_file()
