"""How measurements scale with length, drawn: log-log plots of a column against length (the
tables are octlm_experiments.derived.scaling's). Shared by the reports that compare methods (SDPA
backends, attention paths) across lengths."""

from pathlib import Path

import matplotlib.ticker
import pandas as pd
from matplotlib.figure import Figure  # drawn to a file: no pyplot, no backend to choose

from harness.names import setting


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
