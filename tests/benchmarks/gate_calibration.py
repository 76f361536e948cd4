"""The timing gate's error rates, measured: gates of identical code (A/A) and of known
slowdowns, each run as a user runs it.

A gate here is what a user does: a sweep of the probe experiment `pair` (tests/support: two
timings in a row, `first` and `second`, prefixed as docs/own-experiments.md says) as A, a
sweep with `slower=S` as B (second's work S times; first's unchanged), each by a command of
its own with nothing reused, then `python -m harness again A B factor=1.10`, which runs each
again in turns until the gate decides every timing or a side has `most` processes, and exits
as its last comparison does: 0 passed, 1 failed, 3 not decided. Gates of each kind are
interleaved (A/A, +10%, +25%, +50%, A/A, ...), so that a drift of the machine meets each alike.

Printed: each gate's exit, processes a side, the timings it called slower, and its seconds;
then per kind: how many gates failed (a false alarm for A/A, a detection for a slowdown, and
for a slowdown whether it named `second` alone), passed and were not decided, and the
processes a side they took (median, most). Targets on an idle 2-core machine: at most 1 false
alarm in 20 A/A gates, +25% found in at least 9 of 10, +50% in 10 of 10. It asserts nothing.
Run: python tests/benchmarks/gate_calibration.py [--same 20] [--each 10] [--busy]
(--busy: a loop spinning on one core beside the whole run, as another user's job would.)
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "tests" / "support"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(SUPPORT)])}
PAIR = ["--config-dir", str(SUPPORT / "conf"), "+experiment=pair", "reuse=false"]
FACTOR = "1.10"


def sweep(out: Path, slower: float) -> str:
    """One sweep of `pair` into out, its own process; its id."""
    command = [sys.executable, "-m", "harness", *PAIR, f"slower={slower}", f"out={out}"]
    done = subprocess.run(command, capture_output=True, text=True, env=ENV, cwd=out)
    found = re.search(r"^sweep (\S+): \d+ points: \d+ ok;", done.stdout, re.M)
    if done.returncode != 0 or not found:
        sys.exit(f"the sweep failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return found.group(1)


def gate(out: Path, slower: float, most: int, keep: Path | None) -> dict:
    """One gate: A, B at `slower`, then again's adaptive comparison; what it said (and its
    whole output in keep/, where given)."""
    started = time.monotonic()
    a, b = sweep(out, 1.0), sweep(out, slower)
    command = [sys.executable, "-m", "harness", "again", a, b, f"factor={FACTOR}",
               f"most={most}", f"out={out}"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=ENV, cwd=out)
    if keep:
        (keep / f"{out.name}-{slower}.txt").write_text(done.stdout + done.stderr)
    ended = re.search(r"^gate .* at (\d+) processes a side, look (\d+) of", done.stdout, re.M)
    if done.returncode not in (0, 1, 3) or not ended:
        sys.exit(f"again failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr}")
    regressed = done.stdout.split("## Regressions: ", 1)[-1].split("\n## ", 1)[0]
    named = sorted(set(re.findall(r"\| (\w+_time_ms) ", regressed))) if done.returncode else []
    busy = len(re.findall(r"busy", done.stdout.split("## Not decided", 1)[-1])) > 0
    return {"exit": done.returncode, "processes": int(ended[1]), "looks": int(ended[2]),
            "slower": named, "seconds": time.monotonic() - started,
            "busy": busy and done.returncode == 3}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--same", type=int, default=20, help="A/A gates")
    parser.add_argument("--each", type=int, default=10, help="gates of each slowdown")
    parser.add_argument("--slowdowns", default="1.10,1.25,1.50")
    parser.add_argument("--most", type=int, default=8, help="processes a side at most")
    parser.add_argument("--busy", action="store_true", help="a loop on one core beside")
    parser.add_argument("--keep", type=Path, help="a folder for each gate's output")
    args = parser.parse_args()
    kinds = {1.0: args.same, **{float(s): args.each for s in args.slowdowns.split(",")}}
    order = [k for turn in range(max(kinds.values())) for k in kinds if turn < kinds[k]]
    spinner = None
    if args.busy:
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    said = {kind: [] for kind in kinds}
    try:
        with tempfile.TemporaryDirectory() as scratch:
            for number, kind in enumerate(order, 1):
                out = Path(scratch) / f"gate{number}"
                out.mkdir()
                found = gate(out, kind, args.most, args.keep)
                said[kind].append(found)
                name = "A/A" if kind == 1.0 else f"+{kind - 1:.0%}"
                print(f"gate {number} of {len(order)}, {name}: exit {found['exit']}, "
                      f"{found['processes']} processes a side, slower: "
                      f"{', '.join(found['slower']) or 'none'}, {found['seconds']:.0f} s",
                      flush=True)  # fmt: skip
    finally:
        if spinner:
            spinner.kill()
    print(f"\nfactor {FACTOR}, at most {args.most} processes a side"
          f"{', a busy loop beside' if args.busy else ''}:")  # fmt: skip
    for kind, gates in said.items():
        failed = [g for g in gates if g["exit"] == 1]
        right = sum(g["slower"] == ["second_time_ms"] for g in failed)
        counts = {code: sum(g["exit"] == code for g in gates) for code in (0, 1, 3)}
        taken = [g["processes"] for g in gates]
        name = "A/A (identical code)" if kind == 1.0 else f"second +{kind - 1:.0%}"
        print(f"  {name}: {counts[1]} of {len(gates)} failed"
              + ("" if kind == 1.0 else f" ({right} naming second alone)")
              + f", {counts[0]} passed, {counts[3]} not decided"
              + f" ({sum(g['busy'] for g in gates)} of them for a busy machine); processes a "
              f"side: median {statistics.median(taken):g}, most {max(taken)}; "
              f"{statistics.median(g['seconds'] for g in gates):.0f} s a gate")  # fmt: skip


if __name__ == "__main__":
    main()
