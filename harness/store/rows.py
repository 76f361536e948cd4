"""Rows as Arrow tables and the files that hold them: a job's file and its segments
written whole (harness.files), read back checked, and the columns a row may carry.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from harness import files
from harness.lifetime import per_command
from harness.store import common_schema
from harness.store.layout import HARNESS_COLUMNS, RUNNING, name_once, read_job_file, segments

if TYPE_CHECKING:  # pandas loads where a frame is made: status and compact read Arrow alone
    import pandas as pd


def metrics(row: dict, params: dict) -> dict:
    """A row's numbers (NumPy's scalars as Python's; no truth values): its columns that are
    neither parameters nor the harness's."""
    return {
        k: v.item() if isinstance(v, np.generic) else v
        for k, v in row.items()
        if k not in params
        and k not in HARNESS_COLUMNS
        and isinstance(v, int | float | np.integer | np.floating)
        and not isinstance(v, bool)
    }


def first_numbers(row: dict, params: dict, shown: int = 4) -> str:
    """A row's first few numbers, for a progress line: "step=1.2e+03 loss=0.41 ..."."""
    return " ".join(f"{k}={v:.4g}" for k, v in list(metrics(row, params).items())[:shown])


def write_rows(path: Path, rows: list[dict] | pa.Table, replacing: Iterable[Path] = ()) -> None:
    """Write one job's rows to `path` atomically: a reader sees all of them or none. The files
    `replacing` names (the job's segments) go once it is in place; signals wait meanwhile.

    They are not forced to disk (fsync costs milliseconds a point): the job's own death loses
    nothing once they landed, and after a machine crash a file that did not reach the disk
    reads as missing or damaged, so its point counts as not run and resume reruns it. What
    holds rows that exist nowhere else (a compacted file, the job files release moves out of
    one) is forced to disk before its sources go."""
    table = rows if isinstance(rows, pa.Table) else rows_to_table(rows)
    replacing = list(replacing)
    with files.uninterrupted() if replacing else contextlib.nullcontext():
        write_file(path, table, sync=False)
        for segment in replacing:
            Path(segment).unlink(missing_ok=True)


def end_segments(
    path: Path, parts: list[Path], returned: pa.Table | None, statuses: dict[int, str]
) -> list[dict]:
    """Write the job file of a training job that ended, from its segments `parts` (their rows
    settled, but the row numbers `statuses` names, which take that status), then `returned`
    (its rows in full); it replaces every segment of the job. In the memory of a segment (the
    file is written in parts, a segment a row group; damaged segments skipped), unless two of
    them hold a column of two kinds (then all at once, as `concat` reads it). The rows that
    `telling` picks, as dicts."""
    given = [(part, schema) for part in parts if (schema := _schema(part)) is not None]
    extra = [returned.schema] if returned is not None else []
    try:
        schema = pa.unify_schemas([*(s for _, s in given), *extra], promote_options="permissive")
    except (pa.ArrowTypeError, pa.ArrowInvalid, IndexError):  # an int column and a str one
        tables = [*trusted_tables(parts), *([returned] if returned is not None else [])]
        table = _with_statuses(settled_table(concat(tables)), statuses, 0)
        write_rows(path, table, replacing=segments(path))
        return telling(table)
    kept: list[Path] | None = None  # the segments the first pass read intact
    told: list[dict] = []

    def each() -> Iterator[pa.Table]:
        nonlocal kept
        checking, intact, first = kept is None, [], 0
        for part in [part for part, _ in given] if checking else kept:
            found = trusted(part)
            if found is not None:
                intact.append(part)
                table = _with_statuses(settled_table(found[0]), statuses, first)
                first += table.num_rows
                yield _told(_conformed(table, schema), told if checking else None)
        if returned is not None:
            yield _told(_conformed(returned, schema), told if checking else None)
        kept = intact if checking else kept

    def write() -> None:
        with files.uninterrupted():
            files.write_parts(path, each, schema, sync=False)
            for segment in segments(path):
                segment.unlink(missing_ok=True)

    _written(path, schema, write)
    return told


