"""The reference trainer: smoke run, resume equivalence, NaN stop, HF directories, config."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import random
import stat
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tqdm")

from fbands.cli import main as fbands_main  # noqa: E402
from fbands.rl import checkpoint  # noqa: E402
from fbands.rl import evaluate as rl_evaluate  # noqa: E402
from fbands.rl import train as rl_train  # noqa: E402
from fbands.rl.checkpoint import sealed  # noqa: E402
from fbands.rl.compare import compare, compare_seeds, load_run, steps_to  # noqa: E402
from fbands.rl.config import ConfigError, TrainConfig  # noqa: E402
from fbands.rl.model import char_tokenizer, load_policy, token_logprobs  # noqa: E402
from fbands.rl.tasks import AdditionTask, Prompt, TailTask, make_task  # noqa: E402

from .._draws import old_prompts  # noqa: E402


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


def test_tail_task_with_two_rewarded_solutions():
    p = Prompt("abc>", "cba")
    both = TailTask(share=0.1, length=3, rewarded="reverse+rotate")
    only = TailTask(share=0.1, length=3)
    names = {"cba": "reverse", "bca": "rotate", "abc": "copy", "acb": None, "cb": None,
             " cba ": "reverse"}
    for completion, name in names.items():
        assert both.solution(p, completion) == only.solution(p, completion) == name
        assert both.reward(p, completion) == float(name in ("reverse", "rotate"))
        assert only.reward(p, completion) == float(name == "reverse")
    assert both.rewarded_text(p) == only.rewarded_text(p) == "cba"  # the rare solution
    assert both.exact_match and both.label(p) is None
    assert both.answer_start(p, "bca") == 0 and only.answer_start(p, "bca") is None
    # the warm start is the same for both settings, draw for draw
    a, b = np.random.default_rng(4), np.random.default_rng(4)
    assert both.sft_examples(a, 300) == only.sft_examples(b, 300)
    with pytest.raises(ValueError, match="rewarded"):
        TailTask(rewarded="rotate")


def test_tail_rewarded_option_and_its_warm_start_key(tmp_path):
    cfg = small(tmp_path, tail_rewarded="reverse+rotate").validate()
    assert make_task(cfg).reward(Prompt("abc>", "cba"), "bca") == 1.0
    assert make_task(small(tmp_path)).reward(Prompt("abc>", "cba"), "bca") == 0.0
    assert cfg.warm_start_key() == small(tmp_path).warm_start_key()  # one cache for both
    assert (small(tmp_path, verify_true_share=0.5).warm_start_key()
            == small(tmp_path).warm_start_key())  # a verify option: tail caches kept
    with pytest.raises(ConfigError, match="tail_rewarded"):
        small(tmp_path, tail_rewarded="rotate").validate()


def test_tail_held_out_prompts_are_never_trained_on(tmp_path):
    split = make_task(small(tmp_path, tail_held_out=0.2).validate())
    whole = TailTask()
    pool = {p.text for p in split.eval_pool()}
    assert 0.1 * 336 < len(pool) < 0.3 * 336 and pool < {p.text for p in whole.eval_pool()}
    rng = np.random.default_rng(3)
    trained = {p.text for p in split.prompts(rng, 4000)}
    warm = {text for text, _ in split.sft_examples(rng, 4000)}
    assert trained == warm == {p.text for p in whole.eval_pool()} - pool  # all the rest
    held = split.prompts(np.random.default_rng(0), 500, split="eval")
    assert {p.text for p in held} == pool and len(held) == len(pool)
    # no split by default: the warm start draws what it always drew
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    assert whole.sft_examples(a, 200) == TailTask(held_out=0.0).sft_examples(b, 200)
    assert (small(tmp_path, tail_held_out=0.2).warm_start_key()
            != small(tmp_path).warm_start_key())
    with pytest.raises(ConfigError, match="tail_held_out"):
        small(tmp_path, tail_held_out=1.0).validate()


@pytest.mark.parametrize("task", [TailTask(), TailTask(0.06, 5, "reverse+rotate"),
                                  AdditionTask(), AdditionTask(1, 1)],
                         ids=["tail", "tail5", "add", "add1"])
def test_toy_tasks_training_draw_unchanged_and_eval_draw_distinct(task):
    for seed in range(3):
        new, old = np.random.default_rng(seed), np.random.default_rng(seed)
        assert task.prompts(new, 64) == old_prompts(task, old, 64)
        assert new.random() == old.random()
    old = old_prompts(task, np.random.default_rng(0), 64, split="eval")
    held = task.prompts(np.random.default_rng(0), 64, split="eval")
    assert len(held) == len({p.text for p in held}) == 64
    pool = task.eval_pool()
    if pool is not None and len(pool) <= 400:  # a small pool: the old draw repeated prompts
        assert len({p.text for p in old}) < 64
    assert held == task.prompts(np.random.default_rng(0), 64, split="eval")
    for p in held:
        assert task.reward(p, task.rewarded_text(p)) == 1.0 and task.rewarded_text(p) == p.answer
        assert task.exact_match and task.reward(p, task.rewarded_text(p) + "a") == 0.0


def test_toy_eval_draw_smaller_pool_than_asked():
    short = TailTask(length=2)  # 8 * 7 = 56 prompts in all
    held = short.prompts(np.random.default_rng(0), 100, split="eval")
    assert len(held) == 56 and len({p.text for p in held}) == 56
    assert all(p.answer == p.text[1] + p.text[0] for p in held)
    one_digit = AdditionTask(1, 1)  # 10 * 10 prompts
    held = one_digit.prompts(np.random.default_rng(0), 500, split="eval")
    assert sorted(p.text for p in held) == sorted(f"{a}+{b}=" for a in range(10)
                                                  for b in range(10))
    wide = AdditionTask(1, 2)  # not listed (two operand lengths): distinct draws
    held = wide.prompts(np.random.default_rng(0), 200, split="eval")
    assert len({p.text for p in held}) == 200


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
        for key in ("band/clipfrac_upper", "band/clipfrac_lower", "band/tail_clipfrac_upper",
                    "band/band_width", "band/approx_kl_k3", "time/band_share"):
            assert np.isfinite(r[key]), key
        step_s = r["time/rollout_s"] + r["time/update_s"]
        assert 0 < r["time/band_s"] < step_s
        assert r["time/band_share"] == pytest.approx(r["time/band_s"] / step_s)
    assert last["step"] == 3
    saved = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert saved["step"] == 3 and saved["data_position"] == 3 * cfg.prompts_per_step
    assert TrainConfig.from_dict(saved["config"]) == cfg
    assert list((tmp_path / "cache" / "warmstart").glob("tail-*.pt"))  # warm start cached
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


def test_update_metrics_leave_the_on_policy_update_out(tmp_path):
    """The first update of a step is on-policy; the off-policy diagnostics skip it."""
    cfg = small(tmp_path, loss="clip", steps=2, ppo_epochs=2, minibatches=2, ent_coef=0.01)
    rl_train.train(cfg, log=quiet)
    _, rows = load_run(cfg.run_dir)
    updates = cfg.ppo_epochs * cfg.minibatches
    for r in rows:
        for name in ("ratio_q05", "ratio_q50", "ratio_q95", "ratio_min", "ratio_max",
                     "outside", "clipped"):
            assert len(r[f"update/{name}"]) == updates, name
        assert r["update/ratio_min"][0] == r["update/ratio_max"][0] == 1.0  # on-policy
        assert r["update/outside"][0] == 0.0
        assert all(q05 <= q50 <= q95 for q05, q50, q95 in zip(
            r["update/ratio_q05"], r["update/ratio_q50"], r["update/ratio_q95"], strict=True))
        # the summaries read the off-policy updates only, extremes as extremes
        assert r["band/ratio_max"] == pytest.approx(max(r["update/ratio_max"][1:]))
        assert r["band/ratio_min"] == pytest.approx(min(r["update/ratio_min"][1:]))
        assert r["band/clipfrac"] == pytest.approx(np.mean(r["update/clipped"][1:]), abs=1e-6)
    assert any(max(r["update/ratio_max"][1:]) > 1.0 for r in rows)  # the policy did move


def test_mechanism_metrics_count_every_token_and_sum_the_kl(tmp_path, monkeypatch):
    # a warm start long enough (and a common enough reversal) that some samples earn reward
    cfg = small(tmp_path, loss="band-kl", steps=3, tail_share=0.3, warm_start_steps=300)

    class Labelled(TailTask):  # prompts in two classes: answer/start_p is split by class
        def label(self, prompt):
            return "early" if prompt.text[0] < "e" else "late"

    monkeypatch.setattr("fbands.rl._run.make_task", lambda c: Labelled(c.tail_share, c.tail_length))
    rl_train.train(cfg, log=quiet)
    _, rows = load_run(cfg.run_dir)
    from fbands.rl.diagnostics import P_OLD_BINS

    total, seen = 0.0, 0
    for r in rows:
        tokens = sum(r[f"tokens/{side}/{b}"] for side in ("A+", "A-") for b in P_OLD_BINS)
        assert tokens <= r["response_len"] * cfg.prompts_per_step * cfg.group_size
        assert r["response_len"] <= r["response_width"] <= cfg.max_new_tokens
        seen += tokens
        for side in ("A+", "A-"):
            for b in P_OLD_BINS:
                assert (r[f"dlogp/{side}/{b}"] is None) == (r[f"tokens/{side}/{b}"] == 0)
        assert r["kl/update"] >= 0
        total += r["kl/update"]
        assert r["kl/cumulative"] == pytest.approx(total)
        for side in ("A+", "A-"):
            assert len(r[f"dlogp/tail_{side}_per_prompt"]) == cfg.prompts_per_step
        assert r["time/after_update_s"] > 0
        split = [r[k] for k in ("answer/start_p/early", "answer/start_p/late") if k in r]
        if "answer/start_p" in r:  # the overall mean lies between the classes' means
            assert split and min(split) - 1e-9 <= r["answer/start_p"] <= max(split) + 1e-9
    assert seen > 0
    off = small(tmp_path, "off", loss="band-kl", steps=1, mechanism_metrics=False)
    rl_train.train(off, log=quiet)
    _, (row,) = load_run(off.run_dir)
    assert "kl/update" not in row and not any(k.startswith("dlogp/") for k in row)


def test_cumulative_kl_survives_a_resume(tmp_path):
    full = small(tmp_path, "full", steps=3, checkpoint_every=1, ent_coef=0.01)
    rl_train.train(full, log=quiet)
    cut = small(tmp_path, "cut", steps=3, checkpoint_every=1, ent_coef=0.01)
    rl_train.train(cut, stop_after=2, log=quiet)
    rl_train.train(cut, resume=True, log=quiet)
    a = [r["kl/cumulative"] for r in load_run(full.run_dir)[1]]
    b = [r["kl/cumulative"] for r in load_run(cut.run_dir)[1]]
    assert a == b and a[-1] > a[0] > 0


def test_held_out_scores_read_the_rewarded_text(tmp_path):
    """p_correct, logp_correct and entropy/first against a forward pass written here."""
    cfg = small(tmp_path, temperature=0.7).validate()
    task = make_task(cfg)
    model, codec = load_policy(cfg, task)
    prompts = [Prompt("abc>", "cba"), Prompt("dea>", "aed")]

    class Shown(type(task)):  # a task rewarded for another text, read as a prefix
        exact_match = False

        def rewarded_text(self, prompt):
            return prompt.text[:2]

    shown = Shown()
    got = rl_evaluate.held_out_scores(model, codec, shown, prompts, cfg, "cpu",
                                      rl_train.contextlib.nullcontext)
    logps, entropies = [], []
    with torch.no_grad():
        for p in prompts:
            ids = codec.prompt_ids(p.text)
            text = codec.tokenizer(p.text[:2], add_special_tokens=False)["input_ids"]
            logits = model(torch.tensor([ids + text])).logits[0].double() / 0.7
            logsm = torch.log_softmax(logits, -1)
            logps.append(sum(float(logsm[len(ids) - 1 + k, t]) for k, t in enumerate(text)))
            first = logsm[len(ids) - 1]
            entropies.append(float(-(first.exp() * first).sum()))
    assert got["logp_correct"] == pytest.approx(np.mean(logps), abs=1e-5)
    assert got["p_correct"] == pytest.approx(np.mean(np.exp(logps)), abs=1e-6)
    assert got["entropy/first"] == pytest.approx(np.mean(entropies), abs=1e-5)
    # two spellings of the rewarded text: their probabilities add up
    class Spelt(Shown):
        def rewarded_texts(self, prompt):
            return (prompt.text[:2], prompt.text[1:3])

    both = rl_evaluate.held_out_scores(model, codec, Spelt(), prompts, cfg, "cpu",
                                       rl_train.contextlib.nullcontext)
    other = []
    with torch.no_grad():
        for p in prompts:
            ids = codec.prompt_ids(p.text)
            text = codec.tokenizer(p.text[1:3], add_special_tokens=False)["input_ids"]
            logsm = torch.log_softmax(model(torch.tensor([ids + text])).logits[0].double() / 0.7,
                                      -1)
            other.append(sum(float(logsm[len(ids) - 1 + k, t]) for k, t in enumerate(text)))
    assert both["logp_correct"] == pytest.approx(np.mean(np.logaddexp(logps, other)), abs=1e-5)
    assert both["entropy/first"] == pytest.approx(got["entropy/first"], abs=1e-6)
    # an exact-match task also scores the end token after its answer
    exact = rl_evaluate.held_out_scores(model, codec, task, prompts, cfg, "cpu",
                                        rl_train.contextlib.nullcontext)
    assert exact["entropy/first"] == pytest.approx(got["entropy/first"], abs=1e-6)


def test_held_out_sampling_gives_pass_at_k(tmp_path):
    cfg = small(tmp_path, steps=1, eval_samples=4)
    last = rl_train.train(cfg, log=quiet)
    assert 0 <= last["eval/pass@1"] <= last["eval/pass@4"] <= 1


def test_two_solution_shares_are_logged(tmp_path):
    cfg = small(tmp_path, steps=1, tail_rewarded="reverse+rotate")
    last = rl_train.train(cfg, log=quiet)
    shares = [last[f"solution/{n}"] for n in ("reverse", "rotate", "copy")]
    assert all(0 <= s <= 1 for s in shares) and sum(shares) <= 1 + 1e-12
    assert last["reward"] == pytest.approx(shares[0] + shares[1])


def _params(run_dir):
    return torch.load(f"{run_dir}/checkpoint.pt", weights_only=True)["model"]


def test_resume_equals_uninterrupted_run(tmp_path):
    # the entropy bonus moves the weights even in steps where no sample earns a reward
    opts = dict(steps=4, checkpoint_every=2, ent_coef=0.01)
    full = small(tmp_path, "full", **opts)
    rl_train.train(full, log=quiet)

    cut = small(tmp_path, "cut", **opts)
    rl_train.train(cut, stop_after=3, log=quiet)  # "killed" after step 3, last save at 2
    assert torch.load(f"{cut.run_dir}/checkpoint.pt", weights_only=True)["step"] == 2
    with open(f"{cut.run_dir}/metrics.jsonl", "a") as f:
        f.write('{"step": 4, "rew')  # a line cut short by the kill
    rl_train.train(cut, resume=True, log=quiet)

    a, b = _params(full.run_dir), _params(cut.run_dir)
    assert a.keys() == b.keys()
    (cached,) = (tmp_path / "cache" / "warmstart").glob("*.pt")
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
    saved = torch.load(f"{cfg.run_dir}/checkpoint.pt", weights_only=True)
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


def _metrics_folder(path, accuracies, entropy):
    path.mkdir(parents=True)
    rows = [{"step": i + 1, "reward": a, "accuracy": a, "p_correct": a, "entropy": entropy,
             "band/tail_clipfrac_upper": 0.1, "tokens_per_s": 100.0}
            for i, a in enumerate(accuracies)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_compare_seeds_means_and_pairs(tmp_path):
    """The demo's table: each loss's mean over paired seeds, then the steps to the target
    seed by seed and their difference; a seed that never reaches it is said so."""
    groups = {
        "clip": [_metrics_folder(tmp_path / "c0", [0.1, 0.5, 0.9, 0.9], 0.4),
                 _metrics_folder(tmp_path / "c1", [0.1, 0.2, 0.3, 0.85], 0.2)],
        "band-kl": [_metrics_folder(tmp_path / "b0", [0.8, 0.9, 0.9, 0.9], 0.1),
                    _metrics_folder(tmp_path / "b1", [0.1, 0.2, 0.3, 0.4], 0.3)],
    }
    text = compare_seeds(groups, [5, 6], tmp_path / "seeds.png")
    assert (tmp_path / "seeds.png").stat().st_size > 1000
    lines = text.splitlines()
    head = lines[0].split()
    clip = dict(zip(head, lines[2].split(), strict=True))
    assert clip["run"] == "clip" and clip["steps"] == "4"
    assert float(clip["final_accuracy"]) == pytest.approx(0.875, abs=1e-3)
    assert float(clip["mean_entropy"]) == pytest.approx(0.3, abs=1e-3)
    assert float(clip["steps_to_acc_0.8"]) == pytest.approx(3.5, abs=1e-3)
    band = lines[3].split()
    assert band[0] == "band-kl" and "1/2 never" in lines[3]
    assert "seeds 5 6" in text
    assert lines[-3].split() == ["clip", "3", "4"]
    assert lines[-2].split() == ["band-kl", "1", "never"]
    assert lines[-1].split() == ["band-kl", "-", "clip", "-2", "n/a"]
    with pytest.raises(ValueError, match="1 runs for 2 seeds"):
        compare_seeds({"clip": groups["clip"][:1]}, [5, 6], tmp_path / "x.png")


# --- configuration -----------------------------------------------------------------------------
@pytest.mark.parametrize("field,value", [
    ("steps", 0), ("group_size", 1), ("lr", -1.0), ("lr", float("nan")), ("task", "chess"),
    ("loss", "no-such-loss"), ("delta", 0.0), ("tail_share", 0.9), ("tiny_d_model", 30),
    ("temperature", 0.0), ("minibatches", 10_000), ("model", "/no/such/dir"),
    ("adv_std_norm", "yes"), ("loss", "band-nope"), ("cache_dir", 5), ("extra", [1]),
    ("tail_rewarded", "copy"), ("verify_true_share", 1.2),
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
    cfg = small(tmp_path)
    assert fbands_main(["train", "--run-dir", cfg.run_dir, "--cache-dir", cfg.cache_dir,
                        "--steps", "1", "--prompts-per-step", "2", "--group-size", "2",
                        "--minibatches", "1", "--warm-start-steps", "5",
                        "--tiny-d-model", "32", "--no-progress", "--loss", "clip-higher"]) == 0
    assert json.loads((tmp_path / "run" / "config.json").read_text())["loss"] == "clip-higher"
    capsys.readouterr()
    assert fbands_main(["train", "--run-dir", str(tmp_path / "x"), "--lr", "-1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fbands: error: lr=-1.0") and err.count("\n") == 1


def test_char_tokenizer_roundtrip():
    tok = char_tokenizer("0123456789+=")
    ids = tok("12+5=", add_special_tokens=False)["input_ids"]
    assert len(ids) == 5 and tok.decode(ids) == "12+5="


# --- robustness: checkpoints, folders, config files, errors (issue 19) ----------------------
PAYLOAD_LOSS = "band-alpha(a=(__import__('os').system('touch {marker}') or 2))"


class RunsCode:
    """An object whose unpickling would run a shell command (what a crafted file holds)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def checkpoint_like(cfg, **changes) -> dict:
    """A dict shaped like a checkpoint (no training needed)."""
    return {"model": {}, "optimizer": {}, "rng": {}, "step": 1, "data_position": 4,
            "config": cfg.to_dict(), **changes}


