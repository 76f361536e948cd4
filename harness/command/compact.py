"""python -m harness compact SWEEP_ID: a sweep's job files merged into one Parquet file
(harness.store.compact), refused while SLURM still runs its points."""

import time
from pathlib import Path

from harness import store
from harness.command.status import find_sweep, still_scheduled
from harness.errors import BadInput


def compact(sweep_id: str, out: str, experiment: str | None) -> int:
    """Merge the sweep's job files into one (store.compact) and say what it did; BadInput while
    SLURM runs points of it."""
    results = Path(out).resolve() / "results"
    paths = find_sweep(results, store.named_sweep(results, sweep_id, experiment))
    sweep_id, experiment = paths.sweep, paths.experiment
    running = still_scheduled(store.read_manifest(paths) or {})
    if running:
        raise BadInput(
            f"sweep {sweep_id} still has {len(running)} points queued or running on SLURM; "
            f"compact it once they end (python -m harness status {sweep_id})"
        )
    started = time.perf_counter()
    path, absorbed = store.compact(paths)
    if (
        path is None
        and (store.read(results, experiment, sweep_id)["status"] == store.RUNNING).any()
    ):
        print(f"sweep {sweep_id} ({experiment}) has a training point still running: compact it "
              "once it ends (or resume it)")  # fmt: skip
    elif path is None:
        print(f"sweep {sweep_id} ({experiment}) has no rows to compact")
    elif not absorbed:
        print(f"sweep {sweep_id} ({experiment}) is compacted already: {path}")
    else:
        seconds = time.perf_counter() - started
        print(
            f"sweep {sweep_id} ({experiment}): {len(absorbed)} files merged into {path} in "
            f"{seconds:.1f} s"
        )
    return 0
