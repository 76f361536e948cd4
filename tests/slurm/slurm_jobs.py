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


def job_pythonpath() -> str:
    """The sys.path entry from which this module imports under its current __name__."""
    return str(Path(__file__).resolve().parents[__name__.count(".")])
