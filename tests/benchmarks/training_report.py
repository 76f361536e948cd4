"""A training grid's report: a user's own experiment (its YAML under --config-dir, no report
module) with a sweep of POINTS runs of STEPS steps each, logging METRICS per step and an eval row
per run, then `python -m harness report --config-dir conf` over it, and the page's size.

The store is synthetic but shaped as the harness leaves a finished training sweep: a manifest
with the experiment's config, each point's rows in its own job file (a train row per step, an
eval row last), the harness's columns on every row. The report runs REPEATS times in a fresh
process: the first reads every row (no cache), the later ones find each sweep's section cached.
Prints the times (median and range of the cached ones), index.html's size (plotly.min.js beside
it is 4.8 MB, the same for every page) and how many curves and points its figures hold.
Run: python tests/benchmarks/training_report.py [--points 200] [--steps 1000] [--repeats 3]
[--keep DIR]
"""

import argparse
import base64
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT)]

from harness import store  # noqa: E402

EXPERIMENT = "trainer"
METRICS = ("loss", "grad_norm", "learning_rate")
YAML = """# @package _global_
# python -m harness --config-dir conf +experiment=trainer
experiment:
  name: trainer
  run: mine.trainer.run
  claims:
    - {metric: loss, where: "phase == 'eval'", max: 0.1, text: the student fits its teacher}
lr: 0.1
width: 16
steps: 1000
"""
PROVENANCE = {"torch_version": "2.13.0+cpu", "device_name": "AMD EPYC", "git_dirty": False,
              "git_commit": "f" * 40, "code_digest": "c" * 64}  # fmt: skip


def write_store(folder: Path, points: int, steps: int) -> None:
    """conf/experiment/trainer.yaml and a sweep of `points` runs of `steps` steps in outputs/."""
    (folder / "conf" / "experiment").mkdir(parents=True)
    (folder / "conf" / "experiment" / f"{EXPERIMENT}.yaml").write_text(YAML)
    root, rng = folder / "outputs" / "results", np.random.default_rng(0)
    lrs = np.round(np.geomspace(1e-3, 1.0, max(points // 4, 1)), 5)
    params = [{"lr": float(lrs[p // 4 % len(lrs)]), "width": (8, 16, 32, 64)[p % 4],
               "steps": steps, "seed": 0} for p in range(points)]  # fmt: skip
    sweep = "20261201-120000-b0b0"
    config = {"name": EXPERIMENT, "run": "mine.trainer.run",
              "claims": [{"metric": "loss", "where": "phase == 'eval'", "max": 0.1,
                          "text": "the student fits its teacher"}]}  # fmt: skip
    store.write_manifest(root, {
        "experiment": EXPERIMENT, "sweep": sweep, "experiment_config": config,
        "command": f"python -m harness --config-dir conf +experiment={EXPERIMENT}",
        "points": [{"job": job, "overrides": [f"{k}={v}" for k, v in p.items()], "params": p,
                    "config_hash": None} for job, p in enumerate(params)],
    })  # fmt: skip
    step = np.arange(steps)
    started = datetime(2026, 12, 1, 12, tzinfo=UTC)
    for job, point in enumerate(params):
        rate = point["lr"] * point["width"] / 16
        loss = 0.5 * np.exp(-rate * step / 50) + 0.002 + 0.01 * rng.random(steps)
        train = {"phase": ["train"] * steps, "step": step, "loss": loss,
                 "grad_norm": loss * (2 + rng.random(steps)),
                 "learning_rate": point["lr"] * np.cos(np.pi * step / (2 * steps))}  # fmt: skip
        constant = {"job": job, "status": "ok", **point, **PROVENANCE, "started_at": started,
                    "duration_s": 0.01}  # fmt: skip
        table = pa.table({k: pa.array([v] * steps) for k, v in constant.items()}
                         | {k: pa.array(v) for k, v in train.items()})  # fmt: skip
        last = {**constant, "phase": "eval", "step": steps, "loss": float(loss[-1]) * 1.1}
        table = pa.concat_tables([table, pa.Table.from_pylist([last])], promote_options="default")
        store.write_rows(store.SweepPaths(root, EXPERIMENT, sweep).job(job).file, table)


def report(folder: Path) -> float:
    """Seconds `python -m harness report --config-dir conf` takes in `folder`."""
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "harness", "report", "--config-dir", "conf"],
                   check=True, cwd=folder, stdout=subprocess.DEVNULL)  # fmt: skip
    return time.perf_counter() - began


def drawn(page: Path) -> dict:
    """The curves' figures on the page: how many, their traces and points."""
    text = page.read_text()
    data = json.loads(re.search(r'id="report-data">(.*?)</script>', text, re.S)[1])
    shown = [f for f in data["figures"] if f["layout"]["xaxis"]["title"]["text"] == "step"]
    traces = [t for f in shown for t in f["data"]]
    return {"figures_of_curves": len(shown), "traces": len(traces),
            "points": sum(_length(t["y"]) for t in traces)}  # fmt: skip


def _length(values) -> int:
    if isinstance(values, dict):
        return len(base64.b64decode(values["bdata"])) // np.dtype(values["dtype"]).itemsize
    return len(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=200)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="build the store here and keep it (reused)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.keep or Path(scratch)
        if not (folder / "outputs" / "results").is_dir():
            began = time.perf_counter()
            write_store(folder, args.points, args.steps)
            print(f"store: {args.points} runs x {args.steps} steps x {len(METRICS)} metrics, "
                  f"written in {time.perf_counter() - began:.1f} s")  # fmt: skip
        first = report(folder)
        cached = [report(folder) for _ in range(args.repeats - 1)]
        page = folder / "outputs" / "report" / "index.html"
        said = {"report_first_s": round(first, 2),
                "report_cached_s": f"median {statistics.median(cached):.2f} (range "
                                   f"{min(cached):.2f}-{max(cached):.2f})" if cached else None,
                "index_html_mb": round(page.stat().st_size / 2**20, 2), **drawn(page)}  # fmt: skip
        print(json.dumps(said, indent=1))


if __name__ == "__main__":
    main()