def prepared_run(tmp_path, content) -> TrainConfig:
    """A run folder with config.json and a checkpoint.pt of the given bytes or object."""
    cfg = small(tmp_path)
    run = Path(cfg.run_dir)
    run.mkdir()
    (run / "config.json").write_text(json.dumps(cfg.to_dict()))
    if isinstance(content, bytes):
        (run / "checkpoint.pt").write_bytes(content)
    else:  # (a table is sealed with its digest, so that its entries are what is checked)
        torch.save(sealed(content) if isinstance(content, dict) else content,
                   run / "checkpoint.pt")
    return cfg


def test_rng_state_round_trips_through_a_weights_only_checkpoint(tmp_path):
    random.seed(1)
    np.random.seed(2)  # noqa: NPY002
    torch.manual_seed(3)
    np.random.standard_normal(1)  # noqa: NPY002  (leaves a cached Gaussian in the state)
    torch.save({"rng": checkpoint.rng_state(torch.device("cpu"))}, tmp_path / "s.pt")
    want = (random.random(), np.random.standard_normal(), torch.rand(1).item())  # noqa: NPY002
    state = torch.load(tmp_path / "s.pt", weights_only=True)["rng"]
    checkpoint.set_rng_state(state, torch.device("cpu"))
    assert (random.random(), np.random.standard_normal(), torch.rand(1).item()) == want  # noqa: NPY002


