# Two entry points for a fresh machine: `make demo` and `make test`.
# Each creates .venv when missing and installs the package with its pinned dependencies.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/ragen2: pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(BIN)/ragen2

.PHONY: demo test test-learning
demo: $(BIN)/ragen2
	$(BIN)/ragen2 train

test: $(BIN)/ragen2
	$(BIN)/python -m pytest -q -m "not learning"

test-learning: $(BIN)/ragen2
	$(BIN)/python -m pytest -q -m learning
