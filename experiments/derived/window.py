"""exp018_window's derived tables: every point with its memory, the speedup of each method over
sdpa with a mask, and growth per doubling of length; the ratios are the points' own where their
rows carry them (timed in turns in the point's process: octlm_experiments.window)."""

import pandas as pd

from octlm_experiments.derived.backends import measurements
from octlm_experiments.derived.scaling import keys, paired_first, per_doubling, speedup_over

SHAPE = ["device_used", "dtype", "batch", "heads", "head_dim", "window"]
OTHERS = ["device", "block", "seed", "num_threads", "warmup", "min_repeats", "min_time_s",
          "memory_cap_mib", "timeout_s"]  # fmt: skip


def tables(rows: pd.DataFrame) -> dict[str, pd.DataFrame]:
    data = measurements(rows)  # a point not run yet gets its sweep's device
    shape = keys(data, SHAPE, OTHERS)
    ratios = {"time_ms": "time_growth", "memory_mib": "memory_growth"}
    speedup = speedup_over(data, shape, "method", "sdpa")
    growth = per_doubling(data, shape + ["method"], ratios)
    return {
        "measurements": data,
        "speedup": paired_first(
            speedup, data[data["method"] != "sdpa"], shape + ["method"], "speedup_over_sdpa"
        ),
        "growth": paired_first(growth, data, shape + ["method"], "time_growth"),
    }
