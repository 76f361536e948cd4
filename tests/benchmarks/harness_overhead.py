"""What the harness costs: `python -m harness +experiment=exp014_tiled` against a bare script.

Both start a fresh interpreter and compute the same nine points (length 128, 512, 1024 x
block 64, 128, 256); the bare script calls octlm_experiments.tiled.run in a loop and writes the rows
to one Parquet file. A third command is the bare script that also imports what the harness is
built on (pandas, Hydra, submitit) and has Hydra compose the experiment's config once: the
least any harness on these libraries could cost. They run alternately, REPEATS times each, in
scratch directories; the medians and their ratios to the bare script's are printed. With
AGAINST=DIR, the harness of another checkout (DIR, an earlier commit say) runs among them too
(AGAINST=DIR1,DIR2: each).
Run: python tests/benchmarks/harness_overhead.py [REPEATS]
"""

import os
import statistics
import subprocess
import sys
import tempfile
import time

BARE = """
import pyarrow as pa
import pyarrow.parquet as pq
from octlm_experiments.tiled import run
rows = []
for length in (128, 512, 1024):
    for block in (64, 128, 256):
        point = dict(length=length, block=block)
        rows += [{**point, **row} for row in run(**point)]
pq.write_table(pa.Table.from_pylist(rows), "rows.parquet")
"""

LIBRARIES = """
import pandas, submitit
from hydra import compose, initialize_config_dir
from harness.names import CONF
with initialize_config_dir(config_dir=str(CONF), version_base=None):
    compose("config", overrides=["+experiment=exp014_tiled"])
"""


def wall_time(command: list[str]) -> float:
    with tempfile.TemporaryDirectory() as scratch:
        started = time.perf_counter()
        subprocess.run(command, cwd=scratch, check=True, capture_output=True)
        return time.perf_counter() - started


def harnesses(arguments: list[str], paths: list[str] = ()) -> dict[str, list[str]]:
    """`python -m harness ARGUMENTS` (`paths` on its PYTHONPATH); and the same from each checkout
    AGAINST names, if any (several joined by commas). Each keeps its code in a code store of
    its own (its XDG_CACHE_HOME, a folder of this run's): two harnesses sharing one would each
    hash the other's files again, where their stat caches differ."""
    command = [sys.executable, "-m", "harness", *arguments]
    against = [folder for folder in os.environ.get("AGAINST", "").split(",") if folder]
    caches = tempfile.mkdtemp(prefix="harness-caches-")
    found = {}
    for n, folder in enumerate([None, *against]):
        path = os.pathsep.join([*([folder] if folder else []), *paths])
        name = f"from {folder}" if folder else "python -m harness"
        pythonpath = [f"PYTHONPATH={path}"] if path else []
        found[name] = ["env", f"XDG_CACHE_HOME={caches}/{n}", *pythonpath, *command]
    return found


def side_by_side(commands: dict[str, list[str]], repeats: int) -> list[float]:
    """Run the commands alternately, `repeats` times each; print each one's median and range,
    and return the medians in the commands' order."""
    times = {name: [] for name in commands}
    for _ in range(repeats):
        for name, command in commands.items():
            times[name].append(wall_time(command))
    for name, samples in times.items():
        spread = f"{min(samples):.2f} to {max(samples):.2f}"
        print(f"{name:20} median {statistics.median(samples):.2f} s ({spread} s, {repeats} runs)")
    return [statistics.median(samples) for samples in times.values()]


def main(repeats: int) -> None:
    commands = {
        "bare script": [sys.executable, "-c", BARE],
        "bare + libraries": [sys.executable, "-c", BARE + LIBRARIES],
        **harnesses(["+experiment=exp014_tiled"]),
    }
    bare, *others = side_by_side(commands, repeats)
    for name, median in zip(list(commands)[1:], others, strict=True):
        print(f"{name} / bare script: {median / bare:.2f}x")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
