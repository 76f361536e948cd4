"""Shared fixtures: the harness's command line, run for real in a scratch working directory; and
the tiers (docs/developing.md, Tests): a test that calls a command is marked e2e, one that starts
processes must be marked process (or slow, slurm, serial), and any other (a unit test) that
starts a process fails, saying so."""

import contextlib
import multiprocessing.process
import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from commands import ROOT, SUPPORT, call_command, start_command

from harness.pinning import boot

COMMAND_FIXTURES = {"harness", "probe", "analysis"}  # a test that takes one is e2e
STARTING = {"process", "slow", "slurm", "serial"}  # markers that allow any process
ALLOWED_IN_E2E = {"git"}  # the commit and dirty flag of a row's provenance (once a process)


def pytest_configure(config):
    """Each of pytest-xdist's workers takes its share of the CPUs for torch's threads, and so do
    the processes its tests start (OMP_NUM_THREADS, unless set): workers that each spin every
    CPU's thread (torch's default) slow one another by 10 to 100 times."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch

        share = max(1, len(os.sched_getaffinity(0)) // workers)
        torch.set_num_threads(share)
        os.environ.setdefault("OMP_NUM_THREADS", str(share))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items):
    """e2e on a test that calls a command; the SLURM tests as groups (the group "slurm", unless
    a test names another), each of which one worker runs one after another on a cluster of
    its own (--dist loadgroup), while the others run the rest: the tests that wait minutes on
    SLURM's clock in a group apart from the rest of the SLURM tests."""
    for item in items:
        if COMMAND_FIXTURES & set(item.fixturenames) and not item.get_closest_marker("e2e"):
            item.add_marker("e2e")
        if item.get_closest_marker("slurm") and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group("slurm"))


STARTED = pytest.StashKey[list]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with _watching(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _watching(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A unit test that started a process fails, and so does an e2e one that started any but
    git: such a test is marked process. The processes are recorded where they start rather
    than refused there, where the code under test might take the refusal for its own error."""
    report = yield
    started = item.stash.get(STARTED, [])
    if report.when == "call" and report.passed and started:
        tier = "an e2e test" if item.get_closest_marker("e2e") else "a unit test"
        report.outcome = "failed"
        report.longrepr = (f"{tier} started processes ({', '.join(dict.fromkeys(started))}): "
                           "mark it process, or call the command in this process")  # fmt: skip
    return report


@contextlib.contextmanager
def _watching(item):
    """Record in the item's stash each process that its setup or call starts, unless its
    markers allow it."""
    markers = {marker.name for marker in item.iter_markers()}
    if markers & STARTING:
        yield
        return
    allowed = ALLOWED_IN_E2E if "e2e" in markers else set()
    started = item.stash.setdefault(STARTED, [])

    def watch(patch, owner, name: str, what):
        original = getattr(owner, name)

        def starting(*args, **kwargs):
            said = what(*args, **kwargs)
            if said not in allowed:
                started.append(said)
            return original(*args, **kwargs)

        patch.setattr(owner, name, starting)

    with pytest.MonkeyPatch.context() as patch:
        watch(patch, subprocess.Popen, "_execute_child", _program)
        watch(patch, multiprocessing.process.BaseProcess, "start", _process_name)
        watch(patch, os, "fork", lambda: "os.fork")
        yield


def _program(popen, args, *rest) -> str:
    first = args if isinstance(args, str | bytes | os.PathLike) else args[0]
    return Path(os.fsdecode(first).split()[0]).name


def _process_name(process) -> str:
    return f"multiprocessing {process.name}"


@pytest.fixture
def initialized():
    """Hydra initialized with the harness's configs, as the command line initializes it; the
    config loader."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from harness.names import CONF

    with initialize_config_dir(config_dir=str(CONF), job_name="harness", version_base=None):
        yield GlobalHydra.instance().config_loader()


@pytest.fixture
def harness(tmp_path):
    """`python -m harness ...` in a fresh working directory (outputs/ lands there), called in
    this process (harness.start: started as a process of its own, for the tests about one)."""

    def run(*args: str, **kwargs):
        return call_command("harness", *args, cwd=tmp_path, **kwargs)

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
def trainer(harness, tmp_path):
    """`python -m harness --config-dir tests/support/conf +experiment=trainer folder=GATE ARGS`
    (probes.trainer): .start runs it as a process, .resume(SWEEP, ARGS) resumes a sweep of it
    (with the sweep's own folder=: a resume may not set it again)."""
    gate = tmp_path / "gate"
    gate.mkdir()
    given = ["--config-dir", str(SUPPORT / "conf"), "+experiment=trainer", f"folder={gate}"]
    path = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(SUPPORT)])}

    def run(*args: str, **kwargs):
        return harness(*given, *args, env=path, **kwargs)

    run.start = lambda *args, **kwargs: harness.start(*given, *args, env=path, **kwargs)
    run.resume = lambda sweep, *args: harness(*given[:-1], f"resume={sweep}", *args, env=path)
    run.gate, run.results, run.out = gate, harness.results, harness.cwd / "outputs"
    run.harness = harness
    return run


@pytest.fixture
def gate(tmp_path):
    """An empty folder for the probe's points to arrive in (folder=) and to be released from."""
    folder = tmp_path / "gate"
    folder.mkdir()
    return folder


@pytest.fixture
def analysis(tmp_path):
    """`python -m harness report ...` in the same working directory as the `harness` fixture, called
    in this process."""

    def run(*args: str, **kwargs):
        return call_command("analysis", *args, cwd=tmp_path, **kwargs)

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


@pytest.fixture(autouse=True)
def _no_sweep_code_left_behind():
    """A test leaves no sweep's code in this worker's environment (harness.pinning.boot.enter's, as
    a command called in this process without call_command would): every process a later test
    starts would import the harness from that snapshot."""
    yield
    left = [name for name in (boot.BOOT_ENV, boot.CONF_ENV) if name in os.environ]
    assert not left, f"the test left {', '.join(left)} in the environment: use call_command"
    assert boot.pinned_here() is None, "the test left a snapshot's import hook: use call_command"
