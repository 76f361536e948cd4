"""Shared fixtures: the harness's command line, run for real in a scratch working directory."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_command(module: str, *args: str, cwd: Path, timeout: float = 600, env: dict | None = None):
    """`python -m module args...` in `cwd`; the CompletedProcess (text output, no check)."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def harness(tmp_path):
    """Run `python -m harness ...` in a fresh working directory (outputs/ lands there)."""

    def run(*args: str, **kwargs):
        return run_command("harness", *args, cwd=tmp_path, **kwargs)

    run.cwd = tmp_path
    run.results = tmp_path / "outputs" / "results"
    return run


@pytest.fixture
def analysis(tmp_path):
    """Run `python -m analysis ...` in the same working directory as the `harness` fixture."""

    def run(*args: str, **kwargs):
        return run_command("analysis", *args, cwd=tmp_path, **kwargs)

    return run
