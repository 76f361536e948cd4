"""exp018_window in the report: per window, time and memory by length and method, speedups over
sdpa with a mask, growth per doubling, accuracy and throughput, flex's compile time, and log-log
plots of time and memory (a panel per window, a line per method).

speedup_over_sdpa and time_growth are the points' own where their rows carry them (timed in
turns in the point's process: octlm_experiments.window), not two points' medians from two processes
at two moments; rows of older sweeps fall back to those (octlm_experiments.derived.window's tables,
octlm_experiments.derived.scaling.paired_first)."""

from pathlib import Path

import pandas as pd

from harness.results.tables import markdown
from octlm_analysis.backends import by_length, time_and_memory
from octlm_analysis.scaling import loglog
from octlm_experiments.derived.scaling import keys
from octlm_experiments.derived.window import OTHERS, SHAPE

FIGURES = ["err64", "gflops", "pct_of_peak", "compile_s"]  # per point, beside time and memory


def sections(rows: pd.DataFrame, derived: dict, folder: Path) -> list[str]:
    data = derived["measurements"]
    shape = keys(data, SHAPE, OTHERS)
    shown = [c for c in shape if c == "window" or data[c].nunique(dropna=False) > 1]
    methods = data.sort_values("job")["method"].drop_duplicates().tolist()
    parts = []
    for values, group in data.groupby(shape, dropna=False):
        setting = ", ".join(f"{k} {v}" for k, v in zip(shape, values, strict=True))
        kind = "/".join(group["memory_kind"].dropna().unique()) or "memory"
        table = time_and_memory(group, "method")
        parts += [f"{setting}: median time ±IQR · {kind}:", markdown(table)]
    speedup = derived["speedup"].pivot_table(
        index=[*shown, "length"], columns="method", values="speedup_over_sdpa", dropna=False
    )
    if not speedup.dropna(how="all").empty:
        columns = [m for m in methods if m in speedup]
        caption = (
            "Speedup over sdpa with a mask (its time / the method's, timed in turns in the "
            "method's process: the median of the rounds' ratios; older rows: the two medians')"
        )
        table = speedup.reindex(columns=columns).reset_index()
        parts += [f"{caption}:", markdown(table, ".1f", index=False)]
    growth = derived["growth"].dropna(subset=["time_growth", "memory_growth"], how="all")
    if not growth.empty:
        caption = (
            "Growth per doubling of length (value at L / value at L/2; linear 2, square 4; "
            "time_growth timed in turns with L/2 in the point's own process where "
            "time_growth_paired)"
        )
        hidden = [c for c in shape if c not in shown]
        parts += [f"{caption}:", markdown(growth.drop(columns=hidden), ".2f", index=False)]
    ok = data[data["status"] == "ok"]
    if not ok.empty:
        caption = ("Error against float64 (the last 128 rows), GFLOP/s over the visible pairs, "
                   "percent of the matmul peak, flex's compile time (s)")  # fmt: skip
        figures = ok.set_index([*shown, "length", "method"])[[c for c in FIGURES if c in ok]]
        parts += [f"{caption}:", markdown(figures.sort_index().reset_index(), ".3g", index=False)]
    parts += _plots(data, folder) + _without_measurement(data)
    return parts


def figures(rows: pd.DataFrame, derived: dict) -> list[dict]:
    """Time (IQR as error bars) and memory against length, a line per method, window and
    whatever else of the shape varies."""
    data = derived["measurements"]
    return by_length(data, "method", keys(data, SHAPE, OTHERS))


def _plots(data: pd.DataFrame, folder: Path) -> list[str]:
    measured = data.dropna(subset=["memory_mib"])
    if measured.empty:
        return []
    return [
        f"![{what} vs length]({path.name})"
        for what, column in (("time", "time_ms"), ("memory", "memory_mib"))
        for path in [
            loglog(
                measured,
                column,
                ["method", "dtype"],
                "window",
                folder / f"exp018_window-{what}.png",
            )
        ]  # fmt: skip
    ]


def _without_measurement(data: pd.DataFrame) -> list[str]:
    """A line per method and status that ran without a measurement (oom, unsupported, ...)."""
    lines = []
    for (method, status), group in data[~data["status"].isin(["ok", "not run"])].groupby(
        ["method", "status"]
    ):
        where = ", ".join(
            f"{length} (window {window})"
            for length, window in zip(group["length"], group["window"], strict=True)
        )
        errors = group["error"].dropna() if "error" in group else pd.Series()
        lines.append(f"{method}, {status} at length {where}" + (
            f": {errors.iloc[0]}" if len(errors) else ""))  # fmt: skip
    return lines
