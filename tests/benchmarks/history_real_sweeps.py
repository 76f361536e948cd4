"""The issue's two histories on this machine's CPU: an experiment of one's own whose kernel_ms
and other_ms are the CPU time of a Python loop (the fastest of 15 calls), run as
`python -m harness` runs it, in a scratch folder. First TWELVE sweeps of one code (history
--check should say no step, exit 0); then a new history of six sweeps, and six more after an
edit that makes kernel_ms's loop 1.5x as long (one step, in kernel_ms alone, between the 6th
and 7th sweeps, exit 1). Prints each history's lines and exit code, and the spread of the
timings; asserts nothing. The suite runs the same histories with timings it sets
(tests/test_history.py): a real clock on a shared machine is no test.
Run: python tests/benchmarks/history_real_sweeps.py [ROUNDS]
"""

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from own import OwnExperiment  # noqa: E402 (tests/support's, as the tests import it)

KERNEL = """import time

WORK = {work}


def loop(n):
    total = 0
    for i in range(n):
        total += i * i
    return total


def cpu_ms(n):
    samples = []
    for _ in range(15):
        start = time.process_time()
        loop(n)
        samples.append((time.process_time() - start) * 1e3)
    return min(samples)


def run() -> list[dict]:
    return [{{"kernel_ms": cpu_ms(WORK), "other_ms": cpu_ms(40000)}}]
"""


def history(folder: Path, works: list[int]) -> tuple[int, str, pd.DataFrame]:
    """A sweep for each of `works` (the kernel rewritten where it changes), then history
    --check: its exit code, its output and the rows."""
    mine = OwnExperiment(folder / "mine", "own", "minepkg")
    env = {**os.environ, **mine.env}
    command = [sys.executable, "-m", "harness", *mine.args, "reuse=false",
               f"code_store={folder / 'codes'}"]  # fmt: skip
    for n, work in enumerate(works):
        if n == 0 or work != works[n - 1]:
            mine.edit(KERNEL.format(work=work))
        subprocess.run(command, cwd=folder, env=env, check=True, capture_output=True)
    done = subprocess.run([sys.executable, "-m", "harness", "history", "own", "--check"],
                          cwd=folder, env=env, capture_output=True, text=True)  # fmt: skip
    rows = pd.read_parquet(folder / "outputs" / "results")
    return done.returncode, done.stdout + done.stderr, rows


def main(rounds: int) -> None:
    for round_ in range(rounds):
        for name, works in (
            ("12 sweeps of one code", [40000] * 12),
            ("6 sweeps, then 6 with 1.5x the work", [40000] * 6 + [60000] * 6),
        ):
            with tempfile.TemporaryDirectory() as scratch:
                code, said, rows = history(Path(scratch), works)
            spread = rows[["kernel_ms", "other_ms"]].agg(["min", "median", "max"]).round(2)
            print(f"round {round_ + 1}, {name}: exit {code}")
            print("  " + "\n  ".join(line for line in said.splitlines() if line.strip()))
            print("  " + re.sub(r"\n", "\n  ", spread.to_string()))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
