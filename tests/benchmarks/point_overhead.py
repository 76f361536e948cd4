"""What the harness costs per point: a sweep of POINTS trivial points against a bare loop.

Two figures, each for the harness and for every checkout AGAINST names: a point's cost over the
bare loop's, the commands' start and end left out (the difference between POINTS points and a
tenth of them, over the points between: what one more point costs), and the whole command's
over the bare loop's at POINTS, the start included, a point.

Both start a fresh interpreter and compute the same points: exp014_tiled at length 16, block 16,
one head, seeds 0 to POINTS-1 (each a fraction of a millisecond of attention). The bare loop
calls octlm_experiments.tiled.run and writes all rows to one Parquet file at the end; the harness
plans, checks, runs each point in this process (harness.launchers.in_process), writes each point's
rows to its own file as it ends, and prints a progress line per point. They run alternately, REPEATS
times each, in scratch directories; the medians, their difference per point and their ratio
are printed. The scratch directories are made where TMPDIR says: TMPDIR=/dev/shm (a tmpfs)
separates what the harness computes from what the disk's file-system calls cost (the harness
makes a folder, three small files and a Parquet file per point; the bare loop one file).
With AGAINST=DIR, the harness of another checkout runs among them too (harness_overhead.py).
Run: python tests/benchmarks/point_overhead.py [POINTS] [REPEATS]
"""

import sys

from harness_overhead import harnesses, side_by_side  # this folder is on its scripts' path

BARE = """
import sys
import pyarrow as pa
import pyarrow.parquet as pq
from octlm_experiments.tiled import run
rows = []
for seed in range(int(sys.argv[1])):
    params = dict(length=16, block=16, heads=1, seed=seed)
    rows += [{**params, **row} for row in run(**params)]
pq.write_table(pa.Table.from_pylist(rows), "rows.parquet")
"""


def main(points: int, repeats: int) -> None:
    few = max(1, points // 10)
    commands = {}
    for count in (points, few):
        grid = ["length=16", "block=16", "heads=1", f"seed=range(0,{count})"]
        commands |= {
            f"bare loop, {count}": [sys.executable, "-c", BARE, str(count)],
            **{
                f"{name}, {count}": command
                for name, command in harnesses(["+experiment=exp014_tiled", *grid]).items()
            },  # fmt: skip
        }
    medians = dict(zip(commands, side_by_side(commands, repeats), strict=True))
    names = [name.rpartition(", ")[0] for name in commands if name.endswith(f", {points}")]
    bare = [medians[f"bare loop, {count}"] for count in (points, few)]
    for name in names[1:]:
        many, some = (medians[f"{name}, {count}"] for count in (points, few))
        each = ((many - some) - (bare[0] - bare[1])) / (points - few)
        whole = (many - bare[0]) / points
        print(f"{name}: {each * 1e3:.2f} ms a point over the bare loop ({points} against {few} "
              f"points); {whole * 1e3:.2f} ms a point with the command's start and end, "
              f"{many / bare[0]:.2f}x")  # fmt: skip


if __name__ == "__main__":
    arguments = [int(a) for a in sys.argv[1:]]
    main(*(arguments + [1000, 5][len(arguments) :]))
