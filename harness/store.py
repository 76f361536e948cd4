"""The Parquet result store: one file per job under ROOT/experiment=NAME/sweep=ID/.

A job's rows are written whole or not at all (harness.files: a temporary name, renamed; page
checksums and a digest of the rows, checked when read), so a reader never sees a partial file,
and a job that runs again (resume, a SLURM requeue) replaces its own file instead of adding
rows. The experiment and sweep live in the Hive-style path, not in the files, so pyarrow,
pandas and DuckDB all read them as partition columns. Sweep-level files (the
manifest, package lists, the compaction lock) start with "_", which those readers skip; ROOT's
file "columns" holds the schema of every file, which pyarrow's and pandas' folder readers take
as theirs (harness.common_schema).

A training job that is still running lands its rows as segments, append-only files beside its
job file (job-N.part-K.parquet, K = 1, 2, ...: the rows logged since the previous one, status
"running", written as any row file is), and writes its job file once when it ends, which
replaces them (`write_rows(..., replacing=segments(path))`). A point that runs as several
processes (harness.distributed) lands each one's rows as segments of its own,
job-N.rank-R.part-K.parquet, read after one another by rank; its rank 0 writes the job file.

A finished sweep's job files can be merged into one, compacted-N.parquet (`compact`). The rule
that keeps every row exactly once for `read`, even while a compaction runs or a training job
ends: each job's rows come from one place, its own job file when it has one (a job file is never
older than its segments or the compacted rows of its job), else its segments in order, else the
newest compacted file holding the job. A plain folder reader (pandas, pyarrow, DuckDB over
*.parquet) sees what lies there: each row once, except in the moment between a job file's rename
and the removal of the segments it replaces, and in the one between a restore's writing an
ended job's checkpointed rows back as its first segment and its removing the job file (signals
are held off meanwhile: only a SIGKILL can leave both, and `read` still sees each row once; the
job's next run, or the sweep's compaction, removes the segments a job file replaced).

A file that cannot be trusted is skipped by every reader, named once per process on stderr,
and its point counts as not run: one that cannot be read, fails its Parquet page checksums,
whose rows no longer match the digest written into its metadata (a flipped byte that Parquet
itself would read as another value) or carries none, or a job file holding another job's
rows. Resume reads the sweep, moves the files that read skipped aside (set_aside) under a
name no Parquet reader lists, and reruns their points.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import json
import os
import re
import secrets
import shutil
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from harness import common_schema, files
from harness.lifetime import per_command
from harness.search_settings import shape_fault

if TYPE_CHECKING:  # pandas loads where a frame is made: status and compact read Arrow alone
    import pandas as pd

MANIFEST = "_sweep.json"
# The manifest's settings that commands read, and their kinds (a manifest is anyone's to edit).
MANIFEST_KINDS = {"command": str, "overrides": list, "hydra_overrides": list,
                  "config_dirs": list, "launches": list}  # fmt: skip
LOCK = "_compact.lock"  # held while a compaction or a resume rewrites a sweep's files
RUNNING_MARK = ".running"  # _job-N.running: held by the process that runs job N (hold_running)
RUN_LOCK = "_run.lock"  # held by the command that runs a sweep's points here (claimed)
COMPACTED = re.compile(r"compacted-(\d+)\.parquet")
JOB = re.compile(r"job-(\d+)\.parquet")
# A job's segment: job-N.part-K, or job-N.rank-R.part-K for rank R of a point of several processes.
SEGMENT = re.compile(r"job-(\d+)\.(?:rank-(\d+)\.)?part-(\d+)\.parquet")
READ_ATTEMPTS = 50  # a read retries while compactions change the folder under it
# A point's answer: resume skips these. Other statuses (failed, killed, oom, timeout) rerun.
DONE = ("ok", "unsupported", "pruned")  # pruned: a search's trial that its pruner stopped
RUNNING = "running"  # the rows a training job lands before it ends (harness.tracking)
# The statuses an experiment's row may give; running and pruned are the harness's to write.
ROW_STATUSES = ("ok", "unsupported", "failed", "oom", "killed", "timeout")
PARTITIONS = pa.schema([("experiment", pa.string()), ("sweep", pa.string())])
SET_ASIDE = "_damaged-"  # the prefix of a damaged file moved aside: neither "." nor ".parquet"
_named: dict[Path, str] = per_command({})  # the damaged files this process has named, and why
_named_columns: set[str] = per_command(set())  # the columns of two kinds it has named


# The harness's own columns and their types; parameters and metrics are typed by their values.
HARNESS_COLUMNS = {
    "job": pa.int64(),
    "status": pa.string(),
    "error": pa.string(),
    "config_hash": pa.string(),
    "started_at": pa.timestamp("us", tz="UTC"),
    "duration_s": pa.float64(),
    "git_commit": pa.string(),
    "git_dirty": pa.bool_(),
    "command": pa.string(),
    "torch_version": pa.string(),
    "cuda_version": pa.string(),
    "python_version": pa.string(),
    "packages_digest": pa.string(),
    "device_name": pa.string(),
    "threads": pa.int64(),
    "hostname": pa.string(),
    "slurm_job_id": pa.string(),
    "slurm_array_task_id": pa.int64(),
    "slurm_node": pa.string(),
    "slurm_restarts": pa.int64(),
    "gpus": pa.string(),
    "run_dir": pa.string(),
    "rank": pa.int64(),  # of a point that runs as several processes (harness.distributed)
    "world_size": pa.int64(),
    "cell": pa.int64(),  # a search's trial (harness.search): its cell of the grid
    "trial": pa.int64(),  #   and its number in that cell's study
}
# Names no parameter or metric may take, compared without case (DuckDB reads `Sweep` as the
# partition `sweep`): the harness's columns and the partitions. A row's `status` and `error` are
# the experiment's to set, in those spellings.
RESERVED = frozenset(name.lower() for name in [*HARNESS_COLUMNS, *PARTITIONS.names])
ROW_SETS = ("status", "error")


def metrics(row: dict, params: dict) -> dict:
    """A row's numbers: its columns that are neither parameters nor the harness's."""
    return {
        k: v
        for k, v in row.items()
        if k not in params and k not in HARNESS_COLUMNS and isinstance(v, int | float)
    }


def first_numbers(row: dict, params: dict, shown: int = 4) -> str:
    """A row's first few numbers, for a progress line: "step=1.2e+03 loss=0.41 ..."."""
    return " ".join(f"{k}={v:.4g}" for k, v in list(metrics(row, params).items())[:shown])


