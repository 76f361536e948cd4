"""Experiments for the harness's own tests: points that wait, through files, for each other or
for the test, so that a test can prove two points ran at once, or act while a point runs,
without resting on timing."""

import os
import time
from pathlib import Path


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
