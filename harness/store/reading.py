"""Reading a sweep's rows by the reading rule (each job's rows from one place: its file,
else its segments, else the newest compacted file holding it), and what they say: each job's
status, the parameter columns, the rows of the planned points.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from harness.store.layout import (
    HARNESS_COLUMNS,
    PARTITIONS,
    READ_ATTEMPTS,
    RUNNING,
    JobPaths,
    SweepPaths,
    compacted_files,
    in_order,
    job_files,
    job_segments,
    listing,
    name_once,
    replaced_segments,
    sweep_dirs,
)
from harness.store.manifest import LAST, newest_sweep
from harness.store.rows import concat, job_hashes, trusted

if TYPE_CHECKING:  # pandas loads where a frame is made: status and compact read Arrow alone
    import pandas as pd


def result_files(root: Path, experiment: str | None = None, sweep: str | None = None) -> list[Path]:
    return [
        folder / name for folder in sweep_dirs(root, experiment, sweep) for name in listing(folder)
    ]


def read(root: Path, experiment: str | None = None, sweep: str | None = None) -> pd.DataFrame:
    """read_table's rows as one DataFrame (experiment and sweep as text). An integer column
    with gaps (a value that some points' rows lack) is of pandas' nullable integer type, not
    float64, so that every value reads back exactly (beyond 2**53 too)."""
    import pandas as pd

    table = read_table(root, experiment, sweep)
    if not table.num_columns:
        return pd.DataFrame(columns=list(PARTITIONS.names))
    frame = table.to_pandas()
    nullable = {pa.int8(): pd.Int8Dtype(), pa.int16(): pd.Int16Dtype(), pa.int32(): pd.Int32Dtype(),
                pa.int64(): pd.Int64Dtype(), pa.uint8(): pd.UInt8Dtype(),
                pa.uint16(): pd.UInt16Dtype(), pa.uint32(): pd.UInt32Dtype(),
                pa.uint64(): pd.UInt64Dtype()}  # fmt: skip
    for name, column in zip(table.column_names, table.columns, strict=True):
        if pa.types.is_integer(column.type) and column.null_count:
            frame[name] = column.to_pandas(types_mapper=nullable.get)
    return frame


def read_table(
    root: Path, experiment: str | None = None, sweep: str | None = None, partitions: bool = True
) -> pa.Table:
    """Every row under `root` (or one experiment's, or one sweep's: "last" is the newest, of
    the experiment where one is given) as one table, with the experiment and sweep as columns
    of text (partitions=False: without, and without importing pandas, which pyarrow does to
    make a column from Python values). A sweep that `root` does not hold is a LookupError.

    The schema is the union of every file's, so a column that only some files have is kept
    (pandas.read_parquet on a folder would take the first file's schema and drop it). Each
    job's rows come from one place (the reading rule: harness.store's docstring), so neither
    a compaction nor a training job's end running meanwhile hides or doubles any.
    """
    if sweep == LAST:
        sweep = newest_sweep(root, experiment)
        if sweep is None:
            raise LookupError(f"no sweep{f' of {experiment}' if experiment else ''} in {root}")
    folders = sweep_dirs(root, experiment, sweep)
    if sweep is not None and not folders:
        raise LookupError(f"no sweep {sweep}{f' of {experiment}' if experiment else ''} in {root}")
    tables = []
    for folder in folders:
        table = _read_sweep(folder)
        if table.num_columns:
            tables.append(_with_partitions(table, folder) if partitions else table)
    return _every_harness_column(concat(tables)) if partitions else concat(tables)


def _every_harness_column(table: pa.Table) -> pa.Table:
    """The table with each of the harness's columns, all null where no row has it (a store in
    which nothing was reused has no `reused_from`): a notebook's rows["reused_from"] works on
    any sweep. A table without columns (no rows) stays so."""
    if not table.num_columns:
        return table
    for name, kind in HARNESS_COLUMNS.items():
        if name not in table.column_names:
            table = table.append_column(pa.field(name, kind), pa.nulls(len(table), kind))
    return table


def jobs_with_rows(sweep: SweepPaths) -> set[int]:
    """The jobs that have rows in the store: their own files or segments, and those compacted
    files hold."""
    folder = sweep.folder
    for _ in range(READ_ATTEMPTS):
        names = listing(folder)
        try:
            compacted = set().union(*(_jobs(folder / name) for name in compacted_files(names)))
        except FileNotFoundError:  # compacted again since the listing
            continue
        return set(job_files(names)) | set(job_segments(names)) | compacted
    raise RuntimeError(f"{folder} changed under every one of {READ_ATTEMPTS} reads")


def has_rows(job: JobPaths) -> bool:
    """Whether the job has rows in the store: its own file, its segments, or a compacted file
    holding it."""
    return job.file.exists() or job.job in jobs_with_rows(job.sweep)


def job_statuses(rows: pd.DataFrame) -> pd.Series:
    """Each job's status: its rows' first that is not ok, else ok."""
    import pandas as pd

    if rows.empty:
        return pd.Series(dtype=str)
    not_ok = rows["status"].where(rows["status"] != "ok")  # first() skips the ok ones
    return not_ok.groupby(rows["job"]).first().fillna("ok").rename("status")


def parameter_columns(rows: pd.DataFrame, measured: Iterable[str] = ()) -> list[str]:
    """The columns of a sweep's rows that are its points' parameters, in the rows' order: read
    from the rows alone, as a report does (it reads no experiment's code). A parameter holds one
    value on every row of a job; so does a measurement that a point logs once (or a sweep whose
    points each have one row), which is why `measured` names those a report reads, and the
    harness's own columns are never parameters."""
    excluded = {"experiment", "sweep", *HARNESS_COLUMNS, *measured}
    candidates = [c for c in rows if c not in excluded]
    if "job" not in rows or not candidates:
        return []
    if not rows["job"].is_monotonic_increasing:
        rows = rows.sort_values("job", kind="stable")
    same_job = rows["job"].eq(rows["job"].shift()).to_numpy()
    return [c for c in candidates if not _changes_within_a_job(rows[c], same_job)]


def _changes_within_a_job(column: pd.Series, same_job: np.ndarray) -> bool:
    """Whether a column's value differs between two consecutive rows of one job (rows in job
    order); missing equals missing, and lists compare as their repr."""
    if column.dtype == object:
        column = column.map(repr)
    previous = column.shift()
    same = column.eq(previous).fillna(False) | (column.isna() & previous.isna())
    same = same.to_numpy(dtype=bool)
    return bool((same_job & ~same).any())


def status_counts(statuses: pd.Series, total: int) -> str:
    """ "9 points: 7 ok, 1 failed, 1 not run" for a sweep of `total` points."""
    counts = statuses.value_counts()
    parts = [f"{n} {status}" for status, n in counts.items()]
    if total > len(statuses):
        parts.append(f"{total - len(statuses)} not run")
    return f"{total} points: {', '.join(parts) or 'none run'}"


def _read_sweep(folder: Path) -> pa.Table:
    """A sweep's rows, each job's from one place; read again if a compaction changed the folder.

    A listing taken while a compaction renames its file in and removes the absorbed ones may
    miss both; the compacted files listed after the read then differ from those listed before
    it, and the read starts over, as it does when a listed file is gone when it is opened.
    """
    for attempt in range(READ_ATTEMPTS):
        names = listing(folder)
        try:
            parts, _ = read_parts(folder, names)
        except FileNotFoundError:
            parts = None
        if parts is not None and compacted_files(listing(folder)) == compacted_files(names):
            table = concat(list(parts.values()))
            return by_job(table) if compacted_files(names) and len(parts) > 1 else table
        time.sleep(0.001 * attempt)
    raise RuntimeError(f"{folder} changed under every one of {READ_ATTEMPTS} reads")


def read_parts(folder: Path, names: list[str]) -> tuple[dict[str, pa.Table], dict]:
    """Each file's rows that count (the reading rule: harness.store's docstring), and each
    file's identity.

    Every job file counts whole, and so does every segment of a job without one, in order; a
    compacted file counts for the jobs that neither of those nor a newer compacted file holds.
    """
    compacted = compacted_files(names)
    replaced = set(replaced_segments(names))
    names = sorted((n for n in names if n not in replaced), key=in_order)
    read = {name: trusted(folder / name) for name in names}
    read = {name: found for name, found in read.items() if found is not None}
    parts = {name: table for name, (table, _) in read.items() if name not in compacted}
    identities = {name: identity for name, (_, identity) in read.items()}
    covered = set(job_files(list(parts))) | set(job_segments(list(parts)))
    for name in [name for name in compacted if name in read]:
        table = read[name][0]
        if "job" in table.column_names:
            jobs = table["job"]
            if covered:  # (pyarrow imports pandas to make the set an array)
                table = table.filter(pc.invert(jobs_in(jobs, covered)))
            covered |= set(pc.unique(jobs).to_pylist())
        parts[name] = table
    return parts, identities


def as_planned(rows: pd.DataFrame | pa.Table, manifest: dict | None, root: Path):
    """A sweep's rows (a DataFrame or a table, returned as such) less those that are not its
    planned points' (a job it did not plan, or a config_hash other than the planned point's: a
    file copied from another sweep, or edited), each such job named once on stderr; their
    points count as not run, and a resume's rerun replaces them."""
    table = isinstance(rows, pa.Table)
    columns = rows.column_names if table else list(rows.columns)
    if manifest is None or not len(rows) or "job" not in columns:
        return rows
    planned = {point["job"]: point.get("config_hash") for point in manifest["points"]}
    keys = [c for c in ("job", "config_hash") if c in columns]
    distinct = rows if table else rows[keys].drop_duplicates()  # a job's rows share a hash
    foreign = {
        (job, given)
        for job, given in set(job_hashes(distinct))
        if job not in planned or (given is not None and planned[job] not in (None, str(given)))
    }
    if not foreign:
        return rows  # no copy of a sweep's millions of training rows
    sweep = SweepPaths(root, manifest["experiment"], manifest["sweep"])
    for job in sorted({job for job, _ in foreign}):
        path = sweep.job(job).file
        why = "config_hash differs" if job in planned else "the sweep planned no such job"
        name_once(path, f"its rows are not this sweep's planned point ({why})")
    kept = [pair not in foreign for pair in job_hashes(rows)]
    return rows.filter(pa.array(kept)) if table else rows[kept]


def _jobs(path: Path) -> set[int]:
    found = trusted(path)  # None: damaged, named once
    if found is None or "job" not in found[0].column_names:
        return set()
    return set(found[0]["job"].to_pylist())


def has_running_rows(table: pa.Table) -> bool:
    """Whether a file holds rows of a training job that has not ended (status "running")."""
    if "status" not in table.column_names:
        return False
    return bool(pc.any(pc.equal(table["status"], RUNNING)).as_py())


def jobs_in(jobs: pa.ChunkedArray, values: set[int]) -> pa.ChunkedArray:
    return pc.is_in(jobs, pa.array(sorted(values), jobs.type))


def by_job(table: pa.Table) -> pa.Table:
    """The rows in job order (a stable sort: a job's own rows keep their order)."""
    return table.sort_by("job") if "job" in table.column_names else table


def split_by_job(table: pa.Table) -> dict[int, pa.Table]:
    table = by_job(table)
    jobs, starts, counts = np.unique(table["job"].to_numpy(), return_index=True, return_counts=True)
    return {
        int(job): table.slice(start, count)
        for job, start, count in zip(jobs, starts, counts, strict=True)
    }


def _with_partitions(table: pa.Table, folder: Path) -> pa.Table:
    """The experiment and sweep from the Hive-style path, as the first two columns."""
    values = [folder.parent.name.removeprefix("experiment="), folder.name.removeprefix("sweep=")]
    for position, (field, value) in enumerate(zip(PARTITIONS, values, strict=True)):
        table = table.add_column(position, field, pa.array([value] * len(table), field.type))
    return table
