"""What one isolated measurement costs: harness.measuring.memory.run_isolated of a function that
does nothing, against a fresh interpreter that imports torch (what a process per point would cost).

Both run alternately, REPEATS times each; the medians and their ratio are printed. The first
isolated run also starts the forkserver (once per sweep), shown apart.
Run: python tests/benchmarks/isolation_overhead.py [REPEATS]
"""

import statistics
import subprocess
import sys
import time

from harness.measuring.memory import run_isolated


def nothing() -> int:
    return 0


def seconds(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def main(repeats: int) -> None:
    first = seconds(lambda: run_isolated(nothing))
    fresh = [sys.executable, "-c", "import torch"]
    isolated, interpreter = [], []
    for _ in range(repeats):
        isolated.append(seconds(lambda: run_isolated(nothing)))
        interpreter.append(seconds(lambda: subprocess.run(fresh, check=True)))
    print(f"forkserver start (first measurement of a process): {first * 1000:.0f} ms")
    for name, samples in (("run_isolated", isolated), ("python -c 'import torch'", interpreter)):
        low, high = min(samples) * 1000, max(samples) * 1000
        median = statistics.median(samples) * 1000
        print(f"{name:26} median {median:7.1f} ms ({low:.1f} to {high:.1f} ms, {repeats} runs)")
    ratio = statistics.median(interpreter) / statistics.median(isolated)
    print(f"fresh interpreter / isolated: {ratio:.0f}x")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