def test_checkpoint_that_runs_code_is_refused(tmp_path, capsys):
    marker = tmp_path / "PWNED"
    cfg = prepared_run(tmp_path, checkpoint_like(small(tmp_path), model=RunsCode(marker)))
    with pytest.raises(ConfigError, match="checkpoint .* cannot be read"):
        rl_train.train(cfg, resume=True, log=quiet)
    assert checkpoint.saved_step(Path(cfg.run_dir, "checkpoint.pt")) is None  # the NaN path
    assert fbands_main(["train", "--resume", "--run-dir", cfg.run_dir]) == 2
    assert capsys.readouterr().err.startswith("fbands: error: checkpoint")
    assert not marker.exists()


@pytest.mark.parametrize("kind", ["empty", "truncated", "random", "no-config", "a-list",
                                  "bad-step"])
def test_unreadable_checkpoint_is_a_config_error(tmp_path, kind):
    whole = io.BytesIO()
    torch.save(checkpoint_like(small(tmp_path)), whole)
    content = {
        "empty": b"",
        "truncated": whole.getvalue()[: len(whole.getvalue()) // 2],
        "random": np.random.default_rng(0).bytes(4096),
        "no-config": {k: v for k, v in checkpoint_like(small(tmp_path)).items() if k != "config"},
        "a-list": [1, 2, 3],
        "bad-step": checkpoint_like(small(tmp_path), step="1"),
    }[kind]
    cfg = prepared_run(tmp_path, content)
    with pytest.raises(ConfigError, match=r"checkpoint '.*checkpoint\.pt'"):
        rl_train.train(cfg, resume=True, log=quiet)


def test_checkpoint_of_another_model_is_a_config_error(tmp_path):
    cfg = prepared_run(tmp_path, checkpoint_like(small(tmp_path)))  # no weights in it
    with pytest.raises(ConfigError, match="does not fit"):
        rl_train.train(cfg, resume=True, log=quiet)


@pytest.mark.parametrize("field", ["run_dir", "cache_dir"])
def test_run_and_cache_dir_must_be_folders(tmp_path, field, capsys):
    file = tmp_path / "a_file"
    file.write_text("not a folder")
    for value in (file, file / "below"):
        cfg = dataclasses.replace(small(tmp_path), **{field: str(value)})
        with pytest.raises(ConfigError, match=f"{field}=.*'{file}' is a file"):
            rl_train.train(cfg, log=quiet)
    flag = "--" + field.replace("_", "-")
    argv = ["train", "--run-dir", str(tmp_path / "run"), "--cache-dir", str(tmp_path / "c"),
            flag, str(file / "below")]
    assert fbands_main(argv) == 2  # found before the warm start: nothing was written
    assert capsys.readouterr().err.startswith(f"fbands: error: {field}=")
    assert not (tmp_path / "run").exists() and not (tmp_path / "c").exists()


@pytest.mark.parametrize("name, content, fragment", [
    ("c.json", '{"steps": 3', "not valid JSON"),
    ("c.json", "", "not valid JSON"),
    ("c.json", "[1, 2]", "table of option names"),
    ("c.json", "[" * 100_000, "JSON"),
    ("c.json", b"\xff\xfe{}", "cannot be read"),
    ("c.toml", "steps = ", "not valid TOML"),
    ("c.toml", "steps = 3\nsteps = 4\n", "not valid TOML"),
    ("c.yaml", "steps: 3", "expected a .json or .toml"),
    ("c.json", '{"steps": "3"}', "steps='3'"),
    ("c.json", '{"lr": NaN}', "lr=nan"),
    ("c.toml", "extra = {when = 1979-05-27}", "extra"),
])
def test_malformed_config_files_are_config_errors(tmp_path, capsys, name, content, fragment):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ConfigError, match=fragment):
        TrainConfig.from_file(path).validate()
    assert fbands_main(["train", "--config", str(path), "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fbands: error: ") and err.count("\n") == 1


def test_loss_payloads_are_not_run_on_any_trainer_surface(tmp_path, capsys):
    marker = tmp_path / "PWNED"
    loss = PAYLOAD_LOSS.format(marker=marker)
    with pytest.raises(ConfigError, match="loss="):
        dataclasses.replace(small(tmp_path), loss=loss).validate()
    assert fbands_main(["train", "--run-dir", str(tmp_path / "a"), "--loss", loss]) == 2
    (tmp_path / "c.json").write_text(json.dumps({"loss": loss}))
    (tmp_path / "c.toml").write_text(f"loss = {json.dumps(loss)}\n")
    for config in ("c.json", "c.toml"):
        argv = ["train", "--run-dir", str(tmp_path / "b"), "--config", str(tmp_path / config)]
        assert fbands_main(argv) == 2
    # a run's saved config.json, edited, is read the same way on --resume
    cfg = prepared_run(tmp_path, checkpoint_like(small(tmp_path)))
    saved = Path(cfg.run_dir, "config.json")
    saved.write_text(json.dumps({**cfg.to_dict(), "loss": loss}))
    assert fbands_main(["train", "--resume", "--run-dir", cfg.run_dir]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 4 and all(e.startswith("fbands: error: loss=") for e in errors)
    assert not marker.exists()


def test_resume_accepts_other_spellings_of_the_run_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    options = ["--cache-dir", "cache", "--prompts-per-step", "2", "--group-size", "2",
               "--minibatches", "1", "--warm-start-steps", "5", "--tiny-d-model", "32",
               "--eval-every", "0", "--no-progress"]
    assert fbands_main(["train", "--run-dir", "r3", "--steps", "1", *options]) == 0
    for steps, spelling in ((2, "./r3"), (3, "r3/"), (4, str(tmp_path / "r3"))):
        argv = ["train", "--resume", "--run-dir", spelling, "--steps", str(steps), "--no-progress"]
        assert fbands_main(argv) == 0, spelling
    _, rows = load_run(tmp_path / "r3")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]


def test_a_warm_start_cache_others_can_write_is_never_read(tmp_path):
    """Another user who can write the cache folder, or who owns the file, must not choose
    the starting weights of a run: such a file is never loaded, and nothing is saved there."""
    from fbands.rl import model as rl_model

    cfg = small(tmp_path, warm_start_steps=2)
    task = make_task(cfg)
    model, codec = load_policy(cfg, task, log=quiet)
    rl_model.warm_start(model, codec, task, cfg, "cpu", log=quiet)
    folder = tmp_path / "cache" / "warmstart"
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    (cached,) = folder.glob("*.pt")
    planted = {k: torch.full_like(v, 7.0) for k, v in torch.load(cached, weights_only=True).items()}
    torch.save(planted, cached)  # what another user would put there

    def starts_from_planted(messages):
        model, codec = load_policy(cfg, task, log=quiet)
        note = rl_model.warm_start(model, codec, task, cfg, "cpu", log=messages.append)
        weights = model.state_dict()
        return note, all(torch.equal(weights[k], planted[k]) for k in planted)

    note, planted_used = starts_from_planted([])
    assert "loaded" in note and planted_used  # a private folder: the file is this user's

    os.chmod(folder, 0o777)  # a folder anyone can write: nothing in it is trusted
    messages = []
    note, planted_used = starts_from_planted(messages)
    assert "loaded" not in note and "saved" not in note and not planted_used
    assert any("not a folder private to this user" in m for m in messages)
    kept = torch.load(cached, weights_only=True)  # (and the planted file is not replaced)
    assert all(torch.equal(kept[k], planted[k]) for k in planted)
    os.chmod(folder, 0o700)

    link = folder / "elsewhere.pt"  # a link is not followed, to a good file or a bad one
    cached.rename(link)
    cached.symlink_to(link)
    note, planted_used = starts_from_planted([])
    assert "loaded" not in note and not planted_used
    cached.unlink()
    link.rename(cached)

    try:
        os.chown(cached, 12345, -1)  # another user's file (only root can make one here)
    except PermissionError:
        return
    note, planted_used = starts_from_planted([])
    assert "loaded" not in note and not planted_used


def test_a_damaged_warm_start_cache_is_trained_again(tmp_path):
    """A truncated or foreign cache file is never trusted: the warm start is redone and the
    file replaced by a good one."""
    from fbands.rl import model as rl_model

    cfg = small(tmp_path, warm_start_steps=3)
    task = make_task(cfg)
    model, codec = load_policy(cfg, task, log=quiet)
    rl_model.warm_start(model, codec, task, cfg, "cpu", log=quiet)
    (cached,) = (tmp_path / "cache" / "warmstart").glob("*.pt")
    good = torch.load(cached, weights_only=True)
    messages = []
    for damage in (b"", cached.read_bytes()[:100], b"not a checkpoint"):
        cached.write_bytes(damage)
        model, codec = load_policy(cfg, task, log=quiet)
        note = rl_model.warm_start(model, codec, task, cfg, "cpu", log=messages.append)
        assert "loaded" not in note
        reread = torch.load(cached, weights_only=True)
        assert {k: v.shape for k, v in reread.items()} == {k: v.shape for k, v in good.items()}
    assert sum("ignoring the unreadable cache file" in m for m in messages) == 3


def test_the_sampler_records_the_log_probs_it_drew_from(tmp_path):
    from fbands.rl._run import open_run
    from fbands.rl.rollout import sample

    cfg = small(tmp_path, temperature=0.7).validate()
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True)
    run = open_run(cfg, False, quiet, run_dir / "checkpoint.pt", run_dir / "metrics.jsonl")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        batch = sample(run.model, run.codec, ["abc>", "hgf>"], 4, cfg.max_new_tokens,
                       cfg.temperature, gen, run.device, run.autocast)
        logp, _ = run.logprobs(run.model, batch.input_ids, batch.attention_mask,
                               batch.prompt_width)
    m = batch.response_mask.bool()
    assert batch.logp.shape == logp.shape and m.sum() > 8
    # the incremental sampler and the trainer's full pass agree to float32 rounding
    assert torch.allclose(batch.logp[m], logp[m], atol=1e-4, rtol=0)


