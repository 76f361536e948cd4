"""The local launcher's warm workers against the in-process launcher, and against a process a
point (hydra.launcher.fresh=true).

1. POINTS trivial points (exp014_tiled at length 16, block 16, one head, seeds 0 to POINTS-1:
   a fraction of a millisecond of attention each) on hydra/launcher=basic (this process, a
   loop), on hydra/launcher=local with max_parallel=2 (two warm workers), and FRESH_POINTS of
   them with fresh=true. A point's cost is the sweep's own time (the harness's last line: from
   its first point's start to its last's end, workers' start included) over its points; and,
   to leave the workers' start out, the marginal cost: (time for POINTS - time for POINTS/10)
   over the points between.
2. exp014_tiled's seeded sweep (nine points): the whole command's wall time, local against basic.

Each command runs in a scratch directory, the kinds alternately, REPEATS times; medians.
Run: python tests/benchmarks/warm_workers.py [POINTS] [REPEATS]
"""

import re
import statistics
import subprocess
import sys
import tempfile
import time

BASIC = ["hydra/launcher=basic"]
LOCAL = ["hydra/launcher=local", "hydra.launcher.max_parallel=2"]
FRESH = [*LOCAL, "hydra.launcher.fresh=true"]
FRESH_POINTS = 10


def sweep(points: int, launcher: list[str]) -> tuple[float, float]:
    """(the sweep's own seconds, the command's wall seconds) for `points` trivial points."""
    grid = ["length=16", "block=16", "heads=1", f"seed=range(0,{points})"]
    return run(["+experiment=exp014_tiled", *grid, *launcher])


def run(arguments: list[str]) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as scratch:
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "harness", *arguments], cwd=scratch,
                              check=True, capture_output=True, text=True)  # fmt: skip
        wall = time.perf_counter() - started
    (own,) = re.findall(r"points: .*; in ([0-9.]+) s;", done.stdout)
    return float(own), wall


def main(points: int, repeats: int) -> None:
    few = max(2, points // 10)
    kinds = {  # name: (its launcher, how many points, how many for the marginal cost)
        "basic": (BASIC, points, few),
        "local, warm": (LOCAL, points, few),
        "local, fresh": (FRESH, FRESH_POINTS, 2),
    }
    taken = {name: [] for name in kinds}
    for _ in range(repeats):
        for name, (launcher, many, fewer) in kinds.items():
            taken[name].append((sweep(many, launcher)[0], sweep(fewer, launcher)[0]))
    costs = {}
    for name, (_, many, fewer) in kinds.items():
        whole = statistics.median(t[0] / many for t in taken[name]) * 1000
        marginal = statistics.median((t[0] - t[1]) / (many - fewer) for t in taken[name]) * 1000
        costs[name] = whole, marginal
        print(f"{name:13} {many} points: {whole:8.1f} ms a point (sweep time / points), "
              f"{marginal:8.1f} ms marginal ({repeats} runs, medians)")  # fmt: skip
    for name in ("local, warm", "local, fresh"):
        (whole, marginal), basic = costs[name], costs["basic"]
        print(f"{name} / basic: {whole / basic[0]:.2f}x a point, "
              f"{marginal / basic[1]:.2f}x marginal")  # fmt: skip
    seeded = {"basic": [], "local": []}
    for _ in range(repeats):
        seeded["basic"].append(run(["+experiment=exp014_tiled", *BASIC])[1])
        seeded["local"].append(run(["+experiment=exp014_tiled", *LOCAL])[1])
    basic, local = (statistics.median(seeded[name]) for name in ("basic", "local"))
    print(f"exp014_tiled's seeded sweep, wall time: basic {basic:.2f} s, local {local:.2f} s: "
          f"{local / basic:.2f}x")  # fmt: skip


if __name__ == "__main__":
    arguments = [int(a) for a in sys.argv[1:]]
    main(*arguments) if len(arguments) == 2 else main(200, 3)
