# make run:       set up .venv if needed, run the seeded exp014_tiled sweep here, regenerate the report.
# make test:      the same set-up, then ruff and the whole test suite (what CI runs): all but the
#                 SLURM tests (one cluster) and the serial ones (timings) on up to 4 cores, then
#                 those one after another.
# make test-fast: the edit-run loop: everything but the slow and SLURM tests, on every core.
# make gpu-check: on a machine with one NVIDIA GPU (a few minutes): the GPU tests (pytest -m gpu),
#                 then SDPA's backends on it (exp015_backends in float16 and bfloat16, head width
#                 64, length 1,024 to 16,384), then training in each precision (exp019_precision,
#                 widths 128 and 1,024, 120 steps), then the report with its claims checked.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test test-fast gpu-check setup clean

run: $(VENV)/.installed
	$(BIN)/python -m harness +experiment=exp014_tiled
	$(BIN)/python -m analysis

test: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -m "not slurm and not serial" -n auto --maxprocesses 4 --durations 10
	$(BIN)/python -m pytest -m "slurm or serial" --durations 10

test-fast: $(VENV)/.installed
	$(BIN)/python -m pytest -m "not slow and not slurm" -n auto -q

gpu-check: $(VENV)/.installed
	$(BIN)/python -m pytest -m gpu
	$(BIN)/python -m harness +experiment=exp015_backends device=cuda dtype=float16,bfloat16 \
		head_dim=64 length=1024,2048,4096,8192,16384 min_time_s=0.2
	$(BIN)/python -m harness +experiment=exp019_precision device=cuda width=128,1024 \
		length=256 heads=8 kv_heads=8 batch=64 steps=120
	$(BIN)/python -m analysis --check

setup: $(VENV)/.installed

# Reinstalled when the requirements change; constraints.txt pins what was tested.
$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --quiet --constraint constraints.txt --editable '.[dev]'
	touch $@

clean:
	rm -rf $(VENV) outputs .pytest_cache .ruff_cache *.egg-info
