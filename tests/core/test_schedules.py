"""Radius schedules: values by hand, the string grammar, the adaptive rule."""

from __future__ import annotations

import math

import pytest

from fbands.errors import ConfigError
from fbands.schedules import AdaptiveDelta, DeltaSchedule, parse_schedule

# (schedule, [(step, value computed by hand)]): step 0, the middle, the end, past the end.
CASES = [
    (DeltaSchedule("constant", 0.05), [(0, 0.05), (500, 0.05), (10**9, 0.05)]),
    (
        DeltaSchedule("linear", 0.1, 0.02, 1000),
        [(0, 0.1), (250, 0.08), (500, 0.06), (1000, 0.02), (5000, 0.02)],
    ),
    (
        # 0.02 + 0.08 (1 + cos(pi t)) / 2: t = 1/4 gives 0.02 + 0.04 (1 + sqrt(2)/2).
        DeltaSchedule("cosine", 0.1, 0.02, 1000),
        [(0, 0.1), (250, 0.02 + 0.04 * (1 + math.sqrt(0.5))), (500, 0.06), (1000, 0.02),
         (1001, 0.02)],
    ),
    (
        # 0.02 + 0.08 (1 - t)^2: t = 1/2 gives 0.04, t = 1/4 gives 0.065.
        DeltaSchedule("poly", 0.1, 0.02, 1000, power=2.0),
        [(0, 0.1), (250, 0.065), (500, 0.04), (1000, 0.02), (2000, 0.02)],
    ),
    (
        # hold 0.1 for 200 steps, then linear over the 800 left: step 600 is half-way.
        DeltaSchedule("hold_linear", 0.1, 0.02, 1000, hold_steps=200),
        [(0, 0.1), (199, 0.1), (200, 0.1), (600, 0.06), (1000, 0.02), (3000, 0.02)],
    ),
    (
        # An increasing schedule is allowed.
        DeltaSchedule("linear", 0.01, 0.03, 10),
        [(0, 0.01), (5, 0.02), (10, 0.03), (11, 0.03)],
    ),
]


@pytest.mark.parametrize("schedule, points", CASES, ids=lambda c: getattr(c, "kind", ""))
def test_values_by_hand(schedule, points):
    for step, want in points:
        assert schedule(step) == pytest.approx(want, rel=1e-14, abs=0), (schedule, step)
    assert schedule(10**12) == schedule.end
    assert schedule.update(1.0) == schedule.start  # fixed schedules ignore the KL


@pytest.mark.parametrize("schedule, points", CASES, ids=lambda c: getattr(c, "kind", ""))
def test_string_round_trip(schedule, points):
    again = parse_schedule(str(schedule))
    assert again == schedule
    assert [again(s) for s, _ in points] == [schedule(s) for s, _ in points]


def test_monotone_between_ends():
    for kind in ("linear", "cosine", "poly", "hold_linear"):
        kw = {"hold_steps": 30} if kind == "hold_linear" else {}
        s = DeltaSchedule(kind, 0.2, 0.05, 100, **kw)
        values = [s(i) for i in range(120)]
        assert all(a >= b for a, b in zip(values, values[1:], strict=False)), kind
        assert min(values) == 0.05 and max(values) == 0.2


@pytest.mark.parametrize(
    "text, want",
    [
        ("0.05", DeltaSchedule("constant", 0.05)),
        ("constant:5e-2", DeltaSchedule("constant", 0.05)),
        (" linear:0.1:0.02:1000 ", DeltaSchedule("linear", 0.1, 0.02, 1000)),
        ("cosine:.1:0.02:10", DeltaSchedule("cosine", 0.1, 0.02, 10)),
        ("poly:0.1:0.02:100", DeltaSchedule("poly", 0.1, 0.02, 100)),
        ("poly:0.1:0.02:100:3", DeltaSchedule("poly", 0.1, 0.02, 100, power=3.0)),
        ("hold_linear:0.1:0.02:100:10", DeltaSchedule("hold_linear", 0.1, 0.02, 100, 10)),
    ],
)
def test_parse(text, want):
    assert parse_schedule(text) == want


