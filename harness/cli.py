"""The command line: a sweep from Hydra overrides, or a sweep's status; bad input is one line
on stderr and exit code 2."""

import sys

from harness import sweep
from harness.experiment import BadInput

USAGE = """usage: python -m harness +experiment=NAME [key=value | key=a,b,c ...] [resume=SWEEP_ID]
       python -m harness status SWEEP_ID [out=DIR]

Runs the experiment's grid (its hydra.sweeper.params; key=a,b,c on the command line replaces
a key's values, key=value fixes it) and writes one Parquet row per measurement under
outputs/results. hydra/launcher=local runs points in parallel here, hydra/launcher=slurm as
SLURM job arrays (wait=false: submit and return). Experiments: {experiments}"""


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE.format(experiments=", ".join(sweep.available_experiments())))
        sys.exit(0 if argv else 2)
    argv = [a for a in argv if a not in ("-m", "--multirun")]  # every run is a sweep already
    try:
        code = _status(argv[1:]) if argv[0] == "status" else sweep.run(argv)
    except BadInput as error:
        print(f"error: {error}", file=sys.stderr)
        code = 2
    sys.exit(code)


def _status(argv: list[str]) -> int:
    from harness.status import status

    options = dict(a.split("=", 1) for a in argv if "=" in a)
    ids = [a for a in argv if "=" not in a]
    if len(ids) != 1 or set(options) - {"out"}:
        raise BadInput("usage: python -m harness status SWEEP_ID [out=DIR]")
    return status(ids[0], options.get("out", "outputs"))
