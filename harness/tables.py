"""A sweep's rows as tables: every planned point (one without rows as a "not run" row), the
experiment's declared pivot, and Markdown. Plain pandas, for the end-of-sweep summary and the
report alike."""

from collections.abc import Mapping

import pandas as pd

MISSING = "—"
TABLE_KEYS = ("index", "columns", "values")  # an experiment's `table`: column names


def planned(rows: pd.DataFrame, points: list[dict] | None) -> pd.DataFrame:
    """The sweep's rows, and a "not run" row (its parameters, no measurement) for each planned
    point that has none: what claims and derived tables are computed over."""
    landed = set(rows["job"]) if "job" in rows and not rows.empty else set()
    absent = [
        {"job": point["job"], "status": "not run", **_cell(point), **point.get("params", {})}
        for point in points or []
        if point["job"] not in landed
    ]
    frames = [frame for frame in (rows, pd.DataFrame(absent)) if not frame.empty]
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else (frames or [rows])[0]


def _cell(point: dict) -> dict:
    """A search's trial's cell (harness.search), for its "not run" row."""
    return {"cell": point["cell"]} if point.get("cell") is not None else {}


def validate_table(spec) -> None:
    """Refuse, with a ValueError of one line, an experiment's `table` that is not a mapping of
    `index`, `columns` and `values` to column names (None: no table)."""
    if spec is None:
        return
    if not isinstance(spec, Mapping):
        raise ValueError(f"table must be a mapping of {', '.join(TABLE_KEYS)}, not {spec!r:.60}")
    for key in TABLE_KEYS:
        if key not in spec:
            raise ValueError(f"table has no {key} (it needs {', '.join(TABLE_KEYS)}: column names)")
        if not isinstance(spec[key], str):
            raise ValueError(f"table's {key} must be a column name, not {spec[key]!r:.60}")


def sweep_table(rows: pd.DataFrame, config: dict, params: list[str] = ()) -> pd.DataFrame | None:
    """The experiment's declared pivot (e.g. length x block of max_abs_diff) of ok rows; where
    other parameters (of `params`) vary too, each cell is the largest over them, as it says.
    None without one, or for a spec that cannot work (validate_table) or names absent columns."""
    spec = config.get("table")
    try:
        validate_table(spec)
    except ValueError:
        return None
    if not spec or rows.empty or not all(spec[key] in rows for key in TABLE_KEYS):
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
    """A table as Markdown, numbers to three digits, gaps as a dash, text escaped (_as_text);
    an index of several levels as a column each (not as tuples)."""
    if index and isinstance(table.index, pd.MultiIndex):
        table, index = table.reset_index(), False
    cells = table.map(_as_text).astype(object).where(table.notna(), None)
    if index and not isinstance(table.index, pd.RangeIndex):
        cells.index = table.index.map(_as_text)
    return cells.to_markdown(floatfmt=floatfmt, missingval=MISSING, index=index)


def _as_text(value):
    """A cell as Markdown text: a string's brackets and pipes escaped, so that a value (an
    error, a tag) never becomes a link, an image or a column of the table; others as they are."""
    if not isinstance(value, str):
        return value
    return value.replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]").replace("|", "\\|")
