"""Where a trivial point's milliseconds go: a sweep of POINTS trivial points (exp014_tiled at
length 16, block 16, one head, seeds 0 to POINTS-1), run in this process as `python -m harness`
runs it, with each step of a point timed around the function that does it. Prints each step's
milliseconds per point. The scratch directory is made where TMPDIR says (TMPDIR=/dev/shm leaves
the disk out). Run: python tests/benchmarks/point_phases.py [POINTS]
"""

import contextlib
import functools
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness import (  # noqa: E402
    provenance,
    reuse,  # noqa: E402
    store,
)
from harness.command import cli, sweep  # noqa: E402
from harness.launchers import dispatch, in_process  # noqa: E402
from harness.running import job  # noqa: E402

STEPS = {  # what is timed: (where the function is looked up when called, its name)
    "the whole job (in the loop)": (in_process.InProcess, "run"),
    " its config": (in_process.InProcess, "prepare"),
    " its folder and log": (in_process.InProcess, "_log_to"),
    " its .hydra files": (in_process.InProcess, "_save"),
    " the point (run_point)": (in_process, "run_point"),
    " its state put back after it": (in_process.SameStart, "_put_back"),
    "  the experiment itself": (job, "measure"),  # run_point's name for calling.measure
    "  its rows written": (store, "write_rows"),
    "  provenance": (provenance, "provenance"),
    "  the package list": (job, "_keep_package_list"),
    "  reuse: its inputs hashed": (reuse, "inputs"),
    "  reuse: its key": (reuse, "key"),
    "  what it read undeclared: files_read": (reuse.Watch, "said"),
    "  what it read undeclared: the point's": (reuse.Watch, "keep"),
    "  reuse: answer recorded": (reuse, "record"),
    "reuse: answers looked up before it ran": (dispatch, "reuse_answered"),
    "its progress line and checks": (dispatch, "finish"),
    "the compaction at the end": (sweep, "compact_if_finished"),
}


def timed(owner, name: str, step: str, seconds: dict[str, float]) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            seconds[step] += time.perf_counter() - started

    setattr(owner, name, wrapper)


def main(points: int) -> None:
    seconds: dict[str, float] = defaultdict(float)
    for step, (owner, name) in STEPS.items():
        timed(owner, name, step, seconds)
    grid = ["length=16", "block=16", "heads=1", f"seed=range(0,{points})"]
    here = os.getcwd()
    with (
        tempfile.TemporaryDirectory() as scratch,
        open(os.devnull, "w") as quiet,
        contextlib.redirect_stdout(quiet),
        contextlib.suppress(SystemExit),
    ):
        os.chdir(scratch)
        cli.main(["+experiment=exp014_tiled", *grid])
    os.chdir(here)
    print(f"{points} points in {Path(scratch).parent}, milliseconds per point (indented: within")
    print("the step above it):")
    for step in STEPS:
        print(f"  {step:32} {seconds[step] / points * 1e3:6.3f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)