def sweep_dir(root: Path, experiment: str, sweep: str) -> Path:
    return Path(root) / f"experiment={experiment}" / f"sweep={sweep}"


def job_file(root: Path, experiment: str, sweep: str, job: int) -> Path:
    return sweep_dir(root, experiment, sweep) / f"job-{job:06d}.parquet"


def segment_file(path: Path, number: int, rank: int | None = None) -> Path:
    """Segment `number` (from 1) of the job whose file is `path`; of its process `rank`, where
    the point runs as several (harness.distributed)."""
    ranked = "" if rank is None else f".rank-{rank:04d}"
    return Path(path).with_name(f"{Path(path).stem}{ranked}.part-{number:08d}.parquet")


def segments(path: Path) -> list[Path]:
    """The segments of the job whose file is `path`, in order: by rank (none first), number."""
    found = [
        (_segment_order(m), folder_path)
        for folder_path in Path(path).parent.glob(f"{glob.escape(Path(path).stem)}.*part-*.parquet")
        if (m := SEGMENT.fullmatch(folder_path.name))
    ]
    return [segment for _, segment in sorted(found)]


def segment_number(path: Path) -> int:
    return int(SEGMENT.fullmatch(Path(path).name)[3])


def segment_rank(path: Path) -> int | None:
    """The rank whose rows the segment holds; None for a point of one process."""
    rank = SEGMENT.fullmatch(Path(path).name)[2]
    return None if rank is None else int(rank)


def _segment_order(match: re.Match) -> tuple[int, int, int]:
    """(job, rank, number) of a segment's name, a point of one process as rank -1."""
    return int(match[1]), -1 if match[2] is None else int(match[2]), int(match[3])


