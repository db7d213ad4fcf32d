"""A run folder's integrity: damaged checkpoints are found, nothing is taken for "absent",
two runs never share a folder, and a failed write loses nothing (issue 42, P3-P5, P12-P13).

Each test starts from a finished two-step run of a tiny model (a few seconds) and checks
both the error and that the folder is left as it was.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from fbands.cli import main as fbands_main  # noqa: E402
from fbands.errors import ConfigError  # noqa: E402
from fbands.rl import checkpoint as rl_checkpoint  # noqa: E402
from fbands.rl import train as rl_train  # noqa: E402
from fbands.rl.checkpoint import load_checkpoint, sealed  # noqa: E402
from fbands.rl.config import TrainConfig  # noqa: E402
from fbands.rl.run_folder import claim, keep_metrics  # noqa: E402

from .._tiny_run import TINY_RUN, quiet  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TINY = TINY_RUN


def tiny(run: Path, **changes) -> TrainConfig:
    return TrainConfig(**{**TINY, "run_dir": str(run), "cache_dir": str(run.parent / "c"),
                          **changes})


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("finished") / "run"
    rl_train.train(tiny(run), log=quiet)
    return run


@pytest.fixture
def run(finished, tmp_path) -> Path:
    """A copy of the finished run, to damage."""
    copy = tmp_path / "run"
    shutil.copytree(finished, copy)
    return copy


def snapshot(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def resume(run: Path, *extra: str) -> tuple[int, str]:
    """``fbands train --resume`` on ``run``: the exit code and what it printed on stderr."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = fbands_main(["train", "--resume", "--run-dir", str(run), "--steps", "3",
                            "--no-progress", *extra])
    return code, err.getvalue()


def one_error_line(text: str, *fragments: str) -> None:
    lines = text.strip().splitlines()
    assert "Traceback" not in text and lines[-1].startswith("fbands: error: "), text
    for fragment in fragments:
        assert fragment in lines[-1], text


# --- P3: a damaged checkpoint -----------------------------------------------------------------
def test_checkpoints_carry_the_digest_of_their_content(finished):
    saved = torch.load(finished / "checkpoint.pt", weights_only=True)
    assert saved[rl_checkpoint.DIGEST] == rl_checkpoint.content_digest(saved)
    assert load_checkpoint(finished / "checkpoint.pt")["step"] == 2


def test_one_flipped_bit_in_a_weight_is_refused(run):
    """The exponent's top bit of one float32 weight flipped in the file (a value of order
    1e-2 becomes about 4e36): torch reads the file as before, the digest does not match."""
    path = run / "checkpoint.pt"
    saved = torch.load(path, weights_only=True)
    name, weight = max(saved["model"].items(), key=lambda kv: kv[1].numel())
    raw = bytearray(path.read_bytes())
    at = raw.find(weight.numpy().tobytes())
    assert at >= 0 and weight.dtype == torch.float32
    index = int(torch.argmax((weight.abs() > 1e-3).float().flatten()))  # a normal value
    raw[at + 4 * index + 3] ^= 0x40  # bit 30: the exponent's top bit (little-endian)
    path.write_bytes(bytes(raw))
    flipped = torch.load(path, weights_only=True)["model"][name].flatten()[index]
    assert abs(float(flipped)) > 1e30  # what a resume would have trained on
    before = snapshot(run)
    code, text = resume(run)
    assert code == 2
    one_error_line(text, "checkpoint.pt", "does not match the sha256")
    assert snapshot(run) == before


@pytest.mark.parametrize("how", ["nan", "inf"])
def test_non_finite_weights_are_refused(run, how):
    path = run / "checkpoint.pt"
    saved = torch.load(path, weights_only=True)
    name = next(iter(saved["model"]))
    saved["model"][name].view(-1)[0] = float(how)
    torch.save(sealed(saved), path)  # a run that had diverged, saved with a good digest
    before = snapshot(run)
    code, text = resume(run)
    assert code == 2
    one_error_line(text, "non-finite weights", repr(name))
    assert snapshot(run) == before


def test_a_checkpoint_without_a_digest_is_refused(run):
    path = run / "checkpoint.pt"
    saved = torch.load(path, weights_only=True)
    del saved[rl_checkpoint.DIGEST]
    torch.save(saved, path)
    with pytest.raises(ConfigError, match="has no 'sha256' entry"):
        load_checkpoint(path)


# --- P4: something else where the checkpoint should be -------------------------------------
@pytest.mark.parametrize("kind", ["dangling link", "folder"])
@pytest.mark.parametrize("name", ["checkpoint.pt", "metrics.jsonl"])
def test_a_checkpoint_that_is_not_a_file_is_not_taken_for_none(run, kind, name):
    """A dangling link (an unmounted volume) or a folder in place of the checkpoint or the
    metrics is an error, for --resume and for a fresh start alike: never a run started
    again from step 0 over the old metrics."""
    target = run / name
    target.unlink()
    if kind == "folder":
        target.mkdir()
    else:
        target.symlink_to(run.parent / "unmounted" / name)
    before = snapshot(run)
    code, text = resume(run)
    assert code == 2
    one_error_line(text, name, "a folder" if kind == "folder" else "a link that leads nowhere")
    assert snapshot(run) == before
    with pytest.raises(ConfigError, match=f"{name}|already holds a run"):
        rl_train.train(tiny(run), log=quiet)  # (a fresh start: refused either way)
    assert snapshot(run) == before


