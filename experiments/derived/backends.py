"""exp015_backends's derived tables, which its claims and report read: every point with its
memory (measurements), the speedup of each backend over math, growth per doubling of length,
and the better fused backend's speedup.

Ratios of times are the points' own where their rows carry them (speedup_over_math,
time_growth: timed in turns in the point's process, see octlm_experiments.backends), since two
points' medians come from two processes at two moments, under whatever load each met; rows of
older sweeps, which lack them, fall back to the two points' medians, and COLUMN_paired says
which (octlm_experiments.derived.scaling.paired_first).
"""

import pandas as pd

from octlm_experiments.derived.scaling import (
    keys,
    paired_first,
    per_doubling,
    speedup_over,
    with_memory,
)

SHAPE = ["device_used", "dtype", "batch", "heads", "head_dim", "causal"]  # one table each
OTHERS = ["device", "seed", "num_threads", "warmup", "min_repeats", "min_time_s",
          "memory_cap_mib", "timeout_s"]  # fmt: skip


def measurements(rows: pd.DataFrame) -> pd.DataFrame:
    """Every planned point with its memory (octlm_experiments.derived.scaling.with_memory). A point
    that
    has not run has no device_used yet: it gets the one device its sweep's other points used (a
    sweep with device=auto runs on one kind of machine), else its device parameter."""
    data = with_memory(rows)
    if "device_used" not in data:
        data["device_used"] = None
    used = data["device_used"].dropna().unique()
    fallback = used[0] if len(used) == 1 else data.get("device")
    data["device_used"] = data["device_used"].fillna(fallback)
    return data


def speedup(data: pd.DataFrame) -> pd.DataFrame:
    """Per shape, length and backend other than math: speedup_over_math, the point's own
    (paired_first; else speedup_over). data: measurements(rows)."""
    across = speedup_over(data, shape(data), "backend", "math")
    own = data[data["backend"] != "math"]
    return paired_first(across, own, shape(data) + ["backend"], "speedup_over_math")


def growth(data: pd.DataFrame) -> pd.DataFrame:
    """Per shape and backend: memory and time at each length over those at half the length;
    time_growth the point's own (paired_first). data: measurements(rows)."""
    ratios = {"memory_mib": "memory_growth", "time_ms": "time_growth"}
    across = per_doubling(data, shape(data) + ["backend"], ratios)
    return paired_first(across, data, shape(data) + ["backend"], "time_growth")


def fused(data: pd.DataFrame) -> pd.DataFrame:
    """Per shape and length: fused_speedup_over_math, the better of flash's and efficient's
    speedups over math (missing where neither ran), beside the GPU's capability where the rows
    have it. data: measurements(rows)."""
    by = shape(data) + ["length"]
    candidates = speedup(data)
    candidates = candidates[candidates["backend"].isin(["flash", "efficient"])]
    best = candidates.groupby(by, dropna=False)["speedup_over_math"].max()
    capability = data.assign(capability=data.get("capability", float("nan")))
    capability = capability.groupby(by, dropna=False)["capability"].max()
    table = pd.DataFrame({"fused_speedup_over_math": best}).join(capability, how="left")
    return table.reset_index()


def tables(rows: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The tables exp015's claims name (config `derive`), of its planned points' rows."""
    data = measurements(rows)
    return {
        "measurements": data,
        "speedup": speedup(data),
        "growth": growth(data),
        "fused": fused(data),
    }


def shape(rows: pd.DataFrame) -> list[str]:
    """What tells a point's measurements apart besides length and backend
    (octlm_experiments.derived.scaling.keys)."""
    return keys(rows, SHAPE, OTHERS)
