"""What putting this process's state back costs between two points (harness.launchers.fresh): a
ProcessState taken once, in a process that has imported what a sweep imports; then, after each of
POINTS trivial points (the generators seeded and drawn from, as a point does), the process's
state put back, each way in turn: restore(command=False) and left(), as a warm worker called
them before, reset(records=True), as it calls it now, and reset(), as the points run_here runs
one after another call it. With AGAINST=DIR, the
restore and left of another checkout's fresh.py (an earlier commit's, say; it imports this
checkout's harness) run among them. Prints the median per point of each, in microseconds, and
what taking the state once costs.
Run: python tests/benchmarks/point_state.py [POINTS]
"""

import importlib.util
import os
import random
import statistics
import sys
import time
from pathlib import Path

import numpy
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import harness.command.cli  # noqa: E402, F401 - what a sweep imports, and so what a state holds
import harness.command.sweep  # noqa: E402, F401
import harness.running.job  # noqa: E402, F401
from harness.launchers import fresh  # noqa: E402


def point() -> None:
    """What a trivial point changes: the generators it seeds, and a draw from each."""
    random.seed(1)
    torch.random.default_generator.manual_seed(1)
    random.random(), numpy.random.random(), torch.rand(4)


def ways() -> dict[str, tuple]:
    """Each way of putting the state back after a point, by name: (the state, how)."""
    found = {}
    for folder in [f for f in os.environ.get("AGAINST", "").split(",") if f]:
        path = Path(folder) / "harness" / "launchers" / "fresh.py"
        spec = importlib.util.spec_from_file_location(f"fresh_of_{len(found)}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        found[f"{folder}: restore + left"] = (module.ProcessState(), _restore_and_left)
    found["restore + left"] = (fresh.ProcessState(), _restore_and_left)
    found["reset(records=True)"] = (fresh.ProcessState(), lambda state: state.reset(True))
    found["reset"] = (fresh.ProcessState(), lambda state: state.reset())
    return found


def _restore_and_left(state) -> None:
    state.restore(command=False)
    state.left()


def main(points: int) -> None:
    taking = []
    for _ in range(20):
        started = time.perf_counter()
        fresh.ProcessState()
        taking.append(time.perf_counter() - started)
    found = ways()
    times = {name: [] for name in found}
    for _ in range(points):
        for name, (state, put_back) in found.items():
            point()
            started = time.perf_counter()
            put_back(state)
            times[name].append(time.perf_counter() - started)
    print(f"ProcessState(), once: median {statistics.median(taking) * 1e6:.0f} us")
    for name, samples in times.items():
        low, high = min(samples) * 1e6, max(samples) * 1e6
        median = statistics.median(samples) * 1e6
        print(f"{name:40} median {median:6.0f} us a point ({low:.0f} to {high:.0f} us)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