def test_parse_adaptive():
    a = parse_schedule("adaptive:0.01", start=0.05)
    assert isinstance(a, AdaptiveDelta)
    assert (a.target_kl, a.delta, a.low, a.high) == (0.01, 0.05, 0.005, 0.5)
    b = parse_schedule("adaptive:0.02:0.1:0.01:0.3")
    assert (b.target_kl, b.delta, b.low, b.high) == (0.02, 0.1, 0.01, 0.3)
    assert str(b) == "adaptive:0.02:0.1:0.01:0.3"


@pytest.mark.parametrize(
    "text, match",
    [
        ("", "unknown delta schedule"),
        ("exp:0.1:0.02:100", "unknown delta schedule"),
        ("linear:0.1:0.02", "has 2 field"),
        ("linear:0.1:0.02:100:5", "has 4 field"),
        ("hold_linear:0.1:0.02:100", "has 3 field"),
        ("linear:0.1:0.02:1e3", "total_steps must be an integer"),
        ("linear:0.1:-0.02:100", "end must be a finite number > 0, got '-0.02'"),
        ("cosine:__import__('os'):0.02:100", "start must be a number"),
        ("linear:0.1:0.02:0", "total_steps must be an integer >= 1, got '0'"),
        ("hold_linear:0.1:0.02:100:100", "hold_steps \\(100\\) must be < total_steps"),
        ("constant:0", "start must be a finite number > 0"),
        ("adaptive:0.01", "needs a starting radius"),
        ("adaptive:0.01:0.05:0.01", "has 3 field"),
        ("adaptive:0.01:0.05:0.1:0.5", "need low <= start <= high"),
        ("linear:nan:0.02:10", "start must be a finite number > 0, got 'nan'"),
    ],
)
def test_parse_errors(text, match):
    with pytest.raises(ConfigError, match=match):
        parse_schedule(text)


