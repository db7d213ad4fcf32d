"""fbands.rl: a thin GRPO trainer that shows the band losses working end to end.

Read :mod:`fbands.rl.train` top to bottom for the algorithm; :mod:`fbands.rl.config` holds
every option, :mod:`fbands.rl.tasks` the verifiable tasks, :mod:`fbands.rl.model` the policy
and its float32 log-probabilities, :mod:`fbands.rl.rollout` the sampling,
:mod:`fbands.rl.evaluate` the held-out evaluation and :mod:`fbands.rl.compare` the plots.
Importing this package does not import torch.

Command line::

    fbands demo                                   # clip vs band-kl on the tail task, 3 seeds
    fbands train --task addition --loss band-kl --run-dir runs/add
    fbands train --run-dir runs/add --resume      # after a kill: no step lost or repeated
    fbands train --model path/to/hf_model --task addition --warm-start-steps 0
    fbands compare runs/demo/clip-s0 runs/demo/band-kl-s0 --out cmp.png

From Python::

    from fbands.rl import TrainConfig
    from fbands.rl.train import train
    last = train(TrainConfig(task="tail", loss="band-kl", run_dir="runs/x"))

Needs the ``rl`` extra (transformers, tqdm).
"""

from fbands.rl.config import ConfigError as ConfigError
from fbands.rl.config import TrainConfig as TrainConfig

__all__ = ["ConfigError", "TrainConfig"]
