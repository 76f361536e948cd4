"""Whether load beside a sweep moves its timing verdicts: exp018_window's claims and a same-code
compare gate, on the machine as it is and beside two busy processes.

A run is two sweeps of one grid (method=tiled,sdpa length=4096,8192,16384 window=256 on the CPU;
--quick: length=1024,2048 window=64 min_time_s=0.2) into a scratch out dir, made and read as a
user does: `python -m harness ... out=DIR`, then `python -m harness report --out DIR` for sweep B's
claims and `python -m harness report compare A B --fail-on-regression 1.10 --out DIR` for the gate's
exit code. An idle run makes both sweeps on the machine as it is. A loaded run starts two
processes that spin (`python -c "while True: pass"`) after sweep A and kills them after sweep B:
A is idle, B under load, as when other work comes to the machine between two sweeps of the same
code, so that B's claims ran under load and the gate compares across it. Idle and loaded runs
alternate, RUNS of each. Printed: each run's verdicts, both conditions side by side (every
claim's result with its worst value, the gate's exit code), the timings the gate called
regressions, whether the idle runs agree among themselves, and whether every verdict under
load matched the idle one (loaded run i against idle run i). It asserts nothing about time.
Run: python tests/benchmarks/timing_under_load.py [--runs N] [--quick]
"""

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GRID = ["method=tiled,sdpa", "length=4096,8192,16384", "window=256"]
QUICK = ["method=tiled,sdpa", "length=1024,2048", "window=64", "min_time_s=0.2"]
FACTOR = "1.10"
RESULTS = ("PASS", "FAIL", "INCOMPLETE", "N/A", "ERROR")


def sweep(out: Path, grid: list[str]) -> str:
    """One sweep of exp018_window on the CPU into out; its id."""
    command = [sys.executable, "-m", "harness", "+experiment=exp018_window", "device=cpu"]
    done = subprocess.run([*command, *grid, f"out={out}"], capture_output=True, text=True)
    found = re.search(r"^sweep (\S+):", done.stdout, re.M)
    if done.returncode != 0 or not found:
        sys.exit(f"the sweep failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return found.group(1)


def claims(out: Path) -> dict[str, tuple[str, str]]:
    """The newest sweep's claims in out, as python -m harness report prints them ("RESULT
    exp018_window: TEXT (BOUNDS) (worst W, ...)"): TEXT -> (result, worst value)."""
    done = subprocess.run(
        [sys.executable, "-m", "harness", "report", "--out", str(out)],
        capture_output=True,
        text=True,
    )
    found = {}
    for line in done.stdout.splitlines():
        result, _, rest = line.partition(" ")
        rest = rest.lstrip()
        if result in RESULTS and rest.startswith("exp018_window: "):
            claim, _, said = rest.removeprefix("exp018_window: ").rpartition(" (")
            worst = re.match(r"worst (.+?),", said)
            found[claim.rpartition(" (")[0]] = (result, worst.group(1) if worst else "")
    return found


def gate(out: Path, a: str, b: str) -> tuple[int, list[str], str]:
    """python -m harness report compare A B --fail-on-regression FACTOR: its exit code, the timings
    it called regressions (from its table: the metric at its point, and B/A), and its line on
    the machine's load ("" without one)."""
    command = [sys.executable, "-m", "harness", "report", "compare", a, b, "--out", str(out)]
    done = subprocess.run(
        [*command, "--fail-on-regression", FACTOR], capture_output=True, text=True
    )
    section = done.stdout.partition("timings slower than")[2].partition("\n#")[0]
    lines = [line.strip(" |").split("|") for line in section.splitlines() if "=" in line]
    said = [[cell.strip() for cell in cells] for cells in lines]
    load = next((line for line in done.stdout.splitlines() if "share of the CPUs" in line), "")
    return done.returncode, [f"{c[1]} at {c[0]}: B/A {' / '.join(c[4:])}" for c in said], load


def busy(count: int = 2) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def one_run(grid: list[str], loaded: bool) -> dict:
    """Sweeps A and B (B beside the busy processes if loaded). Returns the verdicts (each
    claim's result for B, the gate's exit code), what to show beside them (a claim's worst
    value) and the gate's regressions."""
    with tempfile.TemporaryDirectory(prefix="timing-under-load-") as scratch:
        out = Path(scratch) / "outputs"
        a = sweep(out, grid)
        spinning = busy() if loaded else []
        try:
            b = sweep(out, grid)
        finally:
            for process in spinning:
                process.kill()
                process.wait()
        found = claims(out)  # B's: the newest sweep
        code, regressions, load = gate(out, a, b)
    verdicts = {text: result for text, (result, _) in found.items()}
    shown = {text: f"{result} {worst}".strip() for text, (result, worst) in found.items()}
    verdicts["gate exit code"] = shown["gate exit code"] = str(code)
    return {"verdicts": verdicts, "shown": shown, "regressions": regressions, "load": load}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each condition (5)")
    parser.add_argument("--quick", action="store_true", help="a small grid: lengths 1,024, 2,048")
    args = parser.parse_args()
    grid = QUICK if args.quick else GRID
    print(f"grid: {' '.join(grid)}; {args.runs} runs idle, {args.runs} loaded, alternating")
    runs = {"idle": [], "loaded": []}
    for number in range(args.runs):
        for condition in runs:
            started = time.perf_counter()
            runs[condition].append(one_run(grid, condition == "loaded"))
            seconds = time.perf_counter() - started
            print(f"run {number + 1} {condition}: {seconds:.0f} s", flush=True)
    report(runs)


def report(runs: dict[str, list[dict]]) -> None:
    """Each verdict per run, idle | loaded (a claim with its worst value), the gate's
    regressions, and whether load moved any verdict (run i loaded against run i idle)."""
    names = list(dict.fromkeys(n for results in runs.values() for r in results for n in r["shown"]))
    width = max(len(name) for name in names)
    print(f"\n{'verdict (worst value)':{width}}  idle runs | loaded runs")
    for name in names:
        idle, loaded = (", ".join(r["shown"].get(name, "-") for r in runs[c]) for c in runs)
        print(f"{name:{width}}  {idle} | {loaded}")
    for condition, results in runs.items():
        for number, result in enumerate(results, 1):
            print(f"run {number} {condition}: {result['load'] or 'no load recorded'}")
            for regression in result["regressions"]:
                print(f"run {number} {condition}: the gate's regression: {regression}")
    idle = [r["verdicts"] for r in runs["idle"]]
    agree = all(v == idle[0] for v in idle)
    matched = all(i == r["verdicts"] for i, r in zip(idle, runs["loaded"], strict=True))
    print(f"\nthe idle runs' verdicts agree among themselves: {'yes' if agree else 'no'}")
    print(f"every verdict under load matched the idle one: {'yes' if matched else 'no'}")


if __name__ == "__main__":
    main()