def write_file(path: Path, table: pa.Table, sync: bool = True) -> None:
    """files.write_table of a row file of the store, its columns added to the store's common
    schema first."""
    _written(path, table.schema, lambda: files.write_table(path, table, sync))


def _written(path: Path, schema: pa.Schema, write: Callable[[], None]) -> None:
    """write() the row file at `path`, once the store's common schema has its columns
    (harness.store.common_schema): a reader that sees the file sees its columns. A link where the
    schema's file or lock lies (files.Linked) is raised after the rows are written: they are
    kept, and nothing is written through it."""
    sweep = Path(path).parent
    try:
        if sweep.name.startswith("sweep=") and sweep.parent.name.startswith("experiment="):
            common_schema.keep(sweep.parent.parent, schema)
    except files.Linked:
        write()
        raise
    write()


def telling(table: pa.Table) -> list[dict]:
    """The rows of a point's table that a summary reads (harness.running.job.summarize): those with
    a status other than ok or an error, in order, then the last."""
    if "status" not in table.column_names:
        return []
    notable = pc.not_equal(table["status"], "ok")
    if "error" in table.column_names:
        notable = pc.or_kleene(notable, pc.is_valid(table["error"]))
    last = table.slice(table.num_rows - 1) if table.num_rows else table
    return [*table.filter(notable).to_pylist(), *last.to_pylist()]


def _told(table: pa.Table, told: list[dict] | None) -> pa.Table:
    """The table, its `telling` rows added to `told` (the last row only while it is last)."""
    if told is not None and table.num_rows:
        told[:] = [*told[:-1], *telling(table)]
    return table


def _schema(path: Path) -> pa.Schema | None:
    try:
        return pq.read_schema(path).remove_metadata()
    except Exception:  # a damaged file: whatever reading its footer raises; read skips it too
        return None


