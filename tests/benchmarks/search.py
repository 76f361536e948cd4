"""The search's benchmark: exp017_recall's lr and warmup searched on the local launcher's two
workers, with each pruner named (the median pruner by default) and without (the same trials
run to the end), side by side: wall time, best held-out accuracy, and the gaps between a
trial's end and the next trial's start (workers idle while trials remain); then the harness's
cost per trial against a grid point's, on a probe that computes nothing (the basic launcher:
in this process).

The pruners read the held-out accuracy from a quarter of the steps on: the median pruner after
4 trials, stopping a trial below the median of those before it at the same step (so about
half of the trials, and the wall time no less than about 0.6 of the unpruned one);
successive_halving keeps a third of the trials at each rung (a quarter of the steps, then
three quarters).

    python tests/benchmarks/search.py [--trials 24] [--steps 300] [--points 200]
                                      [--pruners median,successive_halving] [--keep DIR]
"""

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "tests" / "support"
sys.path.insert(0, str(ROOT))

from harness import store  # noqa: E402

SPACE = [
    "search.params.lr=tag(log, interval(1e-3, 5e-2))",
    "search.params.warmup=range(0, 200, 25)",
]

OPTIONS = {  # each pruner's options for a search of `steps` steps
    "median": lambda steps: {"n_startup_trials": 4, "n_warmup_steps": steps // 4},
    "successive_halving": lambda steps: {"min_resource": steps // 4, "reduction_factor": 3},
    "hyperband": lambda steps: {"min_resource": steps // 4, "max_resource": steps},
    "none": lambda steps: {},
}


def harness(cwd: Path, *args: str) -> float:
    """Run `python -m harness ARGS` in cwd; its wall time in seconds."""
    env = {"PYTHONPATH": f"{ROOT}:{SUPPORT}", "PATH": "/usr/bin:/bin"}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, env=env,
                          capture_output=True, text=True)  # fmt: skip
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"harness {' '.join(args)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return seconds


def trials(cwd: Path, experiment: str) -> pd.DataFrame:
    results = cwd / "outputs" / "results"
    (sweep,) = store.sweeps(results, experiment)
    return store.read(results, experiment, sweep)


def gaps(rows: pd.DataFrame, workers: int) -> list[float]:
    """Seconds from a trial's end to the next start, pairing the k-th start after the first
    `workers` with the (k - workers)-th end: a pool of `workers` starts one as one ends."""
    jobs = rows.groupby("job").agg(start=("started_at", "min"), seconds=("duration_s", "max"))
    starts = sorted(jobs["start"])
    ends = sorted(jobs["start"] + pd.to_timedelta(jobs["seconds"], unit="s"))
    return [(s - e).total_seconds() for s, e in zip(starts[workers:], ends, strict=False)]


def search(folder: Path, pruner: str, n: int, steps: int) -> dict:
    folder.mkdir(parents=True)
    args = ["+experiment=exp017_recall", "attention=sdpa", "window=0", f"steps={steps}",
            "checkpoint_every=50", *SPACE, f"search.trials={n}", f"search.pruner={pruner}",
            "hydra/launcher=local", "hydra.launcher.max_parallel=2"]  # fmt: skip
    args += [f"+search.pruner_options.{k}={v}" for k, v in OPTIONS[pruner](steps).items()]
    wall = harness(folder, *args)
    rows = trials(folder, "exp017_recall")
    statuses = store.job_statuses(rows).value_counts().to_dict()
    held = rows[(rows["phase"] == "eval") & (rows["status"] == "ok")]
    best = held.loc[held["accuracy"].idxmax()]
    between = gaps(rows, 2)
    return {"pruner": pruner, "wall_s": wall, "statuses": statuses,
            "best_accuracy": best["accuracy"], "best_lr": best["lr"], "best_warmup": best["warmup"],
            "gap_median_s": statistics.median(between), "gap_max_s": max(between)}  # fmt: skip


def cost(folder: Path, points: int) -> dict:
    """Seconds a point, of a search's trials and of a grid's points, of a probe with one step."""
    given = ["--config-dir", str(SUPPORT / "conf"), "+experiment=tuned", "variant=a", "steps=1"]
    values = ",".join(f"{10 ** (-4 + 4 * i / points):.6g}" for i in range(points))
    seconds = {}
    for name, args in (("grid", [f"lr={values}"]),
                       ("search", ["search.params.lr=tag(log, interval(1e-4, 1))",
                                   f"search.trials={points}", "search.pruner=none"])):  # fmt: skip
        place = folder / f"cost-{name}"
        place.mkdir(parents=True)
        seconds[name] = harness(place, *given, *args) / points * 1000
    return {"grid_ms_per_point": seconds["grid"], "search_ms_per_trial": seconds["search"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--points", type=int, default=200)
    parser.add_argument(
        "--pruners", default="median", help=f"comma-separated: {', '.join(OPTIONS)}"
    )
    parser.add_argument("--keep", type=Path, help="leave the sweeps in this folder")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="search-bench-"))
    try:
        print(cost(folder, args.points), flush=True)
        measured = {}
        for pruner in [*(p for p in args.pruners.split(",") if p != "none"), "none"]:
            measured[pruner] = search(folder / pruner, pruner, args.trials, args.steps)
            print(measured[pruner], flush=True)
        full = measured.pop("none")
        for pruner, pruned in measured.items():
            print(
                f"{pruner}: wall time with pruning / without: "
                f"{pruned['wall_s'] / full['wall_s']:.2f}; best held-out accuracy "
                f"{pruned['best_accuracy']:.4f} vs {full['best_accuracy']:.4f}"
            )
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
