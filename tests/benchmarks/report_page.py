"""The report page at scale: a store of SWEEPS small sweeps plus one training sweep of POINTS
points of STEPS steps each, then `python -m harness report` over it and the page in headless
Chromium.

The store is synthetic but shaped as the harness writes it: exp014_tiled sweeps (its own config,
claims and 3 x 3 grid, plausible errors, a commit and a start time per sweep, each sweep's rows in
one compacted file as a finished sweep leaves them) and an exp017_recall sweep whose points have a
train row per step and an eval row (its own columns, in one job file per point). Then, each
REPEATS times (medians, with the range): `python -m harness report` as a subprocess (wall time), the
page's size with its sibling script, and the time headless Chromium takes from navigation to the
load event with every plot drawn (tests/support/browser.py).
Run: python tests/benchmarks/report_page.py [--sweeps 1000] [--points 100] [--steps 100000]
[--repeats 3] [--keep DIR]
"""

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "support")]

from browser import Browser  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from harness import store  # noqa: E402
from harness.names import CONF  # noqa: E402

START = datetime(2026, 1, 1, tzinfo=UTC)
PROVENANCE = {"torch_version": "2.13.0+cpu", "device_name": "AMD EPYC", "git_dirty": False,
              "python_version": "3.11.7", "hostname": "bench", "threads": 2}  # fmt: skip


def config(name: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(CONF / "experiment" / f"{name}.yaml").experiment)


def plan(root: Path, experiment: str, sweep: str, params: list[dict]) -> None:
    points = [{"job": job, "overrides": [f"{k}={v}" for k, v in p.items()], "params": p,
               "config_hash": None} for job, p in enumerate(params)]  # fmt: skip
    manifest = {"experiment": experiment, "sweep": sweep, "points": points,
                "experiment_config": config(experiment),
                "command": f"python -m harness +experiment={experiment}"}  # fmt: skip
    store.write_manifest(root, manifest)


def tiled_sweeps(root: Path, count: int, rng: np.random.Generator) -> None:
    grid = [{"length": length, "block": block, "batch": 1, "heads": 8, "head_dim": 32,
             "dtype": "float32", "causal": True, "device": "cpu", "seed": 0}
            for length, block in itertools.product([128, 512, 1024], [64, 128, 256])]  # fmt: skip
    for number in range(count):
        when = START + timedelta(hours=number)
        sweep = f"{when:%Y%m%d-%H%M%S}-{number:04x}"
        plan(root, "exp014_tiled", sweep, grid)
        rows = []
        for job, point in enumerate(grid):
            sdpa = 2e-7 * (1 + 0.1 * rng.standard_normal()) * (point["length"] / 128) ** 0.25
            rows.append({"job": job, "status": "ok", **point, "started_at": when,
                         "git_commit": f"{number // 10:040x}", **PROVENANCE,
                         "duration_s": 0.05, "max_abs_diff": 3e-7 * rng.random(),
                         "sdpa_err64": sdpa, "tiled_err64": sdpa * (1.1 + 0.2 * rng.random()),
                         "tiled_ms": 1.0 + point["length"] / 100 * (1 + 0.05 * rng.random()),
                         "sdpa_ms": 0.5 + point["length"] / 200})  # fmt: skip
        folder = store.SweepPaths(root, "exp014_tiled", sweep).folder
        store.write_rows(folder / "compacted-1.parquet", rows)


def training_sweep(root: Path, points: int, steps: int, rng: np.random.Generator) -> None:
    sweep = f"{START + timedelta(days=60):%Y%m%d-%H%M%S}-7ra1"
    params = [{"task": "recall", "attention": ("sdpa", "tiled", "naive", "flex")[p % 4],
               "window": 0, "lr": round(1e-3 * (1 + p // 4), 4), "steps": steps, "seed": 0,
               "batch": 128, "dtype": "float32", "ddp": False} for p in range(points)]  # fmt: skip
    plan(root, "exp017_recall", sweep, params)
    step = np.arange(1, steps + 1)
    for job, point in enumerate(params):
        loss = 3.0 * np.exp(-step / (steps / 5)) + 0.05 * rng.random(steps)
        train = {"phase": pa.array(["train"] * steps), "step": pa.array(step),
                 "loss": pa.array(loss), "accuracy": pa.array(np.clip(1 - loss / 3, 0, 1)),
                 "tokens_per_s": pa.array(40_000 + 2_000 * rng.standard_normal(steps)),
                 "learning_rate": pa.array(np.full(steps, point["lr"]))}  # fmt: skip
        constant = {"job": job, "status": "ok", **point, **PROVENANCE, "started_at": START,
                    "git_commit": "f" * 40}  # fmt: skip
        columns = {k: pa.array([v] * steps) for k, v in constant.items()} | train
        table = pa.table(columns)
        last = {**constant, "phase": "eval", "step": steps, "loss": 0.05, "accuracy": 0.99,
                "chance": 1 / 16}  # fmt: skip
        table = pa.concat_tables([table, pa.Table.from_pylist([last])], promote_options="default")
        store.write_rows(store.SweepPaths(root, "exp017_recall", sweep).job(job).file, table)


def measure(out: Path, repeats: int) -> None:
    page = out / "report" / "index.html"
    writes, loads = [], []
    with Browser() as browser:
        for _ in range(repeats):
            began = time.perf_counter()
            subprocess.run([sys.executable, "-m", "harness", "report", "--out", str(out)],
                           check=True, cwd=ROOT, stdout=subprocess.DEVNULL)  # fmt: skip
            writes.append(time.perf_counter() - began)
            loads.append(browser.open(page.as_uri())["drawn_s"])
    size = sum(p.stat().st_size for p in page.parent.iterdir() if p.is_file())
    say = {"analysis_s": summary(writes), "chromium_drawn_s": summary(loads),
           "report_folder_mb": round(size / 2**20, 2),
           "index_html_mb": round(page.stat().st_size / 2**20, 2)}  # fmt: skip
    print(json.dumps(say, indent=1))


def summary(values: list[float]) -> str:
    return f"median {statistics.median(values):.2f} (range {min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweeps", type=int, default=1000)
    parser.add_argument("--points", type=int, default=100)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="build the store here and keep it (reused)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        out = args.keep or Path(scratch)
        if not (out / "results").is_dir():
            began, rng = time.perf_counter(), np.random.default_rng(0)
            tiled_sweeps(out / "results", args.sweeps, rng)
            if args.points:
                training_sweep(out / "results", args.points, args.steps, rng)
            print(f"store: {args.sweeps} sweeps + {args.points} x {args.steps} steps, written "
                  f"in {time.perf_counter() - began:.1f} s")  # fmt: skip
        measure(out, args.repeats)


if __name__ == "__main__":
    main()
