"""Claims: bounds on a sweep's measurements, checked over every point the sweep planned.

A claim (an experiment config's `claims`) is {metric, min and/or max, where, needs, table,
text}. `where` (a condition such as `dtype == 'float32' and length > 1`) selects among the
sweep's PLANNED points (its manifest), not only the ones with rows, in the rows or in a table
the experiment derives from them (`table`; the default is the rows): its config's `derive` names
a function of the rows that returns its tables by name (octlm_experiments.derived.backends.tables),
of
the experiments' layer and pandas only, so that the harness checks the claims at a sweep's end
and the report shows them without the harness importing the report's code or the report the code
that measures. A bound is a number, or an expression over the table's columns evaluated row by
row (FlashAttention's rule: `max: 2 * sdpa_err64 + 1.0e-6`), or a list of these that must all
hold (`max: [2 * sdpa_err64 + 1.0e-6, 1.0e-5]`). `needs` is what a selected line must have for
its value to count (`needs: compared_steps >= 100`: a loss compared over fewer steps proves
less); a line without it counts as missing, and the INCOMPLETE line says what it has and what
the claim needs. Wheres, needs and bounds are read by harness.results.expressions, a grammar of
numbers, strings, column names, arithmetic, comparisons and and/or/not that can call nothing: a
manifest is anyone's to edit, and pandas' query and eval would run its code.

- PASS: every selected point has a value, and every value meets the bounds.
- FAIL: some value breaks a bound.
- INCOMPLETE: no value breaks a bound, but some selected points have none (not run, failed,
  killed, oom, timeout, or unsupported where the claim needs a number); they are named.
- N/A: `where` selects none of the planned points.
- ERROR: the claim cannot be evaluated (a where or a bound outside the grammar, or one that
  names no column of the table; a metric that no answered row has, a typo say), the columns
  nearest the name it gives said; or a bound is no finite number on a row whose columns it reads
  all are (a division by zero: an upper bound of inf passes anything), the row named.

Only ok rows carry values: a metric on a row of any other status counts as missing. What a
claim may say, checked before a sweep runs, is harness.results.claim_spec's (validate).
"""

import math

import pandas as pd

from harness.names import closest, setting
from harness.results import expressions, runs
from harness.results.claim_spec import (
    HARNESS_TABLES,
    checked_bound,
    count_bounds,
    deriving,
    listed,
)
from harness.results.claim_spec import validate as validate  # planning checks claims by it
from harness.results.tables import MISSING, planned
from harness.searching import search
from harness.store import HARNESS_COLUMNS, parameter_columns

FAILING = ("FAIL", "INCOMPLETE", "ERROR")  # the results that make --check exit 1
COLUMNS = ["claim", "result", "worst", "points", "passes", "failing", "missing"]
NAMED = 5  # missing points named in full, then a count


def derived_tables(rows: pd.DataFrame, config: dict) -> dict[str, pd.DataFrame]:
    """The rows, and the tables the experiment derives from them (`derive`), by name."""
    derive = deriving(config)
    tables = {"rows": rows, **(derive(rows) if derive and not rows.empty else {})}
    if config.get("search"):  # each cell's best trial (harness.searching.search)
        tables["best"] = search.best_rows(rows, config["search"])
    return tables


def claims_table(
    rows: pd.DataFrame, config: dict, points: list[dict] | None = None
) -> pd.DataFrame:
    """One line per claim of `config`, over the sweep's planned `points` (None: the rows are
    the plan): result, the values' range, how many points have a value and how many pass, the
    failing points with their values and bounds, the missing ones."""
    return claims_of(derived_tables(planned(rows, points), config), config, parameters(points))


def parameters(points: list[dict] | None) -> list[str]:
    """The parameters of a sweep's planned points (its manifest's), in order."""
    return list(dict.fromkeys(k for point in points or [] for k in point.get("params", {})))


def claims_of(
    tables: dict[str, pd.DataFrame], config: dict, params: list[str] = ()
) -> pd.DataFrame:
    """claims_table's lines from tables already derived (derived_tables of the planned rows);
    `params`: the sweep's parameters, which name a point of the rows."""
    lines = [check(tables, claim, params) for claim in config.get("claims") or []]
    return pd.DataFrame(lines, columns=COLUMNS)


