"""Claims: bounds on a sweep's measurements, checked over every point the sweep planned.

A claim (an experiment config's `claims`) is {metric, min and/or max, where, table, text}.
`where` (a pandas query) selects among the sweep's PLANNED points (its manifest), not only the
ones with rows, in the rows or in a table the experiment's report module derives (`table`; the
default is the rows). A bound is a number, or an expression over the table's columns evaluated
row by row (FlashAttention's rule: `max: 2 * sdpa_err64 + 1.0e-6`), or a list of these that
must all hold (`max: [2 * sdpa_err64 + 1.0e-6, 1.0e-5]`).

- PASS: every selected point has a value, and every value meets the bounds.
- FAIL: some value breaks a bound.
- INCOMPLETE: no value breaks a bound, but some selected points have none (not run, failed,
  killed, oom, timeout, or unsupported where the claim needs a number); they are named.
- N/A: `where` selects none of the planned points.
- ERROR: the claim cannot be evaluated (a where or a bound that names no column of the table).

Only ok rows carry values: a metric on a row of any other status counts as missing.
"""

import importlib
import math

import pandas as pd

from harness.tables import MISSING, planned

FAILING = ("FAIL", "INCOMPLETE", "ERROR")  # the results that make --check exit 1
COLUMNS = ["claim", "result", "worst", "points", "missing"]
NAMED = 5  # missing points named in full, then a count


def report_module(config: dict):
    """The experiment's own report module (config `report`), or None."""
    return importlib.import_module(config["report"]) if config.get("report") else None


def derived_tables(rows: pd.DataFrame, config: dict) -> dict[str, pd.DataFrame]:
    """The rows, and the tables the experiment's report module derives from them, by name."""
    module = report_module(config)
    return {"rows": rows, **(module.tables(rows) if module and not rows.empty else {})}


def claims_table(
    rows: pd.DataFrame, config: dict, points: list[dict] | None = None
) -> pd.DataFrame:
    """One line per claim of `config`, over the sweep's planned `points` (None: the rows are
    the plan): result, the values' range, how many points have a value, the missing ones."""
    return claims_of(derived_tables(planned(rows, points), config), config)


def claims_of(tables: dict[str, pd.DataFrame], config: dict) -> pd.DataFrame:
    """claims_table's lines from tables already derived (derived_tables of the planned rows)."""
    lines = [check(tables, claim) for claim in config.get("claims") or []]
    return pd.DataFrame(lines, columns=COLUMNS)


def check(tables: dict[str, pd.DataFrame], claim: dict) -> dict:
    """One claim against the tables: its line of claims_table."""
    text = describe(claim)
    table = tables.get(claim.get("table", "rows"), pd.DataFrame())
    try:
        selected = table.query(claim["where"]) if claim.get("where") and len(table) else table
        if selected.empty:
            return _line(text, "N/A", MISSING, "0 of 0")
        values = _values(selected, claim["metric"])
        low = _bound(selected, claim.get("min"), -math.inf, "max")
        high = _bound(selected, claim.get("max"), math.inf, "min")
    except Exception as error:  # a where or bound that names no column of the table
        return _line(text, "ERROR", f"{type(error).__name__}: {error}", MISSING)
    known = values.notna() & low.notna() & high.notna()
    broken = known & ~values.between(low, high)
    result = "FAIL" if broken.any() else ("INCOMPLETE" if not known.all() else "PASS")
    worst = _worst(values[broken] if broken.any() else values[known], claim)
    points = f"{int(known.sum())} of {len(selected)}"
    return _line(text, result, worst, points, _name(table, selected[~known]))


def describe(claim: dict) -> str:
    """The claim's text and its bounds: "tiled matches (tiled_err64 <= 2 * sdpa_err64 + 1e-06)"."""
    bounds = " and ".join(
        f"{claim['metric']} {op} {_number(bound)}"
        for key, op in (("min", ">="), ("max", "<="))
        for bound in _listed(claim.get(key))
    )
    return f"{claim['text']} ({bounds})" if claim.get("text") else bounds


def outcome(line) -> str:
    """A claims_table line's outcome in words: the worst value, how many points have a value,
    and which lack one; for an ERROR, what went wrong."""
    if line.result == "ERROR":
        return line.worst
    if line.result == "N/A":
        return "it selects no point of this sweep"
    said = f"worst {line.worst}, {line.points} points have a value"
    return f"{said}; none for {line.missing}" if line.missing else said


def _values(table: pd.DataFrame, metric: str) -> pd.Series:
    """The metric where the row is ok; missing (NaN) elsewhere, and where the column is absent."""
    if metric not in table:
        return pd.Series(math.nan, index=table.index)
    values = pd.to_numeric(table[metric], errors="coerce").astype(float)
    return values.where(table["status"] == "ok") if "status" in table else values


def _bound(table: pd.DataFrame, bound, default: float, tightest: str) -> pd.Series:
    """A bound per row: a number or an expression over the table's columns; of a list, the
    tightest ("max" of lower bounds, "min" of upper ones), missing where any is."""
    values = [
        pd.to_numeric(table.eval(b), errors="coerce").astype(float)
        if isinstance(b, str)
        else pd.Series(float(b), index=table.index)
        for b in _listed(bound)
    ]
    if not values:
        return pd.Series(default, index=table.index)
    combined = pd.concat(values, axis=1)
    return getattr(combined, tightest)(axis=1, skipna=False)


def _listed(bound) -> list:
    """A claim's min or max as a list of bounds (none, one, or several)."""
    return [] if bound is None else list(bound) if isinstance(bound, list | tuple) else [bound]


def _worst(values: pd.Series, claim: dict) -> str:
    """The value furthest toward the bound the claim has (both: the range)."""
    if values.empty:
        return MISSING
    if claim.get("min") is not None and claim.get("max") is not None:
        return f"{values.min():.3g} to {values.max():.3g}"
    return f"{(values.max() if claim.get('max') is not None else values.min()):.3g}"


def _name(table: pd.DataFrame, missing: pd.DataFrame) -> str:
    """The points without a value: by job and status in the rows; in a derived table, by the
    columns (not measurements) that tell the table's lines apart."""
    if missing.empty:
        return ""
    if "job" in missing:
        statuses = missing["status"] if "status" in missing else ["no value"] * len(missing)
        names = [f"job {j} ({s})" for j, s in zip(missing["job"], statuses, strict=True)]
    else:
        keys = [
            c for c in table if not pd.api.types.is_float_dtype(table[c]) and table[c].nunique() > 1
        ]
        names = [" ".join(f"{k}={row[k]}" for k in keys) for _, row in missing.iterrows()]
    names = list(dict.fromkeys(names))
    more = f" and {len(names) - NAMED} more" if len(names) > NAMED else ""
    return ", ".join(names[:NAMED]) + more


def _line(claim: str, result: str, worst: str, points: str, missing: str = "") -> dict:
    return {"claim": claim, "result": result, "worst": worst, "points": points, "missing": missing}


def _number(bound) -> str:
    return bound if isinstance(bound, str) else f"{bound:g}"
