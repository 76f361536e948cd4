"""Experiments for the harness's own tests: points that wait, through files, for each other or
for the test, so that a test can prove two points ran at once, or act while a point runs,
without resting on timing."""

import os
import time
from collections.abc import Callable
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent  # the probes, and their configs in conf/
# The PYTHONPATH under which `python -m harness` finds both the harness and the probes.
PROBE_PATH = os.pathsep.join([str(SUPPORT.parent.parent), str(SUPPORT)])


def rendezvous(
    *,
    point: int,
    folder: str,
    expect: int = 0,
    release: str = "",
    hold: int = 0,
    timeout_s: float = 120.0,
) -> list[dict]:
    """Arrive (leave a file of this process in `folder`), then wait until `expect` arrivals are
    there and, if `release` names one, until that file exists in `folder` (only the points
    numbered `hold` or more wait for it). One row: how many arrivals it saw. A point that
    waits longer than timeout_s fails."""
    here = Path(folder)
    (here / f"arrived-{point}-{os.getpid()}").touch()
    held = release and point >= hold
    deadline = time.monotonic() + timeout_s
    while len(arrivals(here)) < expect or (held and not (here / release).exists()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"point {point} waited {timeout_s:g} s in {folder}")
        time.sleep(0.05)
    return [{"arrivals": len(arrivals(here))}]


def arrivals(folder: Path) -> list[Path]:
    """The arrival files in `folder`, one per process that ran a point."""
    return sorted(Path(folder).glob("arrived-*"))


def await_arrivals(folder: Path, count: int, timeout_s: float = 120.0) -> None:
    """For the tests: wait until `count` points have arrived in `folder`, at most timeout_s."""
    deadline = time.monotonic() + timeout_s
    while len(arrivals(folder)) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(arrivals(folder))} of {count} points arrived in {folder}")
        time.sleep(0.05)


def sized(*, width: int, point: int = 0) -> list[dict]:
    """One row from a config that chooses a config group (size: small or large)."""
    return [{"area": width * point}]


def trainer(
    *,
    steps: int,
    folder: str,
    checkpoint_every: int = 4,
    hold_at: int = 0,
    until: str = "release",
    timeout_s: float = 120.0,
    seed: int = 0,
    tracker=None,
) -> list[dict]:
    """A training run without a model: a row per step (step, value = step * 10 + seed), a
    checkpoint every `checkpoint_every` steps. A run that did not resume from a checkpoint
    holds after step `hold_at` (0: never) until the file `until` exists in `folder`, or, with
    until="stopping", until SLURM asks its task to stop (tracker.stopping); it leaves the file
    "held-PID" there meanwhile. Then one final row (step 0, value -1)."""
    state = tracker.restore() if tracker is not None else None
    first = state["step"] + 1 if state else 1
    rows = []
    for step in range(first, steps + 1):
        row = {"step": step, "value": step * 10 + seed, "pid": os.getpid()}
        tracker.log(row) if tracker is not None else rows.append(row)
        if step == hold_at and state is None:
            (Path(folder) / f"held-{os.getpid()}").touch()
            deadline = time.monotonic() + timeout_s
            gate = Path(folder) / until
            while not (tracker.stopping if until == "stopping" else gate.exists()):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"held at step {step} for {timeout_s:g} s")
                time.sleep(0.05)
        if tracker is not None and (step % checkpoint_every == 0 or tracker.stopping):
            tracker.save({"step": step})
    return [*rows, {"step": 0, "value": -1, "pid": os.getpid()}]


def held(folder: Path) -> list[Path]:
    """The "held-PID" files trainer runs left in `folder`."""
    return sorted(Path(folder).glob("held-*"))


def wait_for(
    predicate: Callable[[], object],
    timeout: float,
    what: str,
    interval: float = 0.1,
    describe: Callable[[], str] | None = None,
):
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds
    (with ``describe()`` in the message, e.g. the job's state)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = f"\n{describe()}" if describe else ""
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{extra}")
        time.sleep(interval)
