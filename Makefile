# make run:       set up .venv if needed, run the seeded exp014_tiled sweep here, regenerate the report
#                 and the Day 2 note (docs/notes/, written to outputs/notes/: docs/notes.md).
# make test:      the same set-up, then ruff, the layer contracts (lint-imports) and the whole test
#                 suite (what CI runs): every test but the serial ones on a worker a core and two
#                 more (the SLURM tests, in two groups
#                 each one after another on a worker and a cluster of its own, mostly wait on the
#                 clusters), then the serial ones (timings) alone.
# make test-fast: the edit-run loop: the unit tests and the commands called in-process on tiny grids
#                 (no test that starts processes, none slow), on every core.
# make test-unit: the unit tests alone: no command, no process started.
# make gpu-check: on a machine with one NVIDIA GPU (a few minutes): the GPU tests (pytest -m gpu),
#                 then SDPA's backends on it (exp015_backends in float16 and bfloat16, head width
#                 64, length 1,024 to 16,384), then training in each precision (exp019_precision,
#                 widths 128 and 1,024, 120 steps), then the report with its claims checked.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
WORKERS ?= $(shell expr $$(nproc) + 2)
PYTEST := $(BIN)/python -m pytest --durations 10
UNIT := not e2e and not process and not slow and not slurm and not serial
FAST := not process and not slow and not slurm and not serial

SHELL := /bin/bash

.PHONY: run test test-fast test-unit gpu-check setup clean

run: $(VENV)/.installed
	$(BIN)/python -m harness +experiment=exp014_tiled
	$(BIN)/python -m harness report
	$(BIN)/python -m harness note docs/notes/day2-sdpa-and-tiling.md

test: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(PYTEST) -m "not serial" -n $(WORKERS) --dist loadgroup
	$(PYTEST) -m serial

test-fast: $(VENV)/.installed
	$(PYTEST) -m "$(FAST)" -n auto -q

test-unit: $(VENV)/.installed
	$(PYTEST) -m "$(UNIT)" -n auto -q

gpu-check: $(VENV)/.installed
	$(BIN)/python -m pytest -m gpu
	$(BIN)/python -m harness +experiment=exp015_backends device=cuda dtype=float16,bfloat16 \
		head_dim=64 length=1024,2048,4096,8192,16384 min_time_s=0.2
	$(BIN)/python -m harness +experiment=exp019_precision device=cuda width=128,1024 \
		length=256 heads=8 kv_heads=8 batch=64 steps=120
	$(BIN)/python -m harness report --check

setup: $(VENV)/.installed

# Reinstalled when the requirements change; constraints.txt pins what was tested. pip's lines
# show what it installs, each package it collects numbered against the pinned ones. pip compiles
# the modules one after another; compileall does it on every core (a module written for a newer
# Python, as torch ships one, fails to compile, as pip lets it).
PINNED := $(shell grep -c '==' constraints.txt)
$(VENV)/.installed: pyproject.toml constraints.txt
	@echo "make: installing the harness and its $(PINNED) pinned packages into $(VENV) (the first" \
		"time about a minute where torch's wheel is on the disk, longer where it is downloaded)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	set -o pipefail; $(BIN)/python -m pip install --no-compile --progress-bar on \
		--constraint constraints.txt --editable '.[dev]' 2>&1 | awk '/^(Collecting|Processing) / { n++; $$0 = "[" n " of ~$(PINNED)] " $$0 } \
		!/^(Requirement already satisfied|WARNING: Location .* is ignored)/ { print; fflush() }'
	$(BIN)/python -m compileall -qq -j 0 $(VENV)/lib > /dev/null || true
	touch $@

clean:
	rm -rf $(VENV) outputs .pytest_cache .ruff_cache *.egg-info
