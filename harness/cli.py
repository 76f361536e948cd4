"""The command line: a sweep from Hydra overrides, a sweep's status, or its compaction; bad
input is one line on stderr and exit code 2."""

import os
import sys
import time
from pathlib import Path

from harness import config, store, sweep
from harness.experiment import BadInput

USAGE = """usage: python -m harness [--config-dir DIR] +experiment=NAME [key=value | key=a,b,c ...]
                         [resume=SWEEP_ID]
       python -m harness status SWEEP_ID [out=DIR]
       python -m harness compact SWEEP_ID [out=DIR]

Runs the experiment's grid (its hydra.sweeper.params; key=a,b,c on the command line replaces
a key's values, key=value fixes it) and writes one Parquet row per measurement under
outputs/results. hydra/launcher=local runs points in parallel here, hydra/launcher=slurm as
SLURM job arrays (wait=false: submit and return). compact merges a finished sweep's job files
into one Parquet file. --config-dir DIR also finds experiments of your own in
DIR/experiment/NAME.yaml. Experiments: {experiments}"""


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    argv = [a for a in argv if a not in ("-m", "--multirun")]  # every run is a sweep already
    if not argv or argv[0] in ("-h", "--help", "help"):
        usage = USAGE.format(experiments=", ".join(config.available_experiments()))
        print(usage, file=sys.stdout if argv else sys.stderr)
        sys.exit(0 if argv else 2)
    try:
        command = COMMANDS.get(argv[0])
        code = command(*_sweep_and_out(argv)) if command else sweep.run(argv)
    except BadInput as error:
        print(f"error: {error}", file=sys.stderr)
        code = 2
    except BrokenPipeError:  # the reader went away (status | head): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 141
    sys.exit(code)


def _status(sweep_id: str, out: str) -> int:
    from harness.status import status

    return status(sweep_id, out)


def _compact(sweep_id: str, out: str) -> int:
    """Merge the sweep's job files into one (store.compact); refused while SLURM runs points."""
    from harness.status import find_experiment, still_scheduled

    results = Path(out).resolve() / "results"
    experiment = find_experiment(results, sweep_id)
    running = still_scheduled(store.read_manifest(results, experiment, sweep_id) or {})
    if running:
        raise BadInput(
            f"sweep {sweep_id} still has {len(running)} points queued or running on SLURM; "
            f"compact it once they end (python -m harness status {sweep_id})"
        )
    started = time.perf_counter()
    path, absorbed = store.compact(results, experiment, sweep_id)
    if path is None:
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


COMMANDS = {"status": _status, "compact": _compact}


def _sweep_and_out(argv: list[str]) -> tuple[str, str]:
    """`status SWEEP_ID [out=DIR]`'s sweep id and out dir (the same for compact)."""
    options = dict(a.split("=", 1) for a in argv[1:] if "=" in a)
    ids = [a for a in argv[1:] if "=" not in a]
    if len(ids) != 1 or set(options) - {"out"}:
        raise BadInput(f"usage: python -m harness {argv[0]} SWEEP_ID [out=DIR]")
    return ids[0], options.get("out", "outputs")
