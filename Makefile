# The two commands of the README:
#   make quickstart   install into .venv, then train the quickstart experiment
#   make test         install into .venv, then run every test, the slow-marked ones included
PY ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_WORKERS ?= 2

.PHONY: install quickstart test test-fast benchmark compare clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev,interop,math,tpu]'

quickstart: install
	$(BIN)/python -m experiments.train --config configs/quickstart.py --workdir workdirs/quickstart

# A worker that dies ends the run at once (--max-worker-restart=0): pytest-xdist's loadfile
# scheduling can wait forever for the work a replaced worker would have been given.
test: install
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --max-worker-restart=0 --durations=40 tests

test-fast: install
	JAX_COMPILATION_CACHE_DIR=$(CURDIR)/.cache/jax_tests $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --max-worker-restart=0 --durations=20 -m "not slow" tests

# Speed against transformers, TRL and Tunix (33 min measured on one core; benchmarks/results/).
benchmark: install
	$(BIN)/pip install --quiet -e '.[dev,interop,math,tpu,bench]'
	bash benchmarks/peers/setup_tunix.sh
	$(BIN)/python -m benchmarks.speed --tunix_timeout=2400

# Curricula on equal rollout budgets, 5 seeds (hours on 2 cores; benchmarks/results/).
compare: install
	$(BIN)/python -m experiments.studies.compare_curricula --config configs/compare.py:scratch --seeds=5

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
