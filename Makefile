# The two commands of the README. Everything they need is installed from this repository's
# own files into .venv (PyPI only).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

## demo: install, run the whole pipeline on a simulated fleet, open the dashboard
demo: $(STAMP)
	$(BIN)/fleetlens demo

## test: lint and run the test suite
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest
