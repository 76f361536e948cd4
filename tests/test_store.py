"""The Parquet store as pandas, pyarrow and DuckDB read it; its atomic one-file-per-job writes."""

import math
import os
import random
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime

import duckdb
import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import torch
from sweeps import write_jobs

from harness import files, store


def write_sweep(root, experiment="exp", sweep="s1", jobs=3, extra=None):
    rows = [
        {"job": job, "status": "ok", "length": 128 * (job + 1), "max_abs_diff": 0.5 * job,
         "started_at": datetime.now(UTC), **(extra if extra and job == jobs - 1 else {})}
        for job in range(jobs)
    ]  # fmt: skip
    write_jobs(root, experiment, sweep, rows)


def test_rows_come_back_with_partition_columns_in_every_reader(tmp_path):
    write_sweep(tmp_path, jobs=3)
    write_sweep(tmp_path, experiment="other", sweep="s2", jobs=2)
    rows = store.read(tmp_path)
    assert len(rows) == 5
    assert list(rows.columns[:2]) == ["experiment", "sweep"]
    assert rows.columns.is_unique
    assert sorted(rows.groupby(["experiment", "sweep"]).size().items()) == [
        (("exp", "s1"), 3),
        (("other", "s2"), 2),
    ]
    by_pandas = pd.read_parquet(tmp_path)
    assert set(by_pandas["experiment"]) == {"exp", "other"} and by_pandas.columns.is_unique
    by_arrow = ds.dataset(tmp_path, partitioning="hive").to_table()
    assert by_arrow.num_rows == 5 and "sweep" in by_arrow.column_names
    files = f"read_parquet('{tmp_path}/**/*.parquet', hive_partitioning=true)"
    query = f"select count(*), count(distinct sweep) from {files}"
    assert duckdb.connect().execute(query).fetchone() == (5, 2)


def test_the_last_sweep_is_read_by_name_and_sweeps_read_as_text(tmp_path):
    write_sweep(tmp_path, sweep="20261201-120000-0001", jobs=3)
    write_sweep(tmp_path, sweep="20261202-120000-0002", jobs=2)
    write_sweep(tmp_path, experiment="other", sweep="20261130-120000-0003", jobs=1)
    last = store.read(tmp_path, sweep="last")
    assert len(last) == 2 and set(last["sweep"]) == {"20261202-120000-0002"}
    assert len(store.read(tmp_path, "other", sweep="last")) == 1
    every = store.read(tmp_path)
    assert every["sweep"].max() == "20261202-120000-0002", "text, ordered as text is"
    assert pd.api.types.is_string_dtype(every["sweep"]) and not isinstance(
        every["sweep"].dtype, pd.CategoricalDtype
    )
    for sweep, said in [("20261129-000000-dead", "no sweep 20261129-000000-dead in"),
                        ("last", "no sweep of nothing in")]:  # fmt: skip
        experiment = "nothing" if sweep == "last" else None
        with pytest.raises(LookupError, match=said):
            store.read(tmp_path, experiment, sweep=sweep)


def test_polars_reads_the_store_as_docs_store_md_shows(tmp_path):
    write_sweep(tmp_path, jobs=3)
    write_sweep(tmp_path, experiment="other", sweep="s2", jobs=2)
    store.write_rows(
        store.SweepPaths(tmp_path, "other", "s2").job(9).file, [{"job": 9, "extra": 1.5}]
    )
    frame = pl.read_parquet(
        f"{tmp_path}/**/*.parquet", hive_partitioning=True, missing_columns="insert",
        schema=pl.read_parquet_schema(tmp_path / "columns"),
    )  # fmt: skip
    assert frame.height == 6 and frame["extra"].drop_nulls().to_list() == [1.5]
    assert sorted(frame["sweep"].unique().to_list()) == ["s1", "s2"]