def test_parse_not_a_string():
    with pytest.raises(ConfigError, match="must be a string"):
        parse_schedule(0.1)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"kind": "step", "start": 0.1}, "kind must be one of"),
        ({"kind": "linear", "start": math.inf, "end": 0.1, "total_steps": 5}, "start must be"),
        ({"kind": "linear", "start": 0.1, "end": 0.0, "total_steps": 5}, "end must be"),
        ({"kind": "linear", "start": 0.1, "end": 0.05, "total_steps": 2.5}, "integer"),
        ({"kind": "linear", "start": 0.1, "end": 0.05, "total_steps": True}, "integer"),
        ({"kind": "constant", "start": 0.1, "end": 0.2}, "constant schedule has end = start"),
        ({"kind": "linear", "start": 0.1, "end": 0.05, "total_steps": 5, "hold_steps": 2},
         "hold_steps is for kind 'hold_linear'"),
        ({"kind": "linear", "start": 0.1, "end": 0.05, "total_steps": 5, "power": 2.0},
         "power is for kind 'poly'"),
        ({"kind": "poly", "start": 0.1, "end": 0.05, "total_steps": 5, "power": -1.0},
         "power must be"),
        ({"kind": "linear", "start": "0.1", "end": 0.05, "total_steps": 5}, "start must be"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        DeltaSchedule(**kwargs)


def test_bad_step():
    s = DeltaSchedule("linear", 0.1, 0.05, 5)
    for step in (-1, 1.5, "3", None):
        with pytest.raises(ConfigError, match="step must be"):
            s(step)


def test_adaptive_moves_toward_target():
    """A synthetic system whose KL per update grows with delta: kl = 0.4 delta.

    The target 0.01 needs delta = 0.025; the rule must bring delta from 0.2 into the band
    of the dead zone around it and hold it there."""
    a = AdaptiveDelta(target_kl=0.01, start=0.2, low=0.001, high=1.0, factor=1.5)
    history = []
    for _ in range(40):
        kl = 0.4 * a.delta
        history.append(kl)
        a.update(kl)
    assert history[0] > 1.5 * 0.01
    assert all(0.01 / 1.5 <= kl <= 1.5 * 0.01 for kl in history[10:])
    # and from below
    b = AdaptiveDelta(target_kl=0.01, start=0.002, low=0.001, high=1.0)
    for _ in range(20):
        b.update(0.4 * b.delta)
    assert 0.01 / 1.5 <= 0.4 * b.delta <= 1.5 * 0.01


def test_adaptive_rule_and_bounds():
    """The rule at hand-picked KLs (target 0.01, default gain 1, factor 2, tolerance 1.5)."""
    a = AdaptiveDelta(target_kl=0.01, start=0.08, low=0.02, high=0.2)
    assert a.update(0.016) == pytest.approx(0.05, rel=1e-14)  # 1.6 x target: / 1.6
    assert a.update(0.05) == pytest.approx(0.025, rel=1e-14)  # 5 x target: capped at / 2
    assert a.update(0.05) == 0.02  # clamped at low
    assert a.update(0.0149) == 0.02  # inside the dead zone [0.00667, 0.015]: kept
    assert a.update(0.00667) == 0.02
    assert a.update(0.006) == pytest.approx(0.02 / 0.6, rel=1e-14)  # target / kl = 1.667
    assert a.update(0.0) == pytest.approx(0.04 / 0.6, rel=1e-14)  # nothing moved: x 2
    assert a.update(-1e-9) == pytest.approx(0.08 / 0.6, rel=1e-14)  # a slightly negative
    assert a.update(0.0) == 0.2  # estimate also grows; clamped at high
    assert a(7) == 0.2
    # gain scales the log step: KL 4 x target with gain 0.5 divides by 2
    b = AdaptiveDelta(target_kl=0.01, start=0.08, gain=0.5, factor=10.0)
    assert b.update(0.04) == pytest.approx(0.04, rel=1e-14)
    assert b.update(0.0025) == pytest.approx(0.08, rel=1e-14)
    # A long random walk of measured KLs never leaves [low, high].
    import random

    rng = random.Random(0)
    for _ in range(1000):
        d = a.update(rng.lognormvariate(math.log(0.01), 2.0))
        assert 0.02 <= d <= 0.2


def test_adaptive_state_and_errors():
    a = AdaptiveDelta(target_kl=0.01, start=0.05)
    a.update(1.0)
    b = AdaptiveDelta(target_kl=0.01, start=0.05)
    b.load_state_dict(a.state_dict())
    assert b.delta == a.delta == 0.025  # 100 x target: the largest step down, / 2
    for bad in (math.nan, math.inf, "0.1", None, True):
        with pytest.raises(ConfigError, match="measured KL must be a finite number"):
            a.update(bad)
    with pytest.raises(ConfigError, match="factor and tolerance must be > 1"):
        AdaptiveDelta(0.01, 0.05, factor=0.5)
    with pytest.raises(ConfigError, match="target_kl must be"):
        AdaptiveDelta(0.0, 0.05)
    with pytest.raises(ConfigError, match="gain must be a finite number > 0"):
        AdaptiveDelta(0.01, 0.05, gain=0.0)


def _by_hand(delta, kl, target):
    """The default rule (gain 1, factor 2, dead zone x/ 1.5), written case by case."""
    if target / 1.5 <= kl <= target * 1.5:
        return delta
    if kl >= 2 * target:
        return delta / 2
    if kl <= target / 2:
        return delta * 2
    return delta * target / kl


# --- the trainer: fbands train --delta-schedule --------------------------------------------
def _small(tmp_path, name="run", **overrides):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("tqdm")
    from fbands.rl.config import TrainConfig

    base = dict(run_dir=str(tmp_path / name), cache_dir=str(tmp_path / "cache"), steps=4,
                prompts_per_step=4, group_size=4, ppo_epochs=2, minibatches=2,
                warm_start_steps=20, tiny_d_model=32, eval_prompts=8, eval_every=0,
                progress=False, checkpoint_every=1)
    return TrainConfig(**{**base, **overrides})


def _rows(cfg):
    import json

    with open(f"{cfg.run_dir}/metrics.jsonl") as f:
        return [json.loads(line) for line in f]


def test_trainer_logs_the_scheduled_delta(tmp_path):
    from fbands.rl import train as rl_train

    cfg = _small(tmp_path, loss="band-kl", delta_schedule="linear:0.08:0.02:3")
    rl_train.train(cfg, log=lambda _m: None)
    want = [0.08, 0.06, 0.04, 0.02]  # steps 0..3 of the schedule, by hand
    assert [r["band/delta"] for r in _rows(cfg)] == pytest.approx(want, rel=1e-14)
    # band_width follows the radius down
    widths = [r["band/band_width"] for r in _rows(cfg)]
    assert widths[0] > widths[-1]


def test_trainer_adaptive_delta_follows_its_rule_and_resumes(tmp_path):
    from fbands.rl import train as rl_train

    spec = "adaptive:0.001:0.05:0.01:0.2"
    cfg = _small(tmp_path, loss="band-kl", delta_schedule=spec)
    rl_train.train(cfg, log=lambda _m: None, stop_after=2)  # killed after step 2 ...
    rl_train.train(cfg, resume=True, log=lambda _m: None)  # ... and resumed
    rows = _rows(cfg)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[0]["band/delta"] == 0.05
    for r, after in zip(rows, rows[1:], strict=False):
        kl, d = r["band/measured_kl"], r["band/delta"]
        assert kl == r["kl/update"]  # the KL after the step's updates
        want = min(max(_by_hand(d, kl, 0.001), 0.01), 0.2)
        # the rule, by hand; and the next step (across the resume too) uses its output
        assert r["band/delta_next"] == pytest.approx(want, rel=1e-14)
        assert after["band/delta"] == r["band/delta_next"]
        assert kl >= 0


def test_trainer_config_errors(tmp_path):
    from fbands.rl.config import ConfigError

    for loss, text, match in [
        ("band-kl", "cosine:0.1:0.02", "delta_schedule='cosine:0.1:0.02': .*has 2 field"),
        ("clip", "linear:0.1:0.02:10", "no band radius to schedule"),
        ("band-kl", "exec('x')", "unknown delta schedule"),
    ]:
        with pytest.raises(ConfigError, match=match):
            _small(tmp_path, loss=loss, delta_schedule=text).validate()
    with pytest.raises(ConfigError, match="must be a string"):
        _small(tmp_path, delta_schedule=0.1).validate()
    assert _small(tmp_path, delta_schedule="adaptive:0.01").schedule().delta == 0.05


# --- the TRL plug-in: band_delta_schedule over state.global_step ----------------------------
def test_trl_trainer_follows_the_schedule(tmp_path):
    pytest.importorskip("trl")
    import warnings

    from fbands import losses as fl

    from ..integrations.test_trl import make_trainer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = make_trainer(tmp_path, max_steps=4, band_delta_schedule="linear:0.04:0.01:2")
        trainer.train()
    logs = [e for e in trainer.state.log_history if "band/delta" in e]
    # Generation batches are scored at global steps 0 and 2 (num_iterations=2); each band
    # serves two optimizer steps: schedule(0) = 0.04, schedule(2) = 0.01.
    assert [e["band/delta"] for e in logs] == pytest.approx([0.04, 0.04, 0.01, 0.01])
    (buffered,) = trainer._buffered_inputs
    cfg = fl.LossConfig(**{**trainer.band_config.__dict__, "delta": 0.01})
    want = fl.precompute_band(buffered["old_per_token_logps"], cfg,
                              mask=buffered["completion_mask"])
    torch = pytest.importorskip("torch")
    torch.testing.assert_close(buffered["fbands_log_upper"], want.log_upper)


def test_trl_adaptive_radius_follows_its_rule_and_resumes(tmp_path):
    """adaptive: the radius is updated at each new generation batch from the mean k3 of the
    last pass over the previous one, by AdaptiveDelta's rule; it survives a resume."""
    pytest.importorskip("trl")
    import json
    import warnings

    from ..integrations.test_trl import make_trainer

    spec = "adaptive:1e-4:0.01:0.002:0.05"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = make_trainer(tmp_path, max_steps=6, band_delta_schedule=spec,
                               save_strategy="steps", save_steps=2)
        trainer.train()
    logs = [e for e in trainer.state.log_history if "band/delta" in e]
    assert len(logs) == 6 and logs[0]["band/delta"] == 0.01
    # Generation batches at optimizer steps 0, 2, 4 (num_iterations=2, one micro-batch per
    # step): the second step of each is its last pass, and the next batch's first step logs
    # the update.
    for k in (2, 4):
        measured, delta = logs[k]["band/measured_kl"], logs[k - 1]["band/delta"]
        assert measured == pytest.approx(logs[k - 1]["band/approx_kl_k3"], rel=1e-12)
        want = min(max(_by_hand(delta, measured, 1e-4), 0.002), 0.05)
        assert logs[k]["band/delta_next"] == pytest.approx(want, rel=1e-12)
        assert logs[k]["band/delta"] == logs[k + 1]["band/delta"] == logs[k]["band/delta_next"]
        assert "band/measured_kl" not in logs[k - 1]
    assert len({e["band/delta"] for e in logs}) > 1  # it moved
    # transformers saves the BandRadiusCallback's state with the trainer's
    state_file = tmp_path / "checkpoint-4" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    saved = state["stateful_callbacks"]["BandRadiusCallback"]
    assert saved["args"] == {"schedule": "adaptive:0.0001:0.01:0.002:0.05"}
    assert saved["attributes"]["radius"] == {"delta": logs[3]["band/delta"]}  # after step 4
    assert saved["attributes"]["pending_kl"] == [
        pytest.approx(logs[3]["band/approx_kl_k3"], rel=1e-12)]
    # A resumed run updates the restored radius with the restored KL at its first batch, as
    # the first run did; so does transformers' own restoring of stateful callbacks.
    for restore in (False, True):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            again = make_trainer(tmp_path, max_steps=5, band_delta_schedule=spec,
                                 restore_callback_states_from_checkpoint=restore)
            again.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
        (resumed,) = [e for e in again.state.log_history if "band/delta" in e and e["step"] == 5]
        for key in ("band/measured_kl", "band/delta_next", "band/delta"):
            assert resumed[key] == logs[4][key], (restore, key)
    from fbands.integrations.trl import TRLBandError

    state["stateful_callbacks"]["BandRadiusCallback"]["attributes"]["radius"] = {"delta": "x"}
    state_file.write_text(json.dumps(state))
    again = make_trainer(tmp_path, max_steps=5, band_delta_schedule=spec)
    with pytest.raises(TRLBandError, match="is not a saved adaptive radius"):
        again.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))


