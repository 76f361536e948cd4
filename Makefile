# make run:  set up .venv if needed, run the seeded exp014_tiled sweep here, regenerate the report.
# make test: the same set-up, then ruff and the whole test suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test setup clean

run: $(VENV)/.installed
	$(BIN)/python -m harness +experiment=exp014_tiled
	$(BIN)/python -m analysis

test: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest

setup: $(VENV)/.installed

# Reinstalled when the requirements change; constraints.txt pins what was tested.
$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --quiet --constraint constraints.txt --editable '.[dev]'
	touch $@

clean:
	rm -rf $(VENV) outputs .pytest_cache .ruff_cache *.egg-info