def write_rows(path: Path, rows: list[dict] | pa.Table, replacing: Iterable[Path] = ()) -> None:
    """Write one job's rows to `path` atomically: a reader sees all of them or none. The files
    `replacing` names (the job's segments) go once it is in place; signals wait meanwhile.

    They are not forced to disk (fsync costs milliseconds a point): the job's own death loses
    nothing once they landed, and after a machine crash a file that did not reach the disk
    reads as missing or damaged, so its point counts as not run and resume reruns it. What
    holds rows that exist nowhere else (a compacted file, the job files release moves out of
    one) is forced to disk before its sources go."""
    table = rows if isinstance(rows, pa.Table) else rows_to_table(rows)
    with files.uninterrupted():
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
            found = _trusted(part)
            if found is not None:
                intact.append(part)
                table = _with_statuses(settled_table(found[0]), statuses, first)
                first += table.num_rows
                yield _told(_conformed(table, schema), told if checking else None)
        if returned is not None:
            yield _told(_conformed(returned, schema), told if checking else None)
        kept = intact if checking else kept

    _keep_columns(path, schema)
    with files.uninterrupted():
        files.write_parts(path, each, schema, sync=False)
        for segment in segments(path):
            segment.unlink(missing_ok=True)
    return told


def write_file(path: Path, table: pa.Table, sync: bool = True) -> None:
    """files.write_table of a row file of the store, its columns added to the store's common
    schema first."""
    _keep_columns(path, table.schema)
    files.write_table(path, table, sync)


def _keep_columns(path: Path, schema: pa.Schema) -> None:
    """The store's common schema gets the columns of a row file about to be written at `path`
    (harness.common_schema), before the file: a reader that sees the file sees its columns."""
    sweep = Path(path).parent
    if sweep.name.startswith("sweep=") and sweep.parent.name.startswith("experiment="):
        common_schema.keep(sweep.parent.parent, schema)


def telling(table: pa.Table) -> list[dict]:
    """The rows of a point's table that a summary reads (harness.job.summary): those with a
    status other than ok or an error, in order, then the last."""
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
    return [found[0] for path in paths if (found := _trusted(path)) is not None]


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


PLAIN = frozenset({int, float, str, bool, type(None)})


def check_values(row: dict) -> None:
    """Raise what rows_to_table would for a value of `row` that Parquet cannot hold."""
    for value in row.values():
        if type(value) not in PLAIN:
            pa.array([value])


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


