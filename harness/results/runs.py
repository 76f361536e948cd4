"""A training run's value: the rows of a point that logs a `step` (a tracked training point)
summed up as trainers read them, by its last row, per `phase` where its rows have one. Plain
pandas, for the sweep's table, the report, compare and the page alike."""

import pandas as pd

STEP = "step"  # the column that makes a point's rows a run's steps
PHASE = "phase"  # the column that splits a run's rows (train, eval), where its rows have it
POINT = ("experiment", "sweep", "job")  # what one point's rows share (those the rows hold)
REDUCERS = ("last", "min", "max", "mean")


def stepped(rows: pd.DataFrame) -> bool:
    """Whether the rows are a training run's: some row of the point has a step."""
    return STEP in rows and bool(rows[STEP].notna().any())


def point_columns(rows: pd.DataFrame) -> list[str]:
    """The columns that tell the rows' points apart (of POINT, those the rows hold)."""
    return [name for name in POINT if name in rows]


def ordered(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of each point in the order of their steps, rows of one step (and rows without
    a step, a run's summary) in the order the point wrote them, which the store keeps."""
    if not stepped(rows):
        return rows
    key = rows[STEP].astype("float64").fillna(float("inf"))  # a summary row comes last
    order = key.reset_index(drop=True).sort_values(kind="stable").index
    return rows.iloc[order]


def first_rank(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of a point's rank 0 (and of points of one process): those a run of several
    processes sums up by, as its rank 0 logs the loss averaged over them."""
    return rows[rows["rank"].fillna(0) == 0] if "rank" in rows else rows


def finals(rows: pd.DataFrame, metric: str | None = None) -> pd.DataFrame:
    """A row a point and phase: each run's last row (ordered), the one that holds `metric`
    where one is named; rows of a point without steps are kept as they are. The rows' own
    order of points is kept."""
    if not stepped(rows):
        return rows if metric is None else rows[rows[metric].notna()] if metric in rows else rows
    held = first_rank(rows if metric is None or metric not in rows else rows[rows[metric].notna()])
    keys = [*point_columns(held), *([PHASE] if PHASE in held else [])]
    runs = held[held.groupby(point_columns(held), dropna=False)[STEP].transform("count") > 0]
    rest = held.drop(index=runs.index)
    last = ordered(runs).groupby(keys, dropna=False, sort=False).tail(1)
    return pd.concat([last, rest]).sort_index(kind="stable")


def reduce(rows: pd.DataFrame, metric: str, how: str, by: list[str] = ()) -> pd.DataFrame:
    """A row a point (and a value of each column of `by`: phase, a table's axes) holding
    `metric`: its last row (ordered), its value replaced by `how` of the point's values
    ("last": as it is; "min", "max", "mean" of those that are numbers); of a run of several
    processes, rank 0's rows."""
    if how not in REDUCERS:
        raise ValueError(f"reduce is one of {', '.join(REDUCERS)}, not {how!r:.40}")
    held = first_rank(rows[rows[metric].notna()] if metric in rows else rows.iloc[:0])
    if how != "last":  # numbers only: a text column's values are none
        held = held.assign(**{metric: pd.to_numeric(held[metric], errors="coerce")})
        held = held[held[metric].notna()]
    keys = [*point_columns(held), *dict.fromkeys(name for name in by if name in held)]
    last = ordered(held).groupby(keys, dropna=False, sort=False).tail(1).sort_index(kind="stable")
    if how == "last" or last.empty:
        return last
    values = held.groupby(keys, dropna=False, sort=False, as_index=False)[metric].agg(how)
    return last.drop(columns=metric).merge(values, on=keys, how="left")