def test_columns_only_some_files_have_are_seen_by_every_folder_reader(tmp_path):
    """pyarrow's discovery (and so pandas') takes the schema of the first file in path order:
    the store's common schema file is that one, so later files' columns are there too."""
    write_sweep(tmp_path, jobs=3, extra={"time_ms": 1.5, "note": "late"})
    store.write_rows(store.SweepPaths(tmp_path, "zz", "s9").job(0).file,
                     [{"job": 0, "status": "ok", "length": 1.5, "loss": 2, "tag": 7}])  # fmt: skip
    store.write_rows(store.SweepPaths(tmp_path, "zz", "s9").job(1).file,
                     [{"job": 1, "status": "ok", "loss": 0.5, "tag": "seven"}])  # fmt: skip
    wanted = {"time_ms", "note", "loss", "tag", "length", "experiment", "sweep"}
    by_pandas = pd.read_parquet(tmp_path)
    assert wanted <= set(by_pandas.columns) and len(by_pandas) == 5
    assert by_pandas["time_ms"].notna().sum() == 1 and by_pandas["loss"].tolist()[-2:] == [2, 0.5]
    assert sorted(by_pandas["tag"].dropna()) == ["7", "seven"], "int and str: read as text"
    assert by_pandas["length"].tolist()[:4] == [128, 256, 384, 1.5], "int and float: floats"
    assert by_pandas["length"].isna().tolist() == [False] * 4 + [True]
    by_arrow = pq.read_table(tmp_path)
    assert wanted <= set(by_arrow.column_names) and by_arrow.num_rows == 5
    dataset = ds.dataset(tmp_path, partitioning="hive").to_table()
    assert wanted <= set(dataset.column_names)
    rows = store.read(tmp_path)
    assert rows["time_ms"].tolist()[2] == 1.5 and rows["time_ms"].isna().sum() == 4
    files = f"read_parquet('{tmp_path}/**/*.parquet', hive_partitioning=true, union_by_name=true)"
    duck = duckdb.connect().execute(f"select time_ms, loss from {files}").df()
    assert duck["time_ms"].notna().sum() == 1 and duck["loss"].notna().sum() == 2


def test_a_store_without_the_common_schema_gets_it_from_its_files_footers(tmp_path):
    write_sweep(tmp_path, jobs=3, extra={"time_ms": 1.5})
    (tmp_path / "columns").unlink()  # a store written before the file existed
    assert "time_ms" not in pd.read_parquet(tmp_path).columns, "pandas: the first file's"
    store.write_rows(
        store.SweepPaths(tmp_path, "exp", "s2").job(0).file, [{"job": 0, "other": 1.0}]
    )
    assert {"time_ms", "other", "max_abs_diff"} <= set(pd.read_parquet(tmp_path).columns)
    (tmp_path / "columns").unlink()
    (tmp_path / "columns").symlink_to(tmp_path / "exp-notes")  # not followed, replaced
    store.write_rows(
        store.SweepPaths(tmp_path, "exp", "s2").job(1).file, [{"job": 1, "later": 1.0}]
    )
    assert not (tmp_path / "columns").is_symlink() and not (tmp_path / "exp-notes").exists()
    assert {"time_ms", "later"} <= set(pd.read_parquet(tmp_path).columns)


def test_ints_and_floats_of_one_column_unify(tmp_path):
    store.write_rows(store.SweepPaths(tmp_path, "e", "s").job(0).file, [{"job": 0, "value": 1}])
    store.write_rows(store.SweepPaths(tmp_path, "e", "s").job(1).file, [{"job": 1, "value": 2.5}])
    assert store.read(tmp_path)["value"].tolist() == [1.0, 2.5]


def test_a_job_that_runs_again_replaces_its_rows(tmp_path):
    path = store.SweepPaths(tmp_path, "e", "s").job(4).file
    store.write_rows(path, [{"job": 4, "status": "failed", "error": "boom"}])
    store.write_rows(path, [{"job": 4, "status": "ok", "value": 1.0}])
    rows = store.read(tmp_path)
    assert rows[["job", "status"]].values.tolist() == [[4, "ok"]]


def test_hidden_and_underscore_files_are_not_rows(tmp_path):
    write_sweep(tmp_path, jobs=1)
    folder = store.SweepPaths(tmp_path, "exp", "s1").folder
    files.write_json(folder / store.MANIFEST, {"points": []})
    (folder / ".job-000009.parquet.123.tmp").write_bytes(b"PAR1 half a file")
    assert len(store.read(tmp_path)) == 1
    assert len(pd.read_parquet(tmp_path)) == 1


WRITER = """
import sys
from harness import store
rows = [{"job": 0, "status": "ok", "value": float(i), "text": "x" * 50} for i in range(400_000)]
path = store.SweepPaths(sys.argv[1], "e", "s").job(0).file
print("ready", flush=True)
while True:
    store.write_rows(path, rows)
"""