def read_manifest(root: Path, experiment: str, sweep: str) -> dict | None:
    """The sweep's manifest; None when it is missing or cannot be read (named on stderr)."""
    path = sweep_dir(root, experiment, sweep) / MANIFEST
    try:
        manifest = files.read_json(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        reason = (str(error).splitlines() or [""])[0][:120]
        _name_once(path, f"unreadable manifest ({type(error).__name__}: {reason})")
        return None
    wrong = _manifest_fault(manifest)
    if wrong:
        _name_once(path, f"a damaged manifest: {wrong}")
        return None
    return manifest


def _manifest_fault(manifest) -> str | None:
    """What makes a manifest unusable (no points, a point without its job number or params, a
    job twice, a recorded setting of the wrong kind, a search that is none), or None."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("points"), list):
        return "it has no list of points"
    if not manifest["points"]:
        return "its list of points is empty"
    if not isinstance(manifest.get("experiment_config", {}), dict):
        return "its experiment_config is not a mapping"
    for key, kind in MANIFEST_KINDS.items():
        if manifest.get(key) is not None and not isinstance(manifest[key], kind):
            return f"its {key} is not a {kind.__name__}"
    searched = manifest.get("experiment_config", {}).get("search")
    if searched is not None and (fault := shape_fault(searched)):
        return f"its recorded {fault}"
    jobs = set()
    for position, point in enumerate(manifest["points"]):
        if not isinstance(point, dict):
            return f"point {position} is not a mapping"
        job = point.get("job")
        if isinstance(job, bool) or not isinstance(job, int) or job < 0 or job in jobs:
            return f"point {position} has no job number of its own (job={job!r})"
        if not isinstance(point.get("params"), dict):
            return f"point {position} (job {job}) has no params"
        if not isinstance(point.get("overrides", []), list):
            return f"point {position} (job {job}) has no list of overrides"
        jobs.add(job)
    return None


def write_manifest(root: Path, manifest: dict, new: bool = False) -> None:
    """The manifest as JSON, a line per point: readable, and written by json's C encoder
    (an indented dump is pure Python: seconds for 100,000 points). `new`: a new sweep's, whose
    folder must not exist yet (FileExistsError: the id is another sweep's)."""
    path = sweep_dir(root, manifest["experiment"], manifest["sweep"]) / MANIFEST
    header = json.dumps({k: v for k, v in manifest.items() if k != "points"}, indent=2, default=str)
    points = ",\n".join(json.dumps(point, default=str) for point in manifest["points"])
    text = f'{header[:-2]},\n  "points": [\n{points}\n]}}\n'
    if new:
        _create_sweep(path.parent, text)
    else:
        files.write_text(path, text)


def _create_sweep(folder: Path, manifest: str) -> None:
    """A new sweep's folder appears with its manifest in it, never without (a kill between
    the two would leave a sweep that cannot be resumed): both are written in a hidden folder,
    which is renamed into place. The rename fails onto a folder that holds anything, so two
    sweeps never share an id; a killed creator's hidden folder goes an hour later."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    for stale in folder.parent.glob(".sweep=*.tmp"):
        with contextlib.suppress(OSError):
            if time.time() - stale.stat().st_mtime > files.STALE_S:
                shutil.rmtree(stale)
    staging = folder.with_name(f".{folder.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    staging.mkdir()
    try:
        files.write_text(staging / MANIFEST, manifest)
        try:
            os.rename(staging, folder)
        except OSError as error:
            if error.errno in (errno.EEXIST, errno.ENOTEMPTY):
                raise FileExistsError(errno.EEXIST, "the sweep id is taken", str(folder)) from None
            raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    files.fsync_dir(folder.parent)


def sweeps(root: Path, experiment: str) -> list[str]:
    """The experiment's sweep ids, oldest first (ids start with their UTC start time)."""
    folder = Path(root) / f"experiment={experiment}"
    return sorted(p.name.removeprefix("sweep=") for p in folder.glob("sweep=*") if p.is_dir())


def newest_sweep(root: Path, experiment: str | None = None) -> str | None:
    """The newest sweep's id, of the experiment or of any; None in a store without one."""
    names = [experiment] if experiment else experiments(root)
    return max((s for name in names for s in sweeps(root, name)), default=None)


def experiments(root: Path) -> list[str]:
    return sorted(p.name.removeprefix("experiment=") for p in Path(root).glob("experiment=*"))


def experiment_of(root: Path, sweep: str) -> str | None:
    """The experiment whose sweep this id is; None when no experiment in root has it."""
    found = [e for e in experiments(root) if sweep_dir(root, e, sweep).is_dir()]
    return found[0] if found else None


def result_files(root: Path, experiment: str | None = None, sweep: str | None = None) -> list[Path]:
    return [
        folder / name
        for folder in _sweep_dirs(root, experiment, sweep)
        for name in _listing(folder)
    ]


def read(root: Path, experiment: str | None = None, sweep: str | None = None) -> pd.DataFrame:
    """read_table's rows as one DataFrame."""
    import pandas as pd

    table = read_table(root, experiment, sweep)
    return table.to_pandas() if table.num_columns else pd.DataFrame(columns=list(PARTITIONS.names))


def read_table(
    root: Path, experiment: str | None = None, sweep: str | None = None, partitions: bool = True
) -> pa.Table:
    """Every row under `root` (or one experiment's, or one sweep's) as one table, with the
    experiment and sweep as columns (partitions=False: without, and without importing pandas,
    which pyarrow does to make a column from Python values).

    The schema is the union of every file's, so a column that only some files have is kept
    (pandas.read_parquet on a folder would take the first file's schema and drop it). Each
    job's rows come from one place (see the module's docstring), so neither a compaction nor
    a training job's end running meanwhile hides or doubles any.
    """
    tables = []
    for folder in _sweep_dirs(root, experiment, sweep):
        table = _read_sweep(folder)
        if table.num_columns:
            tables.append(_with_partitions(table, folder) if partitions else table)
    return concat(tables)


def jobs_with_rows(root: Path, experiment: str, sweep: str) -> set[int]:
    """The jobs that have rows in the store: their own files or segments, and those compacted
    files hold."""
    folder = sweep_dir(root, experiment, sweep)
    for _ in range(READ_ATTEMPTS):
        names = _listing(folder)
        try:
            compacted = set().union(*(_jobs(folder / name) for name in _compacted(names)))
        except FileNotFoundError:  # compacted again since the listing
            continue
        return set(_job_files(names)) | set(_segments(names)) | compacted
    raise RuntimeError(f"{folder} changed under every one of {READ_ATTEMPTS} reads")


def has_rows(root: Path, experiment: str, sweep: str, job: int) -> bool:
    """Whether the job has rows in the store: its own file, its segments, or a compacted file
    holding it."""
    path = job_file(root, experiment, sweep, job)
    return path.exists() or job in jobs_with_rows(root, experiment, sweep)


def compact(root: Path, experiment: str, sweep: str) -> tuple[Path | None, list[str]]:
    """Merge a sweep's files into one, compacted-N.parquet; the merged file and what it absorbed.

    The merged rows go to a hidden temporary file, fsynced and renamed into place before any
    absorbed file is removed, so no row is ever out of sight: `read` sees each row once
    throughout, and pandas, pyarrow and DuckDB see each row once again when it returns. A job
    file that a job rewrote after it was merged is kept: it is newer, and `read` prefers it.
    Temporary files that writers killed mid-write left behind (older than files.STALE_S) go too,
    and so do the segments a job file has replaced (a SIGKILL left them). A sweep with a
    training job that has not ended (rows "running"), or with a point that a process runs now
    (its running mark held: a restore writes its rows back as segments beside its job file,
    which a compaction would take for replaced ones), is left as it is: (None, []).
    """
    folder = sweep_dir(root, experiment, sweep)
    if not folder.is_dir():
        return None, []
    with _sweep_lock(folder), files.uninterrupted():
        files.remove_temporaries(folder, older_than_s=files.STALE_S)
        names = _listing(folder)
        if len(names) <= 1 and _compacted(names) == names:  # nothing, or one compacted file
            return (folder / names[0] if names else None), []
        if _a_point_runs(folder):  # its files are its own until it ends (a restore rewrites them)
            return None, []
        parts, identities = _read_parts(folder, names)
        foreign = _foreign_files(root, experiment, sweep, parts)
        parts = {name: part for name, part in parts.items() if name not in foreign}
        identities = {name: ident for name, ident in identities.items() if name not in foreign}
        if not identities or any(_running(table) for table in parts.values()):
            return None, []  # every file damaged, or a training job still going: not ended
        for name in _replaced_segments(names):  # out of sight while their job file lies there
            (folder / name).unlink(missing_ok=True)
        path = folder / f"compacted-{_next_generation(names):06d}.parquet"
        write_file(path, _by_job(concat(list(parts.values()))))
        _remove_unchanged(folder, identities)
    return path, sorted(identities)


def _foreign_files(root: Path, experiment: str, sweep: str, parts: dict) -> set[str]:
    """The job files whose rows are not the sweep's planned point's (as_planned names them):
    never merged, left for resume to set aside."""
    files = _job_files(list(parts))
    hashes = [
        parts[name].select(["job", "config_hash"])
        for name in files.values()
        if {"job", "config_hash"} <= set(parts[name].column_names)
    ]
    if not hashes:
        return set()
    rows = concat(hashes)
    kept = as_planned(rows, read_manifest(root, experiment, sweep), root)
    return {files[job] for job in set(rows["job"].to_pylist()) - set(kept["job"].to_pylist())}


def release(root: Path, experiment: str, sweep: str, jobs: Iterable[int]) -> list[int]:
    """Move these jobs' rows out of the sweep's compacted file into job files of their own.

    Resume calls this before it reruns them, so that a rerun replaces a job's rows the usual
    way, by replacing its job file, and the folder as it lies holds every row once. Returns
    the jobs moved.
    """
    folder = sweep_dir(root, experiment, sweep)
    if not _compacted(_listing(folder)):  # never compacted: nothing to move, nothing to lock
        return []
    with _sweep_lock(folder), files.uninterrupted():
        names = _listing(folder)
        own = set(_job_files(names)) | set(_segments(names))  # their compacted rows are stale
        parts, _ = _read_parts(folder, _compacted(names))
        merged = concat(list(parts.values()))
        if not merged.num_rows:
            return []
        moving = _is_in(merged["job"], set(jobs) - own)
        moved = _split_by_job(merged.filter(moving))
        if not moved:
            return []
        for job, rows in moved.items():
            write_file(job_file(root, experiment, sweep, job), _without_empty_columns(rows))
        kept = merged.filter(pc.invert(pc.or_(moving, _is_in(merged["job"], own))))
        if kept.num_rows:
            write_file(folder / f"compacted-{_next_generation(names):06d}.parquet", kept)
        for name in _compacted(names):
            (folder / name).unlink(missing_ok=True)
        files.fsync_dir(folder)
    return sorted(moved)


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


def _sweep_dirs(root: Path, experiment: str | None, sweep: str | None) -> list[Path]:
    named = [glob.escape(name) if name else "*" for name in (experiment, sweep)]
    pattern = f"experiment={named[0]}/sweep={named[1]}"
    return sorted(p for p in Path(root).glob(pattern) if p.is_dir())


def _listing(folder: Path) -> list[str]:
    """The folder's row files: *.parquet, without hidden (temporary) and "_" files."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.endswith(".parquet") and not n.startswith((".", "_")))


def _job_files(names: list[str]) -> dict[int, str]:
    return {int(m[1]): name for name in names if (m := JOB.fullmatch(name))}


def _segments(names: list[str]) -> dict[int, list[str]]:
    """job -> the names of its segments among `names`, in order."""
    found = sorted((_segment_order(m), name) for name in names if (m := SEGMENT.fullmatch(name)))
    jobs: dict[int, list[str]] = {}
    for (job, _, _), name in found:
        jobs.setdefault(job, []).append(name)
    return jobs


def _replaced_segments(names: list[str]) -> list[str]:
    """The segments of jobs that have a job file: it replaced them (the reading rule)."""
    own = _job_files(names)
    return [name for job, listed in _segments(names).items() if job in own for name in listed]


def _compacted(names: list[str]) -> list[str]:
    """The compacted files among `names`, newest first."""
    found = [(int(m[1]), name) for name in names if (m := COMPACTED.fullmatch(name))]
    return [name for _, name in sorted(found, reverse=True)]


def _next_generation(names: list[str]) -> int:
    newest = _compacted(names)
    return int(COMPACTED.fullmatch(newest[0])[1]) + 1 if newest else 1


def _in_order(name: str) -> tuple:
    """A row file's place: by job, a job's segments by rank and number (past 10^8 too), then
    the rest."""
    if m := SEGMENT.fullmatch(name):
        return (0, *_segment_order(m), name)
    if m := JOB.fullmatch(name):
        return (0, int(m[1]), -1, 0, name)
    return (1, 0, -1, 0, name)


def _read_sweep(folder: Path) -> pa.Table:
    """A sweep's rows, each job's from one place; read again if a compaction changed the folder.

    A listing taken while a compaction renames its file in and removes the absorbed ones may
    miss both; the compacted files listed after the read then differ from those listed before
    it, and the read starts over, as it does when a listed file is gone when it is opened.
    """
    for attempt in range(READ_ATTEMPTS):
        names = _listing(folder)
        try:
            parts, _ = _read_parts(folder, names)
        except FileNotFoundError:
            parts = None
        if parts is not None and _compacted(_listing(folder)) == _compacted(names):
            table = concat(list(parts.values()))
            return _by_job(table) if _compacted(names) and len(parts) > 1 else table
        time.sleep(0.001 * attempt)
    raise RuntimeError(f"{folder} changed under every one of {READ_ATTEMPTS} reads")


def _read_parts(folder: Path, names: list[str]) -> tuple[dict[str, pa.Table], dict]:
    """Each file's rows that count (see the module's docstring), and each file's identity.

    Every job file counts whole, and so does every segment of a job without one, in order; a
    compacted file counts for the jobs that neither of those nor a newer compacted file holds.
    """
    compacted = _compacted(names)
    replaced = set(_replaced_segments(names))
    names = sorted((n for n in names if n not in replaced), key=_in_order)
    read = {name: _trusted(folder / name) for name in names}
    read = {name: found for name, found in read.items() if found is not None}
    parts = {name: table for name, (table, _) in read.items() if name not in compacted}
    identities = {name: identity for name, (_, identity) in read.items()}
    covered = set(_job_files(list(parts))) | set(_segments(list(parts)))
    for name in [name for name in compacted if name in read]:
        table = read[name][0]
        if "job" in table.column_names:
            jobs = table["job"]
            if covered:  # (pyarrow imports pandas to make the set an array)
                table = table.filter(pc.invert(_is_in(jobs, covered)))
            covered |= set(pc.unique(jobs).to_pylist())
        parts[name] = table
    return parts, identities


def _trusted(path: Path) -> tuple[pa.Table, tuple[int, int, int]] | None:
    """_read_file's rows and identity, or None for a damaged file (named once on stderr)."""
    try:
        return files.read_table(path)
    except files.DamagedFile as damaged:
        _name_once(damaged.path, damaged.reason)
        return None


def set_aside(root: Path, experiment: str, sweep: str) -> list[Path]:
    """Move the sweep's files that reads in this process skipped (skipped) out of every
    reader's way: a "_damaged-" name without the .parquet suffix, kept for a post-mortem.
    Returns where they went."""
    folder, moved = sweep_dir(root, experiment, sweep), []
    with _sweep_lock(folder):
        for path in skipped(root, experiment, sweep):
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
            target = folder / f"{SET_ASIDE}{path.name}-{stamp}.bad"
            os.replace(path, target)
            moved.append(target)
        if moved:
            files.fsync_dir(folder)
    return moved


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
        for job, given in set(_pairs(distinct))
        if job not in planned or (given is not None and planned[job] not in (None, str(given)))
    }
    if not foreign:
        return rows  # no copy of a sweep's millions of training rows
    for job in sorted({job for job, _ in foreign}):
        path = job_file(root, manifest["experiment"], manifest["sweep"], job)
        why = "config_hash differs" if job in planned else "the sweep planned no such job"
        _name_once(path, f"its rows are not this sweep's planned point ({why})")
    kept = [pair not in foreign for pair in _pairs(rows)]
    return rows.filter(pa.array(kept)) if table else rows[kept]


