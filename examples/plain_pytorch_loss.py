"""A band loss in your own PyTorch loop: a softmax policy learns a rare rewarded token.

The policy is a categorical distribution over 10 tokens; token 9 starts at probability 0.01
and is the only one rewarded.  Each step samples a group of tokens, computes GRPO advantages,
and takes a few gradient steps on the same samples (so the ratio pi_new / pi_old moves away
from 1 and the clip matters), with PPO clip or with the KL band.  The band lets the rare
token's probability grow faster than clip's fixed ``1 + eps``.

    python examples/plain_pytorch_loss.py            # both losses, 30 steps each
    python examples/plain_pytorch_loss.py --steps 5  # shorter

Needs ``pip install ".[torch]"`` (a checkout of fbands).
"""

from __future__ import annotations

import argparse

import torch

from fbands.losses import policy_loss, precompute_band, preset


def train(loss: str, steps: int, seed: int = 0) -> list[float]:
    """The rewarded token's probability after each step."""
    torch.manual_seed(seed)
    start = torch.full((10,), 0.11)
    start[9] = 0.01
    logits = torch.log(start).requires_grad_()
    optimizer = torch.optim.SGD([logits], lr=0.5)
    cfg = preset(loss)
    history = []
    for _ in range(steps):
        with torch.no_grad():
            logp_all = torch.log_softmax(logits, -1)
            tokens = torch.multinomial(logp_all.exp(), 64, replacement=True)  # (64,) samples
            reward = (tokens == 9).float()
            advantages = (reward - reward.mean()) / (reward.std() + 1e-6)
            logp_old = logp_all[tokens].unsqueeze(0)  # (1, 64): one "sequence" of samples
        band = precompute_band(logp_old, cfg)  # once per batch, reused by every update
        mask = torch.ones_like(logp_old)
        for _epoch in range(4):  # reuse the samples: ratios move away from 1
            logp = torch.log_softmax(logits, -1)[tokens].unsqueeze(0)
            loss_value, _metrics = policy_loss(logp_old, logp, advantages.unsqueeze(0), mask,
                                               cfg, band)
            optimizer.zero_grad()
            loss_value.backward()
            optimizer.step()
        history.append(float(torch.softmax(logits.detach(), -1)[9]))
    return history


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args(argv)
    curves = {loss: train(loss, args.steps) for loss in ("clip", "band-kl")}
    for loss, curve in curves.items():
        print(f"{loss:8s} p(rewarded token): " + " ".join(f"{p:.2f}" for p in curve[::5])
              + f"  final {curve[-1]:.3f}")
    return curves


if __name__ == "__main__":
    main()
