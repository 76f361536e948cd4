"""exp015_backends in the report: time and memory per length and backend, speedups, growth, plots.

Memory is whichever column the device has, named as measured: rss_delta_mib (CPU, resident
memory over the baseline) or cuda_peak_mib (the CUDA allocator's peak over the baseline).

Ratios of times are the points' own where their rows carry them (speedup_over_math,
time_growth: timed in turns in the point's process, see experiments.backends), since two
points' medians come from two processes at two moments, under whatever load each met; rows of
older sweeps, which lack them, fall back to the two points' medians, and COLUMN_paired says
which (paired_first).
"""

from pathlib import Path

import pandas as pd

from analysis.plots import lines
from analysis.scaling import keys, loglog, per_doubling, speedup_over, with_memory
from harness.tables import markdown

SHAPE = ["device_used", "dtype", "batch", "heads", "head_dim", "causal"]  # one table each
OTHERS = ["device", "seed", "num_threads", "warmup", "min_repeats", "min_time_s",
          "memory_cap_mib", "timeout_s"]  # fmt: skip


def measurements(rows: pd.DataFrame) -> pd.DataFrame:
    """Every planned point with its memory (analysis.scaling.with_memory). A point that has not
    run has no device_used yet: it gets the one device its sweep's other points used (a sweep
    with device=auto runs on one kind of machine), else its device parameter."""
    data = with_memory(rows)
    if "device_used" not in data:
        data["device_used"] = None
    used = data["device_used"].dropna().unique()
    fallback = used[0] if len(used) == 1 else data.get("device")
    data["device_used"] = data["device_used"].fillna(fallback)
    return data


def speedup(data: pd.DataFrame) -> pd.DataFrame:
    """Per shape, length and backend other than math: speedup_over_math, the point's own
    (paired_first; else scaling.speedup_over). data: measurements(rows)."""
    across = speedup_over(data, _shape(data), "backend", "math")
    own = data[data["backend"] != "math"]
    return paired_first(across, own, _shape(data) + ["backend"], "speedup_over_math")


def growth(data: pd.DataFrame) -> pd.DataFrame:
    """Per shape and backend: memory and time at each length over those at half the length;
    time_growth the point's own (paired_first). data: measurements(rows)."""
    ratios = {"memory_mib": "memory_growth", "time_ms": "time_growth"}
    across = per_doubling(data, _shape(data) + ["backend"], ratios)
    return paired_first(across, data, _shape(data) + ["backend"], "time_growth")


def paired_first(
    across: pd.DataFrame, data: pd.DataFrame, keys: list[str], column: str
) -> pd.DataFrame:
    """`across` (a line per keys and length, `column` a ratio of two points' medians) with
    `column` taken instead from the ok row of `data` at that line's point where the row
    measured it in its own process, in turns (a missing value: not measured there), and
    COLUMN_paired saying which it is. The lines are `across`'s: what a claim selects does not
    change, only how its values were measured."""
    keys, paired, own = [*keys, "length"], f"{column}_paired", f"{column} own"
    if column not in data:
        return across.assign(**{paired: False})
    values = data[keys].assign(**{own: data[column].where(data["status"] == "ok")})
    lines = across.merge(values, on=keys, how="left")
    lines[paired] = lines[own].notna()
    lines[column] = lines.pop(own).fillna(lines.get(column, float("nan")))
    return lines


def fused(data: pd.DataFrame) -> pd.DataFrame:
    """Per shape and length: fused_speedup_over_math, the better of flash's and efficient's
    speedups over math (missing where neither ran), beside the GPU's capability where the rows
    have it. data: measurements(rows)."""
    keys = _shape(data) + ["length"]
    candidates = speedup(data)
    candidates = candidates[candidates["backend"].isin(["flash", "efficient"])]
    best = candidates.groupby(keys, dropna=False)["speedup_over_math"].max()
    capability = data.assign(capability=data.get("capability", float("nan")))
    capability = capability.groupby(keys, dropna=False)["capability"].max()
    table = pd.DataFrame({"fused_speedup_over_math": best}).join(capability, how="left")
    return table.reset_index()


def tables(rows: pd.DataFrame) -> dict[str, pd.DataFrame]:
    data = measurements(rows)
    return {
        "measurements": data,
        "speedup": speedup(data),
        "growth": growth(data),
        "fused": fused(data),
    }


def sections(rows: pd.DataFrame, derived: dict, folder: Path) -> list[str]:
    """Tables per shape (length x backend), speedup, growth, the plots, the refusals."""
    rows, parts = derived["measurements"], []
    for shape, group in rows.groupby(_shape(rows), dropna=False):
        parts.append(f"{_describe(dict(zip(_shape(rows), shape, strict=True)), group)}:")
        parts.append(markdown(time_and_memory(group)))
    hidden = sorted(set(_shape(rows)) - set(_varying(rows)))
    speedups = _by_backend(derived["speedup"], hidden).dropna(axis=1, how="all")
    if not speedups.empty:
        caption = (
            "Speedup over math (math's time / the backend's, timed in turns in the backend's "
            "process: the median of the rounds' ratios; older rows: the two medians')"
        )
        parts += [f"{caption}:", markdown(speedups.reset_index(), ".2f", index=False)]
    ratios = [c for c in ("memory_growth", "time_growth") if c in derived["growth"]]
    growth = derived["growth"].dropna(subset=ratios, how="all")
    if not growth.empty:  # the tables above show the points without a value
        caption = (
            "Growth per doubling of length (value at L / value at L/2; time_growth timed in "
            "turns with L/2 in the point's own process where time_growth_paired)"
        )
        parts += [f"{caption}:", markdown(growth.drop(columns=hidden), ".2f", index=False)]
    if "gflops" in rows and rows["gflops"].notna().any():
        caption = "Achieved TFLOP/s (percent of the matmul peak measured beside it)"
        parts += [f"{caption}:", markdown(throughput(rows))]
    parts += [f"![{what} vs length]({path.name})" for what, path in plots(rows, folder).items()]
    refused = rows[rows["status"] == "unsupported"]
    for (device, backend), group in refused.groupby(["device_used", "backend"]):
        parts.append(f"{backend} on {device} is unsupported: {group['error'].iloc[0]}")
    return parts