@pytest.mark.parametrize(
    "text, match",
    [
        ("adaptive:0.01:0.05:0.01", "band_delta_schedule='adaptive:0.01:0.05:0.01': .*has 3"),
        ("cosine:0.1", "band_delta_schedule='cosine:0.1': .*has 1 field"),
    ],
)
def test_trl_schedule_errors(tmp_path, text, match):
    pytest.importorskip("trl")
    from fbands.integrations.trl import TRLBandError

    from ..integrations.test_trl import make_args

    with pytest.raises(TRLBandError, match=match):
        make_args(tmp_path, band_delta_schedule=text)
    with pytest.raises(TRLBandError, match="has no radius to schedule"):
        make_args(tmp_path, band_method="clip", band_delta_schedule="linear:0.1:0.02:5")


# --- the verl plug-in logs the radius it used -----------------------------------------------
def test_verl_logs_the_radius():
    pytest.importorskip("verl")
    torch = pytest.importorskip("torch")
    from fbands.integrations.verl import compute_policy_loss

    g = torch.Generator().manual_seed(0)
    old = torch.log(torch.rand(2, 5, generator=g) * 0.9 + 0.05)
    new = (old + 0.1 * torch.randn(2, 5, generator=g)).clamp(max=-1e-3).requires_grad_()
    adv, mask = torch.randn(2, 5, generator=g), torch.ones(2, 5)
    config = {"policy_loss": {"loss_mode": "band", "div": "tv", "delta": 0.07}}
    _, metrics = compute_policy_loss("band", old, new, adv, mask, config=config)
    assert metrics["actor/band/delta"] == 0.07
    config = {"policy_loss": {"loss_mode": "fbands", "method": "clip"}}
    _, metrics = compute_policy_loss("fbands", old, new, adv, mask, config=config)
    assert "actor/band/delta" not in metrics  # a fixed clip has no radius


