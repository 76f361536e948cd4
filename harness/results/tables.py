"""A sweep's rows as tables: every planned point (one without rows as a "not run" row), the
experiment's declared pivot, and Markdown. Plain pandas, for the end-of-sweep summary and the
report alike."""

from collections.abc import Mapping

import pandas as pd

from harness.names import closest, refuse_typo, setting
from harness.results import expressions, runs

MISSING = "—"
TABLE_KEYS = ("index", "columns", "values", "where", "reduce")  # an experiment's `table`


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
    """A search's trial's cell (harness.searching.search), for its "not run" row."""
    return {"cell": point["cell"]} if point.get("cell") is not None else {}


def validate_table(spec) -> None:
    """Refuse, with a ValueError of one line, an experiment's `table` that is not a mapping of
    `index` (a column name, or a list of them), `values` (a column name) and, optionally,
    `columns` (a name or a list) to columns no two of its keys share (None: no table)."""
    if spec is None:
        return
    if not isinstance(spec, Mapping):
        raise ValueError(f"table must be a mapping of {', '.join(TABLE_KEYS)}, not {spec!r:.60}")
    unknown = sorted(str(key) for key in spec if key not in TABLE_KEYS)
    if unknown:
        raise ValueError(f"table takes {', '.join(TABLE_KEYS)}, not {', '.join(unknown)}")
    for key in ("index", "values"):
        if key not in spec:
            raise ValueError(
                f"table has no {key} (it needs index and values, and may have columns: "
                "column names)"
            )
    if not isinstance(spec["values"], str):
        raise ValueError(f"table's values must be a column name, not {spec['values']!r:.60}")
    if spec.get("reduce") is not None and spec["reduce"] not in runs.REDUCERS:
        raise ValueError(f"table's reduce is one of {', '.join(runs.REDUCERS)}, not "
                         f"{spec['reduce']!r:.40}")  # fmt: skip
    if spec.get("where") is not None:
        if not isinstance(spec["where"], str):
            raise ValueError(f"table's where must be a condition, not {spec['where']!r:.60}")
        expressions.parse(spec["where"])
    index, columns = table_axes(spec)
    for key, names in (("index", index), ("columns", columns)):
        named = all(isinstance(name, str) and name for name in names)
        if not named or (key == "index" and not names):
            raise ValueError(
                f"table's {key} must be a column name or a list of them, not {spec.get(key)!r:.60}"
            )
    named = [spec["values"], *index, *columns]
    twice = sorted({name for name in named if named.count(name) > 1})
    if twice:
        raise ValueError(f"table names {', '.join(twice)} twice: each column in one place")


def check_table_names(spec, names: list[str]) -> None:
    """ValueError for a valid `table` whose index or columns name what is no parameter of
    `names` but a typo of one (harness.names.typo_of), said before anything runs (others are the
    experiment's metrics, known once it ran: absent_columns says so then)."""
    if not spec:
        return
    index, columns = table_axes(spec)
    for name in [*index, *columns]:  # its values are a metric, whatever their name is near
        if name not in names:
            refuse_typo("table", name, names)


def absent_columns(rows: pd.DataFrame, spec) -> str:
    """What a `table` names that the sweep's rows lack, or its `where` that cannot be judged on
    them, in a line ("" where they have it all, or where no row has a measurement yet): `table
    names max_abs_dif, which no row has; did you mean max_abs_diff?`."""
    try:
        validate_table(spec)
    except ValueError as error:
        return str(error)
    if not spec or rows.empty or ("status" in rows and not (rows["status"] == "ok").any()):
        return ""
    index, columns = table_axes(spec)
    absent = [name for name in [*index, *columns, spec["values"]] if name not in rows]
    if not absent and spec.get("where"):
        try:
            expressions.holds(spec["where"], rows, "table's where")
        except expressions.ExpressionError as error:
            return f"table's where: {error}"
    if not absent:
        return ""
    which = "which no row has" if len(absent) == 1 else "which no rows have"
    return f"table names {', '.join(absent)}, {which}{closest(absent[0], rows.columns)}"


def validate_plots(spec) -> None:
    """Refuse, with a ValueError of one line, an experiment's `plots` (the metrics its page
    plots, in order) that is not a list of column names (None: the page chooses)."""
    if spec is None:
        return
    if not isinstance(spec, list) or not all(isinstance(n, str) and n for n in spec):
        raise ValueError(f"plots must be a list of metrics (column names), not {spec!r:.60}")


def table_axes(spec: Mapping) -> tuple[list[str], list[str]]:
    """A valid `table`'s index and columns, each as a list of column names."""

    def listed(names) -> list[str]:
        return list(names) if isinstance(names, list) else [names] if names else []

    return listed(spec["index"]), listed(spec.get("columns"))