@pytest.mark.process
def test_a_writer_killed_mid_write_leaves_no_partial_file(tmp_path):
    """SIGKILL a write loop mid-write and between writes: every visible file is whole, every time.

    The kill waits for an event, not a moment: on even attempts for a temporary file to exist
    (a write in progress), on odd ones for the whole file; the store is checked after each.
    """
    folder = store.SweepPaths(tmp_path, "e", "s").folder
    seen_whole, seen_mid_write = False, False
    for attempt in range(40):
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True
        )
        temporaries = f".job-000000.parquet.{writer.pid}.*.tmp"
        try:
            assert writer.stdout.readline().strip() == "ready"
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                whole = (folder / "job-000000.parquet").exists()
                if any(folder.glob(temporaries)) if attempt % 2 == 0 else whole:
                    break
                time.sleep(0.001)
        finally:
            os.kill(writer.pid, signal.SIGKILL)
            writer.wait()
        assert len(store.read(tmp_path)) in (0, 400_000)
        assert len(pd.read_parquet(tmp_path)) in (0, 400_000) if folder.exists() else True
        seen_whole |= (folder / "job-000000.parquet").exists()
        seen_mid_write |= any(folder.glob(temporaries))
        if seen_whole and seen_mid_write and attempt >= 7:
            break
    assert seen_whole and seen_mid_write, (seen_whole, seen_mid_write)


def _manifest(sweep):
    return {"experiment": "exp", "sweep": sweep, "points": [{"job": 0, "params": {}}]}


def test_a_new_sweep_appears_with_its_manifest_or_not_at_all(tmp_path, monkeypatch):
    """A sweep folder never exists without its manifest (a kill between the two would leave a
    sweep that resume refuses): a write that fails leaves nothing; a taken id is refused, and
    the sweep holding it is left as it was; a killed creator's hidden folder goes later."""
    store.write_manifest(tmp_path, _manifest("s1"), new=True)
    assert store.sweeps(tmp_path, "exp") == ["s1"]
    assert store.read_manifest(store.SweepPaths(tmp_path, "exp", "s1"))["points"] == [
        {"job": 0, "params": {}}
    ]
    with pytest.raises(FileExistsError):
        store.write_manifest(tmp_path, {**_manifest("s1"), "points": []}, new=True)
    assert store.read_manifest(store.SweepPaths(tmp_path, "exp", "s1"))["points"] == [
        {"job": 0, "params": {}}
    ]

    def fails(path, text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files, "write_text", fails)
    with pytest.raises(OSError, match="No space"):
        store.write_manifest(tmp_path, _manifest("s2"), new=True)
    monkeypatch.undo()
    experiment = tmp_path / "experiment=exp"
    assert sorted(p.name for p in experiment.iterdir()) == ["sweep=s1"]

    stale = experiment / ".sweep=s3.123.abcd.tmp"  # a creator killed an hour ago
    stale.mkdir()
    (stale / store.MANIFEST).write_text("{")
    os.utime(stale, (time.time() - files.STALE_S - 60,) * 2)
    store.write_manifest(tmp_path, _manifest("s4"), new=True)
    assert sorted(p.name for p in experiment.iterdir()) == ["sweep=s1", "sweep=s4"]


@pytest.mark.parametrize("ids", [["20261129-101500-aaaa", "20261129-091500-bbbb"]])
def test_sweeps_sort_by_their_start_time(tmp_path, ids):
    for sweep in ids:
        write_sweep(tmp_path, sweep=sweep, jobs=1)
    assert store.sweeps(tmp_path, "exp") == sorted(ids)


def _random_bytes(data: bytes) -> bytes:
    return os.urandom(len(data))


