"""The TRL plug-in, with the real TRL: a band GRPO trainer on a tiny random model, on CPU."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import GRPOConfig, GRPOTrainer

import fbands
from fbands import losses as fl
from fbands.integrations.trl import (
    BandGRPOConfig,
    BandGRPOTrainer,
    BandInactiveWarning,
    TRLBandError,
)

CHARS = "abcdefghijklmnopqrstuvwxyz "


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer built in code (nothing is downloaded)."""
    vocab = {t: i for i, t in enumerate(["<pad>", "<bos>", "<eos>", "<unk>", *CHARS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
    )


def tiny_model(tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> LlamaForCausalLM:
    """A one-layer Llama with random weights."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    return LlamaForCausalLM(config)


def letter_reward(completions, **kwargs) -> list[float]:
    """A made-up reward that differs between completions: the share of early letters."""
    return [sum(c in "abcdefghij" for c in text) / max(len(text), 1) for text in completions]


def dataset(n: int = 8) -> Dataset:
    prompts = ["abc", "hello", "xyz", "the cat", "ruby", "quiet", "map", "go on"]
    return Dataset.from_dict({"prompt": [prompts[i % len(prompts)] for i in range(n)]})


def make_args(tmp_path, cls=BandGRPOConfig, **overrides):
    options = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        max_steps=2,
        num_iterations=2,
        learning_rate=0.3,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        seed=0,
        disable_dropout=True,
    )
    if cls is BandGRPOConfig:
        options.update(band_div="kl", band_delta=0.01)
    options.update(overrides)
    return cls(**options)


def make_trainer(tmp_path, cls=BandGRPOTrainer, **overrides):
    tokenizer = tiny_tokenizer()
    args_cls = BandGRPOConfig if cls is BandGRPOTrainer else GRPOConfig
    return cls(
        model=tiny_model(tokenizer),
        reward_funcs=letter_reward,
        args=make_args(tmp_path, args_cls, **overrides),
        train_dataset=dataset(),
        processing_class=tokenizer,
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A band trainer after 2 steps with num_iterations=2, and the warnings it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = make_trainer(tmp_path_factory.mktemp("band"))
        before = [p.detach().clone() for p in trainer.model.parameters()]
        trainer.train()
    return trainer, before, caught


def test_band_trainer_trains_clips_and_logs(trained):
    trainer, before, caught = trained
    assert not [w for w in caught if issubclass(w.category, BandInactiveWarning)]
    logs = [entry for entry in trainer.state.log_history if "band/clipfrac" in entry]
    assert len(logs) == 2  # one per optimizer step
    for key in fl.METRIC_KEYS:
        assert all(f"band/{key}" in entry for entry in logs), key
    for key in ("clip_ratio/region_mean", "clip_ratio/high_max", "entropy", "loss"):
        assert all(key in entry for entry in logs), key
    from .._vocabulary import vocabulary

    assert {k for entry in logs for k in entry if k.startswith("band/")} <= vocabulary()
    first, second = logs
    assert "reward" in first  # generation happened at step 1 only
    # Step 1 uses fresh samples: every ratio is 1 and nothing is clipped.
    assert first["band/ratio_max"] == pytest.approx(1.0, abs=1e-5)
    assert first["band/clipfrac"] == 0.0
    # Step 2 reuses them after an update (num_iterations=2): the band clips.
    assert second["band/ratio_max"] > 1.0 + 1e-3
    assert second["band/clipfrac"] > 0.0
    assert second["clip_ratio/region_mean"] > 0.0
    assert math.isfinite(second["loss"])
    after = list(trainer.model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_band_is_computed_once_per_generation_batch(trained):
    """The band travels with the buffered generation batch that both iterations reuse."""
    trainer = trained[0]
    (buffered,) = trainer._buffered_inputs  # steps_per_generation = 1
    expected = fl.precompute_band(
        buffered["old_per_token_logps"], trainer.band_config, mask=buffered["completion_mask"]
    )
    torch.testing.assert_close(buffered["fbands_log_lower"], expected.log_lower)
    torch.testing.assert_close(buffered["fbands_log_upper"], expected.log_upper)
    cfg = trainer.band_config
    assert (cfg.method, cfg.div, cfg.delta) == ("band_clip", "kl", 0.01)


def test_warns_when_every_ratio_is_one(tmp_path):
    with pytest.warns(BandInactiveWarning, match="every probability ratio is 1"):
        make_trainer(tmp_path, num_iterations=1)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"loss_type": "sapo"}, "sapo"),
        ({"importance_sampling_level": "sequence"}, "sequence"),
        ({"delta": 2.0}, "two-sided"),
        ({"use_adaptive_entropy": True}, "adaptive"),
        ({"band_div": "nope"}, "nope"),
        ({"band_delta": 0.0}, "delta"),
        ({"band_method": "ppo"}, "ppo"),
    ],
)
def test_bad_options_are_rejected(tmp_path, options, match):
    with pytest.raises(ValueError, match=match):
        make_args(tmp_path, **options)


def test_trainer_needs_the_band_config(tmp_path):
    tokenizer = tiny_tokenizer()
    with pytest.raises(TRLBandError, match="BandGRPOConfig"):
        BandGRPOTrainer(
            model=tiny_model(tokenizer),
            reward_funcs=letter_reward,
            args=make_args(tmp_path, GRPOConfig),
            train_dataset=dataset(),
            processing_class=tokenizer,
        )


def fake_batch(trainer, seed=1, batch=4, prompt_len=3, completion_len=5):
    """A generation batch as TRL's _generate_and_score_completions would return it."""
    g = torch.Generator().manual_seed(seed)
    vocab = trainer.model.config.vocab_size
    completion_mask = torch.ones(batch, completion_len, dtype=torch.long)
    completion_mask[1, 3:] = 0
    completion_mask[2, 1:] = 0
    inputs = {
        "prompt_ids": torch.randint(4, vocab, (batch, prompt_len), generator=g),
        "prompt_mask": torch.ones(batch, prompt_len, dtype=torch.long),
        "completion_ids": torch.randint(4, vocab, (batch, completion_len), generator=g),
        "completion_mask": completion_mask,
        "advantages": torch.randn(batch, generator=g),
        "num_items_in_batch": completion_mask.sum(),
    }
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model,
            torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1),
            torch.cat([inputs["prompt_mask"], completion_mask], dim=1),
            completion_len,
        )
    noise = 0.4 * torch.randn(logps.shape, generator=g)
    inputs["old_per_token_logps"] = logps + noise  # ratios spread around 1
    inputs["ref_per_token_logps"] = logps - noise.flip(0)
    inputs["importance_sampling_ratio"] = torch.exp(0.2 * torch.randn(logps.shape, generator=g))
    return inputs


def loss_and_grads(trainer, inputs):
    trainer.model.train()
    trainer.model.zero_grad()
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in trainer.model.parameters()]


