"""exp015_backends in the report: time and memory per length and backend, speedups, growth, plots.

Memory is whichever column the device has, named as measured: rss_delta_mib (CPU, resident
memory over the baseline) or cuda_peak_mib (the CUDA allocator's peak over the baseline).

The tables (measurements, speedup, growth, fused) are the experiment's own, which its claims
read too: octlm_experiments.derived.backends.
"""

from pathlib import Path

import pandas as pd

from harness.results.tables import markdown
from octlm_analysis.plots import lines, plain
from octlm_analysis.scaling import loglog
from octlm_experiments.derived.backends import shape as shape_of
from octlm_experiments.derived.scaling import with_memory


def sections(rows: pd.DataFrame, derived: dict, folder: Path) -> list[str]:
    """Tables per shape (length x backend), speedup, growth, the plots, the refusals."""
    rows, parts = derived["measurements"], []
    for shape, group in rows.groupby(shape_of(rows), dropna=False):
        parts.append(f"{_describe(dict(zip(shape_of(rows), shape, strict=True)), group)}:")
        parts.append(markdown(time_and_memory(group)))
    hidden = sorted(set(shape_of(rows)) - set(_varying(rows)))
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
                    figure["layout"]["yaxis"]["title"]["text"] = plain(f"{kinds} (MiB)")
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


def _varying(rows: pd.DataFrame) -> list[str]:
    """The shape columns that tell this sweep's points apart: the device, and what varies."""
    return [c for c in shape_of(rows) if c == "device_used" or rows[c].nunique(dropna=False) > 1]


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