def test_a_mismatch_gate_reaches_the_loss_and_its_weight_is_logged(tmp_path, monkeypatch):
    from fbands.rl import rollout

    plain = small(tmp_path, "plain", steps=2, checkpoint_every=0)
    wide = small(tmp_path, "wide", steps=2, checkpoint_every=0, gate_div="tv", gate_delta=0.9)
    for cfg in (plain, wide):
        rl_train.train(cfg, log=quiet)
    (_, a), (_, b) = load_run(plain.run_dir), load_run(wide.run_dir)
    # a gate that keeps every token changes no bit of the update
    assert [r["loss/pg"] for r in a] == [r["loss/pg"] for r in b]
    assert "band/gate_weight" not in a[0] and [r["band/gate_weight"] for r in b] == [1.0, 1.0]
    # a sampler whose log-probs are off by 1 on every other token: those leave a tv gate of
    # 0.01 unless their probability is tiny, and the logged weight says so
    original = rollout.sample

    def shifted(*args, **kwargs):
        batch = original(*args, **kwargs)
        batch.logp[:, ::2] -= 1.0
        return batch

    monkeypatch.setattr(rl_train, "sample", shifted)
    gated = small(tmp_path, "gated", steps=1, checkpoint_every=0, gate_div="tv",
                  gate_delta=0.01)
    rl_train.train(gated, log=quiet)
    (row,) = load_run(gated.run_dir)[1]
    assert 0.3 < row["band/gate_weight"] < 0.8
    with pytest.raises(ConfigError, match="gate_mode"):
        small(tmp_path, gate_div="kl", gate_mode="clip").validate()
    with pytest.raises(ConfigError, match="gate_div='kll'"):
        small(tmp_path, gate_div="kll").validate()


def test_the_band_metrics_are_the_shared_vocabulary_and_old_names_still_read(tmp_path):
    from fbands.losses import METRIC_KEYS

    from .._vocabulary import vocabulary

    cfg = small(tmp_path, steps=1, checkpoint_every=0, delta_schedule="adaptive:0.05")
    rl_train.train(cfg, log=quiet)
    (row,) = load_run(cfg.run_dir)[1]
    band = {k for k in row if k.startswith("band/")}
    assert band <= vocabulary()
    assert {f"band/{k}" for k in METRIC_KEYS} | {"band/delta", "band/measured_kl"} <= band
    # a run of an earlier version: loss/<metric>, delta, delta/next
    old = tmp_path / "old"
    old.mkdir()
    (old / "metrics.jsonl").write_text(json.dumps(
        {"step": 1, "loss/clipfrac": 0.25, "loss/total": -0.5, "delta": 0.05,
         "delta/next": 0.06, "gate/weight": 0.9}) + "\n")
    (got,) = load_run(old)[1]
    assert got == {"step": 1, "band/clipfrac": 0.25, "loss/total": -0.5, "band/delta": 0.05,
                   "band/delta_next": 0.06, "band/gate_weight": 0.9}