@pytest.fixture(scope="module")
def twin_trainers(tmp_path_factory):
    """TRL's trainer and the band trainer on identical models; the band one uses "clip"."""
    path = tmp_path_factory.mktemp("twins")
    common = dict(epsilon=0.2, epsilon_high=0.28, num_iterations=2)
    ref = make_trainer(path, cls=GRPOTrainer, **common)
    band = make_trainer(path, band_method="clip", **common)
    return ref, band


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "bnpo", "dr_grpo"])
@pytest.mark.parametrize("extras", [False, True], ids=["plain", "is-kl-entropy"])
def test_clip_method_reproduces_trl_loss(twin_trainers, loss_type, extras):
    """With band_method="clip" the band trainer is TRL's trainer: same loss, same gradient.

    This pins down that TRL's normalisation (every loss_type, gradient accumulation), its
    vLLM importance-sampling correction, the KL penalty, the entropy mask and the entropy
    bonus are kept around the fbands per-token loss.
    """
    for trainer in twin_trainers:
        trainer.loss_type = loss_type
        trainer.current_gradient_accumulation_steps = 2
        trainer.use_vllm = trainer.vllm_importance_sampling_correction = extras
        trainer.beta = 0.1 if extras else 0.0
        trainer.top_entropy_quantile = 0.5 if extras else 1.0
        trainer.entropy_coef = 0.01 if extras else 0.0
        trainer._entropy_bonus_enabled = extras
    ref, band = twin_trainers
    inputs = fake_batch(ref)
    ref_loss, ref_grads = loss_and_grads(ref, inputs)
    band_loss, band_grads = loss_and_grads(band, inputs)
    torch.testing.assert_close(band_loss, ref_loss, rtol=1e-5, atol=1e-7)
    for g_band, g_ref in zip(band_grads, ref_grads, strict=True):
        torch.testing.assert_close(g_band, g_ref, rtol=1e-4, atol=1e-7)
    assert ref._metrics["train"]["clip_ratio/region_mean"][-1] > 0  # the clip acted
    clip_keys = ("low_mean", "high_mean", "region_mean", "low_min", "high_max")
    for key in ("entropy", *(f"clip_ratio/{k}" for k in clip_keys)):
        assert band._metrics["train"][key][-1] == pytest.approx(ref._metrics["train"][key][-1])