DAMAGE = {
    "random bytes": _random_bytes,
    "half a file": lambda data: data[: len(data) // 2],
    "zero bytes": lambda data: b"",
}


@pytest.mark.parametrize("kind", DAMAGE)
def test_a_damaged_file_is_named_skipped_and_set_aside(tmp_path, kind, capsys):
    write_sweep(tmp_path, jobs=3)
    bad = store.SweepPaths(tmp_path, "exp", "s1").job(1).file
    bad.write_bytes(DAMAGE[kind](bad.read_bytes()))
    assert sorted(store.read(tmp_path)["job"]) == [0, 2]
    assert capsys.readouterr().err.count(f"warning: skipping {bad}: unreadable") == 1
    path, absorbed = store.compact(store.SweepPaths(tmp_path, "exp", "s1"))
    assert bad.name not in absorbed and bad.exists(), "compaction leaves it as it lies"
    (moved,) = store.set_aside(store.SweepPaths(tmp_path, "exp", "s1"))
    assert not bad.exists() and moved.name.startswith("_damaged-job-000001.parquet")
    assert not moved.name.endswith(".parquet")
    for rows in (pd.read_parquet(tmp_path), ds.dataset(tmp_path).to_table().to_pandas()):
        assert sorted(rows["job"]) == [0, 2]
    found = duckdb.sql(f"SELECT job FROM read_parquet('{tmp_path}/**/*.parquet')").fetchall()
    assert sorted(job for (job,) in found) == [0, 2]


def test_a_job_file_holding_another_jobs_rows_is_damaged(tmp_path, capsys):
    write_sweep(tmp_path, jobs=2)
    store.write_rows(
        store.SweepPaths(tmp_path, "exp", "s1").job(1).file, [{"job": 0, "status": "ok"}]
    )
    assert store.read(tmp_path)["job"].tolist() == [0]
    assert "a file of job 1 holding rows of jobs [0]" in capsys.readouterr().err


# A file's rows are digested by value up to files.SMALL cells, else as a Parquet reader returns
# them: with SMALL at 0, every table takes the second kind.
DIGESTS = pytest.mark.parametrize(
    "small", [files.SMALL, 0], ids=["values digest", "digest of the table as read"]
)


@DIGESTS
@pytest.mark.parametrize("nested", [False, True], ids=["flat columns", "a list column"])
def test_no_flipped_byte_changes_a_value_silently(tmp_path, nested, small, monkeypatch):
    """Parquet page checksums catch a flip in the data pages, the rows' digest in the file's
    metadata one that Parquet would read as another value (about 1 in 100 offsets without it),
    with flat columns (some all null, some partly) and with a list column."""
    monkeypatch.setattr(files, "SMALL", small)
    path = store.SweepPaths(tmp_path, "exp", "s1").job(3).file
    row = {"job": 3, "status": "ok", "length": 1024, "max_abs_diff": 3.5e-7, "error": None,
           "slurm_restarts": None, "slurm_job_id": None,
           "started_at": datetime.now(UTC)}  # fmt: skip
    if nested:
        row["time_samples_ms"] = [1.0, 2.5]
    store.write_rows(path, [row, {**row, "length": None, "error": "x", "slurm_restarts": 2}])
    kind = files.VALUES_DIGEST if small else files.DIGEST
    assert list(pq.read_schema(path).metadata) == [kind]
    written, _ = files.read_checked(path)
    assert silently_changed(path, written) == []


@DIGESTS
def test_every_table_reads_back_matching_its_digest(tmp_path, small, monkeypatch):
    """Whatever a Parquet reader puts under a null, or however it lays out the buffers, the rows
    it returns match the digest; slices of a bigger table too (what release writes)."""
    monkeypatch.setattr(files, "SMALL", small)
    rng = random.Random(0)
    values = {
        "int": lambda: rng.randint(-(2**62), 2**62),
        "float": lambda: rng.choice([rng.random(), math.nan, -0.0, math.inf]),
        "text": lambda: "é" * rng.randint(0, 9),
        "flag": lambda: rng.random() < 0.5,
        "time": lambda: datetime.now(UTC),
        "list": lambda: [rng.choice([rng.random(), None]) for _ in range(rng.randint(0, 3))],
        "record": lambda: {"n": rng.randint(0, 9), "names": ["a"] * rng.randint(0, 2)},
    }
    path = store.SweepPaths(tmp_path, "exp", "s1").job(1).file
    for _ in range(300):
        kinds = rng.choices(list(values), k=rng.randint(1, 6))
        rows = [
            {f"{k}{i}": values[k]() if rng.random() < 0.7 else None for i, k in enumerate(kinds)}
            for _ in range(rng.randint(1, 30))
        ]
        rows = [{"job": 1, **row} for row in rows]
        store.write_rows(path, rows)
        table, _ = files.read_checked(path)  # DamagedFile on a digest mismatch
        assert table.num_rows == len(rows)
        start = rng.randint(0, len(rows) - 1)
        files.write_table(path, table.slice(start, rng.randint(1, len(rows) - start)))
        files.read_checked(path)


def test_compact_removes_what_killed_writers_left_and_keeps_fresh_temporaries(tmp_path):
    write_sweep(tmp_path, jobs=2)
    folder = store.SweepPaths(tmp_path, "exp", "s1").folder
    stale, fresh = (
        folder / ".job-000001.parquet.123.ab12.tmp",
        folder / ".job-000002.parquet.9.c.tmp",
    )
    for path in (stale, fresh):
        path.write_bytes(b"half a write")
    old = time.time() - files.STALE_S - 60
    os.utime(stale, (old, old))
    store.compact(store.SweepPaths(tmp_path, "exp", "s1"))
    assert not stale.exists() and fresh.exists(), "a fresh one may be a writer at work"


def test_a_file_written_in_parts_reads_back_whole_and_no_flipped_byte_changes_it(tmp_path):
    """What a training job's end writes (files.write_parts: a row group per segment, each
    taken alone for the digest): partly null, list and time columns, an int column as floats."""
    path = store.SweepPaths(tmp_path, "exp", "s1").job(0).file
    started = datetime.now(UTC)
    parts = [
        store.rows_to_table(
            [
                {
                    "job": 0,
                    "status": "ok",
                    "step": step,
                    "loss": loss,
                    "samples": [1.0, step],
                    "started_at": started,
                }  # fmt: skip
                for step, loss in ((1, 2), (2, None))
            ]
        ),
        store.rows_to_table(
            [
                {
                    "job": 0,
                    "status": "failed",
                    "step": 3,
                    "loss": 0.5,
                    "error": "x",
                    "started_at": started,
                }
            ]
        ),  # fmt: skip
    ]
    schema = pa.unify_schemas([p.schema for p in parts], promote_options="permissive")
    conformed = [store.rows._conformed(part, schema) for part in parts]
    files.write_parts(path, lambda: conformed, schema)
    written, _ = files.read_checked(path)
    assert written["step"].to_pylist() == [1, 2, 3]
    assert written["loss"].to_pylist() == [2, None, 0.5]
    assert pq.ParquetFile(path).num_row_groups == 2
    assert silently_changed(path, written) == []


def silently_changed(path, written) -> list[int]:
    """The offsets of the file's bytes that, flipped one at a time, read back as other rows
    than `written` without files.read_checked calling the file damaged."""
    data, silent = path.read_bytes(), []
    for offset in range(len(data)):
        flipped = bytearray(data)
        flipped[offset] ^= 0xFF
        path.write_bytes(bytes(flipped))
        try:
            table, _ = files.read_checked(path)
        except files.DamagedFile:
            continue
        if not table.equals(written):
            silent.append(offset)
    return silent


def test_an_integer_column_with_gaps_reads_back_exactly(tmp_path):
    """A value beyond 2**53 that other points' rows lack: pandas' nullable integer types, never
    floats that round it."""
    write_jobs(tmp_path, "exp", "s1", [
        {"job": 0, "status": "ok", "big": 2**60 + 1, "huge": np.uint64(2**64 - 1)},
        {"job": 1, "status": "ok"},
    ])  # fmt: skip
    rows = store.read(tmp_path, "exp").sort_values("job")
    assert str(rows["big"].dtype) == "Int64" and str(rows["huge"].dtype) == "UInt64"
    assert rows["big"].tolist() == [2**60 + 1, pd.NA] and rows["huge"].iloc[0] == 2**64 - 1
    assert rows["job"].dtype == "int64", "a column without gaps as it was"


def test_a_logged_value_a_parquet_column_cannot_hold_is_refused_naming_its_column():
    """A training run's logged row is checked as it is logged (harness.tracking): the edges of
    a 64-bit integer pass, one beyond them, or a tensor, is a ValueError naming the column."""
    store.check_values({"step": 2**63 - 1, "low": -(2**63), "x": 1.5, "s": "a", "b": True})
    with pytest.raises(ValueError, match=r"^column 'step' holds an int 9223372036854775808 "):
        store.check_values({"loss": 1.0, "step": 2**63})
    with pytest.raises(ValueError, match=r"^column 'loss' holds a Tensor, which a Parquet"):
        store.check_values({"loss": torch.tensor(1.0)})