class _NotFinite(ValueError):
    """A bound that is no finite number on rows whose columns it reads all are: `wrong`, its
    values there."""

    def __init__(self, bound: str, wrong: pd.Series):
        super().__init__(f"the bound {bound} is not a finite number")
        self.wrong = wrong


def check(tables: dict[str, pd.DataFrame], claim: dict, params: list[str] = ()) -> dict:
    """One claim against the tables: its line of claims_table."""
    text, name = statement(claim), claim.get("table", "rows")
    # The rows are there and the table is not (best, a search's, is N/A in a sweep without one).
    if name not in (*tables, *HARNESS_TABLES) and not tables["rows"].empty:
        names = ", ".join(tables)
        return _line(text, "ERROR", f"no table {name!r} (the tables are {names})", MISSING)
    table = tables.get(name, pd.DataFrame())
    try:
        for bound in (*listed(claim.get("min")), *listed(claim.get("max"))):
            checked_bound(bound)
        where = claim.get("where")
        selected = expressions.select(table, where) if where and len(table) else table
        selected = selected.reset_index(drop=True)  # a derived table's labels may repeat
        if selected.empty:
            return _line(text, "N/A", MISSING, "0 of 0")
        if name == "rows" and not where and runs.stepped(selected):
            count = len(runs.reduce(selected, runs.STEP, "last"))
            text += f" on every row of {count} runs, each step's (a where picks rows)"
        if claim["metric"] not in table and _answered(table):
            near = closest(claim["metric"], table.columns)
            return _line(
                text, "ERROR", f"no column {claim['metric']!r} in the {name}{near}", MISSING
            )
        values = _values(selected, claim["metric"])
        short = _short(selected, claim.get("needs")) & values.notna()
        values = values.mask(short)
        # No value anywhere: nothing to judge, whatever columns the bounds name (every point
        # failed, say, and none has a column a bound reads): INCOMPLETE, never an ERROR.
        judged = values.notna().any()
        nothing = pd.Series(math.nan, index=selected.index)
        low = _bound(selected, claim.get("min"), -math.inf, "max") if judged else nothing
        high = _bound(selected, claim.get("max"), math.inf, "min") if judged else nothing
    except _NotFinite as error:  # never a PASS, nor the point missing: name the row
        names = _names(selected, table, claim, params)
        return _line(text, "ERROR", _not_finite(error, names), MISSING)
    except Exception as error:  # a where or bound outside the grammar, or naming no column
        reason = (str(error).splitlines() or [""])[0]
        return _line(text, "ERROR", f"{type(error).__name__}: {reason}", MISSING)
    known = values.notna() & low.notna() & high.notna()
    above = known & (values > high)
    broken = above | (known & (values < low))
    result = "FAIL" if broken.any() else ("INCOMPLETE" if not known.all() else "PASS")
    worst = _worst(values[broken] if broken.any() else values[known], claim)
    points, passes = f"{int(known.sum())} of {len(selected)}", _passing(selected, known & ~broken)
    if result == "PASS":  # nothing to name
        return _line(text, result, worst, points, passes=passes)
    names = _names(selected, table, claim, params)
    failing = _failing(values[broken], above, low, high, names)
    missing = _name(selected[~known], names) + _lacking(selected[short], claim.get("needs"))
    return _line(text, result, worst, points, missing, passes, failing)


def _names(selected: pd.DataFrame, table: pd.DataFrame, claim: dict, params) -> pd.Series:
    """Each selected line's name (_point_names); without a plan, a claim on the rows names them
    by the parameters read from the rows, less the columns it judges."""
    rows = claim.get("table", "rows") in HARNESS_TABLES
    if rows and not params:
        bounds = [b for b in (*listed(claim.get("min")), *listed(claim.get("max")))
                  if isinstance(b, str)]  # fmt: skip
        judging = {claim["metric"], *(n for b in bounds for n in expressions.parse(b).names)}
        params = parameter_columns(table, judging)
    return pd.Series(_point_names(selected, params, rows), index=selected.index)


def _not_finite(error: _NotFinite, names: pd.Series) -> str:
    """The bound, the first point where it is no finite number, and how many more: "the bound
    value / (n - n) is not a finite number at n=2 x=1 (inf) and 3 more"."""
    named = dict.fromkeys(names[i] for i in error.wrong.index)
    first = error.wrong.index[0]
    more = f" and {len(named) - 1} more" if len(named) > 1 else ""
    return f"{error} at {names[first]} ({error.wrong[first]:g}){more}"


