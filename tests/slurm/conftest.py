"""A real single-node SLURM cluster for the tests under tests/slurm.

The session-scoped fixture ``slurm_cluster`` starts the cluster with ``cluster.sh start`` in a
temporary directory, points ``SLURM_CONF`` (in ``os.environ``) at it for the whole session and
stops it at the end.  sbatch/squeue/scontrol/scancel/sinfo, submitit and hydra-submitit-launcher
in this process and in its subprocesses then talk to the test cluster.

Skip rules: without the SLURM and munge programs, or when not root, the tests that use the
fixture are skipped, saying how to enable them (test modules that call
``slurm_testing.skip_module_unless_available()`` at import get ONE skip line for the whole
module).  With HARNESS_REQUIRE_SLURM=1 a missing or failing cluster is an error instead, never
a skip (CI sets it).  A cluster that is installed but fails to start is skipped too (with the
first error line) unless HARNESS_REQUIRE_SLURM=1, which fails with the daemon logs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest
from slurm_testing import (
    SlurmCluster,
    availability_problem,
    make_directory,
    run_script,
    slurm_required,
    unavailable,
)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    problem = availability_problem()
    if problem:
        unavailable(problem)

    directory, remove_after = make_directory(tmp_path_factory)
    started = time.monotonic()
    try:
        proc = run_script("start", directory, timeout=180)
    except subprocess.TimeoutExpired:
        run_script("stop", directory, timeout=60)
        unavailable(f"cluster.sh start {directory} hung for 180 s")
    if proc.returncode != 0:
        details = (proc.stderr or proc.stdout).strip()
        errors = [line for line in details.splitlines() if line.startswith("cluster.sh: error:")]
        reason = errors[0] if errors else f"exit status {proc.returncode}"
        if slurm_required():
            pytest.fail(
                f"SLURM test cluster failed to start (cluster.sh start {directory}):\n{details}",
                pytrace=False,
            )
        pytest.skip(
            f"SLURM test cluster failed to start ({reason}); "
            "set HARNESS_REQUIRE_SLURM=1 to make this a failure with the daemon logs"
        )

    exported: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        if line.startswith("export ") and "=" in line:
            key, _, value = line[len("export ") :].partition("=")
            exported[key] = value
    env = {"SLURM_CONF": exported["SLURM_CONF"]}  # all a client needs
    cluster = SlurmCluster(
        directory=directory,
        partition=exported["HARNESS_SLURM_PARTITION"],
        max_array_size=int(exported["HARNESS_SLURM_MAX_ARRAY_SIZE"]),
        requeue_delay_s=int(exported["HARNESS_SLURM_REQUEUE_DELAY_S"]),
        env=env,
    )
    print(f"\nSLURM test cluster in {directory} up in {time.monotonic() - started:.1f}s")

    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield cluster
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        stop = run_script("stop", directory, timeout=120)
        if stop.returncode != 0:
            print(f"cluster.sh stop {directory} failed:\n{stop.stderr}")
        if remove_after:
            shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def cluster(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The session cluster, with every job cancelled after each test."""
    yield slurm_cluster
    slurm_cluster.cancel_all()
