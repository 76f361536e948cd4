"""Faults a user, a second user or a disk brings: nothing read from outputs/ runs code, no row
the sweep did not plan is stored, nothing is hidden or counted twice, and each failure is one
line (exit 2), or a failed row, with the command that works. One test (or table row) a fault."""

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from probes import PROBE_PATH, SUPPORT, arrivals, await_arrivals, wait_for
from sweeps import own_file

from harness import files, store
from harness.planning.plan import new_sweep_id

ROOT = Path(__file__).resolve().parent.parent
TINY = ["+experiment=exp014_tiled", "block=16", "heads=2"]


@pytest.fixture
def faulty(harness, tmp_path):
    """`python -m harness --config-dir CONF +experiment=faulty ARGS`, CONF a copy of the probe's
    config (tests/support/conf/experiment/faulty.yaml) that a test may edit as a user would."""
    conf = tmp_path / "conf"
    (conf / "experiment").mkdir(parents=True)
    shutil.copy(SUPPORT / "conf" / "experiment" / "faulty.yaml", conf / "experiment")
    given = ["--config-dir", str(conf), "+experiment=faulty"]

    def run(*args: str, **kwargs):
        return harness(*given, *args, env={"PYTHONPATH": PROBE_PATH}, **kwargs)

    run.conf, run.yaml = conf, conf / "experiment" / "faulty.yaml"
    run.results, run.cwd, run.harness = harness.results, harness.cwd, harness
    run.env = {"PYTHONPATH": PROBE_PATH}
    return run


def only_sweep(results: Path, experiment: str) -> str:
    (sweep,) = store.sweeps(results, experiment)
    return sweep


def manifest_path(results: Path, experiment: str, sweep: str) -> Path:
    return store.SweepPaths(results, experiment, sweep).folder / store.MANIFEST


def duckdb_count(results: Path) -> int:
    files = f"'{results}/**/*.parquet', hive_partitioning=true, union_by_name=true"
    return duckdb.connect().execute(f"select count(*) from read_parquet({files})").fetchone()[0]


def one_line_error(result) -> bool:
    return (
        result.returncode == 2
        and result.stderr.startswith("error: ")
        and result.stderr.count("\n") == 1
        and "Traceback" not in result.stdout + result.stderr
    )


# 1. Nothing read from outputs/ runs code (the checkpoint's case is in test_tracking.py, the
# claims' expressions in test_expressions.py).


@pytest.mark.parametrize(
    "key, named, said", [("report", "outputs.evil", "report module"),
                         ("derive", "outputs.evil.tables", "tables")]
)  # fmt: skip
def test_code_named_only_by_a_manifest_is_not_imported(harness, analysis, key, named, said):
    assert harness(*TINY, "length=64,80").returncode == 0
    sweep = only_sweep(harness.results, "exp014_tiled")
    planted = harness.cwd / "planted"
    (harness.cwd / "outputs" / "evil.py").write_text(
        f"open({str(planted)!r}, 'w').close()\ndef tables(rows):\n    return {{}}\n"
    )
    path = manifest_path(harness.results, "exp014_tiled", sweep)
    manifest = json.loads(path.read_text())
    manifest["experiment_config"][key] = named
    path.write_text(json.dumps(manifest))
    result = analysis()
    assert result.returncode == 0, result.stderr
    assert not planted.exists(), f"the manifest's {key} ran"
    report = (harness.cwd / "outputs" / "report" / "REPORT.md").read_text()
    assert f"**Not loaded:** the {said} `{named}`" in report


# 2-4. The row stored is the planned point's: what the manifest planned runs on resume, values
# read once at planning, quoted strings as their text.


def test_a_config_edited_before_a_resume_changes_nothing_the_sweep_planned(faulty):
    first = faulty(f"folder={faulty.cwd}", "fail=1")
    assert first.returncode == 1
    faulty.yaml.write_text(faulty.yaml.read_text().replace("tag: t\n", "tag: t2\n"))
    (faulty.cwd / "fixed").touch()
    sweep = only_sweep(faulty.results, "faulty")
    resumed = faulty(f"resume={sweep}")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "1 points to run" in resumed.stdout and "3 points: 3 ok" in resumed.stdout
    rows = store.read(faulty.results, "faulty")
    assert rows["tag"].tolist() == ["t"] * 3 and rows["tag_seen"].tolist() == ["t"] * 3
    assert duckdb_count(faulty.results) == 3 and len(pd.read_parquet(faulty.results)) == 3
    log = Path(rows.loc[rows["job"] == 1, "run_dir"].iloc[0]) / "harness.log"
    assert "tag is 't2' in the config now; the sweep planned 't'" in log.read_text()
    again = faulty(f"resume={sweep}")
    assert again.returncode == 0 and "0 points to run" in again.stdout


