"""How measurements scale with length: memory named for what it is, ratios per doubling, plots.

Shared by the experiments whose reports compare methods (SDPA backends, attention paths)
across lengths.
"""

from pathlib import Path

import matplotlib.ticker
import pandas as pd
from matplotlib.figure import Figure  # drawn to a file: no pyplot, no backend to choose

from harness.names import setting

MEMORY = ["cuda_peak_mib", "rss_delta_mib"]  # a row has one of these, named for what it is


def with_memory(rows: pd.DataFrame) -> pd.DataFrame:
    """Every row (planned points without a measurement too, see analysis.claims.planned), with
    memory_mib, memory_kind (the column it came from) and memory_over_inputs; the measurements
    of a row that is not ok are missing (NaN), so that what is derived from them is too."""
    data = rows.copy()
    measured = [c for c in ("time_ms", "inputs_mib", *MEMORY) if c in data]
    data[measured] = data[measured].where(data["status"] == "ok")
    kinds = [column for column in MEMORY if column in data]
    memory = data[kinds].bfill(axis=1).iloc[:, 0] if kinds else pd.Series(float("nan"), data.index)
    data["memory_kind"] = (
        data[kinds].notna().idxmax(axis=1).where(memory.notna()) if kinds else None
    )
    data["memory_mib"] = memory
    if "inputs_mib" in data:
        data["memory_over_inputs"] = data["memory_mib"] / data["inputs_mib"]
    return data


def keys(rows: pd.DataFrame, shape: list[str], others: list[str]) -> list[str]:
    """What tells a sweep's measurements apart besides length: the shape columns it has, and
    any other parameter that varies in it (so that no two points share a key)."""
    varying = [c for c in others if c in rows and rows[c].nunique(dropna=False) > 1]
    return [c for c in shape if c in rows] + varying


def per_doubling(data: pd.DataFrame, keys: list[str], ratios: dict[str, str]) -> pd.DataFrame:
    """Per group of `keys`: each column at length L over its value at L/2, for every L whose L/2
    was planned too; missing (NaN) where either point has no value, so that a claim on the
    ratio sees the gap.

    ratios maps a column to the name of its ratio, e.g. {"memory_mib": "memory_growth"}.
    """
    if data.empty:
        return pd.DataFrame(columns=[*keys, "length", *ratios.values()])
    indexed = data.set_index(keys + ["length"])
    if not indexed.index.is_unique:
        raise ValueError(f"two measurements share {', '.join(keys)} and length")
    half = indexed.rename(index=lambda length: length * 2, level="length")
    both = indexed.index.intersection(half.index)
    growth = pd.DataFrame(
        {name: indexed.loc[both, c] / half.loc[both, c] for c, name in ratios.items() if c in data},
        index=both,
    )
    return growth.reset_index()


def speedup_over(data: pd.DataFrame, keys: list[str], by: str, baseline: str) -> pd.DataFrame:
    """Per `keys` and length, for each value of `by` other than `baseline`: the baseline's
    median time over its own (speedup_over_BASELINE), missing where either has no time; no
    line where the baseline was not planned."""
    keys, name = keys + ["length"], f"speedup_over_{baseline}"
    if "time_ms" not in data:  # no point has a time yet
        data = data.assign(time_ms=float("nan"))
    base = data.loc[data[by] == baseline, keys + ["time_ms"]]
    others = data.loc[data[by] != baseline, keys + [by, "time_ms"]]
    paired = others.merge(base, on=keys, suffixes=("", "_base"))
    paired[name] = paired["time_ms_base"] / paired["time_ms"]
    return paired[[*keys, by, name]]


def loglog(data: pd.DataFrame, column: str, lines: list[str], panels: str, path: Path) -> Path:
    """`column` against length, log-log: a panel per value of `panels` (titled "panels value"
    when it is a number), sharing their y range; a line per value of the `lines` columns that
    vary (named by those alone, e.g. "method=tiled window=64"), none for a series without a
    value; a median time's interquartile range as error bars (time_iqr_ms)."""
    values = sorted(data[panels].unique())
    figure = Figure(figsize=(6 * len(values), 4))
    axes = figure.subplots(1, len(values), squeeze=False, sharey=True)
    named = [c for c in lines if data[c].astype(str).nunique() > 1] or lines[:1]
    for axis, value in zip(axes[0], values, strict=True):
        panel = data[(data[panels] == value) & data[column].notna()]
        for label, line in panel.groupby(named):
            line = line.groupby("length")[[c for c in (column, "time_iqr_ms") if c in line]]
            line = line.median()
            parts = label if isinstance(label, tuple) else (label,)
            name = " ".join(setting(k, v) for k, v in zip(named, parts, strict=True))
            spread = (
                line["time_iqr_ms"] / 2 if column == "time_ms" and "time_iqr_ms" in line else None
            )
            axis.errorbar(line.index, line[column], yerr=spread, marker="o", label=name, capsize=2)
        axis.set_xscale("log")
        axis.set_yscale("log")
        name = value if isinstance(value, str) else f"{panels} {value}"
        axis.set(title=str(name), xlabel="length", ylabel=_label(panel, column))
        axis.set_xticks(sorted(panel["length"].unique()))
        axis.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        axis.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        axis.grid(True, which="both", alpha=0.3)
        if panel.size:
            axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    return path


def _label(panel: pd.DataFrame, column: str) -> str:
    if column == "memory_mib":
        return f"{'/'.join(panel['memory_kind'].dropna().unique())} (MiB)"
    return {"time_ms": "median time (ms; bars: IQR)"}.get(column, column)