def figures(rows: pd.DataFrame, derived: dict) -> list[dict]:
    """Median time (IQR as error bars) and memory against length, a figure per device, a line
    per backend and whatever else of the shape varies."""
    return by_length(derived["measurements"], "backend", _varying(rows))


def by_length(data: pd.DataFrame, method: str, shape: list[str]) -> list[dict]:
    """Time and memory against length, a figure per device_used, a line per `method` and the
    `shape` columns that vary; hover names each point's job and settings."""
    shown = []
    series = [method, *[c for c in shape if c != "device_used"]]
    for device, group in data.groupby("device_used", dropna=False):
        kinds = "/".join(group["memory_kind"].dropna().unique()) or "memory"
        hover = ["job", *series]
        for column, what in (("time_ms", "median time"), ("memory_mib", kinds)):
            spread = "time_iqr_ms" if column == "time_ms" else None
            name = f"{what} against length on {device}"
            figure = lines(group, "length", column, series, name, hover, spread)
            if figure is not None:
                if column == "memory_mib":
                    figure["layout"]["yaxis"]["title"]["text"] = f"{kinds} (MiB)"
                else:
                    figure["layout"]["yaxis"]["title"]["text"] = "median time (ms; bars: IQR)"
                shown.append(figure)
    return shown


def time_and_memory(rows: pd.DataFrame, by: str = "backend") -> pd.DataFrame:
    """length x `by`: "median ms ±IQR · memory MiB", or the status of a point without one."""
    cells = rows.assign(cell=rows["status"])
    ok = with_memory(rows)
    ok = ok[ok["status"] == "ok"]
    if ok.empty:
        ok = ok.assign(time_ms=[], time_iqr_ms=[])
    cells.loc[ok.index, "cell"] = [
        f"{_number(t)} ms ±{_number(iqr)} · {_number(m)} MiB"
        for t, iqr, m in zip(ok["time_ms"], ok["time_iqr_ms"], ok["memory_mib"], strict=True)
    ]
    table = cells.pivot_table(index="length", columns=by, values="cell", aggfunc="first")
    order = rows.sort_values("job")[by].drop_duplicates()
    return table.reindex(columns=order)


def throughput(rows: pd.DataFrame) -> pd.DataFrame:
    """The shape columns that vary and length x backend: "TFLOP/s (percent of peak)"."""
    ok = rows[(rows["status"] == "ok") & rows["gflops"].notna()]
    pairs = zip(ok["gflops"], ok["pct_of_peak"], strict=True)
    cells = ok.assign(cell=[f"{gflops / 1000:.3g} ({pct:.2g}%)" for gflops, pct in pairs])
    index = [c for c in _varying(rows) if c in cells] + ["length"]
    return cells.pivot_table(index=index, columns="backend", values="cell", aggfunc="first")


def plots(rows: pd.DataFrame, folder: Path) -> dict[str, Path]:
    """Memory and time against length, log-log, a panel per device, a line per backend, dtype
    and whatever else of the shape varies (head width, batch, ...)."""
    data = with_memory(rows)
    if data["memory_mib"].isna().all():
        return {}
    varying = [c for c in _varying(data) if c not in ("device_used", "dtype")]
    lines = ["backend", "dtype", *varying]
    return {
        what: loglog(data, column, lines, "device_used", folder / f"exp015_backends-{what}.png")
        for what, column in (("memory", "memory_mib"), ("time", "time_ms"))
    }


def _by_backend(speedup: pd.DataFrame, hidden: list[str]) -> pd.DataFrame:
    """Speedups as a table: the shape columns that vary and length (rows) by backend."""
    values = ("backend", "speedup_over_math", "speedup_over_math_paired")
    index = [c for c in speedup if c not in (*hidden, *values)]
    return speedup.pivot_table(
        index=index, columns="backend", values="speedup_over_math", dropna=False
    )


def _shape(rows: pd.DataFrame) -> list[str]:
    return keys(rows, SHAPE, OTHERS)


def _varying(rows: pd.DataFrame) -> list[str]:
    """The shape columns that tell this sweep's points apart: the device, and what varies."""
    return [c for c in _shape(rows) if c == "device_used" or rows[c].nunique(dropna=False) > 1]


def _describe(shape: dict, rows: pd.DataFrame) -> str:
    device = shape.pop("device_used", "?")
    names = ", ".join(rows["device_name"].dropna().unique()) if "device_name" in rows else ""
    memory = with_memory(rows)["memory_kind"].dropna().unique()
    settings = ", ".join(f"{k} {v}" for k, v in shape.items())
    label = f"{device} ({names})" if names else device
    return f"{label}, {settings}: median time ±IQR · {'/'.join(memory) or 'memory'}"


def _number(value: float) -> str:
    """Three significant digits, without an exponent: 0.0123, 12.3, 8,870."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