def _pairs(rows: pd.DataFrame | pa.Table) -> Iterator[tuple]:
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


def skipped(root: Path, experiment: str, sweep: str) -> dict[Path, str]:
    """The sweep's files that reads in this process skipped as damaged (and still lie there),
    with the reason."""
    folder = sweep_dir(root, experiment, sweep)
    named = _named.items()
    return {path: why for path, why in named if path.parent == folder and os.path.lexists(path)}


def _name_once(path: Path, reason: str) -> None:
    """Say on stderr, once per process, that a file is skipped and why."""
    if path not in _named:
        _named[path] = reason
        print(f"warning: skipping {path}: {reason}", file=sys.stderr)


def _jobs(path: Path) -> set[int]:
    try:
        table, _ = files.read_table(path)
    except files.DamagedFile as damaged:
        _name_once(damaged.path, damaged.reason)
        return set()
    return set(table["job"].to_pylist()) if "job" in table.column_names else set()


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


def _running(table: pa.Table) -> bool:
    """Whether a file holds rows of a training job that has not ended (status "running")."""
    if "status" not in table.column_names:
        return False
    return bool(pc.any(pc.equal(table["status"], RUNNING)).as_py())


def _is_in(jobs: pa.ChunkedArray, values: set[int]) -> pa.ChunkedArray:
    return pc.is_in(jobs, pa.array(sorted(values), jobs.type))


