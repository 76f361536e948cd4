"""The store at scale: a synthetic 10,000-point sweep written, read, reported and compacted.

Writes one job file per point through store.write_rows (the harness's columns, four
parameters, five metrics and the repeats' timings, 1% failed points) and a manifest with every
point (and one more, not run: an unfinished sweep, which the report does not compact by
itself), in a scratch directory. Then times, each REPEATS times (medians, with the range):
- store.read over 1,000, 3,000 and 10,000 job files (is reading linear in the files?);
- the report: `python -m harness report` as a subprocess, and write_report (the function it calls)
  in this process, over the store as written and after compaction;
- the compaction of the 10,000 files (on hard-linked copies of the sweep, then on the sweep).
Run: python tests/benchmarks/store_scale.py [POINTS] [REPEATS]
"""

import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness import store  # noqa: E402
from octlm_analysis.report import write_report  # noqa: E402

EXPERIMENT, SWEEP = "exp900_scale", "20261129-120000-5ca1"
CONFIG = {
    "name": EXPERIMENT,
    "table": {"index": "length", "columns": "block", "values": "max_abs_diff"},
    "claims": [{"metric": "max_abs_diff", "max": 1e-6, "text": "matches to 1e-6"}],
}


def grid(points: int) -> list[dict]:
    axes = itertools.product(
        [128 * (i + 1) for i in range(10)],  # length
        [16 * (i + 1) for i in range(10)],  # block
        range(1, 26),  # heads
        ["float32", "bfloat16", "float16", "float64"],  # dtype
    )
    keys = ("length", "block", "heads", "dtype")
    found = [dict(zip(keys, values, strict=True)) for values in itertools.islice(axes, points)]
    assert len(found) == points, f"the grid has {len(found)} points, not {points}"
    return found


def row(job: int, params: dict) -> dict:
    """One point's row as the harness writes it: its columns, the parameters, the metrics."""
    started = datetime.now(UTC)
    harness_columns = {
        "job": job,
        "status": "ok",
        "error": None,
        "config_hash": f"{job:016x}",
        "started_at": started,
        "duration_s": 0.25,
        "git_commit": "0123456789abcdef0123456789abcdef01234567",
        "git_dirty": False,
        "command": f"python -m harness +experiment={EXPERIMENT}",
        "torch_version": "2.13.0+cpu",
        "cuda_version": None,
        "python_version": "3.11.7",
        "packages_digest": "9d3722ae5c180b19",
        "device_name": "Intel(R) Xeon(R) Processor",
        "threads": 2,
        "hostname": "node-1",
        "slurm_job_id": None,
        "slurm_array_task_id": None,
        "slurm_node": None,
        "slurm_restarts": None,
        "gpus": None,
        "run_dir": f"/scratch/outputs/runs/{EXPERIMENT}/{SWEEP}/job-{job}",
    }
    if job % 100 == 99:
        return {**harness_columns, **params, "status": "failed", "error": "RuntimeError: boom"}
    samples = [1.0 + 0.01 * ((job + i) % 7) for i in range(5)]
    metrics = {
        "max_abs_diff": 1e-7 * (1 + job % 5),
        "mean_abs_diff": 1e-8 * (1 + job % 3),
        "time_ms": statistics.median(samples),
        "time_iqr_ms": 0.02,
        "repeats": len(samples),
        "time_samples_ms": samples,
    }
    return {**harness_columns, **params, **metrics}


def write_sweep(results: Path, points: list[dict]) -> list[float]:
    """The sweep's job files and manifest; each write_rows call's seconds."""
    seconds = []
    for job, params in enumerate(points):
        rows = [row(job, params)]
        started = time.perf_counter()
        store.write_rows(store.SweepPaths(results, EXPERIMENT, SWEEP).job(job).file, rows)
        seconds.append(time.perf_counter() - started)
    # One planned point more, without rows: the sweep has not ended, so the report does not
    # compact it on its own, and the report over job files is measured as such.
    manifest_points = [
        {"job": job, "overrides": [f"{k}={v}" for k, v in p.items()], "params": p}
        for job, p in enumerate([*points, points[-1]])
    ]
    store.write_manifest(
        results,
        {
            "experiment": EXPERIMENT,
            "sweep": SWEEP,
            "command": f"python -m harness +experiment={EXPERIMENT}",
            "overrides": [],
            "experiment_config": CONFIG,
            "points": manifest_points,
        },
    )
    return seconds


