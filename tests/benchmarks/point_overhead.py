"""What the harness costs per point: a sweep of POINTS trivial points against a bare loop.

Both start a fresh interpreter and compute the same points: exp014_tiled at length 16, block 16,
one head, seeds 0 to POINTS-1 (each a fraction of a millisecond of attention). The bare loop
calls experiments.tiled.run and writes all rows to one Parquet file at the end; the harness
plans, checks, runs each point in this process (harness.inprocess), writes each point's rows to
its own file as it ends, and prints a progress line per point. They run alternately, REPEATS
times each, in scratch directories; the medians, their difference per point and their ratio
are printed. Run: python tests/benchmarks/point_overhead.py [POINTS] [REPEATS]
"""

import statistics
import subprocess
import sys
import tempfile
import time

BARE = """
import sys
import pyarrow as pa
import pyarrow.parquet as pq
from experiments.tiled import run
rows = []
for seed in range(int(sys.argv[1])):
    params = dict(length=16, block=16, heads=1, seed=seed)
    rows += [{**params, **row} for row in run(**params)]
pq.write_table(pa.Table.from_pylist(rows), "rows.parquet")
"""


def wall_time(command: list[str]) -> float:
    with tempfile.TemporaryDirectory() as scratch:
        started = time.perf_counter()
        subprocess.run(command, cwd=scratch, check=True, capture_output=True)
        return time.perf_counter() - started


def main(points: int, repeats: int) -> None:
    grid = ["length=16", "block=16", "heads=1", f"seed=range(0,{points})"]
    commands = {
        "bare loop": [sys.executable, "-c", BARE, str(points)],
        "python -m harness": [sys.executable, "-m", "harness", "+experiment=exp014_tiled", *grid],
    }
    times = {name: [] for name in commands}
    for _ in range(repeats):
        for name, command in commands.items():
            times[name].append(wall_time(command))
    for name, samples in times.items():
        spread = f"{min(samples):.2f} to {max(samples):.2f}"
        print(f"{name:18} median {statistics.median(samples):.2f} s ({spread} s, {repeats} runs)")
    bare, harness = (statistics.median(times[name]) for name in commands)
    print(f"{points} points: {(harness - bare) / points * 1e3:.2f} ms of harness per point, "
          f"{harness / bare:.2f}x the bare loop")  # fmt: skip


if __name__ == "__main__":
    arguments = [int(a) for a in sys.argv[1:]]
    main(*(arguments + [1000, 5][len(arguments) :]))