def _by_job(table: pa.Table) -> pa.Table:
    """The rows in job order (a stable sort: a job's own rows keep their order)."""
    return table.sort_by("job") if "job" in table.column_names else table


def _split_by_job(table: pa.Table) -> dict[int, pa.Table]:
    table = _by_job(table)
    jobs, starts, counts = np.unique(table["job"].to_numpy(), return_index=True, return_counts=True)
    return {
        int(job): table.slice(start, count)
        for job, start, count in zip(jobs, starts, counts, strict=True)
    }


def _without_empty_columns(table: pa.Table) -> pa.Table:
    """As the job wrote it: no column that is null in every row, but the harness's own."""
    empty = [c for c in table.column_names if table[c].null_count == len(table)]
    return table.drop_columns([c for c in empty if c not in HARNESS_COLUMNS])


def _with_partitions(table: pa.Table, folder: Path) -> pa.Table:
    """The experiment and sweep from the Hive-style path, as the first two columns."""
    values = [folder.parent.name.removeprefix("experiment="), folder.name.removeprefix("sweep=")]
    for position, (field, value) in enumerate(zip(PARTITIONS, values, strict=True)):
        table = table.add_column(position, field, pa.array([value] * len(table), field.type))
    return table


def prune(root: Path, experiment: str, sweep: str) -> bool:
    """Remove a sweep folder that holds nothing but temporaries older than files.STALE_S (a sweep
    whose manifest a kill cut short, planned and never started): whether it went."""
    folder = sweep_dir(root, experiment, sweep)
    if (folder / MANIFEST).exists() or _listing(folder):
        return False
    files.remove_temporaries(folder, older_than_s=files.STALE_S)
    with contextlib.suppress(OSError):
        for path in folder.iterdir():
            if path.name != LOCK:
                return False
        (folder / LOCK).unlink(missing_ok=True)
        folder.rmdir()
        return True
    return False