def test_a_value_that_differs_at_each_read_is_read_once_when_planned(faulty):
    result = faulty("point=0,1", "tag=${now:%H%M%S%f}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 points: 2 ok" in result.stdout
    sweep = only_sweep(faulty.results, "faulty")
    planned = json.loads(manifest_path(faulty.results, "faulty", sweep).read_text())["points"]
    rows = store.read(faulty.results, "faulty").sort_values("job")
    assert rows["tag_seen"].tolist() == [point["params"]["tag"] for point in planned]
    assert faulty.harness("status", sweep).stdout.count("| ok") == 2


@pytest.mark.parametrize(
    "grid, column, values",
    [(["tag='a b',c"], "tag", ["a b", "c"]), (["tag='x,y',\"it's\""], "tag", ["x,y", "it's"])],
)
def test_quoted_strings_in_a_swept_list_are_their_text(faulty, grid, column, values):
    result = faulty("point=0", *grid)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = store.read(faulty.results, "faulty").sort_values("job")
    assert rows[column].tolist() == values and rows["tag_seen"].tolist() == values
    sweep = only_sweep(faulty.results, "faulty")
    planned = json.loads(manifest_path(faulty.results, "faulty", sweep).read_text())["points"]
    assert [point["params"][column] for point in planned] == values


def test_a_quoted_choice_of_a_literal_parameter_is_accepted(harness):
    result = harness(*TINY, "length=64", "dtype='float32',float64")
    assert result.returncode == 0, result.stderr
    assert sorted(set(store.read(harness.results)["dtype"])) == ["float32", "float64"]


def test_a_swept_parameter_the_config_lacks_runs_each_point(faulty):
    """A parameter with only its function's default, swept by the grid or the command line."""
    faulty.yaml.write_text(faulty.yaml.read_text().replace("point: 0\n", ""))
    for grid, points in (([], [0, 1, 2]), (["point=5,6"], [5, 6])):
        result = faulty(*grid)
        assert result.returncode == 0, result.stdout + result.stderr
        sweep = store.sweeps(faulty.results, "faulty")[-1]
        assert store.read(faulty.results, "faulty", sweep)["point"].tolist() == points


# 5. A compaction stopped by a signal finishes first: no reader sees a row twice.

STOP_AT_FIRST_REMOVAL = """
import os, signal, sys
from harness.command.cli import main
signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal, not ignored
real = os.unlink
def unlink(path, *args, **kwargs):
    if os.path.basename(str(path)).startswith("job-"):
        os.kill(os.getpid(), signal.{signal})
    return real(path, *args, **kwargs)
os.unlink = unlink
main(sys.argv[1:])
"""


@pytest.mark.process
@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM"])
def test_a_sweep_stopped_while_it_compacts_reads_each_row_once(harness, stop):
    """The signal comes as the end-of-sweep compaction removes its first merged file: the merge
    completes, then the sweep stops, saying where its rows are."""
    code = STOP_AT_FIRST_REMOVAL.replace("{signal}", stop)
    grid = ["+experiment=exp014_tiled", "length=range(40,44)", "block=16", "heads=2"]
    result = subprocess.run(
        [sys.executable, "-c", code, *grid], cwd=harness.cwd, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600,
    )  # fmt: skip
    assert result.returncode == (130 if stop == "SIGINT" else 143), result.stderr
    sweep = only_sweep(harness.results, "exp014_tiled")
    assert "Traceback" not in result.stderr
    assert (
        f"interrupted; its points had ended; see them with: python -m harness status {sweep}"
        in (result.stderr)
    )
    folder = store.SweepPaths(harness.results, "exp014_tiled", sweep).folder
    assert [p.name for p in folder.glob("*.parquet")] == ["compacted-000001.parquet"]
    assert duckdb_count(harness.results) == 4 and len(pd.read_parquet(harness.results)) == 4


@pytest.mark.process
def test_compact_stopped_by_ctrl_c_finishes_the_merge_first(harness):
    assert harness(*TINY, "length=range(40,44)").returncode == 0
    sweep = only_sweep(harness.results, "exp014_tiled")
    for job in range(4):
        own_file(harness.results, "exp014_tiled", sweep, job)
    code = STOP_AT_FIRST_REMOVAL.replace("{signal}", "SIGINT")
    result = subprocess.run(
        [sys.executable, "-c", code, "compact", sweep], cwd=harness.cwd, capture_output=True,
        text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600,
    )  # fmt: skip
    assert result.returncode == 130 and result.stderr == "\ninterrupted\n", result.stderr
    folder = store.SweepPaths(harness.results, "exp014_tiled", sweep).folder
    assert len(list(folder.glob("*.parquet"))) == 1 and duckdb_count(harness.results) == 4


# 6-7. Names and folders from configs and the command line.


def test_an_out_dir_with_spaces_equals_and_brackets_runs_and_its_commands_work(faulty):
    """The rerun hint, split as a shell splits it, is the command that finishes the sweep (its
    words after python -m harness called in this process, as that process would be called)."""
    out = faulty.cwd / "runs" / "o b=c [1]"
    result = faulty(f"out='{out}'", f"folder={faulty.cwd}", "fail=1")
    assert result.returncode == 1, result.stdout + result.stderr
    results = out / "results"
    sweep = only_sweep(results, "faulty")
    assert store.read(results, "faulty")["status"].tolist() == ["ok", "failed", "ok"]
    hint = result.stderr.strip().splitlines()[-1].split("rerun them with: ")[1]
    assert f"out='{out}'" in shlex.split(hint)
    (faulty.cwd / "fixed").touch()
    words = shlex.split(hint)
    assert words[1:3] == ["-m", "harness"], hint
    resumed = faulty.harness(*words[3:], env=faulty.env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert set(store.read(results, "faulty")["status"]) == {"ok"}
    for given in (f"out='{out}'", f"out={out}"):
        shown = faulty.harness("status", sweep, given)
        assert shown.returncode == 0 and shown.stdout.count("| ok") == 3, shown.stderr


NAMES = [
    ("name: faulty", "name: other", "experiment.name is 'other' in experiment/faulty.yaml"),
    ("name: faulty", "name: ../../../escaped", "experiment.name is '../../../escaped'"),
]


@pytest.mark.parametrize("old, new, said", NAMES)
def test_an_experiment_named_otherwise_than_its_file_is_refused(faulty, old, new, said):
    faulty.yaml.write_text(faulty.yaml.read_text().replace(old, new))
    result = faulty()
    assert one_line_error(result) and said in result.stderr, result.stderr
    assert not (faulty.cwd / "outputs").exists() and not (faulty.cwd.parent / "escaped").exists()


def test_an_experiment_name_that_is_no_plain_name_is_refused(faulty):
    text = faulty.yaml.read_text().replace("name: faulty", "name: exp[1]")
    (faulty.conf / "experiment" / "exp[1].yaml").write_text(text)
    result = faulty.harness("--config-dir", str(faulty.conf), "+experiment='exp[1]'",
                            env=faulty.env)  # fmt: skip
    assert one_line_error(result) and "'exp[1]' is not a plain name" in result.stderr


@pytest.mark.parametrize("command", [["status"], ["compact"], ["+experiment=exp014_tiled"]])
def test_a_sweep_id_that_is_no_plain_name_is_refused(harness, command):
    given = [*command, "resume=../x"] if command[0].startswith("+") else [*command, "../x"]
    result = harness(*given)
    assert one_line_error(result) and "sweep id '../x' is not a plain name" in result.stderr


# 8-9. Files and columns the readers cannot take as they are.


def test_a_column_whose_type_changes_between_points_is_read_as_text(faulty, analysis):
    result = faulty("kinds=true")
    assert result.returncode == 0, result.stderr
    assert "warning: column val holds" in result.stderr and "Traceback" not in result.stderr
    sweep = only_sweep(faulty.results, "faulty")
    assert store.read(faulty.results, "faulty")["val"].tolist() == ["0", "text-1", "text-2"]
    for command in (["status", sweep], ["compact", sweep]):
        shown = faulty.harness(*command)
        assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    assert faulty(f"resume={sweep}").returncode == 0
    assert analysis().returncode == 0
    assert duckdb_count(faulty.results) == 3


def _plant(kind: str, path: Path) -> None:
    if kind == "a folder":
        path.mkdir()
    elif kind == "a dangling symbolic link":
        path.symlink_to(path.parent / "nowhere.parquet")
    else:  # a socket, which open() cannot read (bound by a short relative name)
        here = os.getcwd()
        os.chdir(path.parent)
        try:
            bound = socket.socket(socket.AF_UNIX)
            bound.bind(path.name)
            bound.close()
        finally:
            os.chdir(here)


@pytest.mark.parametrize("kind", ["a folder", "a dangling symbolic link", "a socket"])
def test_an_entry_that_cannot_be_read_is_named_and_its_point_reruns(harness, analysis, kind):
    assert harness(*TINY, "length=64,80,96").returncode == 0
    sweep = only_sweep(harness.results, "exp014_tiled")
    path = own_file(harness.results, "exp014_tiled", sweep, 1)
    path.unlink()
    _plant(kind, path)
    shown = harness("status", sweep)
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    assert shown.stderr.startswith(f"warning: skipping {path}") and "| not run" in shown.stdout
    assert analysis().returncode == 0 and harness("compact", sweep).returncode == 0
    resumed = harness("+experiment=exp014_tiled", f"resume={sweep}")
    assert resumed.returncode == 0 and "moved a damaged file aside" in resumed.stdout
    assert sorted(store.read(harness.results)["job"]) == [0, 1, 2]
    assert duckdb_count(harness.results) == 3


@pytest.mark.process
@pytest.mark.skipif(os.geteuid() != 0, reason="reads the store as another user: needs root")
def test_a_file_of_another_user_that_cannot_be_read_is_named(harness):
    assert harness(*TINY, "length=64,80,96").returncode == 0
    sweep = only_sweep(harness.results, "exp014_tiled")
    path = own_file(harness.results, "exp014_tiled", sweep, 1)
    path.chmod(0o600)
    for folder in [harness.cwd, *harness.cwd.parents]:
        folder.chmod(folder.stat().st_mode | 0o005)  # others may pass and list
    for entry in harness.results.rglob("*"):
        if entry != path:
            entry.chmod(entry.stat().st_mode | 0o004)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # as nobody: the store as it lies, read with this process's harness
        code = 4
        try:
            os.close(read)
            os.setgid(65534)
            os.setuid(65534)
            sys.stderr = os.fdopen(write, "w")
            rows = store.read(harness.results, "exp014_tiled", sweep)
            code = 0 if sorted(rows["job"]) == [0, 2] else 3
        finally:  # never back into pytest
            sys.stderr.flush()
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as said:
        warned = said.read()
    _, code = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(code) == 0
    assert f"skipping {path}: cannot be read (PermissionError" in warned


# 10. An experiment that ends the process.


@pytest.mark.parametrize("how", ["sys.exit", "os._exit"])
def test_an_experiment_that_ends_the_process_is_a_failed_row(faulty, how):
    result = faulty("exit_at=1", f"exit_with={how}")
    assert result.returncode == 1, result.stdout + result.stderr
    rows = store.read(faulty.results, "faulty").sort_values("job")
    assert rows["status"].tolist() == ["ok", "failed", "ok"]
    assert rows["error"].iloc[1] == f"the experiment called {how}(0)"
    assert "1 of 3 points have no answer; rerun them with: " in result.stderr


# 11. Sweeps started at once.


def test_sweep_ids_sort_by_the_millisecond():
    moments = [datetime(2026, 12, 1, 8, 0, 0, 1000 * ms, tzinfo=UTC) for ms in (0, 1, 500, 999)]
    ids = [new_sweep_id(moment) for moment in moments]
    assert ids == sorted(ids) and len(set(ids)) == 4
    assert all(i.startswith("20261201-080000-") and len(i) == 20 for i in ids)


def test_a_taken_sweep_id_is_never_reused(harness, monkeypatch):
    ids = iter(["20261201-080000-0001", "20261201-080000-0001", "20261201-080000-0002"])
    monkeypatch.setattr("harness.command.sweep.new_sweep_id", lambda: next(ids))
    for grid in (["length=64"], ["length=80"]):
        ran = harness("+experiment=exp014_tiled", *grid, "block=16", "heads=2")
        assert ran.returncode == 0, ran.stdout + ran.stderr
    assert store.sweeps(harness.results, "exp014_tiled") == ["20261201-080000-0001",
                                                             "20261201-080000-0002"]  # fmt: skip
    rows = store.read(harness.results, "exp014_tiled")
    assert dict(zip(rows["sweep"], rows["length"], strict=True)) == {
        "20261201-080000-0001": 64, "20261201-080000-0002": 80,
    }  # fmt: skip


# 12. A full disk.


@pytest.mark.process
def test_a_full_disk_stops_the_sweep_with_one_line_and_resume_finishes_it(faulty, small_disk):
    out = small_disk / "out"
    result = faulty("point=range(30)", "pad_kib=200", f"out={out}")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "Logging error" not in result.stderr
    (said,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert "cannot write the sweep's outputs (No space left on device" in said
    assert "the sweep stopped" in said and "resume=" in said
    rows = store.read(out / "results", "faulty")
    assert 0 < len(rows) < 30 and set(rows["status"]) == {"ok"}, "no failed rows for the disk"
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    resumed = faulty(f"resume={only_sweep(out / 'results', 'faulty')}", f"out={out}")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert sorted(store.read(out / "results", "faulty")["job"]) == list(range(30))


# 13-14. Files the harness did not write, or left.


def test_a_temporary_file_a_kill_left_goes_at_the_next_resume_or_report(harness, analysis):
    assert harness(*TINY, "length=64,80").returncode == 0
    sweep = only_sweep(harness.results, "exp014_tiled")
    own_file(harness.results, "exp014_tiled", sweep, 1).unlink()
    folder = store.SweepPaths(harness.results, "exp014_tiled", sweep).folder
    left = folder / ".job-000001.parquet.999.abcd1234.tmp"
    left.write_bytes(b"half a file")
    cut = store.SweepPaths(harness.results, "exp014_tiled", "20261201-000000-0000").folder
    cut.mkdir()
    manifest_left = cut / "._sweep.json.999.abcd1234.tmp"
    manifest_left.write_text('{"points": [')
    hour_ago = datetime.now(UTC).timestamp() - 2 * files.STALE_S
    os.utime(manifest_left, (hour_ago, hour_ago))
    assert harness("+experiment=exp014_tiled", f"resume={sweep}").returncode == 0
    assert not left.exists(), "the rerun point's temporary goes at its resume"
    report = analysis()
    assert report.returncode == 0
    text = (harness.cwd / "outputs" / "report" / "REPORT.md").read_text()
    assert "nothing landed yet" not in text and not cut.exists()


def test_a_job_file_without_the_harness_digest_is_no_result(harness, analysis):
    assert harness(*TINY, "length=64,80").returncode == 0
    sweep = only_sweep(harness.results, "exp014_tiled")
    path = own_file(harness.results, "exp014_tiled", sweep, 1)
    table = pq.read_table(path)
    edited = table.set_column(table.column_names.index("max_abs_diff"), "max_abs_diff",
                              pa.array([999.0]))  # fmt: skip
    pq.write_table(edited.replace_schema_metadata(None), path)
    shown = harness("status", sweep)
    assert "carries no digest of its rows: not written by the harness" in shown.stderr
    assert "| not run" in shown.stdout
    assert 999.0 not in store.read(harness.results)["max_abs_diff"].tolist()
    analysis()
    text = (harness.cwd / "outputs" / "report" / "REPORT.md").read_text()
    shown_values = re.sub(r"`[^`]*`", "", text)  # not the commit's hash, which may hold "999"
    assert not re.search(r"\b999\b", shown_values)


# 15. The local launcher's points end with their sweep.


@pytest.mark.process
def test_the_local_launchers_points_end_when_the_sweep_is_killed(probe, gate):
    running = probe.start("point=0", f"folder={gate}", "release=never", "hydra/launcher=local")
    wait_for(lambda: arrivals(gate), 120, "the point to start")
    (arrival,) = arrivals(gate)
    point_pid = int(arrival.name.rsplit("-", 1)[1])
    os.kill(running.pid, signal.SIGKILL)  # the sweep's process alone
    running.wait(timeout=60)
    wait_for(lambda: not Path(f"/proc/{point_pid}").exists(), 120, "the point to end")


def marked(mark: str) -> list[str]:
    """The processes (pid: command) whose environment holds `mark`: a sweep's and all it
    started, whatever became of their parents."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and mark.encode() in (proc / "environ").read_bytes():
                command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
                found.append(f"{proc.name}: {command}")
        except OSError:  # gone meanwhile, or a zombie's
            continue
    return found


@pytest.mark.process
@pytest.mark.parametrize("how", ["SIGKILL", "Ctrl-C"])
@pytest.mark.parametrize("launcher", [[], ["hydra/launcher=local"]], ids=["basic", "local"])
def test_no_process_a_point_started_outlives_its_sweep(harness, gate, launcher, how):
    """A point whose work waits in an isolated measurement child (with its forkserver and the
    resource tracker beside it): the sweep's process killed, or Ctrl-C to its terminal's
    group, and every process of the sweep ends."""
    token = os.urandom(6).hex()
    mark = f"HARNESS_TEST_MARK={token}"
    running = harness.start("--config-dir", str(SUPPORT / "conf"), "+experiment=isolated",
                            f"folder={gate}", *launcher,
                            env={"PYTHONPATH": PROBE_PATH, "HARNESS_TEST_MARK": token})  # fmt: skip
    wait_for(lambda: list(gate.glob("child-*")), 120, "the isolated child to start")
    if how == "SIGKILL":
        os.kill(running.pid, signal.SIGKILL)  # the sweep's process alone
    else:
        os.killpg(running.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends
    running.communicate(timeout=120)
    wait_for(
        lambda: not marked(mark),
        60,
        "the sweep's processes to end",
        describe=lambda: "\n".join(marked(mark)),
    )


# 16. Manifests and table specs that cannot be read as they are.

MANIFEST_DAMAGE = [
    ("a point without its job", lambda m: m["points"][1].pop("job"), "point 1 has no job number"),
    ("a null point", lambda m: m["points"].__setitem__(1, None), "point 1 is not a mapping"),
    ("no points", lambda m: m["points"].clear(), "its list of points is empty"),
    ("a job twice", lambda m: m["points"][1].update(job=0), "point 1 has no job number"),
]


@pytest.mark.parametrize("what, damage, said", MANIFEST_DAMAGE, ids=[d[0] for d in MANIFEST_DAMAGE])
def test_a_malformed_manifest_is_damaged_for_every_command(harness, analysis, what, damage, said):
    assert harness(*TINY, "length=64,80").returncode == 0
    sweep = only_sweep(harness.results, "exp014_tiled")
    path = manifest_path(harness.results, "exp014_tiled", sweep)
    manifest = json.loads(path.read_text())
    damage(manifest)
    path.write_text(json.dumps(manifest))
    for command in (["status", sweep], ["+experiment=exp014_tiled", f"resume={sweep}"]):
        result = harness(*command)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.splitlines()[-1].startswith("error: ")
        assert f"a damaged manifest: {said}" in result.stderr
    checked = analysis("--check")
    assert checked.returncode == 1 and "is missing or unreadable" in checked.stdout


TABLE_SPECS = [
    ("table: {index: point, columns: tag, values: val}", "table: {index: point, value: val}",
     "table takes index, columns, values, where, reduce, not value"),
    ("table: {index: point, columns: tag, values: val}", "plots: tag",
     "plots must be a list of metrics"),
    ("table: {index: point, columns: tag, values: val}", "table: [point]", "table must be"),
    ("table: {index: point, columns: tag, values: val}", "claims: [{max: 1}]", "claim 1"),
]  # fmt: skip


@pytest.mark.parametrize("old, new, said", TABLE_SPECS)
def test_a_table_or_claims_spec_that_cannot_work_is_refused_before_anything_runs(
    faulty, old, new, said
):
    faulty.yaml.write_text(faulty.yaml.read_text().replace(old, new))
    result = faulty()
    assert one_line_error(result) and said in result.stderr, result.stderr
    assert not (faulty.cwd / "outputs").exists()


# 17. What a new user meets.


@pytest.mark.skipif(torch.cuda.is_available(), reason="asks for CUDA where there is none")
@pytest.mark.parametrize("device", ["cuda", "cuda:1", "cpu,cuda"])
def test_cuda_asked_for_where_there_is_none_is_refused_before_anything_runs(harness, device):
    result = harness(*TINY, "length=64", f"device={device}")
    assert one_line_error(result), result.stderr
    assert "but this machine has no CUDA GPU" in result.stderr
    assert not (harness.cwd / "outputs").exists()


def test_a_long_error_is_shortened_in_the_status_table(faulty):
    faulty.yaml.write_text(faulty.yaml.read_text().replace('folder: ""', f"folder: {'x' * 900}"))
    result = faulty("fail=1")
    assert result.returncode == 1
    shown = faulty.harness("status", only_sweep(faulty.results, "faulty"))
    assert max(len(line) for line in shown.stdout.splitlines()) < 260, shown.stdout


def test_resuming_a_users_sweep_without_its_config_dir_says_the_command_that_works(faulty):
    assert faulty(f"folder={faulty.cwd}", "fail=1").returncode == 1
    sweep = only_sweep(faulty.results, "faulty")
    result = faulty.harness(f"resume={sweep}", env=faulty.env)
    assert one_line_error(result), result.stderr
    command = f"python -m harness --config-dir {faulty.conf} resume={sweep}"
    assert f"an experiment of --config-dir {faulty.conf}; resume it with: {command}" in (
        result.stderr
    )
    (faulty.cwd / "fixed").touch()
    works = faulty.harness(*shlex.split(command)[3:], env=faulty.env)
    assert works.returncode == 0, works.stdout + works.stderr


def test_resuming_another_experiments_sweep_says_whose_it_is(harness):
    assert harness(*TINY, "length=64,80").returncode == 0
    sweep = only_sweep(harness.results, "exp014_tiled")
    result = harness("+experiment=exp015_backends", f"resume={sweep}")
    assert one_line_error(result)
    assert f"sweep {sweep} is exp014_tiled's, not exp015_backends's" in result.stderr
    alone = harness(f"resume={sweep}")
    assert alone.returncode == 0 and "0 points to run" in alone.stdout


def test_status_of_an_unfinished_sweep_says_how_to_finish_it(faulty):
    """With its --config-dir and out=, and the launcher settings it ran with repeated; the
    command it gives finishes the sweep."""
    out = faulty.cwd / "elsewhere"
    ran = faulty(f"out={out}", "fail=1", "hydra/launcher=basic", "wait=true")
    assert ran.returncode == 1
    sweep = only_sweep(out / "results", "faulty")
    shown = faulty.harness("status", sweep, f"out={out}")
    assert shown.returncode == 0
    command = (f"--config-dir {faulty.conf} +experiment=faulty resume={sweep} "
               f"hydra/launcher=basic wait=true out={out}")  # fmt: skip
    assert f"finish it with: python -m harness {command}" in shown.stdout
    (faulty.cwd / "fixed").touch()
    finished = faulty.harness(*shlex.split(command), env=faulty.env)
    assert finished.returncode == 0 and "1 points to run" in finished.stdout, finished.stdout


def test_status_last_of_an_experiment_names_its_newest_sweep(harness):
    assert harness(*TINY, "length=64").returncode == 0
    (first,) = store.sweeps(harness.results, "exp014_tiled")
    other = ["--config-dir", str(SUPPORT / "conf"), "+experiment=rendezvous", "point=0"]
    ran = harness(*other, f"folder={harness.cwd}", env={"PYTHONPATH": PROBE_PATH})
    assert ran.returncode == 0, ran.stderr
    shown = harness("status", "last", "+experiment=exp014_tiled")
    assert shown.returncode == 0 and f"sweep {first} (exp014_tiled)" in shown.stdout, shown.stderr
    compacted = harness("compact", "last", "+experiment=exp014_tiled")
    assert compacted.returncode == 0, compacted.stderr


@pytest.mark.parametrize("damage", ["emptied", "cut short"])
def test_a_damaged_columns_file_is_named_and_rebuilt_by_status_and_the_report(
    harness, analysis, damage
):
    """pandas' and pyarrow's folder readers raise on a columns file that cannot be read; status
    and the report each say so and rebuild it, and the readers read every row again."""
    assert harness(*TINY, "length=64,80").returncode == 0
    (sweep,) = store.sweeps(harness.results, "exp014_tiled")
    columns = harness.results / "columns"
    for command in (("status", sweep), None):
        data = columns.read_bytes()
        columns.write_bytes(b"" if damage == "emptied" else data[: len(data) // 2])
        with pytest.raises(Exception):  # noqa: B017 - whatever pyarrow raises for it
            pd.read_parquet(harness.results)
        ran = harness(*command) if command else analysis()
        assert ran.returncode == 0, ran.stderr
        assert "the store's columns file" in ran.stderr
        assert "results/columns could not be read" in ran.stderr
        assert "rebuilt from the row files" in ran.stderr
        assert len(pd.read_parquet(harness.results)) == 2
        assert pq.read_table(harness.results).num_rows == 2


@pytest.mark.process
def test_status_of_a_sweep_a_command_runs_now_shows_its_points_pending_and_running(probe, gate):
    """A local sweep held at its second point: status shows the first ok, the second running,
    the third pending, names the command's process and advises no resume."""
    sweeping = probe.start("point=0,1,2", f"folder={gate}", "release=open", "hold=1")
    await_arrivals(gate, 2)
    (sweep,) = store.sweeps(probe.results, "rendezvous")
    shown = probe.harness("status", sweep)
    (gate / "open").touch()
    assert sweeping.wait(timeout=300) == 0
    assert shown.returncode == 0, shown.stderr
    states = {int(line.split("|")[1]): line.split("|")[3].strip()
              for line in shown.stdout.splitlines() if re.match(r"\| \d", line)}  # fmt: skip
    assert states == {0: "ok", 1: "running", 2: "pending"}, shown.stdout
    assert f"a command runs it now (pid {sweeping.pid} on" in shown.stdout
    assert "finish it with" not in shown.stdout


@pytest.mark.parametrize(
    "line",
    ["hydra.launcher._target_=builtins.exec", "experiment.run=os.system",
     "hydra.job.env_set.LD_PRELOAD=/planted.so", "+hydra.callbacks.x._target_=os.system"],
)  # fmt: skip
def test_a_resume_takes_no_code_from_the_manifest(harness, line):
    """A manifest's overrides are what a resume composes; one naming code to run is refused."""
    assert harness(*TINY, "length=64,80").returncode == 0
    sweep = only_sweep(harness.results, "exp014_tiled")
    path = manifest_path(harness.results, "exp014_tiled", sweep)
    manifest = json.loads(path.read_text())
    manifest["overrides"].append(line)
    path.write_text(json.dumps(manifest))
    result = harness(f"resume={sweep}")
    assert one_line_error(result) and "which names code to run" in result.stderr, result.stderr


# A sweep whose first points all fail alike stops: the rest would compute only to fail.


@pytest.mark.parametrize("name", ["threads", "Status", "JOB", "Sweep", "Experiment"])
def test_rows_that_set_a_harness_column_fail_saying_how_to_mend_them(faulty, name):
    """Compared without case, as DuckDB compares them: Status would read as status."""
    result = faulty("point=0,1", f"clash={name}")
    assert result.returncode == 1
    rows = store.read(faulty.results, "faulty")
    said = (f"ValueError: the experiment's rows set {name}, which the harness writes in every "
            f"row (column names compared without case): name it otherwise in the rows "
            f"({name}_measured, say)")  # fmt: skip
    assert rows["error"].tolist() == [said] * 2 and set(rows["status"]) == {"failed"}


@pytest.mark.parametrize("name", ["point", "POINT"])
def test_rows_that_set_a_parameter_fail_saying_to_leave_it_out(faulty, name):
    faulty("point=0,1", f"clash={name}")
    said = store.read(faulty.results, "faulty")["error"]
    end = f"{name}, the point's parameter, which every row has already: leave it out of the rows"
    assert said.str.endswith(end).all() and len(said) == 2


@pytest.mark.parametrize(
    ("unheld", "said"),
    [
        ("bigint", "holds an int 1180591620717411303424 beyond 64 bits: give it as a float, or"),
        ("tensor", "holds a Tensor, which a Parquet column cannot hold: give a number, text,"),
        ("mixed", "mixes int, str across the rows: give it one kind (text, say)"),
        ("list", "holds a list of items of several kinds: give its items one kind"),
    ],
)
def test_a_value_a_parquet_column_cannot_hold_fails_its_point_naming_the_column(
    faulty, unheld, said
):
    """The experiment's failed row, saying which column and what to give instead: not a
    harness error, and the other points' rows stand."""
    result = faulty("point=0,1,2", f"unheld={unheld}", "fail_fast=0")
    assert result.returncode == 1
    rows = store.read(faulty.results, "faulty").sort_values("job")
    assert rows["status"].tolist() == ["ok", "failed", "ok"]
    assert rows["error"].iloc[1].startswith(f"ValueError: column 'val' {said}"), rows["error"]


@pytest.mark.parametrize("status", ["running", "pruned", "OK"])
def test_a_row_status_only_the_harness_writes_fails_its_point(faulty, status):
    """A row saying running would be a phantom that every resume reruns."""
    result = faulty("point=0,1", f"row_status={status}", "fail_fast=0")
    assert result.returncode == 1
    rows = store.read(faulty.results, "faulty")
    said = (f"ValueError: the experiment's rows give status {status!r}: a row's status is one of "
            "ok, unsupported, failed, oom, killed, timeout (or none, for ok)")  # fmt: skip
    assert rows["status"].tolist() == ["failed"] * 2 and rows["error"].tolist() == [said] * 2
    again = faulty(f"resume={only_sweep(faulty.results, 'faulty')}")
    assert "2 points to run" in again.stdout, "failed rows rerun; nothing stays running"
    assert faulty("point=0", "row_status=unsupported").returncode == 0


def test_a_parameter_named_as_a_harness_column_is_refused_before_anything_runs(faulty):
    result = faulty("experiment.run=probes.columns_as_parameters")
    assert one_line_error(result), result.stderr
    assert "faulty's parameter Status is named as a column the harness writes in every row " \
           "(names compared without case): rename it in probes.columns_as_parameters's " \
           "signature (Status_value, say)" in result.stderr  # fmt: skip
    assert not faulty.results.exists()


def test_a_sweep_whose_first_points_fail_alike_stops_and_says_so(faulty):
    result = faulty("point=range(0,8)", "clash=threads")
    assert result.returncode == 1
    assert "the first 3 points failed with the same error, so the sweep stopped with 5 points " \
           "not run: ValueError: the experiment's rows set threads" in result.stderr  # fmt: skip
    assert "fix it and resume the sweep with code=current" in result.stderr
    sweep = only_sweep(faulty.results, "faulty")
    rows = store.read(faulty.results, "faulty", sweep)
    assert sorted(rows["job"]) == [0, 1, 2] and set(rows["status"]) == {"failed"}
    status = faulty.harness("status", sweep).stdout
    assert status.count("| failed") == 3 and status.count("| not run") == 5, status
    again = faulty("point=range(0,8)", "clash=threads", "fail_fast=0")
    assert again.returncode == 1 and "stopped" not in again.stderr
    (_, kept) = store.sweeps(faulty.results, "faulty")
    assert len(store.read(faulty.results, "faulty", kept)) == 8


def test_points_that_fail_each_their_own_way_run_on(faulty):
    """Point 0 fails, the rest do not: no stop. Nor does fail_fast=N stop a sweep of N points."""
    result = faulty("point=range(0,5)", "fail=0", f"folder={faulty.cwd}")
    assert result.returncode == 1 and "stopped" not in result.stderr
    assert "5 points: 4 ok, 1 failed" in result.stdout
    result = faulty("point=range(0,3)", "clash=threads")
    assert "stopped" not in result.stderr and "3 points: 3 failed" in result.stdout


@pytest.mark.parametrize("value", [-1, 1.5, "'x'", "true"])
def test_a_fail_fast_that_is_no_count_is_one_line(faulty, value):
    result = faulty(f"fail_fast={value}")
    assert one_line_error(result) and "fail_fast must be a whole number" in result.stderr


WELL = "# @package _global_\nexperiment:\n  name: mine\n  run: minekernel.run\nn: 1\n"
KERNEL = 'def run(*, n: int = 1) -> list[dict]:\n    return [{"v": n}]\n'


@pytest.mark.parametrize(
    ("yaml_text", "kernel", "said"),
    [
        (WELL, KERNEL.replace("]:\n", "]\n"), "cannot import experiment.run=minekernel.run: "
         "SyntaxError: expected ':' ("),
        (WELL, "raise RuntimeError('no data here')\n" + KERNEL, "cannot import "
         "experiment.run=minekernel.run: RuntimeError: no data here"),
        (WELL.replace("n: 1", " n: [1"), KERNEL, "mine.yaml is not YAML: line 5, column 2: "
         "expected <block end>, but found '<block mapping start>'"),
        (WELL.replace("  name", "\tname"), KERNEL, "mine.yaml is not YAML: line 3, column 1"),
        ("[1, 2]\n", KERNEL, "mine.yaml holds a list: an experiment's YAML is a mapping"),
        (WELL.removeprefix("# @package _global_\n"), KERNEL, "mine.yaml lacks its header line "
         "'# @package _global_': without it Hydra reads every key of the file as experiment.KEY"),
    ],
    ids=["syntax", "raises", "yaml", "tab", "list", "header"],
)  # fmt: skip
def test_an_experiment_that_cannot_be_read_or_imported_is_one_line(
    harness, tmp_path, yaml_text, kernel, said
):
    """A researcher's own experiment with a mistake in its YAML or its module: the sweep and
    --help each say it in one line, exit code 2, before anything is written (a SyntaxError
    names the line in the user's file, not a path in the sweep's pinned copy)."""
    mine = tmp_path / "mine"
    (mine / "experiment").mkdir(parents=True)
    (mine / "experiment" / "mine.yaml").write_text(yaml_text)
    (mine / "minekernel.py").write_text(kernel)
    for extra in ([], ["--help"]):
        result = harness("--config-dir", str(mine), "+experiment=mine", *extra,
                         env={"PYTHONPATH": str(mine)})  # fmt: skip
        assert one_line_error(result), result.stdout + result.stderr
        assert said in result.stderr, result.stderr
        if "SyntaxError" in said:  # the line in the user's file (the pinned copy's, --help's)
            assert result.stderr.endswith("(minekernel.py, line 1)\n") or result.stderr.endswith(
                f"{mine}/minekernel.py, line 1)\n"
            ), result.stderr
    assert not harness.results.exists()


@pytest.mark.parametrize(
    ("returned", "said"),
    [
        ('{"v": n}', "the experiment returned a dict: it returns a list of rows, each a dict "
         "(return [row] for one)"),
        ("3.5", "the experiment returned a float: it returns a list of rows"),
        ('["v"]', "the experiment's rows hold a str: each row is a dict of column to value"),
    ],
    ids=["dict", "float", "strings"],
)  # fmt: skip
def test_an_experiment_that_returns_no_list_of_rows_fails_its_point_saying_what_to_return(
    harness, tmp_path, returned, said
):
    mine = tmp_path / "mine"
    (mine / "experiment").mkdir(parents=True)
    (mine / "experiment" / "mine.yaml").write_text(WELL)
    (mine / "minekernel.py").write_text(f"def run(*, n: int = 1):\n    return {returned}\n")
    result = harness("--config-dir", str(mine), "+experiment=mine", env={"PYTHONPATH": str(mine)})
    assert result.returncode == 1, result.stdout + result.stderr
    rows = store.read(harness.results, "mine")
    assert rows["status"].tolist() == ["failed"]
    assert rows["error"][0].startswith(f"ValueError: {said}"), rows["error"][0]
