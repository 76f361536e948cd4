"""Compaction: a sweep's job files merged into one, every row seen once by every reader, during
and after; resume and status on a compacted sweep."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow.dataset as ds
import pytest
from sweeps import write_jobs

from harness import store

JOBS = 40


def write_sweep(root, sweep, experiment="exp", jobs=range(JOBS), version=0):
    """One file per job; columns that only some jobs have (time_ms, note), a failed job."""
    rows = []
    for job in jobs:
        row = {"job": job, "status": "ok", "length": 64 * (job + 1), "version": version}
        if job % 7 == 3:
            row.update(status="failed", error="RuntimeError: boom")
        elif job % 2:
            row["time_ms"] = 1.0 + job
        else:
            row["note"] = f"even {job}"
        rows.append(row)
    write_jobs(root, experiment, sweep, rows)


def files(root, sweep, experiment="exp"):
    return sorted(p.name for p in store.result_files(root, experiment, sweep))


def once_each(rows: pd.DataFrame, jobs=range(JOBS)) -> bool:
    counts = rows.groupby("job").size()
    return sorted(counts.index) == list(jobs) and (counts == 1).all()


def test_compaction_leaves_one_file_that_every_reader_reads_once(tmp_path):
    write_sweep(tmp_path, "s1")
    write_sweep(tmp_path, "s2", jobs=range(5))
    path, absorbed = store.compact(store.SweepPaths(tmp_path, "exp", "s1"))
    assert files(tmp_path, "s1") == ["compacted-000001.parquet"] == [path.name]
    assert len(absorbed) == JOBS and files(tmp_path, "s2")[0] == "job-000000.parquet"
    rows = store.read(tmp_path)
    assert len(rows) == JOBS + 5 and once_each(rows[rows["sweep"] == "s1"])
    assert list(rows.columns[:2]) == ["experiment", "sweep"]
    s1 = rows[rows["sweep"] == "s1"].set_index("job")
    assert s1.loc[1, "time_ms"] == 2.0 and s1.loc[2, "note"] == "even 2"
    assert s1.loc[3, "status"] == "failed" and s1.index.is_monotonic_increasing
    by_pandas = pd.read_parquet(tmp_path)
    assert len(by_pandas) == JOBS + 5 and "time_ms" in by_pandas
    assert ds.dataset(tmp_path, partitioning="hive").to_table().num_rows == JOBS + 5
    parquet = f"read_parquet('{tmp_path}/**/*.parquet', hive_partitioning=true, union_by_name=true)"
    query = f"select count(*), count(distinct (sweep, job)), count(time_ms) from {parquet}"
    timed = int(rows["time_ms"].notna().sum())
    assert duckdb.connect().execute(query).fetchone() == (JOBS + 5, JOBS + 5, timed)
    assert store.compact(store.SweepPaths(tmp_path, "exp", "s1")) == (path, [])  # compacted already


def test_every_state_a_compaction_passes_through_reads_each_row_once(tmp_path, monkeypatch):
    """The states a compaction (or a crash in one) leaves: the merged file beside the files it
    absorbed, a job rerun after the compaction, two compacted files. store.read takes each
    job's rows from one file; plain readers see the overlap until the next compaction."""
    write_sweep(tmp_path, "s1")
    removal = store.compaction._remove_unchanged
    monkeypatch.setattr(store.compaction, "_remove_unchanged", lambda folder, identities: None)
    store.compact(
        store.SweepPaths(tmp_path, "exp", "s1")
    )  # as if it crashed before removing what it absorbed
    assert len(files(tmp_path, "s1")) == JOBS + 1
    assert once_each(store.read(tmp_path)) and len(pd.read_parquet(tmp_path)) == 2 * JOBS
    write_sweep(tmp_path, "s1", jobs=[3, 5], version=1)  # reruns, newer than the merged rows
    store.compact(store.SweepPaths(tmp_path, "exp", "s1"))
    assert files(tmp_path, "s1")[:2] == ["compacted-000001.parquet", "compacted-000002.parquet"]
    rows = store.read(tmp_path).set_index("job")
    assert once_each(rows.reset_index()) and rows["version"].sum() == 2
    assert rows.loc[[3, 5], "version"].tolist() == [1, 1]
    write_sweep(tmp_path, "s1", jobs=[5], version=2)
    rows = store.read(tmp_path).set_index("job")
    assert once_each(rows.reset_index()) and rows.loc[[3, 5], "version"].tolist() == [1, 2]
    monkeypatch.setattr(store.compaction, "_remove_unchanged", removal)
    store.compact(store.SweepPaths(tmp_path, "exp", "s1"))
    assert files(tmp_path, "s1") == ["compacted-000003.parquet"]
    by_pandas = pd.read_parquet(tmp_path).set_index("job")
    assert once_each(by_pandas.reset_index()) and by_pandas.loc[[3, 5], "version"].tolist() == [
        1,
        2,
    ]
    assert store.has_rows(store.SweepPaths(tmp_path, "exp", "s1").job(5)) and not store.has_rows(
        store.SweepPaths(tmp_path, "exp", "s1").job(99)
    )


