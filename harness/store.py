"""The Parquet result store: one file per job under ROOT/experiment=NAME/sweep=ID/.

A job's rows are written to a hidden temporary file and renamed into place, so a reader never
sees a partial file, and a job that runs again (resume, a SLURM requeue) replaces its own file
instead of adding rows. The experiment and sweep live in the Hive-style path, not in the files,
so pyarrow, pandas and DuckDB all read them as partition columns. Sweep-level files (the
manifest, package lists) start with "_", which those readers skip.
"""

import json
import os
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

MANIFEST = "_sweep.json"
# A point's answer: resume skips these. Other statuses (failed, killed, oom, timeout) rerun.
DONE = ("ok", "unsupported")
PARTITIONS = pa.schema([("experiment", pa.string()), ("sweep", pa.string())])

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
}


def sweep_dir(root: Path, experiment: str, sweep: str) -> Path:
    return Path(root) / f"experiment={experiment}" / f"sweep={sweep}"


def job_file(root: Path, experiment: str, sweep: str, job: int) -> Path:
    return sweep_dir(root, experiment, sweep) / f"job-{job:06d}.parquet"


def write_rows(path: Path, rows: list[dict]) -> None:
    """Write one job's rows to `path` atomically: a reader sees all of them or none."""
    table = rows_to_table(rows)
    _replace_atomically(path, lambda tmp: pq.write_table(table, tmp))


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


def write_json(path: Path, data: dict) -> None:
    """Write a JSON file atomically (the manifest, package lists)."""
    write_text(path, json.dumps(data, indent=2, default=str) + "\n")


def write_text(path: Path, text: str) -> None:
    _replace_atomically(path, lambda tmp: Path(tmp).write_text(text))


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def read_manifest(root: Path, experiment: str, sweep: str) -> dict | None:
    path = sweep_dir(root, experiment, sweep) / MANIFEST
    return read_json(path) if path.exists() else None


def write_manifest(root: Path, manifest: dict) -> None:
    path = sweep_dir(root, manifest["experiment"], manifest["sweep"]) / MANIFEST
    write_json(path, manifest)


def sweeps(root: Path, experiment: str) -> list[str]:
    """The experiment's sweep ids, oldest first (ids start with their UTC start time)."""
    folder = Path(root) / f"experiment={experiment}"
    return sorted(p.name.removeprefix("sweep=") for p in folder.glob("sweep=*") if p.is_dir())


def experiments(root: Path) -> list[str]:
    return sorted(p.name.removeprefix("experiment=") for p in Path(root).glob("experiment=*"))


def result_files(root: Path, experiment: str | None = None, sweep: str | None = None) -> list[Path]:
    pattern = f"experiment={experiment or '*'}/sweep={sweep or '*'}/*.parquet"
    return sorted(Path(root).glob(pattern))


def read(root: Path, experiment: str | None = None, sweep: str | None = None) -> pd.DataFrame:
    """Every row under `root` (or one experiment's, or one sweep's) as one DataFrame.

    The schema is the union of every file's, so a column that only some files have is kept
    (pandas.read_parquet on a folder would take the first file's schema and drop it).
    """
    files = result_files(root, experiment, sweep)
    if not files:
        return pd.DataFrame(columns=["experiment", "sweep"])
    schema = pa.unify_schemas([pq.read_schema(f) for f in files], promote_options="permissive")
    partitioning = ds.partitioning(PARTITIONS, flavor="hive")
    dataset = ds.dataset(
        [str(f) for f in files],
        schema=pa.unify_schemas([PARTITIONS, schema]),
        format="parquet",
        partitioning=partitioning,
        partition_base_dir=str(root),
    )
    return dataset.to_table().to_pandas()


def job_statuses(rows: pd.DataFrame) -> pd.Series:
    """Each job's status: its rows' first that is not ok, else ok."""
    if rows.empty:
        return pd.Series(dtype=str)
    return rows.groupby("job")["status"].agg(lambda s: next((x for x in s if x != "ok"), "ok"))


def status_counts(statuses: pd.Series, total: int) -> str:
    """ "9 points: 7 ok, 1 failed, 1 not run" for a sweep of `total` points."""
    counts = statuses.value_counts()
    parts = [f"{n} {status}" for status, n in counts.items()]
    if total > len(statuses):
        parts.append(f"{total - len(statuses)} not run")
    return f"{total} points: {', '.join(parts) or 'none run'}"


def _replace_atomically(path: Path, write) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
