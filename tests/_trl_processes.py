"""Run under ``torchrun --nproc_per_node N`` by ``tests/integrations/test_trl_processes.py``:
the TRL plug-in across N processes (torch.distributed over gloo, on CPU).

1. The loss on one fixed batch of 4 sequences, each process holding its share: the mean of
   the processes' losses, the mean of their gradients (what DDP applies) and the metrics, for
   TRL's own trainer, the band trainer with ``band_method="clip"`` and with ``band-kl``.
2. A real run: ``band-kl`` with an adaptive radius, 2 optimizer steps and a checkpoint at
   step 2, whose radius a new trainer restores.

Rank 0 writes what it found to ``OUT/processes-N.json``.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

import torch
from transformers import TrainerState
from trl import GRPOConfig, GRPOTrainer

from fbands.integrations.trl import BandGRPOConfig, BandGRPOTrainer
from tests.integrations.test_trl import (
    dataset,
    fake_batch,
    letter_reward,
    make_args,
    tiny_model,
    tiny_tokenizer,
)

SEQUENCES = 4
KEYS = ("entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean",
        "clip_ratio/low_min", "clip_ratio/high_max")


def trainer(out: Path, cls, **options):
    tok = tiny_tokenizer()
    args_cls = BandGRPOConfig if cls is BandGRPOTrainer else GRPOConfig
    args = make_args(out, args_cls, per_device_train_batch_size=SEQUENCES // world(), **options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(model=tiny_model(tok), reward_funcs=letter_reward, args=args,
                   train_dataset=dataset(), processing_class=tok)


def world() -> int:
    """The number of processes torchrun started (before any trainer sets up the group)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def share(full: dict, rank: int, n: int) -> dict:
    """This process's rows of the batch; the token count stays global, as TRL gathers it."""
    rows = slice(rank * SEQUENCES // n, (rank + 1) * SEQUENCES // n)
    return {k: v[rows] if torch.is_tensor(v) and v.dim() and v.shape[0] == SEQUENCES else v
            for k, v in full.items()}


def loss_on_fixed_batch(t) -> dict:
    a = t.accelerator
    t.loss_type, t.current_gradient_accumulation_steps = "dapo", 1
    full = fake_batch(t, seed=2, batch=SEQUENCES)  # the same on every process (seeded)
    t.model.train()
    t.model.zero_grad()
    loss = t.compute_loss(t.model, share(full, a.process_index, a.num_processes))
    loss.backward()
    grads = torch.cat([p.grad.reshape(-1) for p in t.model.parameters()])
    mean_loss = a.reduce(loss.detach(), reduction="mean")
    mean_grad = a.reduce(grads, reduction="mean")
    m = t._metrics["train"]
    return {"loss": mean_loss.item(), "grad": mean_grad.tolist(),
            "metrics": {k: m[k][-1] for k in KEYS},
            "band": {k: v[-1] for k, v in m.items() if k.startswith("band/")}}


def main(out: Path) -> None:
    n = world()
    found = {}
    common = dict(epsilon=0.2, epsilon_high=0.28, num_iterations=2)
    for name, cls, options in (("trl", GRPOTrainer, {}),
                               ("band-clip", BandGRPOTrainer, {"band_method": "clip"}),
                               ("band-kl", BandGRPOTrainer, {"band_method": "band-kl"})):
        found[name] = loss_on_fixed_batch(trainer(out / f"fixed-{name}", cls, **common, **options))
    run = out / f"run-{n}"
    spec = "adaptive:1e-4:0.01:0.002:0.05"
    first = trainer(run, BandGRPOTrainer, band_method="band-kl", band_delta_schedule=spec,
                    max_steps=2, save_strategy="steps", save_steps=2)
    first.train()
    # (transformers' own resume cannot read back a multi-CPU run's optimizer state, saved
    # from device "cpu:0" in torch 2.13; the band's part of the checkpoint is read here, by
    # the callback's hook that a resume calls)
    again = trainer(run, BandGRPOTrainer, band_method="band-kl", band_delta_schedule=spec,
                    max_steps=3, save_strategy="steps", save_steps=2)
    saved = TrainerState.load_from_json(str(run / "checkpoint-2" / "trainer_state.json"))
    again.band_radius.on_train_begin(again.args, saved, again.control)
    found["run"] = {"first": first.state.log_history,
                    "saved": saved.stateful_callbacks["BandRadiusCallback"]["attributes"],
                    "restored": again.band_schedule.delta,
                    "pending": again.band_radius.pending_kl,
                    "schedule": first.band_schedule.delta}
    if int(os.environ.get("RANK", "0")) == 0:
        (out / f"processes-{n}.json").write_text(json.dumps(found))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
