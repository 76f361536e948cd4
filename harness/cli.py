"""The command line: a sweep from Hydra overrides; bad input is one line and exit code 2."""

import sys

from harness import sweep
from harness.experiment import BadInput

USAGE = """usage: python -m harness +experiment=NAME [key=value | key=a,b,c ...] [resume=SWEEP_ID]

Runs the experiment's grid (its hydra.sweeper.params; key=a,b,c on the command line replaces
a key's values, key=value fixes it) and writes one Parquet row per measurement under
outputs/results. Experiments: {experiments}"""


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE.format(experiments=", ".join(sweep.available_experiments())))
        sys.exit(0 if argv else 2)
    argv = [a for a in argv if a not in ("-m", "--multirun")]  # every run is a sweep already
    try:
        code = sweep.run(argv)
    except BadInput as error:
        print(f"error: {error}", file=sys.stderr)
        code = 2
    sys.exit(code)
