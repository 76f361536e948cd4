"""Whether the timing gate judges the code: the same code against itself, and a real 1.3x
slowdown, gated at 1.10 with one process a side and with three.

A run makes twelve sweeps, each by a command of its own and so in processes of its own, into a
scratch out dir, as a user does, interleaved so that a drift of the machine meets every side
alike: six of exp018_window on the CPU (method=tiled,sdpa length=1024,2048 window=64
min_time_s=0.2: the sweep whose same-code gate failed 2 of 5 idle runs with one process a
side), three of the code as it is and three more of it; and six of the probe experiment `spin`
(tests/support: ten products of size x size matrices a call, one thread, sizes 128 to 256),
three as it is and three with 1.3x its work (work=1.3: 13 products a call). Then four gates,
`python -m harness report compare X Y --fail-on-regression 1.10`: the first sweep of exp018's one
side against the first of its other (one process a side), then each side's three against the
other's; spin's first against its first slowed one, then its three against the three slowed.
Printed: each gate's exit code (0 passed, 1 a regression) and its timings' verdicts, then how
many runs each gate passed. The
gate judges the code when the same code passes every run and the slowdown fails every run (a
run whose machine was busy judges nothing: "busy machine"). It asserts nothing about time.
Run: python tests/benchmarks/timing_gate.py [--runs N]
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "tests" / "support"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(SUPPORT)])}
FACTOR = "1.10"


WINDOW = ["+experiment=exp018_window", "device=cpu", "method=tiled,sdpa", "length=1024,2048",
          "window=64", "min_time_s=0.2"]  # fmt: skip
SPIN = ["--config-dir", str(SUPPORT / "conf"), "+experiment=spin"]


def sweep(out: Path, args: list[str]) -> str:
    """One sweep into out; its id."""
    command = [sys.executable, "-m", "harness", *args, f"out={out}"]
    done = subprocess.run(command, capture_output=True, text=True, env=ENV, cwd=out)
    found = re.search(r"^sweep (\S+): \d+ points: \d+ ok;", done.stdout, re.M)
    if done.returncode != 0 or not found:
        sys.exit(f"the sweep failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return found.group(1)


def gate(out: Path, a: list[str], b: list[str]) -> str:
    """The gate's exit code for sides a and b (0 passed, 1 a regression), and its verdicts."""
    command = [sys.executable, "-m", "harness", "report", "compare", ",".join(a), ",".join(b),
               "--fail-on-regression", FACTOR, "--out", str(out)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=ENV, cwd=out)
    if done.returncode not in (0, 1) or done.stderr:  # 1 is a regression, and says nothing more
        sys.exit(f"compare failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    verdicts = re.search(r"timings: ([^.]+)\.", done.stdout)
    return f"exit {done.returncode} ({verdicts.group(1) if verdicts else 'no timings'})"


GATES = {
    "exp018, same code, 1 process a side": ("window", "again", 1),
    "exp018, same code, 3 processes a side": ("window", "again", 3),
    "spin, 1.3x slower, 1 process a side": ("spin", "slowed", 1),
    "spin, 1.3x slower, 3 processes a side": ("spin", "slowed", 3),
}


def one_run(out: Path) -> dict[str, str]:
    made = {"window": [], "again": [], "spin": [], "slowed": []}
    for _ in range(3):
        for side, args in (("window", WINDOW), ("again", WINDOW), ("spin", SPIN),
                           ("slowed", [*SPIN, "work=1.3"])):  # fmt: skip
            made[side].append(sweep(out, args))
    return {name: gate(out, made[a][:n], made[b][:n]) for name, (a, b, n) in GATES.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    passed = dict.fromkeys(GATES, 0)
    for run in range(1, args.runs + 1):
        with tempfile.TemporaryDirectory() as scratch:
            codes = one_run(Path(scratch))
        print(f"run {run}:", flush=True)
        for name, said in codes.items():
            print(f"  {name}: {said}", flush=True)
            passed[name] += said.startswith("exit 0")
    print(f"\nthe {FACTOR} gate passed, of {args.runs} runs:")
    for name, count in passed.items():
        print(f"  {name}: {count}")


if __name__ == "__main__":
    main()
