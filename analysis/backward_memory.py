"""exp016_backward_memory in the report: forward + backward memory per method and length, its
growth per doubling (4x is the square, 2x linear: octlm_experiments.derived.backward_memory's
tables), and a log-log plot."""

from pathlib import Path

import pandas as pd

from harness.results.tables import markdown
from octlm_analysis import plots
from octlm_analysis.scaling import loglog
from octlm_experiments.derived.backward_memory import OTHERS, SHAPE
from octlm_experiments.derived.scaling import keys


def figures(rows: pd.DataFrame, derived: dict) -> list[dict]:
    """Forward + backward memory against length, a line per method and setting that varies."""
    data = derived["measurements"]
    kinds = "/".join(data["memory_kind"].dropna().unique()) or "memory"
    series = ["method", *keys(rows, SHAPE, OTHERS)]
    name = f"forward + backward memory ({kinds}) against length"
    figure = plots.lines(data, "length", "memory_mib", series, name, ["job", *series])
    if figure is None:
        return []
    figure["layout"]["yaxis"]["title"]["text"] = plots.plain(f"{kinds} (MiB)")
    return [figure]


def sections(rows: pd.DataFrame, derived: dict, folder: Path) -> list[str]:
    """Per setting: memory by length and method, its growth per doubling; then the plot."""
    data, growth = derived["measurements"], derived["growth"]
    if data.empty:
        return []
    order = rows.sort_values("job")["method"].drop_duplicates()
    varying = [c for c in keys(rows, SHAPE, OTHERS) if rows[c].nunique(dropna=False) > 1]
    parts = []
    for setting, group in data.groupby(varying, dropna=False) if varying else [((), data)]:
        label = "".join(f", {k} {v}" for k, v in zip(varying, setting, strict=True))
        kind = "/".join(group["memory_kind"].unique())
        mine = growth.merge(group[varying].drop_duplicates()) if varying else growth
        memory = group.pivot_table(index="length", columns="method", values="memory_mib")
        ratios = mine.pivot_table(index="length", columns="method", values="memory_growth")
        parts += [
            f"Forward + backward memory ({kind}, MiB) by length and method{label}:",
            markdown(memory.reindex(columns=order), ".4g"),
            "Growth per doubling (memory at L / memory at L/2; 4 is the square, 2 linear):",
            markdown(ratios.reindex(columns=order), ".2f"),
        ]
    plot = loglog(data, "memory_mib", ["method", *varying], "device",
                  folder / "exp016_backward_memory.png")  # fmt: skip
    return [*parts, f"![forward + backward memory vs length]({plot.name})"]