def _failing(broken: pd.Series, above, low, high, names: pd.Series) -> str:
    """The failing points, each once (at its worst row, where it has several), with its value
    and the bound it breaks: "at dtype=bfloat16 length=4096: 0.0032 > 0.0011, ..."."""
    worst_of: dict[str, tuple[float, str]] = {}
    for i, value in broken.items():
        bound, op = (high[i], ">") if above[i] else (low[i], "<")
        beyond = abs(value - bound) / (abs(bound) or 1.0)
        if beyond >= worst_of.get(names[i], (-1.0, ""))[0]:
            worst_of[names[i]] = beyond, f"at {names[i]}: {_versus(value, op, bound)}"
    failing = [said for _, said in worst_of.values()]
    more = f" and {len(failing) - NAMED} more" if len(failing) > NAMED else ""
    return ", ".join(failing[:NAMED]) + more


def _passing(selected: pd.DataFrame, passed: pd.Series) -> str:
    """How many selected points pass: each a job of the rows (all its rows passing), each a
    line of a derived table."""
    if "job" not in selected:
        return f"{int(passed.sum())} of {len(selected)}"
    failed = set(selected["job"][~passed])
    return f"{len(set(selected['job']) - failed)} of {selected['job'].nunique()}"


def _versus(value: float, op: str, bound: float) -> str:
    """A value against the bound it breaks, with digits enough to tell them apart:
    "0.00325 > 0.0011", "1.00002 > 1"."""
    for digits in range(3, 10):
        shown = f"{value:.{digits}g}", f"{bound:.{digits}g}"
        if shown[0] != shown[1]:
            return f"{shown[0]} {op} {shown[1]}"
    return f"{value!r} {op} {bound!r}"


def statement(claim: dict) -> str:
    """The claim's text, its bounds and what it needs: "tiled matches (tiled_err64 <= 2 *
    sdpa_err64 + 1e-06)", "... (max_loss_diff <= 0.0001; needs compared_steps >= 100)"."""
    bounds = " and ".join(
        f"{claim['metric']} {op} {_number(bound)}"
        for key, op in (("min", ">="), ("max", "<="))
        for bound in listed(claim.get(key))
    )
    if claim.get("needs"):
        bounds += f"; needs {claim['needs']}"
    return f"{claim['text']} ({bounds})" if claim.get("text") else bounds


def outcome(line) -> str:
    """A claims_table line's outcome in words: the worst value and how many points have a value
    (a FAIL: each failing point, its value and the bound it breaks, and how many pass), and which
    lack one; for an ERROR, what went wrong."""
    if line.result == "ERROR":
        return line.worst
    if line.result == "N/A":
        return "it selects no point of this sweep"
    said = f"worst {line.worst}, {line.points} points have a value"
    if line.result == "FAIL":  # where, by how much, and how much of the sweep holds
        said = f"{line.failing}; {line.passes} pass"
    return f"{said}; none for {line.missing}" if line.missing else said


def _answered(table: pd.DataFrame) -> bool:
    """Whether a table has a line with measurements (an ok row; any line of a derived table),
    so that a metric it lacks is a name no experiment gave, not a value none measured."""
    return bool(len(table)) and ("status" not in table or (table["status"] == "ok").any())


def _values(table: pd.DataFrame, metric: str) -> pd.Series:
    """The metric where the row is ok; missing (NaN) elsewhere, and where the column is absent."""
    if metric not in table:
        return pd.Series(math.nan, index=table.index)
    values = pd.to_numeric(table[metric], errors="coerce").astype(float)
    return values.where(table["status"] == "ok") if "status" in table else values


def _bound(table: pd.DataFrame, bound, default: float, tightest: str) -> pd.Series:
    """A bound per row: a number or an expression over the table's columns; of a list, the
    tightest ("max" of lower bounds, "min" of upper ones), missing where any is."""
    count_bounds(bound)
    values = [
        _evaluated(table, b) if isinstance(b, str) else pd.Series(float(b), index=table.index)
        for b in listed(bound)
    ]
    if not values:
        return pd.Series(default, index=table.index)
    combined = pd.concat(values, axis=1)
    return getattr(combined, tightest)(axis=1, skipna=False)


