"""What a command costs to start: the CPU time (user + system, of the process and its children)
of `python -m harness --help`, of `python -m harness status ID` on a finished sweep, and of
`python -m harness report` on a store of that one sweep, each against `python -c "import torch"`,
measured side by side: the commands alternate, REPEATS times, and the medians are compared.
`python -X importtime -m harness --help` shows where a start goes.

    python tests/benchmarks/command_start.py [REPEATS]
"""

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import store


def cpu_seconds(arguments: list[str], cwd: Path) -> float:
    """The CPU seconds a command took, its children's included (a fork's, wait4's rusage)."""
    process = subprocess.Popen([sys.executable, *arguments], cwd=cwd,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        sys.exit(f"{' '.join(arguments)} failed: {process.stderr.read().decode()[-2000:]}")
    return usage.ru_utime + usage.ru_stime


def main(repeats: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        here = Path(scratch)
        grid = ["+experiment=exp014_tiled", "length=16,32", "block=16", "seed=0,1,2"]
        subprocess.run([sys.executable, "-m", "harness", *grid], cwd=here, check=True,
                       capture_output=True)  # fmt: skip
        (sweep,) = store.sweeps(here / "outputs" / "results", "exp014_tiled")
        commands = {
            'python -c "import torch"': ["-c", "import torch"],
            "python -m harness --help": ["-m", "harness", "--help"],
            "python -m harness status ID": ["-m", "harness", "status", sweep],
            "python -m harness report": ["-m", "harness", "report"],
        }
        taken = {name: [] for name in commands}
        for _ in range(repeats):
            for name, arguments in commands.items():
                taken[name].append(cpu_seconds(arguments, here))
    torch = statistics.median(taken['python -c "import torch"'])
    for name, seconds in taken.items():
        median = statistics.median(seconds)
        print(f"{name:30} {median:6.2f} s of CPU (median of {repeats}), {median / torch:.2f}x "
              "import torch's")  # fmt: skip


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 7)