def test_a_link_to_a_checkpoint_resumes(run, tmp_path):
    elsewhere = tmp_path / "volume" / "checkpoint.pt"
    elsewhere.parent.mkdir()
    (run / "checkpoint.pt").rename(elsewhere)
    (run / "checkpoint.pt").symlink_to(elsewhere)
    code, text = resume(run)
    assert code == 0, text
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").open()] == [1, 2, 3]


# --- P5: two runs in one folder ---------------------------------------------------------------
def test_a_folder_held_by_a_run_is_refused(tmp_path):
    folder = tmp_path / "run"
    with claim(folder, create=True):  # a run in progress (here: in this process)
        with pytest.raises(ConfigError, match="in use by another fbands train"):
            rl_train.train(tiny(folder), log=quiet)
        with pytest.raises(ConfigError, match="in use"):
            rl_train.train(tiny(folder), resume=True, log=quiet)
    assert list(folder.iterdir()) == []  # nothing was written, and no lock file is left
    rl_train.train(tiny(folder), log=quiet)  # once it ends, the folder is free
    assert [json.loads(x)["step"] for x in (folder / "metrics.jsonl").open()] == [1, 2]


@pytest.mark.slow
def test_two_runs_started_at_once_on_one_folder(tmp_path):
    """Two ``fbands train`` processes on one run_dir: one runs, the other is refused at
    once with one line, and the metrics hold each step once."""
    folder = tmp_path / "run"
    argv = [sys.executable, "-m", "fbands", "train", "--run-dir", str(folder), "--cache-dir",
            str(tmp_path / "c"), "--steps", "3", "--no-progress", "--warm-start-steps", "0",
            "--prompts-per-step", "2", "--group-size", "2"]
    procs = [subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    results = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    for p in procs:
        p.stdout.close()
        p.stderr.close()
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    refused = next(text for code, text in results if code == 2)
    assert refused.strip().splitlines()[-1].startswith("fbands: error: run_dir=")
    assert "in use by another fbands train" in refused
    assert [json.loads(x)["step"] for x in (folder / "metrics.jsonl").open()] == [1, 2, 3]


# --- P12: damaged metrics lines and odd paths -------------------------------------------------
@pytest.mark.parametrize("line", [b'{"step": "two", "reward": 0.5}', b"\xff\xfe not text",
                                  b"[1, 2]", b'{"reward": 0.5}'])
def test_a_damaged_metrics_line_is_named_not_a_traceback(run, line):
    metrics = run / "metrics.jsonl"
    rows = metrics.read_bytes().splitlines()
    metrics.write_bytes(b"\n".join([rows[0], line, *rows[1:]]) + b"\n")
    before = snapshot(run)
    code, text = resume(run)
    assert code == 2
    one_error_line(text, "metrics.jsonl", "line 2", "repair or remove")
    assert snapshot(run) == before


def test_only_the_last_metrics_line_may_be_cut_short(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1}\n\n{"step": 2}\n{"step": 3}\n{"step": 4, "rew')
    keep_metrics(path, 2)
    assert path.read_bytes() == b'{"step": 1}\n{"step": 2}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


def test_a_nul_in_a_path_of_a_config_file_is_one_line(tmp_path, capsys):
    config = tmp_path / "c.json"
    for field in ("run_dir", "cache_dir"):
        config.write_text(json.dumps({**TINY, "run_dir": str(tmp_path / "r"), field: "a\0b"}))
        assert fbands_main(["train", "--config", str(config)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"fbands: error: {field}=") and "NUL" in err, err
        assert err.count("\n") == 1


# --- P13: a checkpoint that cannot be written -------------------------------------------------
def test_a_full_disk_during_a_checkpoint_keeps_the_last_one(tmp_path, monkeypatch, capsys):
    """torch.save fails half-way through the second checkpoint (as on a full disk): the run
    stops with one line naming the file, the first checkpoint is intact and no temporary
    file is left in the folder."""
    real_save = torch.save
    calls = []

    def save(obj, f, *args, **kwargs):
        if not isinstance(f, io.BytesIO):
            calls.append(f)
            if len(calls) == 2:
                f.write(b"PK\x03\x04 part of a checkpoint")
                raise RuntimeError("[enforce fail at inline_container.cc] . PytorchStreamWriter "
                                   "failed writing file data/3: file write failed")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(rl_checkpoint.torch, "save", save)
    folder = tmp_path / "run"
    argv = ["train", "--run-dir", str(folder), "--cache-dir", str(tmp_path / "c"),
            "--steps", "3", "--no-progress", "--warm-start-steps", "0",
            "--prompts-per-step", "2", "--group-size", "2", "--checkpoint-every", "1"]
    assert fbands_main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("fbands: error: checkpoint ") and "file write failed" in err[-1]
    assert "previous checkpoint is kept" in err[-1]
    assert sorted(p.name for p in folder.iterdir()) == ["checkpoint.pt", "config.json",
                                                        "metrics.jsonl"]
    assert load_checkpoint(folder / "checkpoint.pt")["step"] == 1
    monkeypatch.setattr(rl_checkpoint.torch, "save", real_save)
    assert fbands_main([*argv, "--resume"]) == 0  # and the run goes on from there
    assert [json.loads(x)["step"] for x in (folder / "metrics.jsonl").open()] == [1, 2, 3]


def test_save_atomic_leaves_no_temporary_file_on_any_failure(tmp_path, monkeypatch):
    target = tmp_path / "checkpoint.pt"

    def fail(obj, f, *args, **kwargs):
        f.write(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(rl_checkpoint.torch, "save", fail)
    with pytest.raises(OSError, match="No space left on device"):
        rl_checkpoint.save_atomic({"step": 1}, target)
    assert os.listdir(tmp_path) == []
