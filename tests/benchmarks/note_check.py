"""`python -m harness note NOTE.md --check` at scale: a note of BINDINGS bindings over a store of
SWEEPS sweeps.

The store is synthetic but shaped as the harness writes it: exp014_tiled sweeps (its own config,
claims and 3 x 3 grid, plausible errors, each sweep's rows in one compacted file as a finished
sweep leaves them). The note's bindings: 30% on the sweep the report judges (max, min, mean,
median, count of its metrics, half with a where), 50% each naming a sweep of its own, 20% the
claims' verdicts (half of them of named sweeps); --accept writes their values first, so that
--check finds every one standing and reads all of them. Then, REPEATS times (medians, with the
range): --check as a process of its own (Python's start and imports included) and called in
this process (the command alone), each its wall time and its CPU time (user and system: on a
machine others share, what the command itself costs).
Run: python tests/benchmarks/note_check.py [--sweeps 1000] [--bindings 200] [--repeats 5]
"""

import argparse
import itertools
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT)]

from harness import store  # noqa: E402
from harness.names import CONF  # noqa: E402
from octlm_analysis.note_command import main  # noqa: E402

START = datetime(2026, 1, 1, tzinfo=UTC)
METRICS = ("max_abs_diff", "sdpa_err64", "tiled_err64")
REDUCERS = ("max", "min", "mean", "median", "count")


def sweeps(root: Path, count: int, rng: np.random.Generator) -> list[str]:
    """`count` finished exp014_tiled sweeps of its seeded grid; their ids, oldest first."""
    config = OmegaConf.to_container(OmegaConf.load(CONF / "experiment" / "exp014_tiled.yaml"))
    grid = [{"length": length, "block": block, "dtype": "float32"}
            for length, block in itertools.product([128, 512, 1024], [64, 128, 256])]  # fmt: skip
    ids = []
    for number in range(count):
        sweep = f"{START + timedelta(hours=number):%Y%m%d-%H%M%S}-{number:04x}"
        points = [{"job": job, "overrides": [], "params": p, "config_hash": None}
                  for job, p in enumerate(grid)]  # fmt: skip
        store.write_manifest(root, {
            "experiment": "exp014_tiled", "sweep": sweep, "points": points,
            "experiment_config": config["experiment"], "command": "python -m harness",
        })  # fmt: skip
        rows = []
        for job, point in enumerate(grid):
            sdpa = 2e-7 * (1 + 0.1 * rng.standard_normal())
            rows.append({"job": job, "status": "ok", **point, "max_abs_diff": 3e-7 * rng.random(),
                         "sdpa_err64": sdpa, "tiled_err64": sdpa * (1.1 + 0.2 * rng.random()),
                         "code_digest": f"{number // 10:064x}"})  # fmt: skip
        folder = store.SweepPaths(root, "exp014_tiled", sweep).folder
        store.write_rows(folder / "compacted-1.parquet", rows)
        ids.append(sweep)
    return ids


def note(ids: list[str], count: int) -> str:
    """A note of `count` bindings, a line each, none with a value yet (--accept writes them)."""
    lines = []
    for number in range(count):
        metric, reducer = METRICS[number % 3], REDUCERS[number % 5]
        share = number % 10
        if share < 3:  # the judged sweep
            where = " where length > 128" if number % 2 else ""
            lines.append(f"- {{{{ exp014_tiled {metric} {reducer}{where} }}}}")
        elif share < 8:  # a sweep of its own
            named = ids[(number * 7919) % len(ids)]
            lines.append(f"- {{{{ exp014_tiled {metric} {reducer} sweep {named} }}}}")
        else:  # a claim's verdict
            named = f" sweep {ids[(number * 104729) % len(ids)]}" if number % 2 else ""
            lines.append(f"- {{{{ exp014_tiled {('sdpa_err64', 'tiled_err64')[number % 2]} "
                         f"verdict{named} }}}}")  # fmt: skip
    return "# A note at scale\n\n" + "\n".join(lines) + "\n"


def timed(call) -> tuple[float, float]:
    """Wall seconds and CPU seconds (this process's and its children's: user and system) of a
    call: on a machine others share, the CPU seconds are what the command itself costs."""
    start, cpu = time.perf_counter(), _cpu()
    assert call() == 0
    return time.perf_counter() - start, _cpu() - cpu


def _cpu() -> float:
    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                          resource.RUSAGE_CHILDREN))  # fmt: skip
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main_() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sweeps", type=int, default=1000)
    parser.add_argument("--bindings", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        ids = sweeps(work / "outputs" / "results", args.sweeps, np.random.default_rng(0))
        path = work / "NOTE.md"
        path.write_text(note(ids, args.bindings))
        out = ["--out", str(work / "outputs")]
        assert main([str(path), "--accept", *out]) == 0
        named = len({line.rsplit("sweep ", 1)[1] for line in path.read_text().splitlines()
                     if " sweep " in line})  # fmt: skip
        command = [sys.executable, "-m", "harness", "note", str(path), "--check", *out]
        processes = [timed(lambda: subprocess.run(command, capture_output=True).returncode)
                     for _ in range(args.repeats)]  # fmt: skip
        in_process = [timed(lambda: main([str(path), "--check", *out]))
                      for _ in range(args.repeats)]  # fmt: skip
    print(f"{args.bindings} bindings ({named} sweeps named) over {args.sweeps} sweeps, "
          f"medians of {args.repeats}:")  # fmt: skip
    for what, times in (("note --check, a process", processes), ("in this process", in_process)):
        for kind, seconds in zip(("wall", "CPU"), zip(*times, strict=True), strict=True):
            print(f"  {what}, {kind}: {statistics.median(seconds):.2f} s ({min(seconds):.2f} to "
                  f"{max(seconds):.2f})")  # fmt: skip


if __name__ == "__main__":
    main_()
