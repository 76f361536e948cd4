"""For the tests: the harness's and the analysis's command lines, run for real in a folder."""

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "tests" / "support"  # the test probes: a user's own experiment, on its own path


def run_command(module: str, *args: str, cwd: Path, timeout: float = 600, env: dict | None = None):
    """`python -m module args...` in `cwd`; the CompletedProcess (text output, no check)."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=_environment(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_command(module: str, *args: str, cwd: Path, env: dict | None = None):
    """`python -m module args...` in `cwd`, started in its own session as from a terminal
    (Ctrl-C's SIGINT not ignored, even when the tests run in the background); the Popen."""
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=_environment(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _environment(extra: dict | None) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), **(extra or {})}
