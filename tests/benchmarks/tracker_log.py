"""tracker.log at the scale of training: its cost per logged step, and a landing's cost late in
a long run.

A training point's rows, {step, loss, accuracy, tokens_per_s, learning_rate} a step with no
compute, through a Tracker made as harness.running.job makes one (the point's parameters and the
harness's columns on every stored row), in a scratch directory:
- the cost of tracker.log per call over a 10,000-step loop, landings included (every 1,000 rows
  and every second, the defaults): the median of ROUNDS rounds, each a fresh point;
- a long run (STEPS steps, landing every 1,000 rows only): the time of the 10th and of the
  1,000th landing (each the log call that lands; with the median of the ten landings around
  each), the time of the point's end (its job file written once), and the process's peak
  resident memory after the loop and after the end, against the same process before the run.
Each long run is a process of its own, so that its peak memory is its own.

With --old, the same for the tracker before segments (git show OLD:harness/tracking.py, the
commit before 66a4563, as a module of its own; its long run is cut to OLD_STEPS steps: every
landing rewrites every row so far).
Run: python tests/benchmarks/tracker_log.py [--old] [STEPS]
"""

import importlib.util
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness import (  # noqa: E402
    provenance,  # noqa: E402
    store,
    tracking,
)
from harness.running import calling, job  # noqa: E402

LOOP, ROUNDS, STEPS, OLD_STEPS = 10_000, 5, 1_000_000, 20_000
OLD = "66a4563^"  # the last commit whose tracker rewrote every row at each landing
PARAMS = {"attention": "sdpa", "window": 0, "steps": STEPS, "lr": 3e-4, "device": "cpu"}


def old_tracking():
    """The Tracker of commit OLD, as a module of its own."""
    text = subprocess.run(["git", "show", f"{OLD}:harness/tracking.py"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout  # fmt: skip
    path = Path(tempfile.mkdtemp()) / "old_tracking.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("old_tracking", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def point(folder: Path, old: bool, **kwargs):
    """A Tracker of job 0 in `folder`, with harness.running.job's columns (the old one: its
    prepare)."""
    path = store.SweepPaths(folder / "results", "bench", "s").job(0).file
    path.parent.mkdir(parents=True, exist_ok=True)
    started, clock = datetime.now(UTC), time.perf_counter()
    shared = {"job": 0, "config_hash": "h", "started_at": started, "command": "bench",
              "run_dir": str(folder), **provenance.provenance("cpu")}  # fmt: skip

    def prepare(row: dict) -> dict:
        if old:  # what harness.running.job's prepare did for a logged row
            calling._check_rows([row], PARAMS)
        return job._row(row, PARAMS, {**shared, "duration_s": time.perf_counter() - clock})

    checkpoints = folder / "checkpoints"
    if old:
        return old_tracking().Tracker(path, checkpoints, prepare, config_hash="h", **kwargs)
    return tracking.Tracker(path, checkpoints, prepare, config_hash="h", clock=clock,
                            check=calling.row_check(PARAMS), **kwargs)  # fmt: skip


def step_row(step: int) -> dict:
    return {"step": step, "loss": 1 / step, "accuracy": 0.5, "tokens_per_s": 1.2e5 + step,
            "learning_rate": 3e-4}  # fmt: skip


def per_call_us(old: bool) -> list[float]:
    """tracker.log's cost a call over LOOP steps, in each of ROUNDS fresh points."""
    found = []
    for _ in range(ROUNDS):
        with tempfile.TemporaryDirectory() as scratch:
            tracker = point(Path(scratch), old, every_rows=1000, every_s=1.0)
            rows = [step_row(step) for step in range(1, LOOP + 1)]
            started = time.perf_counter()
            for row in rows:
                tracker.log(row)
            found.append((time.perf_counter() - started) / LOOP * 1e6)
            tracker.close()
    return found


def long_run(old: bool, steps: int) -> dict:
    """One long run in this process: each landing's time, the end's, the peak memory."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with tempfile.TemporaryDirectory() as scratch:
        tracker = point(Path(scratch), old, every_rows=1000, every_s=3600.0)
        landings = []
        for step in range(1, steps + 1):
            row = step_row(step)
            if step % 1000:
                tracker.log(row)
            else:  # this call lands the 1,000 rows
                started = time.perf_counter()
                tracker.log(row)
                landings.append(time.perf_counter() - started)
        looped = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        started = time.perf_counter()
        if old:
            store.write_rows(tracker.path, tracker.close())
        else:
            tracker.end([])
        ended = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"landings": landings, "end_s": ended, "rss_before_mb": before / 1024,
            "rss_loop_mb": looped / 1024, "rss_end_mb": after / 1024}  # fmt: skip


def around(landings: list[float], number: int) -> float:
    """The median of the landings number-5 .. number+4 (1-based), in ms."""
    start = max(0, min(number - 5, len(landings) - 10))
    return statistics.median(landings[start : start + 10]) * 1e3


def report(name: str, old: bool, steps: int) -> None:
    costs = per_call_us(old)
    print(f"{name}: tracker.log over {LOOP:,} steps: median {statistics.median(costs):.1f} us a "
          f"call (rounds: {', '.join(f'{c:.1f}' for c in costs)})")  # fmt: skip
    command = [sys.executable, __file__, "--long", *(["--old"] if old else []), str(steps)]
    found = json.loads(subprocess.run(command, check=True, capture_output=True).stdout)
    landings, last = found["landings"], len(found["landings"])
    print(f"{name}: {steps:,} steps, {last} landings of 1,000 rows: the 10th took "
          f"{landings[9] * 1e3:.2f} ms (median around it {around(landings, 10):.2f}), the "
          f"{last:,}th {landings[-1] * 1e3:.2f} ms (median around it {around(landings, last):.2f}"
          f"; ratio of the medians {around(landings, last) / around(landings, 10):.2f}); the "
          f"end took {found['end_s']:.2f} s")  # fmt: skip
    print(f"{name}: peak RSS {found['rss_before_mb']:.0f} MB before the run, "
          f"{found['rss_loop_mb']:.0f} MB after the loop, {found['rss_end_mb']:.0f} MB after "
          "the end")  # fmt: skip


def main(argv: list[str]) -> None:
    old = "--old" in argv
    numbers = [int(a) for a in argv if a.isdigit()]
    if "--long" in argv:
        print(json.dumps(long_run(old, numbers[0])))
        return
    report("this tree", False, numbers[0] if numbers else STEPS)
    if old:
        report(OLD, True, min(numbers[0] if numbers else STEPS, OLD_STEPS))


if __name__ == "__main__":
    main(sys.argv[1:])
