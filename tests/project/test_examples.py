"""The scripts of examples/ run and show what they say (issue 42, first contact)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(name: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """The example ``name`` in a process of its own (for those that change the libraries
    they drive)."""
    return subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py"), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=EXAMPLES.parent)


def test_every_example_is_listed_and_tested():
    listed = (EXAMPLES / "README.md").read_text()
    tested = Path(__file__).read_text()
    for script in EXAMPLES.glob("*.py"):
        assert f"`{script.name}`" in listed, script.name
        assert (f'load("{script.stem}")' in tested
                or f'run("{script.stem}"' in tested), script.name


def test_plain_loop_band_outgrows_clip_on_the_rare_token(capsys):
    """On paired seeds (the same samples until the losses' updates differ), the band lets the
    rewarded token, at p = 0.01, grow faster than clip's 1 + 0.2 per step allows."""
    pytest.importorskip("torch")
    example = load("plain_pytorch_loss")
    for seed in range(4):
        clip, band = example.train("clip", 3, seed), example.train("band-kl", 3, seed)
        assert band[-1] > clip[-1] > 0.01, seed
    curves = example.main(["--steps", "2"])
    assert set(curves) == {"clip", "band-kl"}
    assert "band-kl  p(rewarded token)" in capsys.readouterr().out


@pytest.mark.slow
def test_trl_example_trains_with_the_band(capsys):
    pytest.importorskip("trl")
    logged = load("trl_band_grpo").main(["--steps", "2"])
    assert [row["step"] for row in logged] == [1, 2]
    assert all(row["band/delta"] == 0.05 for row in logged)
    assert logged[1]["band/ratio_max"] > 1  # the second pass reuses the batch: ratios move
    assert "clipped" in capsys.readouterr().out


@pytest.mark.slow
def test_verl_example_runs_verls_loss_and_refuses_a_bad_override():
    pytest.importorskip("verl")
    from fbands.errors import FBandsError

    example = load("verl_cpu_check")
    got = example.main([])
    assert got["metrics"]["actor/band/delta"] == 0.05
    other = example.main(["+actor_rollout_ref.actor.policy_loss.delta=0.2"])
    assert other["metrics"]["actor/band/delta"] == 0.2 and other["loss"] != got["loss"]
    from hydra.errors import InstantiationException

    # (verl's dataclass conversion wraps the plug-in's error in Hydra's, message kept)
    with pytest.raises((FBandsError, InstantiationException), match="unknown divergence 'nope'"):
        example.main(["+actor_rollout_ref.actor.policy_loss.div=nope"])


@pytest.mark.slow
def test_verl_example_trains_in_verls_own_worker(tmp_path):
    """verl's ActorRolloutRefWorker (FSDP2 over gloo) runs one actor update with the band on
    a CPU, in this process's layout and in verl's Ray worker group of two ranks; data
    parallelism over two ranks gives the update of one."""
    pytest.importorskip("verl")
    pytest.importorskip("ray")
    radius = "+actor_rollout_ref.actor.policy_loss.delta=0.1"
    found = {}
    for name, extra in (("one", []), ("ray", ["--ray", "--world", "2"])):
        done = run("verl_cpu_update", radius, "--json", str(tmp_path / f"{name}.json"), *extra)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "ok: verl's own actor update trained with the band" in done.stdout
        found[name] = json.loads((tmp_path / f"{name}.json").read_text())
    one, ray = found["one"], found["ray"]
    assert (one["ranks"], ray["ranks"]) == (1, 2) and ray["backend"] == "gloo"
    assert one["loss"] == "fbands.integrations.verl.fbands_band_policy_loss"
    assert one["band_calls"] == 2 and ray["band_calls"] == 2  # (a micro-batch each)
    assert one["tensors_moved"] == one["tensors"] > 0
    assert one["metrics"]["actor/band/delta"] == 0.1
    assert one["metrics"]["actor/pg_clipfrac"] > 0  # the stale old policy is clipped
    for key in ("actor/pg_loss", "actor/pg_clipfrac", "actor/band/band_width", "grad_norm"):
        assert ray["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-5), key
    assert ray["largest_move"] == pytest.approx(one["largest_move"], rel=1e-4)
