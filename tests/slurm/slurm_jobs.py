"""Functions that submitit runs inside SLURM jobs in tests/slurm/test_cluster.py.

They live in a module of their own (not the test module) because cloudpickle pickles a
module-level function by reference ("slurm_jobs.report"): the job's python must be able to
import this module.  The tests put this folder on the job's PYTHONPATH (see
``job_pythonpath``).  Keep this module free of pytest and of the harness.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

SLURM_VARIABLES = (
    "SLURM_JOB_ID",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_ARRAY_TASK_COUNT",
    "SLURM_RESTART_COUNT",
    "SLURM_JOB_PARTITION",
    "SLURM_JOB_GPUS",
    "CUDA_VISIBLE_DEVICES",
)


def report(x: int, sleep_s: float = 0.0) -> dict:
    """Return 2*x together with what the job saw: SLURM ids, GPUs, timing, interpreter."""
    start = time.time()
    time.sleep(sleep_s)
    return {
        "x": x,
        "y": 2 * x,
        "env": {name: os.environ.get(name) for name in SLURM_VARIABLES},
        "start": start,
        "end": time.time(),
        "host": socket.gethostname(),
        "cwd": os.getcwd(),
        "python": sys.executable,
    }


def meet(x: int, folder: str, timeout_s: float = 120.0) -> dict:
    """Arrive in `folder`, then wait for the partner task (x ^ 1) to arrive too: two tasks
    that both return ran at the same time, whatever the machine's speed. report()'s dict."""
    here = Path(folder)
    (here / f"arrived-{x}").touch()
    deadline = time.monotonic() + timeout_s
    while not (here / f"arrived-{x ^ 1}").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"task {x} waited {timeout_s:g} s for task {x ^ 1}")
        time.sleep(0.05)
    return report(x)


def job_pythonpath() -> str:
    """The sys.path entry from which this module imports under its current __name__."""
    return str(Path(__file__).resolve().parents[__name__.count(".")])
