"""The findings of the adversarial probe of issue 27, each from its reproducer: data loss
(``demo`` over a user's folder, a resume from a damaged checkpoint), crashes (``--threads``),
raw tracebacks where one line should name the problem, and messages that stated the wrong
rule."""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fbands
from fbands.cli import main as fbands_main
from fbands.errors import BandError, ConfigError
from fbands.schedules import parse_schedule

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tqdm")

from fbands.rl import train as rl_train  # noqa: E402
from fbands.rl.checkpoint import sealed  # noqa: E402
from fbands.rl.config import MAX_THREADS, TrainConfig  # noqa: E402

from .._tiny_run import TINY_RUN as SMALL  # noqa: E402
from .._tiny_run import quiet  # noqa: E402


def config_file(tmp_path, name="run", **changes) -> tuple[Path, Path]:
    """``(config.json, run_dir)`` of a small run in ``tmp_path``."""
    run = tmp_path / name
    data = {**SMALL, "run_dir": str(run), "cache_dir": str(tmp_path / "cache"), **changes}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data))
    return path, run


def one_line_error(capsys, code, *fragments) -> str:
    """Assert exit code 2 and one ``fbands: error:`` line holding ``fragments``."""
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and err.startswith("fbands: error: "), err
    assert err.count("\n") == 1, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    return err


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished 2-step run (checkpoint at step 2, two metrics lines), to copy and damage."""
    tmp = tmp_path_factory.mktemp("finished")
    cfg = TrainConfig(**{**SMALL, "run_dir": str(tmp / "run"), "cache_dir": str(tmp / "c")})
    rl_train.train(cfg, log=quiet)
    return tmp / "run"


def damaged(finished_run, tmp_path, change) -> Path:
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    saved = torch.load(run / "checkpoint.pt", weights_only=True)
    change(saved)
    torch.save(sealed(saved), run / "checkpoint.pt")  # (damaged entries, a matching digest)
    return run


# --- F2: demo over a folder that is not the demo's -------------------------------------------
def fake_train(cfg, **kwargs):
    """What ``train`` writes, without the training."""
    cfg.validate()
    run = Path(cfg.run_dir)
    run.mkdir(parents=True, exist_ok=True)
    (run / "config.json").write_text(json.dumps(cfg.to_dict()))
    (run / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n')
    (run / "checkpoint.pt").write_bytes(b"weights")
    return {"step": 1}


def test_demo_refuses_a_folder_it_did_not_write(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(rl_train, "train", fake_train)
    clip = tmp_path / "runs" / "clip-s0"
    clip.mkdir(parents=True)
    for name, text in (("config.json", "{}"), ("checkpoint.pt", "mine"),
                       ("NOTES.md", "my notes")):
        (clip / name).write_text(text)
    argv = ["demo", "--out", str(tmp_path / "runs"), "--steps", "1", "--no-progress"]
    one_line_error(capsys, fbands_main(argv), "clip-s0", "NOTES.md", "--force")
    assert sorted(p.name for p in clip.iterdir()) == ["NOTES.md", "checkpoint.pt",
                                                      "config.json"]
    assert (clip / "checkpoint.pt").read_text() == "mine"
    assert not (tmp_path / "runs" / "band-kl-s0").exists()  # refused before any run
    # --force replaces the run files only: the user's notes stay
    assert fbands_main([*argv, "--force"]) == 0
    assert (clip / "NOTES.md").read_text() == "my notes"
    assert (clip / "checkpoint.pt").read_bytes() == b"weights"
    # the demo's own folders are the demo's to replace (a second `make demo` just works)
    capsys.readouterr()
    assert fbands_main(argv) == 2  # (the notes are still there: not the demo's folder)
    (clip / "NOTES.md").unlink()
    assert fbands_main(argv) == 0


def test_demo_force_is_documented(capsys):
    with pytest.raises(SystemExit):
        fbands_main(["demo", "--help"])
    assert "--force" in capsys.readouterr().out


# --- F3: a damaged checkpoint is refused before any file is touched ------------------------
@pytest.mark.parametrize("change", [
    lambda s: s.update(step=-3),
    lambda s: s.update(step=10**30),
    lambda s: s.update(kl_cumulative=math.nan),
    lambda s: s.update(data_position="4"),
    lambda s: s["rng"]["numpy"].update(key=torch.zeros(3)),
    lambda s: s["rng"]["numpy"].update(key="abc"),
    lambda s: s["rng"].update(python=(3, (1, 2), None)),
    lambda s: s["rng"].update(torch=torch.zeros(3)),
    lambda s: s["config"].update(lr=torch.zeros(2)),
], ids=["negative-step", "huge-step", "nan-kl", "str-position", "short-key", "str-key",
        "python-state", "torch-state", "tensor-in-config"])
def test_damaged_checkpoint_leaves_the_run_as_it_was(finished_run, tmp_path, capsys, change):
    run = damaged(finished_run, tmp_path, change)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    code = fbands_main(["train", "--resume", "--run-dir", str(run), "--steps", "4"])
    one_line_error(capsys, code, "checkpoint", "checkpoint.pt")
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2


def test_good_checkpoint_still_resumes(finished_run, tmp_path):
    run = damaged(finished_run, tmp_path, lambda s: None)
    cfg = TrainConfig.from_file(run / "config.json")
    cfg.steps = 3
    assert rl_train.train(cfg, resume=True, log=quiet)["step"] == 3


# --- F11 and the raw tracebacks of train -------------------------------------------------
@pytest.mark.parametrize("flags, fragment", [
    (["--threads", "100000"], f"threads=100000: must be an integer from 0 to {MAX_THREADS}"),
    (["--seed", "18446744073709551616"], "seed=18446744073709551616"),
    (["--warm-start-seed", str(2**64)], "warm_start_seed="),
    (["--eval-prompts", "0", "--eval-every", "1"], "eval_prompts=0"),
    (["--tiny-arch", "gpt2", "--max-new-tokens", "300"], "max_new_tokens=300"),
])
def test_train_option_out_of_range_is_one_line(tmp_path, capsys, flags, fragment):
    path, run = config_file(tmp_path)
    one_line_error(capsys, fbands_main(["train", "--config", str(path), *flags]), fragment)
    assert not (run / "metrics.jsonl").exists()


def test_eval_prompts_zero_is_fine_without_evaluation():
    TrainConfig(eval_prompts=0, eval_every=0).validate()


def test_model_folder_that_is_not_a_model(tmp_path, capsys, finished_run):
    path, _ = config_file(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    code = fbands_main(["train", "--config", str(path), "--model", str(empty)])
    one_line_error(capsys, code, "model=", "config.json")
    # a folder with a config.json that is not a model's (a run folder)
    code = fbands_main(["train", "--config", str(path), "--model", str(finished_run),
                        "--lora-rank", "0"])
    one_line_error(capsys, code, "model=", "does not load")


@pytest.mark.parametrize("suffix, text", [(".json", '{"seed": %s}'), (".toml", "seed = %s")])
def test_seed_of_5000_digits_in_a_config_file(tmp_path, capsys, suffix, text):
    path = tmp_path / f"c{suffix}"
    path.write_text(text % ("1" * 5000))
    code = fbands_main(["train", "--config", str(path), "--run-dir", str(tmp_path / "r")])
    one_line_error(capsys, code, "too long")


def test_seed_of_400_digits_is_named_by_its_size():
    with pytest.raises(ConfigError, match="seed=an integer of about 400 digits"):
        TrainConfig(seed=int("1" * 400)).validate()


def test_compare_with_a_null_metric(tmp_path, capsys):
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5, "accuracy": null}\n')
    code = fbands_main(["compare", str(run), "--out", str(tmp_path / "c.png")])
    one_line_error(capsys, code, "line 1", "'accuracy' must be a number")


def test_plot_to_a_text_file(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:  # argparse's own error
        fbands_main(["plot", "-o", str(tmp_path / "x.txt")])
    one_line_error(capsys, exit_.value.code, ".txt")


# --- numbers too large for a float64 ---------------------------------------------------------
@pytest.mark.parametrize("delta", [10**400, -(10**400), 10**5000, Fraction(10**400, 3),
                                   Fraction(10**5000, 3)],
                         ids=["int400", "negative", "int5000", "fraction400", "fraction5000"])
def test_huge_delta_is_a_band_error(delta):
    with pytest.raises(BandError, match="delta"):
        fbands.bounds(0.5, delta)


def test_huge_numbers_in_a_schedule():
    with pytest.raises(ConfigError, match="total_steps must be an integer >= 1 of at most"):
        parse_schedule("linear:0.1:0.02:" + "1" * 5000)
    with pytest.raises(ConfigError, match="start must be a finite number > 0, got '111"):
        parse_schedule("linear:" + "1" * 400 + ":0.02:10")


# --- messages ---------------------------------------------------------------------------------
@pytest.mark.parametrize("text, rule", [
    ("poly:0.1:0.02:10:-1", "power must be a finite number > 0, got '-1'"),
    ("hold_linear:0.1:0.02:10:-1", "hold_steps must be an integer >= 0"),
    ("adaptive:-1", "target_kl must be a finite number > 0, got '-1'"),
    ("adaptive:inf:0.1", "target_kl must be a finite number > 0, got 'inf'"),
])
def test_schedule_messages_state_the_real_rule(text, rule):
    with pytest.raises(ConfigError, match=rule.replace("(", r"\(").replace(")", r"\)")):
        parse_schedule(text)


def test_run_killed_before_its_first_checkpoint_can_be_restarted(finished_run, tmp_path,
                                                                  capsys):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    (run / "checkpoint.pt").unlink()  # killed after a step, before any checkpoint
    (run / "metrics.jsonl").write_text('{"step": 1, "reward": 0.0}\n')
    one_line_error(capsys, fbands_main(["train", "--run-dir", str(run)]),
                   "--resume to start it again from step 0")
    assert fbands_main(["train", "--resume", "--run-dir", str(run)]) == 0
    assert (run / "checkpoint.pt").is_file()
    steps = [json.loads(ln)["step"] for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    # a folder with neither a checkpoint nor a config names the way out too
    capsys.readouterr()
    (tmp_path / "bare").mkdir()
    one_line_error(capsys, fbands_main(["train", "--resume", "--run-dir",
                                        str(tmp_path / "bare")]), "without --resume")


def test_tilde_in_a_config_file_is_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    path = tmp_path / "c.json"
    path.write_text('{"run_dir": "~/x", "cache_dir": "~/cache"}')
    cfg = TrainConfig.from_file(path)
    assert cfg.run_dir == str(tmp_path / "home" / "x")
    assert cfg.cache_dir == str(tmp_path / "home" / "cache")


# --- hypothesis: any damage to a checkpoint, through `fbands train --resume` ---------------
def _junk():
    scalars = (st.none() | st.booleans() | st.integers() | st.integers(-(10**40), 10**40)
               | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8))
    tensors = st.builds(lambda n, kind: torch.zeros(n, dtype=kind), st.integers(0, 5),
                        st.sampled_from([torch.int64, torch.float32, torch.uint8, torch.bool]))
    return st.recursive(scalars | tensors,
                        lambda inner: st.lists(inner, max_size=3)
                        | st.tuples(inner, inner)
                        | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                        max_leaves=6)


def _entries(saved, prefix=()):
    """Every path into the checkpoint's nested dicts (the model's tensors left out)."""
    for key, value in saved.items():
        if prefix[:1] in (("model",), ("optimizer",)) and len(prefix) >= 1:
            continue
        yield (*prefix, key)
        if isinstance(value, dict):
            yield from _entries(value, (*prefix, key))


@pytest.mark.slow
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_any_damage_to_a_checkpoint_is_one_line_or_a_resume(finished_run, tmp_path_factory,
                                                            data):
    tmp = tmp_path_factory.mktemp("damage")
    run = tmp / "run"
    shutil.copytree(finished_run, run)
    ckpt = run / "checkpoint.pt"
    if data.draw(st.booleans(), label="bytes"):  # the file: cut or overwritten somewhere
        raw = bytearray(ckpt.read_bytes())
        at = data.draw(st.integers(0, len(raw) - 1), label="offset")
        patch = data.draw(st.binary(min_size=0, max_size=16), label="patch")
        raw = raw[:at] + patch if data.draw(st.booleans(), label="cut") else (
            raw[:at] + patch + raw[at + len(patch):])
        ckpt.write_bytes(bytes(raw))
    else:  # one entry replaced by any plain data or tensor
        saved = torch.load(ckpt, weights_only=True)
        paths = sorted(_entries(saved))
        config = [p for p in paths if p[0] == "config"]  # the largest surface: weigh it up
        path = data.draw(st.sampled_from(config) | st.sampled_from(paths), label="entry")
        holder = saved
        for key in path[:-1]:
            holder = holder[key]
        holder[path[-1]] = data.draw(_junk(), label="value")
        torch.save(sealed(saved), ckpt)  # (the entries, not the digest, are what is damaged)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    buffer = io.StringIO()
    with contextlib.redirect_stderr(buffer), contextlib.redirect_stdout(io.StringIO()):
        code = fbands_main(["train", "--resume", "--run-dir", str(run), "--steps", "2",
                            "--no-progress"])
    text = buffer.getvalue()
    assert code in (0, 2), text
    assert "Traceback" not in text
    if code == 2:
        # (progress lines may come first: the error is the last line, and a single one)
        lines = text.splitlines()
        assert lines[-1].startswith("fbands: error: "), text
        assert sum("error" in line for line in lines) == 1, text
        assert {p.name: p.read_bytes() for p in run.iterdir()} == before
