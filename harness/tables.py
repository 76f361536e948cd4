"""A sweep's rows as tables: every planned point (one without rows as a "not run" row), the
experiment's declared pivot, and Markdown. Plain pandas, for the end-of-sweep summary and the
report alike."""

import pandas as pd

MISSING = "—"


def planned(rows: pd.DataFrame, points: list[dict] | None) -> pd.DataFrame:
    """The sweep's rows, and a "not run" row (its parameters, no measurement) for each planned
    point that has none: what claims and derived tables are computed over."""
    landed = set(rows["job"]) if "job" in rows and not rows.empty else set()
    absent = [
        {"job": point["job"], "status": "not run", **point.get("params", {})}
        for point in points or []
        if point["job"] not in landed
    ]
    frames = [frame for frame in (rows, pd.DataFrame(absent)) if not frame.empty]
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else (frames or [rows])[0]


def sweep_table(rows: pd.DataFrame, config: dict, params: list[str] = ()) -> pd.DataFrame | None:
    """The experiment's declared pivot (e.g. length x block of max_abs_diff) of ok rows; where
    other parameters (of `params`) vary too, each cell is the largest over them, as it says."""
    spec = config.get("table")
    if not spec or rows.empty or spec["values"] not in rows:
        return None
    ok = rows[rows["status"] == "ok"]
    table = ok.pivot_table(
        index=spec["index"], columns=spec["columns"], values=spec["values"], aggfunc="max"
    )
    in_grid_order = rows.sort_values("job")
    index = in_grid_order[spec["index"]].drop_duplicates()
    columns = in_grid_order[spec["columns"]].drop_duplicates()
    table = table.reindex(index=index, columns=columns)  # grid order; failed points show as gaps
    table.columns.name = f"{spec['values']}, {spec['index']} (rows) by {spec['columns']} (columns)"
    hidden = [p for p in params if p in rows and p not in spec.values() and rows[p].nunique() > 1]
    if hidden:
        table.columns.name += f", the largest over {', '.join(hidden)}"
    return table


def markdown(table: pd.DataFrame, floatfmt: str = ".3g", index: bool = True) -> str:
    """A table as Markdown, numbers to three digits, gaps as a dash."""
    cells = table.astype(object).where(table.notna(), None)
    return cells.to_markdown(floatfmt=floatfmt, missingval=MISSING, index=index)
