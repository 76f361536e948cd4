"""What every experiment module keeps to: no Hydra, no Parquet, not even through its imports."""

import subprocess
import sys

import pytest

MODULES = ["attention", "model", "tiled", "equivalence", "backends", "tiled_backward", "checks"]
HARNESS_SIDE = ("hydra", "omegaconf", "pyarrow", "pandas")


@pytest.mark.parametrize("module", MODULES)
def test_an_experiment_module_imports_nothing_of_hydra_or_parquet(module):
    code = (
        f"import sys, experiments.{module}; print(sorted(set({HARNESS_SIDE}) & sys.modules.keys()))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
