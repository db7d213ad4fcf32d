#!/usr/bin/env bash
# Run the TRL and verl plug-in tests against the oldest and the newest release of each that
# pyproject.toml allows, each in a fresh virtual environment.
#
#   scripts/check_versions.sh
#
# Environments go to ${FBANDS_COMPAT_DIR:-/tmp/fbands-compat}/<package>-<version>, logs beside
# them. torch: $FBANDS_TORCH (default torch==2.13.0, the CPU build on local disk) is installed
# first and kept, as scripts/bootstrap.sh does. fbands is installed (not editable) from a
# temporary copy of the repository, so nothing is written into the repository.
set -euo pipefail

# These must match the ranges of the trl and verl extras in pyproject.toml (make test-versions
# runs this script; docs/install.md states the ranges).
TRL_OLDEST=1.10.0   # 1.9.x: a different entropy-bonus normalisation for loss_type="dapo"
TRL_NEWEST=1.16.0
VERL_OLDEST=0.9.0   # 0.8.0 needs numpy<2, fbands needs numpy>=2.4
VERL_NEWEST=0.9.1
# fbands is installed with the package's own extra (fbands[dev,trl], fbands[dev,verl]), so that
# what the extra adds (requests for TRL before 1.14.2, TransferQueue & co. for verl's v1
# trainer) is tested too.

repo="$(cd "$(dirname "$0")/.." && pwd)"
dir="${FBANDS_COMPAT_DIR:-/tmp/fbands-compat}"
python="${PYTHON:-python3}"
mkdir -p "$dir"
src="$(mktemp -d "$dir/src.XXXXXX")"
trap 'rm -rf "$src"' EXIT
tar -C "$repo" --exclude=./.venv --exclude=./.git --exclude=./build --exclude='*.egg-info' \
    --exclude=__pycache__ -cf - . | tar -C "$src" -xf -

# version DIST: its version in $venv (the caller's).
version() {
  "$venv/bin/python" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' \
    "$1" 2>/dev/null
}

# check PACKAGE VERSION TEST...: build the environment, run the tests; one summary row.
rows=() failed=0
check() {
  local pkg=$1 ver=$2 venv="$dir/$1-$2" log="$dir/$1-$2.log" start=$SECONDS status=failed
  shift 2
  local pip=("$venv/bin/python" -m pip --disable-pip-version-check)
  echo "[check_versions] $pkg $ver: building $venv (log: $log)"
  # shellcheck disable=SC2086
  if "$python" -m venv --clear "$venv" >"$log" 2>&1 \
      && "${pip[@]}" install -q ${FBANDS_TORCH:-torch==2.13.0} >>"$log" 2>&1 \
      && torch_ver="$(version torch)" \
      && "${pip[@]}" install -q "$src[dev,$pkg]" "$pkg==$ver" "torch==$torch_ver" \
          >>"$log" 2>&1; then
    echo "[check_versions] $pkg $ver: pytest $*"
    if (cd "$src" && "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@") >>"$log" 2>&1
    then status=passed; fi
  fi
  [ "$status" = passed ] || { failed=1; grep -v "^WARNING: Location" "$log" | tail -n 5; }
  rows+=("$(printf '%-6s %-9s %-14s %-8s %ss' "$pkg" "$ver" "$(version transformers || echo -)" \
    "$status" "$((SECONDS - start))")")
}

check trl "$TRL_OLDEST" tests/integrations/test_trl.py
check trl "$TRL_NEWEST" tests/integrations/test_trl.py
check verl "$VERL_OLDEST" tests/integrations/test_verl.py tests/integrations/test_verl_bandpo.py tests/integrations/test_verl_trainer.py
check verl "$VERL_NEWEST" tests/integrations/test_verl.py tests/integrations/test_verl_bandpo.py tests/integrations/test_verl_trainer.py

echo
printf '%-6s %-9s %-14s %-8s %s\n' package version transformers result time
printf '%s\n' "${rows[@]}"
exit "$failed"
