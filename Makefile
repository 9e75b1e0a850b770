# The two commands of the README:
#   make quickstart   install into .venv, then train the quickstart experiment
#   make test         install into .venv, then run every test, the slow-marked ones included
PY ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_WORKERS ?= 2

.PHONY: install quickstart test test-fast clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev,interop,math]'

quickstart: install
	$(BIN)/python experiments/train.py --config configs/quickstart.py --workdir workdirs/quickstart

test: install
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) tests

test-fast: install
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) -m "not slow" tests

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