def sweep_table(rows: pd.DataFrame, config: dict, params: list[str] = ()) -> pd.DataFrame | None:
    """The experiment's declared pivot of ok rows (those its `where` holds for): its values by
    its index (one parameter or several), and by its columns where it names some (e.g.
    max_abs_diff, length by block). Each point gives one value, its `reduce` over its rows:
    `last` by default for a training run (rows with a step: its final value, harness.results.
    runs), the largest otherwise; where other parameters (of `params`) vary too, each cell is
    the largest over them. Its caption (attrs["caption"]) says all of it. Rows and columns in
    the grid's order, a failed point a gap. None without one, or for a spec that cannot work
    (validate_table) or names absent columns."""
    spec = config.get("table")
    try:
        validate_table(spec)
    except ValueError:
        return None
    if not spec:
        return None
    index, columns = table_axes(spec)
    values = spec["values"]
    if rows.empty or not all(name in rows for name in [*index, *columns, values]):
        return None
    ok = rows[rows["status"] == "ok"]
    if spec.get("where"):
        try:
            ok = ok[expressions.holds(spec["where"], ok, "table's where")]
        except expressions.ExpressionError:  # absent_columns says why
            return None
    stepped = runs.stepped(ok)
    if stepped:  # a run that did not end ok has no final value: a gap, not its last step's
        ended = rows.groupby(runs.point_columns(rows))["status"].transform(
            lambda s: (s == "ok").all()
        )
        ok = ok[ended.loc[ok.index]]
    how = spec.get("reduce") or ("last" if stepped else "max")
    each = runs.reduce(ok, values, how, [*index, *columns])  # a point's rows of one cell
    table = each.pivot_table(index=index, columns=columns or None, values=values, aggfunc="max")
    in_grid_order = rows.sort_values("job")
    table = table.reindex(index=_in_order(in_grid_order, index))  # failed points: gaps
    if columns:
        table = table.reindex(columns=_in_order(in_grid_order, columns))
    else:
        table = table.reindex(columns=[values])
    shown = f"{values} by {', '.join(index)}"
    if columns:
        shown = f"{values}, {', '.join(index)} (rows) by {', '.join(columns)} (columns)"
    if spec.get("reduce") or how == "last":  # not the largest of a plain sweep's rows
        shown += f", {REDUCED[how]}"
    if spec.get("where"):
        shown += f", where {spec['where']}"
    hidden = [p for p in params if p in rows and p not in [*index, *columns, values]
              and rows[p].nunique() > 1]  # fmt: skip
    if hidden:
        shown += f", the largest over {', '.join(hidden)}"
    table.attrs["caption"] = shown
    return table


REDUCED = {"last": "each point's last row", "min": "each point's least", "max": "each point's "
           "largest", "mean": "each point's mean"}  # fmt: skip


def _in_order(rows: pd.DataFrame, names: list[str]) -> pd.Index:
    """The values (or combinations of values) of `names` in the order the rows first hold them."""
    if len(names) == 1:
        return pd.Index(rows[names[0]].drop_duplicates(), name=names[0])
    return pd.MultiIndex.from_frame(rows[names].drop_duplicates())


WIDTH = 120  # characters: the sweep's table wider than this is folded (on the terminal, REPORT.md)


def markdown(table: pd.DataFrame, floatfmt: str = ".3g", index: bool = True,
             width: int | None = None) -> str:  # fmt: skip
    """A table as Markdown, numbers to three digits, gaps as a dash, text escaped (_as_text);
    an index of several levels as a column each, and columns of several levels each headed by
    its settings (dtype=float32 cap=30), not as tuples. One wider than `width` characters is
    folded: tables of as many of its columns as fit, one after another, each with the index
    (None: never)."""
    whole = _markdown(table, floatfmt, index)
    if width is None or len(table.columns) < 2 or max(map(len, whole.splitlines())) <= width:
        return whole
    folds, fold = [], []
    for position in range(len(table.columns)):
        wider = _markdown(table.iloc[:, [*fold, position]], floatfmt, index)
        if fold and max(map(len, wider.splitlines())) > width:
            folds.append(fold)
            fold = []
        fold.append(position)
    parts = [_markdown(table.iloc[:, part], floatfmt, index) for part in [*folds, fold]]
    return "\n\n".join(parts)


def _markdown(table: pd.DataFrame, floatfmt: str, index: bool) -> str:
    if isinstance(table.columns, pd.MultiIndex):
        names = table.columns.names
        heads = [" ".join(map(setting, names, key)) for key in table.columns]
        table = table.set_axis(heads, axis=1)
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