def _remove_unchanged(folder: Path, identities: dict[str, tuple[int, int, int]]) -> None:
    """Remove the files that were merged, unless one was replaced since it was read."""
    for name, identity in identities.items():
        path = folder / name
        try:
            stat = path.stat()
        except FileNotFoundError:
            continue
        if (stat.st_ino, stat.st_mtime_ns, stat.st_size) == identity:
            path.unlink(missing_ok=True)
    files.fsync_dir(folder)


class Claimed(Exception):
    """Another command runs the sweep (claimed): its message says which."""


@contextmanager
def claimed(root: Path, experiment: str, sweep: str) -> Iterator[None]:
    """Hold the sweep for this command while it runs its points: a second command that would
    run them too (two resumes) raises Claimed, naming the process that holds it. The lock goes
    with the process, however it ends."""
    folder = sweep_dir(root, experiment, sweep)
    with open(folder / RUN_LOCK, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            raise Claimed(
                f"sweep {sweep} is being run by another command ({holder}): let it end, or "
                f"stop it, then resume; see its points with: python -m harness status {sweep}"
            ) from None
        lock.truncate(0)
        lock.write(f"pid {os.getpid()} on {os.uname().nodename}\n")
        lock.flush()
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextmanager
def _sweep_lock(folder: Path) -> Iterator[None]:
    """One compaction (or resume's release) of a sweep at a time; the lock goes with the process."""
    folder.mkdir(parents=True, exist_ok=True)
    with files.held(folder / LOCK):
        yield


def hold_running(path: Path):
    """Mark the job of file `path` as running in this process: a lock (_job-N.running, beside
    the job's file) that this process holds until release_running, or its death, lets it go."""
    marker = open(_running_marker(path), "a")  # noqa: SIM115 (held until release_running)
    fcntl.flock(marker, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return marker


def release_running(marker) -> None:
    with contextlib.suppress(OSError):
        os.unlink(marker.name)
    marker.close()


def still_running(path: Path) -> bool | None:
    """Whether a process holds the job's running mark (hold_running); None where it has none
    (the job ended, or its store predates the mark)."""
    return _mark_held(_running_marker(path))


def _mark_held(marker: Path) -> bool | None:
    try:
        with open(marker, "rb") as held:
            fcntl.flock(held, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    return False


def _running_marker(path: Path) -> Path:
    return Path(path).with_name(f"_{Path(path).stem}{RUNNING_MARK}")


def _a_point_runs(folder: Path) -> bool:
    """Whether a process holds the running mark of one of the sweep's jobs."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return False
    return any(
        _mark_held(folder / n) for n in names if n.startswith("_") and n.endswith(RUNNING_MARK)
    )
