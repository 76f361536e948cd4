"""Synthetic sweeps for the tests of python -m harness report compare: timed rows of one
point, a sweep a process, written through the store as a sweep writes them."""

import numpy as np
import pandas as pd

from harness import store

EXPERIMENT = "exp_timed"
CONFIG = {
    "name": EXPERIMENT,
    "claims": [{"metric": "max_abs_diff", "max": 1e-6, "text": "matches to 1e-6"}],
}


def changes(comparison, factor: float = 1.10) -> dict[str, list[str]]:
    """Each timing's changes, point by point."""
    from octlm_analysis.gate import timing_tables

    return {metric: table["change"].tolist()
            for metric, table in timing_tables(comparison, factor).items()}  # fmt: skip


# A process's samples: TIMES times its factor (a process of its own: its repeats tight, the
# processes apart by their factors).
TIMES = [10.0, 10.3, 9.8, 10.1, 10.4, 9.9, 10.2, 10.0]
STARTS = iter(range(10**6))  # each row's start: a measurement of its own


def timed_row(slower: float, load: float | None, prefix: str = "", **more) -> dict:
    """A row as harness.measuring.timing.time_call gives it on the CPU: samples `slower` times
    TIMES, and its cpu_load_beside (None: an older row without it), each column prefixed."""
    samples = [t * slower for t in TIMES]
    row = {f"{prefix}time_ms": float(np.median(samples)), f"{prefix}time_samples_ms": samples,
           f"{prefix}repeats": len(samples), **more}  # fmt: skip
    return row if load is None else row | {f"{prefix}cpu_load_beside": load}


def write_timed(results, sweep: str, row: dict) -> None:
    """A sweep of one point whose row is `row`, started at a moment of its own (unless the row
    says when: a copy of another's)."""
    params = {"backend": "flash", "length": 128}
    started = pd.Timestamp("2026-11-29", tz="UTC") + pd.Timedelta(seconds=next(STARTS))
    line = {"job": 0, "status": "ok", "started_at": started, **params, **row}
    store.write_rows(store.SweepPaths(results, EXPERIMENT, sweep).job(0).file, [line])
    points = [{"job": 0, "overrides": [], "params": params}]
    manifest = {"experiment": EXPERIMENT, "sweep": sweep, "command": "python -m harness"}
    store.write_manifest(results, {**manifest, "experiment_config": CONFIG, "points": points})


def sides(results, factors_a, factors_b, failed_in_b=None, load_b=0.01, broken_b=0.0,
          rows=None) -> tuple[str, str]:  # fmt: skip
    """Sweeps of one point, a sweep a process, each side's ids joined by commas: each row
    timed_row(factor, load) (rows(side, number, factor): a row of the test's own). B's sweeps
    ran beside load_b (a list: each its own); with broken_b other than 0.0, their timing is that
    value (None: no value) and their samples none, on rows that say ok."""
    ids = {}
    for side, factors in (("a", factors_a), ("b", factors_b)):
        ids[side] = [f"20261129-12{side}{n:03d}-{side * 4}" for n in range(len(factors))]
        for number, (sweep, factor) in enumerate(zip(ids[side], factors, strict=True)):
            load_here = load_b[number] if isinstance(load_b, list) else load_b
            row = timed_row(factor, load_here if side == "b" else 0.01)
            if rows:
                row = rows(side, number, factor)
            if side == "b" and broken_b != 0.0:
                row = {**row, "time_ms": broken_b, "time_samples_ms": None}
            if side == "b" and number == failed_in_b:
                row = {"status": "failed", "error": "RuntimeError: out of memory"}
            write_timed(results, sweep, row)
    return ",".join(ids["a"]), ",".join(ids["b"])


SAME = [1.0, 1.01, 0.99]  # the same code in three processes, a little apart