def test_mismatch_gate_is_one_more_factor_of_the_weights(twin_trainers):
    """band_gate_*: the gate multiplies the per-token weights as vLLM's importance sampling
    ratio does; checked against the binary TV gate |pi - mu| <= delta written by hand."""
    from fbands.losses.gate import gate_options

    _, band = twin_trainers
    band.loss_type, band.current_gradient_accumulation_steps = "dapo", 1
    band.use_vllm = band.vllm_importance_sampling_correction = True
    band.beta, band.top_entropy_quantile, band._entropy_bonus_enabled = 0.0, 1.0, False
    inputs = fake_batch(band, seed=3)
    old = inputs["old_per_token_logps"]
    g = torch.Generator().manual_seed(5)
    sampling = old + 0.3 * torch.randn(old.shape, generator=g)
    sampling[0, 0] = math.nan  # a token vLLM could not score: neither gated nor reweighted
    inputs["sampling_per_token_logps"] = sampling
    gap = (old.exp() - sampling.exp()).abs()
    delta = float(gap[inputs["completion_mask"].bool()].nan_to_num(0.0).median()) * 1.0001
    by_hand = (gap <= delta).float()
    by_hand[0, 0] = 1.0
    try:
        band._band_gate = gate_options("tv", delta, "mask")
        gated, _ = loss_and_grads(band, inputs)
        logged = band._metrics["train"]["band/gate_weight"][-1]
        with pytest.raises(RuntimeError, match="sampling_per_token_logps"):
            band.compute_loss(band.model, {k: v for k, v in inputs.items()
                                            if k != "sampling_per_token_logps"})
    finally:
        band._band_gate = None
    folded = dict(inputs, importance_sampling_ratio=inputs["importance_sampling_ratio"] * by_hand)
    plain, _ = loss_and_grads(band, folded)
    torch.testing.assert_close(gated, plain, rtol=1e-6, atol=1e-8)
    mask = inputs["completion_mask"].float()
    assert 0 < (by_hand * mask).sum() < mask.sum()  # the gate dropped some tokens, not all
    assert logged == pytest.approx(float((by_hand * mask).sum() / mask.sum()))


@pytest.mark.parametrize("options, match", [
    ({"band_gate_div": "kl"}, "use_vllm=False"),
    ({"band_gate_div": "kll", "use_vllm": True}, "band_gate_div='kll'"),
    ({"band_gate_div": "kl", "band_gate_delta": 0.0, "use_vllm": True}, "band_gate_delta"),
    ({"band_gate_div": "kl", "band_gate_mode": "cap", "use_vllm": True},
     "vllm_importance_sampling_correction=False"),
])
def test_gate_options_are_checked_at_configuration(tmp_path, options, match):
    with pytest.raises(TRLBandError, match=match):
        make_args(tmp_path, **options)
    cap = make_args(tmp_path, band_gate_div="kl&reverse_kl", band_gate_mode="cap",
                    use_vllm=True, vllm_importance_sampling_correction=False)
    assert cap.band_gate() == {"div": "kl&reverse_kl", "delta": 0.01, "mode": "cap"}