def linked_copy(results: Path, into: Path, sweep: str, files: int) -> None:
    """A sweep of the first `files` job files, hard-linked (no bytes copied)."""
    source = store.SweepPaths(results, EXPERIMENT, SWEEP).folder
    target = store.SweepPaths(into, EXPERIMENT, sweep).folder
    target.mkdir(parents=True)
    for path in store.result_files(results, EXPERIMENT, SWEEP)[:files]:
        os.link(path, target / path.name)
    os.link(source / store.MANIFEST, target / store.MANIFEST)


def timed(function, repeats: int) -> list[float]:
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        seconds.append(time.perf_counter() - started)
    return seconds


def show(name: str, seconds: list[float], per: int | None = None) -> None:
    median = statistics.median(seconds)
    spread = f"{min(seconds):.3f} to {max(seconds):.3f} s, {len(seconds)} runs"
    each = f"; {median / per * 1e3:.3f} ms per file" if per else ""
    print(f"{name:52} median {median:8.3f} s ({spread}){each}", flush=True)


def analysis_command(out: Path) -> None:
    command = [sys.executable, "-m", "harness", "report", "--out", str(out)]
    subprocess.run(command, check=True, capture_output=True, cwd=ROOT)


def main(points: int, repeats: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        out = scratch / "outputs"
        results = out / "results"
        print(f"{points} points, {repeats} runs each, in {scratch}", flush=True)
        writes = write_sweep(results, grid(points))
        show(f"write_rows, {points} job files (total)", [sum(writes)], per=points)
        print(f"{'write_rows, one job file':52} median {statistics.median(writes) * 1e3:8.3f} ms")
        subsets = scratch / "subsets"
        for files in sorted({min(n, points) for n in (1_000, 3_000, 10_000)}):
            linked_copy(results, subsets, f"files-{files}", files)
            read = lambda f=files: store.read(subsets, EXPERIMENT, f"files-{f}")  # noqa: E731
            show(f"store.read, {files} job files", timed(read, repeats), per=files)
        startup = [sys.executable, "-c", "import octlm_analysis.report, harness.store"]
        show(
            "python start and imports alone",
            timed(lambda: subprocess.run(startup, cwd=ROOT), repeats),
        )
        show("python -m harness report, job files", timed(lambda: analysis_command(out), repeats))
        report = lambda: write_report(results, out / "report")  # noqa: E731
        show("write_report in process, job files", timed(report, repeats))
        copies = scratch / "copies"
        for copy in range(repeats - 1):
            linked_copy(results, copies, f"copy-{copy}", points)
        compactions = [
            *(
                timed(
                    lambda c=c: store.compact(store.SweepPaths(copies, EXPERIMENT, f"copy-{c}")), 1
                )[0]
                for c in range(repeats - 1)
            ),
            *timed(lambda: store.compact(store.SweepPaths(results, EXPERIMENT, SWEEP)), 1),
        ]
        show(f"store.compact, {points} job files into one", compactions)
        read = lambda: store.read(results, EXPERIMENT, SWEEP)  # noqa: E731
        show("store.read, compacted", timed(read, repeats))
        show("python -m harness report, compacted", timed(lambda: analysis_command(out), repeats))
        show("write_report in process, compacted", timed(report, repeats))


if __name__ == "__main__":
    main(
        int(sys.argv[1]) if len(sys.argv) > 1 else 10_000,
        int(sys.argv[2]) if len(sys.argv) > 2 else 3,
    )
