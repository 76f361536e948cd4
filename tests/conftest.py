"""Shared fixtures: the harness's command line, run for real in a scratch working directory."""

import os
import subprocess

import pandas as pd
import pytest
from commands import ROOT, SUPPORT, run_command, start_command


@pytest.fixture
def initialized():
    """Hydra initialized with the harness's configs, as the command line initializes it; the
    config loader."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from harness.config import CONF

    with initialize_config_dir(config_dir=str(CONF), job_name="harness", version_base=None):
        yield GlobalHydra.instance().config_loader()


@pytest.fixture
def harness(tmp_path):
    """Run `python -m harness ...` in a fresh working directory (outputs/ lands there)."""

    def run(*args: str, **kwargs):
        return run_command("harness", *args, cwd=tmp_path, **kwargs)

    def start(*args: str, **kwargs):
        return start_command("harness", *args, cwd=tmp_path, **kwargs)

    run.start = start
    run.cwd = tmp_path
    run.results = tmp_path / "outputs" / "results"
    return run


@pytest.fixture
def probe(harness):
    """`python -m harness --config-dir tests/support/conf +experiment=rendezvous ARGS`, with
    tests/support on the path: points that wait for each other or for a file (probes.py)."""
    given = ["--config-dir", str(SUPPORT / "conf"), "+experiment=rendezvous"]
    path = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(SUPPORT)])}

    def run(*args: str, env: dict | None = None, **kwargs):
        return harness(*given, *args, env={**path, **(env or {})}, **kwargs)

    def start(*args: str, env: dict | None = None, **kwargs):
        return harness.start(*given, *args, env={**path, **(env or {})}, **kwargs)

    run.start, run.cwd, run.results, run.harness = start, harness.cwd, harness.results, harness
    return run


@pytest.fixture
def gate(tmp_path):
    """An empty folder for the probe's points to arrive in (folder=) and to be released from."""
    folder = tmp_path / "gate"
    folder.mkdir()
    return folder


@pytest.fixture
def analysis(tmp_path):
    """Run `python -m analysis ...` in the same working directory as the `harness` fixture."""

    def run(*args: str, **kwargs):
        return run_command("analysis", *args, cwd=tmp_path, **kwargs)

    return run


@pytest.fixture
def most_at_once():
    """How many of a sweep's points ran at the same moment, from their rows' start and duration."""

    def count(rows: pd.DataFrame) -> int:
        starts = rows["started_at"].map(pd.Timestamp.timestamp)
        ends = starts + rows["duration_s"]
        events = sorted([(t, 1) for t in starts] + [(t, -1) for t in ends])
        running = most = 0
        for _, change in events:
            running += change
            most = max(most, running)
        return most

    return count


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MiB file system (tmpfs) for the out dir; needs root (mount)."""
    folder = tmp_path / "disk"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(folder)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
    yield folder
    subprocess.run(["umount", "-l", str(folder)], capture_output=True)
