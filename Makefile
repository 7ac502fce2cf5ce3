# The two commands of the README. Everything they need is installed from this repository's
# own files into .venv (PyPI only).
PYTHON ?= python3
# pytest-xdist workers for the rest of the suite (default: the cores tests/run_suite.py gives it).
TEST_WORKERS ?=
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The real-vLLM tests' own venv (vLLM's CPU build, about 3 GB: tests/agent/vllm_env.py).
VLLM_STAMP := .venv-vllm/.installed

.PHONY: demo test constraints

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# pyproject.toml says which ranges fleetlens works with; constraints.txt pins the set tested.
# The C span kernel is compiled by the install: an edited kernel source installs again, or
# the tests would run a stale build against the Python decoder they compare it with.
KERNEL_SOURCES := $(wildcard collector/_spankernel*.c collector/_spankernel*.h)
$(STAMP): pyproject.toml constraints.txt $(KERNEL_SOURCES) | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

$(VLLM_STAMP): tests/agent/vllm_env.py
	$(PYTHON) tests/agent/vllm_env.py
	touch $(VLLM_STAMP)

## demo: install, run the whole pipeline on a simulated fleet, open the dashboard
demo: $(STAMP)
	$(BIN)/fleetlens demo

## test: lint and run the test suite
# The two venvs are built side by side (downloads and unpacking overlap), before any test
# runs, so that no test shares the cores with pip. tests/run_suite.py then runs the real-vLLM
# tests on one core beside the rest on the others, then the Ray tests on every core (about 23
# minutes on 2 cores); SERIAL=1 runs the three parts one after the other (about 34 minutes).
test:
	$(MAKE) --no-print-directory -j2 $(STAMP) $(VLLM_STAMP)
	$(BIN)/ruff check .
	$(BIN)/python tests/run_suite.py $(if $(SERIAL),--serial) $(if $(TEST_WORKERS),--workers $(TEST_WORKERS))

## constraints: pin the installed, tested set again (after changing pyproject's ranges)
constraints: $(STAMP)
	{ echo '# The exact set the tests ran on (make installs with -c constraints.txt). Regenerate with'; \
	  echo '# `make constraints` after changing the ranges in pyproject.toml.'; \
	  $(BIN)/python -m pip freeze --exclude-editable | grep -vi '^fleetlens'; } > constraints.txt
