"""Step time of the real-model trainer: LoRA r16 vs full fine-tuning, 1 vs 2 torch threads.

The llm_bench configuration on the verify task, 3 steps each (the first is dropped as warm-up),
no evaluation.  ``PYTHONPATH=. python benchmarks/llm_timing.py`` (a few minutes); the numbers
go to stdout, one JSON line per configuration.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from llm_bench import RUN  # noqa: E402

from fbands.rl.config import TrainConfig  # noqa: E402
from fbands.rl.train import train  # noqa: E402

CONFIGS = (("lora16_t1", {}), ("full_t1", dict(lora_rank=0, lr=1e-5)),
           ("lora16_t2", dict(threads=2)))

for name, extra in CONFIGS:
    run_dir = f"runs/llm_timing/{name}"
    cfg = TrainConfig(**{**RUN, **extra, "task": "verify", "seed": 5, "steps": 3,
                         "run_dir": run_dir, "eval_every": 0, "progress": False,
                         "checkpoint_every": 0})
    train(cfg, log=lambda _m: None)
    rows = [json.loads(line) for line in open(f"{run_dir}/metrics.jsonl")][1:]
    print(name, json.dumps({
        "step_s": [r["time/rollout_s"] + r["time/update_s"] for r in rows],
        "rollout_s": [r["time/rollout_s"] for r in rows],
        "tokens_per_s": [r["tokens_per_s"] for r in rows],
        "band_share": [r["time/band_share"] for r in rows]}), flush=True)