# --- restarts (SGDR, BandPO's decaying_clipbound) -------------------------------------------
# Values worked out by hand: with T0 = 0.15, T_mult = 2 the periods of t = step / 100 are
# [0, 0.15), [0.15, 0.45), [0.45, 1] (the third, 0.6 long, cut to 0.55); in a cosine
# period delta = 0.02 + 0.18 (1 + cos(pi u)) / 2 at phase u.
@pytest.mark.parametrize(("text", "steps", "want"), [
    ("restarts:0.2:0.02:100", (0, 10, 15, 20, 45, 100),
     (0.2, 0.065, 0.2, 0.02 + 0.09 * (1 + 3 ** 0.5 / 2), 0.2, 0.02)),
    # fixed periods of 0.25, constant shape: start everywhere (end is never reached)
    ("restarts:0.2:0.02:100:0.25:1:fixed:constant", (0, 30, 99, 100), (0.2,) * 4),
    # ... with decay: steps 0.2, 0.14, 0.08, 0.02 over the four periods
    ("restarts:0.2:0.02:100:0.25:3:fixed:constant:decay", (10, 25, 74, 75, 100),
     (0.2, 0.14, 0.08, 0.02, 0.02)),
    # cosine with decay 0.5: period 1 restarts at 0.02 + 0.18 * 0.5 = 0.11
    ("restarts:0.2:0.02:100:0.15:2:expanding:cosine:decay:0.5", (15, 30, 45),
     (0.11, 0.02 + 0.045 * 1.0, 0.02 + 0.045)),
])
def test_restarts_by_hand(text, steps, want):
    schedule = parse_schedule(text)
    assert [schedule(s) for s in steps] == pytest.approx(want, rel=1e-12)
    assert parse_schedule(str(schedule)) == schedule


def test_restarts_fields_and_errors():
    s = DeltaSchedule("restarts", start=0.2, end=0.02, total_steps=10, t0=0.5, mode="fixed")
    assert [s(k) for k in (0, 5, 10)] == pytest.approx([0.2, 0.2, 0.02])
    for text, match in [("restarts:0.2:0.02:100:0.1:2:growing", "mode must be one of"),
                        ("restarts:0.2:0.02:100:0.1:2:fixed:square", "shape must be one of"),
                        ("restarts:0.2:0.02:100:0.1:2:fixed:cosine:maybe", "decay must be"),
                        ("restarts:0.2:0.02:100:0:2", "t0")]:
        with pytest.raises(ConfigError, match=match):
            parse_schedule(text)
    with pytest.raises(ConfigError, match="is for kind 'restarts'"):
        DeltaSchedule("linear", start=0.2, end=0.1, total_steps=10, t0=0.3)