def test_the_trl_surface_the_band_trainer_relies_on():
    """Fails when TRL changes one of the places BandGRPOTrainer's docstring lists."""
    import inspect

    source = inspect.getsource(GRPOTrainer)
    # compute_loss is the loss's one entry: TRL reaches its _compute_loss from there only
    assert list(inspect.signature(GRPOTrainer.compute_loss).parameters) == [
        "self", "model", "inputs", "return_outputs", "num_items_in_batch"]
    assert source.count("self._compute_loss(") == 1
    assert BandGRPOTrainer.compute_loss is not GRPOTrainer.compute_loss
    # the one private method overridden, with the arguments the override passes on
    assert list(inspect.signature(GRPOTrainer._generate_and_score_completions).parameters)[
        :2] == ["self", "inputs"]
    ours = BandGRPOTrainer.__mro__[:BandGRPOTrainer.__mro__.index(GRPOTrainer)]
    private = {name for cls in ours for name in vars(cls) if name.startswith("_")
               and not name.startswith("__") and hasattr(GRPOTrainer, name)}
    assert private == {"_generate_and_score_completions"}
    for name in ("_get_per_token_logps_and_entropies", "get_off_policy_mask",
                 "get_high_entropy_mask"):
        assert callable(getattr(GRPOTrainer, name)), name


def test_guide_laptop_example_runs(tmp_path, monkeypatch):
    """The offline script of docs/guides/trl.md, executed as written."""
    guide = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "trl.md").read_text()
    section = guide[guide.index("## A run on a laptop") :]
    start = section.index("```python\n") + len("```python\n")
    code = section[start : section.index("```", start)]
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "docs/guides/trl.md", "exec"), namespace)
    logs = [e for e in namespace["trainer"].state.log_history if "band/clipfrac" in e]
    assert len(logs) == 4
    assert max(e["band/clipfrac"] for e in logs) > 0


# --- strict input coercion and divergence strings (issue 19) -------------------------------
@pytest.mark.parametrize(
    "options, match",
    [
        ({"band_delta": True}, "band_delta must be a number, got True"),
        ({"band_delta": False}, "band_delta must be a number, got False"),
        ({"band_delta": "wide"}, "band_delta"),
        ({"band_relax": "maybe"}, "band_relax must be true or false"),
        ({"band_truncation": True}, "band_truncation"),
        ({"band_upper_bound_max": True}, "band_upper_bound_max"),
        ({"band_dual_clip_c": True}, "band_dual_clip_c"),
        ({"band_div": 5}, "band_div"),
    ],
)
def test_band_options_are_read_strictly(tmp_path, options, match):
    with pytest.raises(fbands.ConfigError, match=match):
        make_args(tmp_path, **options)


def test_relax_text_is_not_truthy(tmp_path):
    assert make_args(tmp_path, band_relax="false").band_loss_config().relax is False
    assert make_args(tmp_path, band_relax="true").band_loss_config().relax is True
    assert make_args(tmp_path, band_delta="5e-2").band_loss_config().delta == 0.05
    assert issubclass(TRLBandError, fbands.ConfigError)


def test_command_line_band_options_are_strict(tmp_path):
    from transformers import HfArgumentParser

    parser = HfArgumentParser(BandGRPOConfig)
    base = ["--output_dir", str(tmp_path), "--report_to", "none", "--use_cpu", "true"]
    (args,) = parser.parse_args_into_dataclasses(base + ["--band_relax", "false"])
    assert args.band_loss_config().relax is False
    marker = tmp_path / "PWNED"
    with pytest.raises(fbands.DivergenceError):
        parser.parse_args_into_dataclasses(
            base + ["--band_div", f"alpha(a=(__import__('os').system('touch {marker}') or 2))"])
    assert not marker.exists()


@pytest.mark.parametrize(
    "payload",
    [
        "alpha(a=(__import__('os').system('touch {marker}') or 2))",
        "__import__('os').system('touch {marker}')",
        "alpha(a=__import__('os').system('touch {marker}'))",
    ],
)
def test_divergence_payloads_are_not_executed(tmp_path, payload):
    marker = tmp_path / "PWNED"
    with pytest.raises(fbands.DivergenceError):
        make_args(tmp_path, band_div=payload.format(marker=marker))
    assert not marker.exists()