def _evaluated(table: pd.DataFrame, bound: str) -> pd.Series:
    """A bound's expression on each row; _NotFinite where it is inf or NaN though every column it
    reads is a finite number there (a division by zero, which gives inf or NaN on a column as
    pandas does: an upper bound of inf would pass anything, a NaN count the point missing).
    Where a column it reads is missing (a failed point), the bound is missing too."""
    values = pd.to_numeric(expressions.evaluate(bound, table), errors="coerce").astype(float)
    given = pd.Series(True, index=table.index)
    for name in expressions.parse(bound).names:
        given &= _finite(pd.to_numeric(table[name], errors="coerce").astype(float))
    wrong = given & ~_finite(values)
    if wrong.any():
        raise _NotFinite(bound, values[wrong])
    return values


def _finite(values: pd.Series) -> pd.Series:
    return values.abs() < math.inf  # NaN too is not


def _short(table: pd.DataFrame, needs: str | None) -> pd.Series:
    """Where a line lacks what the claim needs (never, without a needs)."""
    if not needs:
        return pd.Series(False, index=table.index)
    return ~expressions.holds(needs, table, "a needs")


def _lacking(short: pd.DataFrame, needs: str | None) -> str:
    """What the lines short of the claim's needs have: " (compared_steps=30, compared_steps=12,
    where it needs compared_steps >= 100)"."""
    if short.empty:
        return ""
    names = sorted(expressions.parse(needs).names)
    lines = (" ".join(setting(name, row[name]) for name in names) for _, row in short.iterrows())
    return f" ({', '.join(dict.fromkeys(lines))}, where it needs {needs})"


def _worst(values: pd.Series, claim: dict) -> str:
    """The value furthest toward the bound the claim has (both: the range)."""
    if values.empty:
        return MISSING
    if claim.get("min") is not None and claim.get("max") is not None:
        return f"{values.min():.3g} to {values.max():.3g}"
    return f"{(values.max() if claim.get('max') is not None else values.min()):.3g}"


def _point_names(selected: pd.DataFrame, params: list[str], rows: bool) -> list[str]:
    """Each line's name: the sweep's parameters that vary among the selected lines (dtype=bfloat16
    length=4096); in a derived table (not `rows`), also its other columns that are no
    measurement (not floats) and tell its lines apart; where nothing varies, its job or "its
    only line"."""

    def varies(column: str) -> bool:  # as text: a list parameter's values are no keys
        return selected[column].astype(str).nunique() > 1

    keys = [p for p in params if p in selected and varies(p)]
    if not rows:
        keys += [c for c in selected if c not in (*keys, *HARNESS_COLUMNS) and varies(c)
                 and not pd.api.types.is_float_dtype(selected[c])]  # fmt: skip
    if keys:
        said = [selected[k].map(lambda value, k=k: setting(k, value)) for k in keys]
        return [" ".join(parts) for parts in zip(*said, strict=True)]
    if "job" in selected:
        return [f"job {job}" for job in selected["job"]]
    return [
        "its only line" if len(selected) == 1 else f"line {i + 1}" for i in range(len(selected))
    ]


def _name(missing: pd.DataFrame, names: pd.Series) -> str:
    """The points without a value, by name (_point_names), with their status where they have one:
    "dtype=bfloat16 length=4096 (failed)"."""
    if missing.empty:
        return ""
    statuses = missing.get("status")
    listed = [
        f"{names[i]} ({statuses[i]})" if statuses is not None else names[i] for i in missing.index
    ]
    listed = list(dict.fromkeys(listed))
    more = f" and {len(listed) - NAMED} more" if len(listed) > NAMED else ""
    return ", ".join(listed[:NAMED]) + more


def _line(
    claim: str, result: str, worst: str, points: str, missing: str = "", passes: str = "",
    failing: str = "",
) -> dict:  # fmt: skip
    return {"claim": claim, "result": result, "worst": worst, "points": points, "passes": passes,
            "failing": failing, "missing": missing}  # fmt: skip


def _number(bound) -> str:
    return bound if isinstance(bound, str) else f"{bound:g}"
