"""The reference trainer: smoke run, resume equivalence, NaN stop, HF directories, config."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tqdm")

from fbands.rl import cli as rl_cli  # noqa: E402
from fbands.rl import train as rl_train  # noqa: E402
from fbands.rl.compare import compare, load_run, steps_to  # noqa: E402
from fbands.rl.config import ConfigError, TrainConfig  # noqa: E402
from fbands.rl.model import char_tokenizer, load_policy, token_logprobs  # noqa: E402
from fbands.rl.tasks import AdditionTask, Prompt, TailTask, make_task  # noqa: E402


def small(tmp_path, name="run", **overrides) -> TrainConfig:
    """A CI-sized config: a smaller model, a short warm start, a few steps."""
    base = dict(run_dir=str(tmp_path / name), cache_dir=str(tmp_path / "cache"), steps=3,
                prompts_per_step=4, group_size=4, ppo_epochs=2, minibatches=2,
                warm_start_steps=20, tiny_d_model=32, eval_prompts=8, progress=False,
                checkpoint_every=1)
    return TrainConfig(**{**base, **overrides})


def quiet(_msg):
    pass


# --- tasks ---------------------------------------------------------------------------------
def test_tail_task_rewards_only_the_reversal_and_warm_start_share():
    task = TailTask(share=0.1, length=3)
    rng = np.random.default_rng(0)
    prompts = task.prompts(rng, 50)
    assert all(p.answer == p.text[:-1][::-1] and p.text.endswith(">") for p in prompts)
    p = Prompt("abc>", "cba")
    assert task.reward(p, "cba") == 1.0 and task.reward(p, "abc") == 0.0
    answers = [task.sft_answer(p, rng) for _ in range(4000)]
    assert abs(answers.count("cba") / 4000 - 0.1) < 0.02
    assert answers.count("abc") > answers.count("bca") > answers.count("cba")


def test_addition_task_is_exact_match():
    task = AdditionTask(2, 3)
    for p in task.prompts(np.random.default_rng(1), 100):
        a, b = p.text[:-1].split("+")
        assert 2 <= len(a) <= 3 and 2 <= len(b) <= 3
        assert p.answer == str(int(a) + int(b))
        assert task.reward(p, p.answer) == 1.0 and task.reward(p, p.answer + "0") == 0.0


# --- log-probabilities ----------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_chunked_logprobs_match_full_logits(arch, tmp_path):
    cfg = small(tmp_path, tiny_arch=arch)
    model, codec = load_policy(cfg, make_task(cfg))
    ids = torch.randint(3, len(codec.tokenizer), (3, 9))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # a left-padded row
    with torch.no_grad():
        lp, ent = token_logprobs(model, ids, mask, 4, chunk=5)
        full = torch.log_softmax(model(input_ids=ids, attention_mask=mask,
                                       position_ids=(mask.cumsum(-1) - 1).clamp(min=0)
                                       ).logits.float(), -1)
    want = full[:, 3:-1].gather(-1, ids[:, 4:, None]).squeeze(-1)
    torch.testing.assert_close(lp, want, atol=1e-5, rtol=1e-5)
    want_ent = -(full[:, 3:-1].exp() * full[:, 3:-1]).sum(-1)
    torch.testing.assert_close(ent, want_ent, atol=1e-5, rtol=1e-5)
    # gradients flow through the checkpointed chunks
    lp, _ = token_logprobs(model, ids, mask, 4, chunk=5)
    lp.sum().backward()
    assert model.get_output_embeddings().weight.grad.abs().sum() > 0


# --- training ---------------------------------------------------------------------------------
def test_smoke_run_writes_metrics_and_checkpoint(tmp_path):
    cfg = small(tmp_path, loss="band-kl")
    last = rl_train.train(cfg, log=quiet)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert 0.0 <= r["reward"] <= 1.0 and 0.0 <= r["accuracy"] <= 1.0
        assert r["entropy"] > 0 and r["tokens_per_s"] > 0 and np.isfinite(r["grad_norm"])
        for key in ("loss/clipfrac_upper", "loss/clipfrac_lower", "loss/tail_clipfrac_upper",
                    "loss/band_width", "loss/approx_kl_k3", "time/band_share"):
            assert np.isfinite(r[key]), key
    assert last["step"] == 3
    saved = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)
    assert saved["step"] == 3 and saved["data_position"] == 3 * cfg.prompts_per_step
    assert TrainConfig.from_dict(saved["config"]) == cfg
    assert list((tmp_path / "cache").glob("warmstart-tail-*.pt"))  # warm start cached
    # the same run folder refuses a second fresh start
    with pytest.raises(ConfigError, match="already holds a run"):
        rl_train.train(cfg, log=quiet)


def test_reward_is_computed_from_samples(tmp_path):
    """With the KL and entropy terms on, the addition task trains and rewards are 0/1 means."""
    cfg = small(tmp_path, task="addition", loss="clip", kl_coef=0.1, ent_coef=0.01,
                adv_std_norm=False, steps=2)
    rl_train.train(cfg, log=quiet)
    _, rows = load_run(cfg.run_dir)
    n = cfg.prompts_per_step * cfg.group_size
    for r in rows:
        assert abs(r["reward"] * n - round(r["reward"] * n)) < 1e-9
        assert r["loss/kl_ref"] >= 0


def _params(run_dir):
    return torch.load(f"{run_dir}/checkpoint.pt", weights_only=False)["model"]


def test_resume_equals_uninterrupted_run(tmp_path):
    # the entropy bonus moves the weights even in steps where no sample earns a reward
    opts = dict(steps=4, checkpoint_every=2, ent_coef=0.01)
    full = small(tmp_path, "full", **opts)
    rl_train.train(full, log=quiet)

    cut = small(tmp_path, "cut", **opts)
    rl_train.train(cut, stop_after=3, log=quiet)  # "killed" after step 3, last save at 2
    assert torch.load(f"{cut.run_dir}/checkpoint.pt", weights_only=False)["step"] == 2
    with open(f"{cut.run_dir}/metrics.jsonl", "a") as f:
        f.write('{"step": 4, "rew')  # a line cut short by the kill
    rl_train.train(cut, resume=True, log=quiet)

    a, b = _params(full.run_dir), _params(cut.run_dir)
    assert a.keys() == b.keys()
    (cached,) = (tmp_path / "cache").glob("warmstart-*.pt")
    start = torch.load(cached, weights_only=True)
    assert any(not torch.equal(start[k], a[k]) for k in a)  # RL did move the weights
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=0, rtol=0, msg=k)
    rows_full = [json.loads(x) for x in open(f"{full.run_dir}/metrics.jsonl")]
    rows_cut = [json.loads(x) for x in open(f"{cut.run_dir}/metrics.jsonl")]
    assert [r["step"] for r in rows_cut] == [1, 2, 3, 4]  # no step lost or repeated
    assert [r["reward"] for r in rows_cut] == [r["reward"] for r in rows_full]
    # a resumed run must keep its options
    other = dataclasses.replace(cut, lr=1e-2)
    with pytest.raises(ConfigError, match="lr"):
        rl_train.train(other, resume=True, log=quiet)


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    cfg = small(tmp_path, steps=4)
    real = rl_train.policy_loss
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        loss, metrics = real(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] > 2 * cfg.ppo_epochs * cfg.minibatches:  # from step 3 on
            loss = loss * float("nan")
        return loss, metrics

    monkeypatch.setattr(rl_train, "policy_loss", poisoned)
    with pytest.raises(rl_train.NonFiniteLossError, match="step 3.*step 2"):
        rl_train.train(cfg, log=quiet)
    saved = torch.load(f"{cfg.run_dir}/checkpoint.pt", weights_only=False)
    assert saved["step"] == 2
    assert all(torch.isfinite(v).all() for v in saved["model"].values())
    _, rows = load_run(cfg.run_dir)
    assert [r["step"] for r in rows] == [1, 2]


def test_save_pretrained_directory_loads_and_trains(tmp_path):
    cfg = small(tmp_path, tiny_arch="gpt2")
    task = make_task(cfg)
    model, codec = load_policy(cfg, task)
    folder = tmp_path / "hf"
    model.save_pretrained(folder)
    codec.tokenizer.save_pretrained(folder)
    # the entropy bonus gives a gradient even if no sample earns a reward
    run = small(tmp_path, "hfrun", model=str(folder), steps=2, warm_start_steps=0,
                ent_coef=0.01)
    rl_train.train(run, log=quiet)
    _, rows = load_run(run.run_dir)
    assert len(rows) == 2 and rows[-1]["grad_norm"] > 0
    before, after = model.state_dict(), _params(run.run_dir)
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_compare_plots_and_tabulates(tmp_path):
    a = small(tmp_path, "a", steps=2, loss="clip")
    b = small(tmp_path, "b", steps=2, loss="band-kl")
    for cfg in (a, b):
        rl_train.train(cfg, log=quiet)
    table = compare([a.run_dir, b.run_dir], tmp_path / "cmp.png")
    assert (tmp_path / "cmp.png").stat().st_size > 1000
    assert table.splitlines()[2].startswith("a ") and "final_accuracy" in table
    assert steps_to([{"step": 1, "accuracy": 0.5}], "accuracy", 0.9) is None


# --- configuration -----------------------------------------------------------------------------
@pytest.mark.parametrize("field,value", [
    ("steps", 0), ("group_size", 1), ("lr", -1.0), ("lr", float("nan")), ("task", "chess"),
    ("loss", "no-such-loss"), ("delta", 0.0), ("tail_share", 0.9), ("tiny_d_model", 30),
    ("temperature", 0.0), ("minibatches", 10_000), ("model", "/no/such/dir"),
    ("adv_std_norm", "yes"),
])
def test_bad_config_is_rejected_before_work(tmp_path, field, value):
    cfg = dataclasses.replace(small(tmp_path), **{field: value})
    with pytest.raises(ConfigError, match=field if field != "loss" else "loss"):
        rl_train.train(cfg, log=quiet)
    assert not (tmp_path / "run").exists()  # nothing was started


def test_config_file_and_unknown_keys(tmp_path):
    (tmp_path / "c.toml").write_text('task = "addition"\nsteps = 7\n')
    assert TrainConfig.from_file(tmp_path / "c.toml").steps == 7
    (tmp_path / "c.json").write_text('{"stepz": 7}')
    with pytest.raises(ConfigError, match="stepz"):
        TrainConfig.from_file(tmp_path / "c.json")


def test_cli_train_and_bad_option(tmp_path, capsys):
    import argparse

    parser = argparse.ArgumentParser()
    rl_cli.register(parser.add_subparsers())
    cfg = small(tmp_path)
    args = parser.parse_args(["train", "--run-dir", cfg.run_dir, "--cache-dir", cfg.cache_dir,
                              "--steps", "1", "--prompts-per-step", "2", "--group-size", "2",
                              "--minibatches", "1", "--warm-start-steps", "5",
                              "--tiny-d-model", "32", "--no-progress", "--loss", "clip-higher"])
    assert args.func(args) == 0
    assert json.loads((tmp_path / "run" / "config.json").read_text())["loss"] == "clip-higher"
    args = parser.parse_args(["train", "--run-dir", str(tmp_path / "x"), "--lr", "-1"])
    assert args.func(args) == 2
    assert "lr=-1.0" in capsys.readouterr().err


def test_char_tokenizer_roundtrip():
    tok = char_tokenizer("0123456789+=")
    ids = tok("12+5=", add_special_tokens=False)["input_ids"]
    assert len(ids) == 5 and tok.decode(ids) == "12+5="
