"""A one-minute CPU check of a verl band configuration, before you book the GPUs.

verl's full trainer needs GPUs (on a CPU machine it prints its configuration and waits).
This script takes the same Hydra overrides you would give ``verl.trainer.main_ppo``, builds
the actor configuration exactly as verl's workers do (Hydra compose, then verl's own
dataclass conversion), and runs verl's registered policy loss once, forward and backward,
on a small random batch, printing the band configuration it resolved and verl's metrics.

    python examples/verl_cpu_check.py                                 # the guide's 4 overrides
    python examples/verl_cpu_check.py +actor_rollout_ref.actor.policy_loss.delta=0.1
    python examples/verl_cpu_check.py "+actor_rollout_ref.actor.policy_loss.div='alpha(0.5)'"

A mistake in an override (an unknown divergence, ``delta=-1``, a preset that contradicts the
loss mode) fails here, in seconds, with the plug-in's own message.  To see how verl itself
reads the overrides, without running anything:
``python -m verl.trainer.main_ppo OVERRIDES --cfg job -p actor_rollout_ref.actor.policy_loss``.

Needs ``pip install ".[verl]"`` (a checkout of fbands).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import verl
from hydra import compose, initialize_config_dir
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.utils.config import omega_conf_to_dataclass

from fbands.integrations.verl import loss_config

#: the verl guide's four overrides: the band clip, KL, radius 0.05 (later ones win)
BAND = (
    "actor_rollout_ref.actor.policy_loss._target_=fbands.integrations.verl.BandPolicyLossConfig",
    "actor_rollout_ref.actor.policy_loss.loss_mode=band",
    "+actor_rollout_ref.actor.policy_loss.div=kl",
    "+actor_rollout_ref.actor.policy_loss.delta=0.05",
)


def main(argv: list[str] | None = None) -> dict:
    overrides = list(sys.argv[1:] if argv is None else argv)
    keys = {o.lstrip("+").split("=", 1)[0] for o in overrides}
    merged = [o for o in BAND if o.lstrip("+").split("=", 1)[0] not in keys] + overrides
    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        cfg = compose("ppo_trainer", overrides=[
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", *merged])
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)  # as verl's workers do
    print("band:", loss_config(actor.policy_loss, actor))

    rows, cols = 4, 16  # a small batch of old and new log-probabilities around each other
    g = torch.Generator().manual_seed(0)
    old = torch.log(torch.rand(rows, cols, generator=g) * 0.9 + 0.01)
    new = (old + 0.3 * torch.randn(rows, cols, generator=g)).clamp(max=0).requires_grad_()
    advantages = torch.randn(rows, 1, generator=g).expand(rows, cols)
    mask = torch.ones(rows, cols, dtype=torch.bool)
    loss, metrics = get_policy_loss_fn(actor.policy_loss.loss_mode)(
        old_log_prob=old, log_prob=new, advantages=advantages, response_mask=mask,
        loss_agg_mode=actor.loss_agg_mode, config=actor, rollout_is_weights=None)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(new.grad).all()
    shown = {k: round(float(v), 4) for k, v in metrics.items()
             if k in ("actor/pg_clipfrac", "actor/band/clipfrac_upper",
                      "actor/band/clipfrac_lower", "actor/band/band_width", "actor/band/delta")}
    print(f"loss {loss.item():.4f}; metrics {shown}")
    print("ok: verl's registered loss ran the band on CPU")
    return {"loss": loss.item(), "metrics": metrics, "actor": actor}


if __name__ == "__main__":
    main()