def test_a_listing_that_missed_the_compacted_file_is_taken_again(tmp_path, monkeypatch):
    """A directory listing taken while a compaction renames its file in and removes the files
    it absorbed may miss both; the compacted files listed after the read differ, so the read
    starts over instead of returning only the job files the first listing saw."""
    write_sweep(tmp_path, "s1")
    monkeypatch.setattr(store.compaction, "_remove_unchanged", lambda folder, identities: None)
    store.compact(store.SweepPaths(tmp_path, "exp", "s1"))
    listdir, calls = os.listdir, []

    def torn_listing(folder):
        calls.append(folder)
        names = listdir(folder)
        return [n for n in names if n >= "job-000020"] if len(calls) == 1 else names

    monkeypatch.setattr(os, "listdir", torn_listing)
    assert once_each(store.read(tmp_path)) and len(calls) == 4  # listed, read, listed; again


def test_release_gives_jobs_their_own_files_back(tmp_path):
    write_sweep(tmp_path, "s1")
    store.compact(store.SweepPaths(tmp_path, "exp", "s1"))
    write_sweep(tmp_path, "s1", jobs=[5], version=1)  # a rerun that did not release job 5
    before = store.read(tmp_path)
    assert len(pd.read_parquet(tmp_path)) == JOBS + 1
    assert store.release(store.SweepPaths(tmp_path, "exp", "s1"), [3, 10, 99]) == [3, 10]
    assert files(tmp_path, "s1") == [
        "compacted-000002.parquet",
        "job-000003.parquet",
        "job-000005.parquet",
        "job-000010.parquet",
    ]
    assert len(pd.read_parquet(tmp_path)) == JOBS  # job 5's stale merged row is gone too
    after = store.read(tmp_path)
    pd.testing.assert_frame_equal(after[before.columns], before)
    alone = pd.read_parquet(store.SweepPaths(tmp_path, "exp", "s1").job(3).file)
    assert alone["status"].tolist() == ["failed"] and "time_ms" not in alone  # as written


READER = """
import json, sys
from pathlib import Path
from harness import store
root, stop, jobs = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
reads, mixed, bad = 0, 0, []
print("ready", flush=True)
while not stop.exists():
    names = [path.name for path in store.result_files(root)]
    rows = store.read(root)
    reads += 1
    mixed += {"compacted", "job"} <= {name.split("-")[0] for name in names}
    for sweep, part in rows.groupby("sweep"):
        counts = part.groupby("job").size()
        if sorted(counts.index) != list(range(jobs)) or (counts != 1).any():
            bad.append(f"{sweep}: {len(part)} rows, jobs {sorted(counts.index)}")
print(json.dumps({"reads": reads, "mixed": mixed, "bad": bad[:5]}))
"""


