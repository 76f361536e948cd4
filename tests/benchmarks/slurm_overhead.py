"""What a SLURM array task costs the harness, on the single-node test cluster.

Starts a throw-away cluster (tests/slurm/cluster.sh, MaxArraySize 1001), then runs POINTS
trivial points (exp014_tiled at length 16, block 16, one head, seeds 0 to POINTS-1) as a job
array, once with one point per task and once with PACK points per task, and prints for each:
the whole sweep's wall time (submission to the last row read back), and per task, from its
submitit log and its rows (medians over the tasks):
- start: from the task's first log line (the interpreter up, submitit imported) to its first
  point's start (Hydra's state restored, the config composed, torch and the experiment imported);
- points: the experiment's own seconds (the rows' duration_s), and the harness's per point
  (from the first point's start to the last point's end, less the experiment's seconds:
  the values set, the run folder and its files, the rows written);
- end: from the last point's end to the log's "Job completed" line (the result pickled).
The time before the first log line (SLURM starting the task, the interpreter) is not in the
log; the sweep's wall time includes it. Needs root and SLURM's Debian packages, as the tests.
Run: python tests/benchmarks/slurm_overhead.py [POINTS] [PACK]
"""

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness import store  # noqa: E402

STAMP = re.compile(r"\((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\)")


def log_times(log: Path) -> tuple[datetime, datetime]:
    """The first log line's time and the "Job completed" line's, as local times."""
    lines = log.read_text().splitlines()
    stamps = [(STAMP.search(line), line) for line in lines]
    stamps = [(datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f"), line) for m, line in stamps if m]
    completed = [t for t, line in stamps if "completed" in line.lower()]
    return stamps[0][0], completed[-1]


def per_task(cwd: Path) -> pd.DataFrame:
    results = cwd / "outputs" / "results"
    rows = store.read(results)
    (sweep,) = store.sweeps(results, "exp014_tiled")
    runs = cwd / "outputs" / "runs" / "exp014_tiled" / sweep / ".submitit"
    lines = []
    for task, part in rows.groupby("slurm_job_id"):
        array, index = task.split("_")
        (log,) = runs.glob(f"{array}_{index}/{array}_{index}_0_log.out")
        first, completed = log_times(log)
        starts = part["started_at"].dt.tz_convert(None)  # UTC; the cluster's clock is UTC
        ends = starts + pd.to_timedelta(part["duration_s"], unit="s")
        computed = part["duration_s"].sum()
        points = len(part)
        lines.append({
            "start_s": (starts.min() - pd.Timestamp(first)).total_seconds(),
            "experiment_s_per_point": computed / points,
            "harness_ms_per_point": ((ends.max() - starts.min()).total_seconds() - computed)
            / points * 1e3,
            "end_s": (pd.Timestamp(completed) - ends.max()).total_seconds(),
            "points": points,
        })  # fmt: skip
    return pd.DataFrame(lines)


def sweep(points: int, pack: int, env: dict) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        cwd = Path(scratch)
        grid = ["length=16", "block=16", "heads=1", f"seed=range(0,{points})"]
        launcher = [
            "hydra/launcher=slurm",
            "hydra.launcher.mem_gb=1",
            "hydra.launcher.cpus_per_task=1",
            f"hydra.launcher.points_per_task={pack}",
        ]
        command = [sys.executable, "-m", "harness", "+experiment=exp014_tiled", *grid, *launcher]
        started = time.perf_counter()
        subprocess.run(command, cwd=cwd, env=env, check=True, capture_output=True)
        seconds = time.perf_counter() - started
        tasks = per_task(cwd)
        medians = {column: statistics.median(tasks[column]) for column in tasks}
        print(
            f"{points} points, {pack} per task ({len(tasks)} tasks): sweep {seconds:.1f} s; "
            f"per task (medians): start {medians['start_s']:.2f} s, experiment "
            f"{medians['experiment_s_per_point'] * 1e3:.2f} ms a point, harness "
            f"{medians['harness_ms_per_point']:.2f} ms a point, end {medians['end_s']:.2f} s",
            flush=True,
        )


def main(points: int, pack: int) -> None:
    script = ROOT / "tests" / "slurm" / "cluster.sh"
    with tempfile.TemporaryDirectory() as directory:
        knobs = {**os.environ, "SLURM_TEST_MAX_ARRAY_SIZE": "1001"}
        started = subprocess.run([script, "start", directory], env=knobs, check=True,
                                 capture_output=True, text=True)  # fmt: skip
        exports = dict(re.findall(r"export (\w+)=(\S+)", started.stdout))
        env = {**os.environ, **exports, "HARNESS_SLURM_PARTITION": exports.get(
            "HARNESS_SLURM_PARTITION", "debug")}  # fmt: skip
        try:
            for each in (1, pack):
                sweep(points, each, env)
        finally:
            subprocess.run([script, "stop", directory], capture_output=True)


if __name__ == "__main__":
    arguments = [int(a) for a in sys.argv[1:]]
    main(*(arguments + [100, 50][len(arguments) :]))
