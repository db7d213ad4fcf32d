"""GRPO with a band loss through TRL: ``BandGRPOTrainer`` on a small model, on a CPU.

A tiny Llama (built from a config: random weights, nothing downloaded) learns to answer
prompts with early letters of the alphabet.  The band replaces TRL's clip; everything else
is TRL's own trainer.  On a GPU with a real model, change the model, the dataset and the
reward, and drop ``use_cpu``: the band options stay the same.

    python examples/trl_band_grpo.py                 # 4 steps, band-kl
    python examples/trl_band_grpo.py --loss clip     # TRL's clip, for comparison

Needs ``pip install ".[trl]"`` (a checkout of fbands).
"""

from __future__ import annotations

import argparse
import tempfile

from datasets import Dataset

from fbands.integrations.trl import BandGRPOConfig, BandGRPOTrainer
from fbands.rl.config import TrainConfig
from fbands.rl.model import build_tiny_model, char_tokenizer

LETTERS = "abcdefghijklmnopqrstuvwxyz "


def early_letters(completions, **kwargs) -> list[float]:
    """The reward: the share of letters from the first ten of the alphabet."""
    return [sum(c in "abcdefghij" for c in text) / max(len(text), 1) for text in completions]


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loss", default="band-kl", help="a preset of fbands.losses.preset")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--output-dir", default=None, help="TRL's output folder (default: a "
                                                           "temporary one)")
    args = parser.parse_args(argv)

    tokenizer = char_tokenizer(LETTERS)
    model = build_tiny_model(TrainConfig(tiny_d_model=32, tiny_layers=1, tiny_heads=2),
                             tokenizer)
    prompts = ["abc", "hello", "xyz", "the cat", "ruby", "quiet", "map", "go on"]
    with tempfile.TemporaryDirectory() as scratch:
        config = BandGRPOConfig(
            band_method=args.loss,       # the band: a preset name, as in `fbands train --loss`
            num_iterations=2,            # reuse each batch: ratios move, the band acts
            output_dir=args.output_dir or scratch,
            per_device_train_batch_size=8, num_generations=4, max_completion_length=8,
            max_steps=args.steps, learning_rate=0.05, logging_steps=1, report_to="none",
            save_strategy="no", use_cpu=True, seed=0)
        trainer = BandGRPOTrainer(model=model, reward_funcs=early_letters, args=config,
                                  train_dataset=Dataset.from_dict({"prompt": prompts}),
                                  processing_class=tokenizer)
        trainer.train()
    logged = [row for row in trainer.state.log_history if "band/clipfrac" in row]
    for row in logged:  # (TRL logs the reward on the steps that generate)
        reward = f"reward {row['reward']:.3f}, " if "reward" in row else ""
        print(f"step {row['step']}: {reward}clipped {row['band/clipfrac']:.3f}, ratio "
              f"{row['band/ratio_min']:.2f}-{row['band/ratio_max']:.2f}, band width "
              f"{row['band/band_width']:.2f}")
    return logged


if __name__ == "__main__":
    main()