@pytest.mark.process
def test_a_reader_during_compactions_and_reruns_sees_every_row_once(tmp_path, monkeypatch):
    """A reader process loops store.read while fresh sweeps are compacted, jobs are released
    and rerun, and compacted again; removals are slowed so that reads land mid-compaction."""
    root, staging, stop = tmp_path / "results", tmp_path / "staging", tmp_path / "stop"
    (root / "experiment=exp").mkdir(parents=True)
    unlink = Path.unlink
    monkeypatch.setattr(Path, "unlink", lambda self, **kw: (time.sleep(0.005), unlink(self, **kw)))
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(root), str(stop), str(JOBS)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )
    try:
        assert reader.stdout.readline().strip() == "ready"
        for round_ in range(5):
            sweep = f"s{round_}"
            write_sweep(staging, sweep)  # then moved into place whole: a reader sees all or none
            store.SweepPaths(staging, "exp", sweep).folder.rename(
                store.SweepPaths(root, "exp", sweep).folder
            )
            store.compact(store.SweepPaths(root, "exp", sweep))
            rerun = list(range(round_, JOBS, 5))
            assert store.release(store.SweepPaths(root, "exp", sweep), rerun) == rerun
            write_sweep(root, sweep, jobs=rerun, version=1)
            store.compact(store.SweepPaths(root, "exp", sweep))
    finally:
        stop.touch()
        output, _ = reader.communicate(timeout=120)
    seen = json.loads(output.splitlines()[-1])
    assert seen["bad"] == [] and seen["reads"] > 0
    assert seen["mixed"] > 0, "no read landed mid-compaction: the test proved nothing"
    final = store.read(root)
    assert len(final) == 5 * JOBS and len(pd.read_parquet(root)) == 5 * JOBS
    assert final.groupby("sweep")["version"].sum().tolist() == [JOBS // 5] * 5


def test_resume_and_status_on_a_compacted_sweep(harness):
    grid = ("+experiment=exp014_tiled", "length=64,96", "block=16,32")
    assert harness(*grid).returncode == 0
    (sweep,) = store.sweeps(harness.results, "exp014_tiled")
    assert files(harness.results, sweep, "exp014_tiled") == ["compacted-000001.parquet"]
    result = harness("compact", sweep)  # the sweep compacted itself as it ended
    assert result.returncode == 0 and "is compacted already" in result.stdout, result.stderr
    first = store.read(harness.results)
    # Job 1 loses its rows and job 2 fails, inside the compacted file.
    store.release(store.SweepPaths(harness.results, "exp014_tiled", sweep), [1, 2])
    store.SweepPaths(harness.results, "exp014_tiled", sweep).job(1).file.unlink()
    failed = [{"job": 2, "status": "failed", "error": "x"}]
    store.write_rows(store.SweepPaths(harness.results, "exp014_tiled", sweep).job(2).file, failed)
    harness("compact", sweep)
    assert files(harness.results, sweep, "exp014_tiled") == ["compacted-000003.parquet"]
    status = harness("status", sweep)
    assert "| failed" in status.stdout and "| not run" in status.stdout, status.stderr
    result = harness("+experiment=exp014_tiled", f"resume={sweep}")
    assert result.returncode == 0, result.stderr
    assert "2 points to run" in result.stdout and "4 points: 4 ok" in result.stdout
    for rows in (store.read(harness.results), pd.read_parquet(harness.results)):
        assert once_each(rows, range(4)) and set(rows["status"]) == {"ok"}
    rows = store.read(harness.results).set_index("job")
    kept = first.set_index("job").loc[[0, 3], "started_at"]
    assert rows.loc[[0, 3], "started_at"].tolist() == kept.tolist()
    assert "4 ok" in harness("status", sweep).stdout
    assert "2 points to run" not in harness("+experiment=exp014_tiled", f"resume={sweep}").stdout


@pytest.mark.parametrize("argv", [["compact", "20990101-000000-0000"], ["compact"]])
def test_compacting_an_unknown_sweep_is_one_line_and_exit_2(harness, argv):
    result = harness(*argv)
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error: ")
