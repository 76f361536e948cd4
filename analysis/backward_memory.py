"""exp016_backward_memory in the report: forward + backward memory per method and length, its
growth per doubling (4x is the square, 2x linear), and a log-log plot."""

from pathlib import Path

import pandas as pd

from analysis.report import markdown
from analysis.scaling import loglog, per_doubling, with_memory

SHAPE = ["device", "dtype", "batch", "heads", "kv_heads", "head_dim", "causal", "window"]


def tables(rows: pd.DataFrame) -> dict[str, pd.DataFrame]:
    data = with_memory(rows)
    keys = [column for column in SHAPE if column in data] + ["method"]
    return {
        "measurements": data,
        "growth": per_doubling(data, keys, {"memory_mib": "memory_growth"}),
    }


def sections(rows: pd.DataFrame, derived: dict, folder: Path) -> list[str]:
    """Memory by length and method, its growth per doubling, the plot."""
    data = derived["measurements"]
    if data.empty:
        return []
    kind = "/".join(data["memory_kind"].unique())
    order = rows.sort_values("job")["method"].drop_duplicates()
    memory = data.pivot_table(index="length", columns="method", values="memory_mib")
    growth = derived["growth"].pivot_table(index="length", columns="method", values="memory_growth")
    plot = loglog(data, "memory_mib", ["method"], "device", folder / "exp016_backward_memory.png")
    return [
        f"Forward + backward memory ({kind}, MiB) by length and method:",
        markdown(memory.reindex(columns=order), ".4g"),
        "Growth per doubling of length (memory at L / memory at L/2; 4 is the square, 2 linear):",
        markdown(growth.reindex(columns=order), ".2f"),
        f"![forward + backward memory vs length]({plot.name})",
    ]