def _conformed(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """The table in `schema`: its columns cast (an int as a float), the missing ones null."""
    count = table.num_rows
    columns = [
        table[f.name].cast(f.type) if f.name in table.column_names else pa.nulls(count, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def _with_statuses(table: pa.Table, statuses: dict[int, str], first: int) -> pa.Table:
    """The rows numbered (from `first`) in `statuses` with that status."""
    own = {n - first: s for n, s in statuses.items() if first <= n < first + table.num_rows}
    if not own:
        return table
    listed = table["status"].to_pylist()
    for number, status in own.items():
        listed[number] = status
    return _with_status(table, pa.array(listed, pa.string()))


def job_table(path: Path) -> pa.Table:
    """The rows of a job by the reading rule: its own file, else its segments in order (those
    that are damaged skipped, named on stderr); none when it has neither or is damaged."""
    if Path(path).exists():
        return concat(trusted_tables([Path(path)]))
    return concat(trusted_tables(segments(path)))


def trusted_tables(paths: Iterable[Path]) -> list[pa.Table]:
    """The rows of each file, in order, but those that are damaged (named on stderr)."""
    return [found[0] for path in paths if (found := trusted(path)) is not None]


def job_rows(path: Path) -> list[dict]:
    """job_table's rows, as dicts."""
    try:
        return job_table(path).to_pylist()
    except FileNotFoundError:  # gone since the listing: the job ended, or a compaction took it
        return job_table(path).to_pylist()


def settled(rows: list[dict]) -> list[dict]:
    """Rows a training job landed while it ran ("running"), as the measurements they are (ok):
    for when the job has ended, and a row of its own says how."""
    return [{**row, "status": "ok"} if row["status"] == RUNNING else row for row in rows]


def settled_table(table: pa.Table) -> pa.Table:
    """settled, of a table."""
    if "status" not in table.column_names:
        return table
    column = table["status"]
    return _with_status(table, pc.if_else(pc.equal(column, RUNNING), "ok", column))


def as_running(table: pa.Table) -> pa.Table:
    """Rows a training job ended with, as it lands them while it runs again: "running"."""
    return _with_status(table, pa.repeat(pa.scalar(RUNNING), table.num_rows))


def _with_status(table: pa.Table, status) -> pa.Table:
    if "status" not in table.column_names:
        return table.append_column("status", status)
    return table.set_column(table.column_names.index("status"), "status", status)


_named_columns: set[str] = per_command(set())  # the columns of two kinds it has named
PLAIN_TYPES = frozenset({int, float, str, bool, type(None)})
INT64 = range(-(2**63), 2**63)  # what a Parquet integer column holds


def check_values(row: dict) -> None:
    """ValueError, naming the column, for a value of `row` that a Parquet column cannot hold:
    an int beyond 64 bits, an object pyarrow cannot convert (a tensor). A plain value costs a
    type check (a training run's logged rows)."""
    for name, value in row.items():
        kind = type(value)
        if kind not in PLAIN_TYPES or (kind is int and value not in INT64):
            _check_column(name, [value])


def check_columns(rows: list[dict]) -> None:
    """check_values over a point's rows together: also a column given two kinds that one
    column cannot hold both of (1 in one row, "n/a" in another). A column of one plain kind
    (or of ints and floats) costs a pass over its values."""
    for name in dict.fromkeys(name for row in rows for name in row):
        values = [row.get(name) for row in rows]
        kinds = set(map(type, values)) - {type(None)}
        plain = kinds <= PLAIN_TYPES and (len(kinds) <= 1 or kinds == {int, float})
        if not plain or (int in kinds and not all(v in INT64 for v in values if type(v) is int)):
            _check_column(name, values)


def _check_column(name: str, values: list) -> None:
    try:
        pa.array(values)
    except (pa.ArrowException, OverflowError, TypeError) as error:
        kinds = sorted({type(v).__name__ for v in values if v is not None})
        if isinstance(error, OverflowError):
            big = next((f" {v}" for v in values if type(v) is int and v not in INT64), "")
            said = f"holds an int{big} beyond 64 bits: give it as a float, or as text"
        elif len(kinds) > 1:
            said = f"mixes {', '.join(kinds)} across the rows: give it one kind (text, say)"
        elif kinds[0] in ("list", "tuple"):
            said = f"holds a {kinds[0]} of items of several kinds: give its items one kind"
        else:
            said = (
                f"holds a {kinds[0]}, which a Parquet column cannot hold: give a number, text, "
                "a bool or a list of one kind (a tensor's .item() or .tolist())"
            )
        raise ValueError(f"column {name!r} {said}") from None


def segment_table(rows: list[dict], template: dict, seconds: list[float] | None) -> pa.Table:
    """Logged rows (the experiment's own columns) as a segment: each of `template`'s columns (a
    prepared empty row: the job, the parameters, the harness's columns) once as a constant,
    status "running", each row's own columns before "error", and `seconds` as duration_s."""
    own = [name for name in dict.fromkeys(k for row in rows for k in row) if name not in SET]
    arrays, count = {}, len(rows)
    for name, value in [*template.items(), *([] if "error" in template else [("error", None)])]:
        if name == "error":
            columns = {n: [row.get(n) for row in rows] for n in own}
            arrays |= {n: pa.array(v) for n, v in columns.items() if any(x is not None for x in v)}
            arrays[name] = pa.array([row.get(name) for row in rows], pa.string())
        elif name == "status":
            arrays[name] = pa.repeat(pa.scalar(RUNNING), count)
        elif name == "duration_s" and seconds is not None:
            arrays[name] = pa.array(seconds, pa.float64())
        elif name in HARNESS_COLUMNS or value is not None:
            arrays[name] = pa.repeat(pa.scalar(value, HARNESS_COLUMNS.get(name)), count)
    return pa.table(arrays)


SET = ("status", "error")  # the harness's columns a row may set itself


def rows_to_table(rows: list[dict]) -> pa.Table:
    """Rows (flat dicts) as a table; a column that is None in every row is left out."""
    names = list(dict.fromkeys(name for row in rows for name in row))
    arrays = {}
    for name in names:
        values = [row.get(name) for row in rows]
        if name in HARNESS_COLUMNS:
            arrays[name] = pa.array(values, type=HARNESS_COLUMNS[name])
        elif any(value is not None for value in values):
            arrays[name] = pa.array(values)
    return pa.table(arrays)


def trusted(path: Path) -> tuple[pa.Table, tuple[int, int, int]] | None:
    """read_job_file's rows and identity, or None for a damaged file (named once on stderr)."""
    try:
        return read_job_file(path)
    except files.DamagedFile as damaged:
        name_once(damaged.path, damaged.reason)
        return None


def job_hashes(rows: pd.DataFrame | pa.Table) -> Iterator[tuple]:
    """Each row's (job, config_hash); None where it has no hash."""
    return zip(values(rows, "job"), values(rows, "config_hash"), strict=True)


def values(rows: pd.DataFrame | pa.Table, name: str) -> list:
    """A column's values as a list (None where missing, or where there is no such column)."""
    if isinstance(rows, pa.Table):
        return rows[name].to_pylist() if name in rows.column_names else [None] * len(rows)
    if name not in rows:
        return [None] * len(rows)
    column = rows[name]
    return column.astype(object).where(column.notna(), None).tolist()


def concat(tables: list[pa.Table]) -> pa.Table:
    """One table with the union of the columns (an int column and a float one unify as float).

    Tables of one schema are concatenated as they are first: promoting 10,000 tables one by one
    is slow, and a sweep's files have a few schemas (ok rows, failed rows).
    """
    groups: list[list[pa.Table]] = []
    for table in tables:
        group = next((g for g in groups if g[0].schema.equals(table.schema)), None)
        if group is None:
            groups.append([table])
        else:
            group.append(table)
    merged = [pa.concat_tables(group) for group in groups]
    if len(merged) > 1:
        try:
            return pa.concat_tables(merged, promote_options="permissive").combine_chunks()
        except (pa.ArrowTypeError, pa.ArrowInvalid):  # a column of two kinds: int and str, say
            merged = _as_text_where_kinds_differ(merged)
            return pa.concat_tables(merged, promote_options="permissive").combine_chunks()
    return merged[0].combine_chunks() if merged else pa.table({})


def _as_text_where_kinds_differ(tables: list[pa.Table]) -> list[pa.Table]:
    """The tables with each column whose types no promotion unifies (an experiment that gave
    an int in one point and a str in another) as text, named once on stderr."""
    kinds: dict[str, set[pa.DataType]] = {}
    for table in tables:
        for field in table.schema:
            kinds.setdefault(field.name, set()).add(field.type)
    clashing = [name for name, types in kinds.items() if not _unify(types)]
    for name in clashing:
        if name not in _named_columns:
            _named_columns.add(name)
            said = " and ".join(sorted(map(str, kinds[name])))
            print(f"warning: column {name} holds {said} in different files: read as text",
                  file=sys.stderr)  # fmt: skip
    for name in clashing:
        tables = [_column_as_text(table, name) for table in tables]
    return tables


def _unify(types: set[pa.DataType]) -> bool:
    try:
        pa.unify_schemas([pa.schema([("c", kind)]) for kind in types], promote_options="permissive")
    except (pa.ArrowTypeError, pa.ArrowInvalid):
        return False
    return True


def _column_as_text(table: pa.Table, name: str) -> pa.Table:
    if name not in table.column_names or pa.types.is_string(table.schema.field(name).type):
        return table
    column = table[name]
    try:
        text = pc.cast(column, pa.string())
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):  # lists, structs: as JSON
        listed = [None if v is None else json.dumps(v, default=str) for v in column.to_pylist()]
        text = pa.array(listed, pa.string())
    return table.set_column(table.column_names.index(name), name, text)


def without_empty_columns(table: pa.Table) -> pa.Table:
    """As the job wrote it: no column that is null in every row, but the harness's own."""
    empty = [c for c in table.column_names if table[c].null_count == len(table)]
    return table.drop_columns([c for c in empty if c not in HARNESS_COLUMNS])
