"""The seconds `python -m harness history` takes over a long history: SWEEPS sweeps of POINTS
points (a timing each, a 25% step at the middle of one point's), written through the store's own
functions (a manifest and a job file a point, as a sweep leaves them), then the command called
in this process twice: cold (each sweep's point lines computed from its files and cached, as
the report caches them) and warm (read from that cache), and the detector alone on the same
series. Prints the three; asserts nothing.
Run: python tests/benchmarks/history_scale.py [SWEEPS] [POINTS]
"""

import contextlib
import io
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from harness import store
from octlm_analysis import history, steps


def write(results: Path, sweeps: int, points: int) -> None:
    """The sweeps, an hour apart; point 0's time_ms 25% higher from the middle sweep on."""
    rng = np.random.default_rng(0)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for n in range(sweeps):
        sweep, planned = f"2026{n:010d}-aaaa", start + timedelta(hours=n)
        plan = [{"job": j, "overrides": [], "params": {"x": j}} for j in range(points)]
        store.write_manifest(results, {"experiment": "long", "sweep": sweep, "points": plan,
                                       "created_at": planned.isoformat(), "command": "",
                                       "experiment_config": {}})  # fmt: skip
        paths = store.SweepPaths(results, "long", sweep)
        for j in range(points):
            grow = 1.25 if j == 0 and n >= sweeps // 2 else 1.0
            row = {"job": j, "x": j, "status": "ok", "started_at": planned,
                   "time_ms": float(grow * np.exp(rng.normal(0, 0.03))),
                   "device_name": "cpu", "code_digest": f"c{n}", "git_commit": "g"}  # fmt: skip
            store.write_rows(paths.job(j).file, [row])


def timed(call) -> float:
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        call()
    return time.perf_counter() - started


def main() -> None:
    sweeps = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    points = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        started = time.perf_counter()
        write(out / "results", sweeps, points)
        print(f"{sweeps} sweeps x {points} points written in {time.perf_counter() - started:.1f} s")
        cold = timed(lambda: history.main("long", [], out, False))
        warm = timed(lambda: history.main("long", [], out, False))
        judged = history.history(out / "results", "long", [], out / "report")
        alone = timed(lambda: steps.find_steps([s.values for s in judged.series]))
        found = [
            (
                judged.series[s.series].point,
                len(judged.series[s.series].values),
                judged.series[s.series].sweeps[s.at],
                steps.said(s),
            )
            for s in judged.found
        ]
        print(f"history: cold {cold:.2f} s, warm {warm:.2f} s; the detector alone {alone:.3f} s;"
              f" steps (point, its sweeps, the first after, change) {found}")  # fmt: skip


if __name__ == "__main__":
    main()
