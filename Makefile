# The two commands of the README. Everything they need is installed from this repository's
# own files into .venv (PyPI only).
PYTHON ?= python3
# pytest-xdist workers for `make test`: the real-vLLM timeline (mostly waiting on a server
# at 40% load) runs on one while the other runs the rest of the suite (tests/conftest.py).
TEST_WORKERS ?= 2
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test constraints

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# pyproject.toml says which ranges fleetlens works with; constraints.txt pins the set tested.
$(STAMP): pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

## demo: install, run the whole pipeline on a simulated fleet, open the dashboard
demo: $(STAMP)
	$(BIN)/fleetlens demo

## test: lint and run the test suite
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n $(TEST_WORKERS)

## constraints: pin the installed, tested set again (after changing pyproject's ranges)
constraints: $(STAMP)
	{ echo '# The exact set the tests ran on (make installs with -c constraints.txt). Regenerate with'; \
	  echo '# `make constraints` after changing the ranges in pyproject.toml.'; \
	  $(BIN)/python -m pip freeze --exclude-editable | grep -vi '^fleetlens'; } > constraints.txt
