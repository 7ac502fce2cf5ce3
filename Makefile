# The two commands of the README. Everything they need is installed from this repository's
# own files into .venv (PyPI only).
PYTHON ?= python3
# pytest-xdist workers for the rest of the suite.
TEST_WORKERS ?= 2
# Run first and alone, on one process: a CPU vLLM server at load beside the rest of the suite
# on 2 cores starved both (load 14-22: the agent's exports missed their deadline, a
# collector did not listen in 60 s, a browser page did not draw in 60 s).
SOLO_TESTS := tests/agent/test_vllm_incidents.py tests/agent/test_vllm_e2e.py \
	tests/analytics/test_ray_analyze.py tests/pipeline/test_ray_runner.py \
	tests/pipeline/test_object_store_e2e.py
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The real-vLLM tests' own venv (vLLM's CPU build, about 3 GB: tests/agent/vllm_env.py).
VLLM_STAMP := .venv-vllm/.installed

.PHONY: demo test constraints

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# pyproject.toml says which ranges fleetlens works with; constraints.txt pins the set tested.
$(STAMP): pyproject.toml constraints.txt | $(BIN)/python
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
# The two venvs are built side by side (downloads and unpacking overlap: about 1.5 minutes
# less on 2 cores), before any test runs, so that no test shares the cores with pip.
test:
	$(MAKE) --no-print-directory -j2 $(STAMP) $(VLLM_STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest $(SOLO_TESTS); solo=$$?; \
	$(BIN)/python -m pytest -n $(TEST_WORKERS) $(addprefix --ignore=,$(SOLO_TESTS)); rest=$$?; \
	test $$solo -eq 0 && test $$rest -eq 0

## constraints: pin the installed, tested set again (after changing pyproject's ranges)
constraints: $(STAMP)
	{ echo '# The exact set the tests ran on (make installs with -c constraints.txt). Regenerate with'; \
	  echo '# `make constraints` after changing the ranges in pyproject.toml.'; \
	  $(BIN)/python -m pip freeze --exclude-editable | grep -vi '^fleetlens'; } > constraints.txt
