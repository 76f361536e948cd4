"""Sweeps at scale, through the real commands, in a scratch directory:

- planning: `python -m harness` over a grid of PLAN points (exp014_tiled, length 1 to PLAN/3 x
  three blocks): seconds and peak resident memory until it prints "N points to run" (the grid
  expanded, every point checked, the manifest written), then it is stopped;
- a real sweep of SWEEP trivial points (length 16, block 16, one head, seeds 0 to SWEEP-1),
  then `python -m harness status ID` and `python -m harness report` right after it;
- `python -m harness report` over MANY sweeps of EACH points (a real sweep of EACH trivial points,
  its compacted file and manifest copied under MANY-1 older ids).

Commands that do not change the store run REPEATS times (medians, with the range).
Run: python tests/benchmarks/sweep_scale.py [PLAN] [SWEEP] [MANY] [EACH] [REPEATS]
"""

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness import store  # noqa: E402


def planning(scratch: Path, points: int) -> tuple[float, float]:
    """Seconds and peak MB until the sweep says how many points it runs; then it is killed."""
    grid = [f"length=range(1,{points // 3 + 1})", "block=16,32,64", f"max_points={points}"]
    command = [sys.executable, "-m", "harness", "+experiment=exp014_tiled", *grid]
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=scratch, stdout=subprocess.PIPE, text=True)
    for line in process.stdout:
        if "points to run" in line:
            seconds = time.perf_counter() - started
            status = Path(f"/proc/{process.pid}/status").read_text()
            peak = next(int(x.split()[1]) for x in status.splitlines() if x.startswith("VmHWM"))
            process.kill()
            process.wait()
            return seconds, peak / 1024
    raise RuntimeError(f"the sweep ended without planning: {process.wait()}")


def run(command: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    subprocess.run(command, cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - started


def show(name: str, seconds: list[float], extra: str = "") -> None:
    spread = f"{min(seconds):.2f} to {max(seconds):.2f} s, {len(seconds)} runs"
    print(f"{name:58} median {statistics.median(seconds):7.2f} s ({spread}){extra}", flush=True)


def copies(results: Path, sweep: str, many: int) -> None:
    """MANY more sweeps of the experiment: the sweep's folder copied under older ids."""
    source = store.SweepPaths(results, "exp014_tiled", sweep).folder
    for i in range(many):
        target = store.SweepPaths(results, "exp014_tiled", f"20200101-000000-{i:04x}").folder
        shutil.copytree(source, target)
        manifest = json.loads((target / store.MANIFEST).read_text())
        store.write_manifest(results, manifest | {"sweep": target.name.removeprefix("sweep=")})


def trivial(points: int) -> list[str]:
    grid = ["length=16", "block=16", "heads=1", f"seed=range(0,{points})"]
    return [sys.executable, "-m", "harness", "+experiment=exp014_tiled", *grid]


def main(plan_points: int, sweep_points: int, many: int, each: int, repeats: int) -> None:
    analysis = [sys.executable, "-m", "harness", "report"]
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        print(f"in {scratch}", flush=True)
        plans = []
        for i in range(repeats):
            (scratch / f"plan-{i}").mkdir()
            plans.append(planning(scratch / f"plan-{i}", plan_points))
        peak = statistics.median(mb for _, mb in plans)
        show(f"plan {plan_points:,} points", [s for s, _ in plans], f"; peak {peak:.0f} MB")
        (scratch / "one").mkdir()
        swept = run(trivial(sweep_points), scratch / "one")
        show(f"a sweep of {sweep_points:,} trivial points (compacted at its end)", [swept])
        results = scratch / "one" / "outputs" / "results"
        (sweep,) = store.sweeps(results, "exp014_tiled")
        files = len(store.result_files(results, "exp014_tiled", sweep))
        status = [sys.executable, "-m", "harness", "status", sweep]
        show(f"status of it ({files} file)", [run(status, scratch / "one") for _ in range(repeats)])
        show("python -m harness report right after it",
             [run(analysis, scratch / "one") for _ in range(repeats)])  # fmt: skip
        (scratch / "many").mkdir()
        run(trivial(each), scratch / "many")
        results = scratch / "many" / "outputs" / "results"
        (sweep,) = store.sweeps(results, "exp014_tiled")
        copies(results, sweep, many - 1)
        show(f"python -m harness report over {many} sweeps of {each:,} points",
             [run(analysis, scratch / "many") for _ in range(repeats)])  # fmt: skip


if __name__ == "__main__":
    arguments = [int(a) for a in sys.argv[1:]]
    main(*(arguments + [100_000, 10_000, 100, 1_000, 3][len(arguments) :]))
