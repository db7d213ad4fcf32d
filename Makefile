# Every target does its own set-up: it creates .venv and installs what it needs.
PY := .venv/bin/python
ALL_EXTRAS := dev,rl,docs,verl,trl,llm

.PHONY: demo test test-fast test-versions docs bench bench-rl bench-llm bench-claims setup

setup:
	scripts/bootstrap.sh $(ALL_EXTRAS)

## The main job on its built-in default (needs only the rl extra).
demo:
	scripts/bootstrap.sh rl
	$(PY) -m fbands demo

## The quick loop while working: lint and the tests not marked slow (a few minutes here).
test-fast: setup
	$(PY) -m ruff check .
	$(PY) -m pytest -m "not slow" -q

## Lint, the test suite, the docs (warnings are errors) and their doctests.  The suite
## includes the llm extra installed alone in a fresh venv (scripts/check_llm_extra.sh).
test: setup
	$(PY) -m ruff check .
	FBANDS_CHECK_LLM_EXTRA=1 $(PY) -m pytest
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html -q
	$(PY) -m sphinx -W --keep-going -b doctest docs docs/_build/doctest -q

## The HTML pages (warnings are errors).  Only the docs extra: docs/conf.py mocks the packages
## of the rl, verl and trl extras that the API pages would import when they are missing.
docs:
	scripts/bootstrap.sh docs
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html

## The TRL and verl plug-in tests against the oldest and newest release each extra allows,
## one fresh venv per release under /tmp (about 12 min on 2 cores).
test-versions:
	scripts/check_versions.sh

bench: setup
	$(PY) benchmarks/run.py

bench-rl: setup
	$(PY) benchmarks/rl_bench.py

## clip, band-kl, Clip-Higher on SmolLM2-135M-Instruct, 3 seeds each (20-60 min on 2 cores)
bench-llm: setup
	PYTHONPATH=. $(PY) benchmarks/llm_bench.py passrates
	PYTHONPATH=. $(PY) benchmarks/llm_bench.py runs

## BandPO's three claims, tested: toy and SmolLM2-135M experiments, then
## benchmarks/results/claims.md (hours on 2 cores; resumes where it stopped; run it alone)
bench-claims: setup
	PYTHONPATH=benchmarks $(PY) benchmarks/claims.py
