"""A store that a disk or a hand damaged: every command names the bad file in one line, counts
its point as not run, reports the rest; resume sets the file aside and reruns the point; a
sweep without a readable manifest is reported as damaged and fails --check."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from sweeps import own_file

from harness import files, store

GRID = ["+experiment=exp014_tiled", "length=64,80,96", "block=16", "heads=2"]


@pytest.fixture
def swept(harness):
    result = harness(*GRID)
    assert result.returncode == 0, result.stderr
    (sweep,) = store.sweeps(harness.results, "exp014_tiled")
    return sweep


def test_every_command_names_a_damaged_job_file_and_resume_reruns_its_point(
    harness, analysis, swept
):
    bad = own_file(harness.results, "exp014_tiled", swept, 1)
    bad.write_bytes(os.urandom(bad.stat().st_size))

    def named_once(stderr: str) -> bool:
        return stderr.startswith("warning: skipping ") and stderr.count(f"{bad.name}: unread") == 1

    shown = harness("status", swept)
    assert shown.returncode == 0 and named_once(shown.stderr)
    assert shown.stderr.count("\n") == 1 and "| not run" in shown.stdout
    checked = analysis("--check")
    assert checked.returncode == 1 and named_once(checked.stderr)
    assert "INCOMPLETE" in checked.stdout and "none for length=80 (not run)" in checked.stdout
    report = (harness.cwd / "outputs" / "report" / "REPORT.md").read_text()
    assert "**Skipped** `job-000001.parquet`" in report and "3 points: 2 ok, 1 not run" in report
    compacted = harness("compact", swept)
    assert compacted.returncode == 0 and named_once(compacted.stderr), compacted.stderr

    resumed = harness("+experiment=exp014_tiled", f"resume={swept}")
    assert resumed.returncode == 0, resumed.stderr
    assert "moved a damaged file aside" in resumed.stdout and "1 points to run" in resumed.stdout
    assert sorted(store.read(harness.results)["job"]) == [0, 1, 2]
    assert len(pd.read_parquet(harness.results)) == 3
    again = harness("status", swept)
    assert again.returncode == 0 and again.stderr == "" and "3 ok" in again.stdout


@pytest.mark.parametrize("damage", ["garbage", "deleted", "deep", "deeper", "big"])
def test_a_sweep_without_a_readable_manifest_is_damaged_and_fails_the_check(
    harness, analysis, swept, damage, monkeypatch
):
    manifest = store.SweepPaths(harness.results, "exp014_tiled", swept).folder / store.MANIFEST
    kept = json.loads(manifest.read_text())
    if damage == "deleted":
        manifest.unlink()
    elif damage == "garbage":
        manifest.write_text('{"points": [')
    elif damage == "big":  # over the limit: refused before it is parsed
        monkeypatch.setattr(files, "JSON_BYTES", manifest.stat().st_size - 1)
    else:  # nested past the limit, or past what Python's parser can
        depth = files.JSON_DEPTH if damage == "deep" else 100_000
        kept["experiment_config"]["table"] = "nested"
        manifest.write_text(json.dumps(kept).replace('"nested"', "[" * depth + "]" * depth))
    checked = analysis("--check")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert f"{manifest.parent.name}/{store.MANIFEST} is missing or unreadable" in checked.stdout
    reason = {"deep": "nested over 32 deep", "deeper": "nested over 32 deep", "big": "bytes, over"}
    assert reason.get(damage, "") in checked.stderr and "Traceback" not in checked.stderr
    report = (harness.cwd / "outputs" / "report" / "REPORT.md").read_text()
    assert "**Damaged:**" in report
    for command in (["status", swept], ["+experiment=exp014_tiled", f"resume={swept}"]):
        result = harness(*command)
        assert result.returncode == 2 and result.stderr.count("\n") <= 2, result.stderr
        assert result.stderr.splitlines()[-1].startswith("error: ")
    assert len(store.read(harness.results)) == 3, "its rows are still readable"


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("search", "lr", "its recorded search must be a mapping with its params, not 'lr'"),
        ("search", {"params": {"lr": "interval(0.1, 1)"}, "trials": "24"},
         "its recorded search.trials must be a positive integer, got '24'"),
        ("overrides", "length=1", "its overrides is not a list"),
        ("command", ["python"], "its command is not a str"),
    ],
)  # fmt: skip
def test_a_manifest_whose_settings_are_of_the_wrong_kind_is_damaged_not_a_traceback(
    harness, analysis, swept, key, value, said
):
    """A manifest is anyone's to edit: a setting a command reads, of the wrong kind, marks the
    sweep damaged, and each command says so in a line."""
    path = store.SweepPaths(harness.results, "exp014_tiled", swept).folder / store.MANIFEST
    manifest = json.loads(path.read_text())
    if key == "search":
        manifest["experiment_config"]["search"] = value
    else:
        manifest[key] = value
    path.write_text(json.dumps(manifest))
    checked = analysis("--check")
    assert checked.returncode == 1 and "Traceback" not in checked.stderr, checked.stderr
    assert f"a damaged manifest: {said}" in checked.stderr
    for command in (["status", swept], ["+experiment=exp014_tiled", f"resume={swept}"]):
        result = harness(*command)
        assert result.returncode == 2 and result.stderr.count("\n") <= 2, result.stderr
        assert "Traceback" not in result.stderr


@pytest.mark.process
def test_status_into_a_closed_pipe_exits_quietly(harness, swept):
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line
    process = subprocess.run(
        [sys.executable, "-m", "harness", "status", swept],
        cwd=harness.cwd,
        env={**os.environ, "PYTHONPATH": str(Path(store.__file__).parents[2])},
        stdout=write,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
    )
    os.close(write)
    assert process.returncode == 141 and process.stderr == ""


def test_rows_that_are_not_the_planned_point_count_as_not_run_until_rerun(harness, swept):
    path = own_file(harness.results, "exp014_tiled", swept, 0)
    row = pq.read_table(path).to_pylist()[0] | {"config_hash": "0123456789abcdef"}
    store.write_rows(path, [row])  # as if copied from another sweep
    shown = harness("status", swept)
    assert shown.returncode == 0 and "job-000000.parquet: its rows are not this sweep's" in (
        shown.stderr
    )
    assert "2 ok, 1 not run" in shown.stdout
    resumed = harness("+experiment=exp014_tiled", f"resume={swept}")
    assert resumed.returncode == 0 and "1 points to run" in resumed.stdout, resumed.stderr
    again = harness("status", swept)
    assert again.stderr == "" and "3 ok" in again.stdout


@pytest.fixture
def immutable():
    """Make folders read-only for everyone, root too (chattr +i: what another user's store is
    to this one), and writable again after the test; skipped where chattr cannot."""
    made: list[Path] = []

    def make(*folders: Path) -> None:
        for folder in folders:
            done = subprocess.run(["chattr", "-R", "+i", str(folder)], capture_output=True)
            if done.returncode:
                pytest.skip(f"chattr +i is refused here: {done.stderr.decode().strip()}")
            made.append(folder)

    yield make
    for folder in made:
        subprocess.run(["chattr", "-R", "-i", str(folder)], check=True)


@pytest.mark.process  # chattr
def test_a_store_that_cannot_be_written_is_reported_elsewhere_and_errors_are_one_line(
    harness, analysis, swept, immutable
):
    outputs = harness.cwd / "outputs"
    (harness.cwd / "outputs" / "report").mkdir()
    immutable(outputs / "results", outputs / "report")
    refused = analysis()
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.startswith("error: Operation not permitted: outputs/report/")
    assert refused.stderr.rstrip().endswith("(the report can go elsewhere: --report DIR)")
    elsewhere = harness.cwd / "elsewhere"
    checked = analysis("--report", str(elsewhere), "--check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "Traceback" not in checked.stderr and (elsewhere / "index.html").is_file()
    compacted = harness("compact", swept)
    assert compacted.returncode == 1 and compacted.stderr.count("\n") == 1, compacted.stderr
    assert compacted.stderr.startswith("error: Operation not permitted: ")
    assert harness("status", swept).returncode == 0
