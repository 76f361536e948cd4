"""The harness end to end: `python -m harness` in a scratch directory, read back from Parquet."""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from importlib import metadata

import duckdb
import pandas as pd
import pytest
import torch
from commands import ROOT
from probes import PROBE_PATH, SUPPORT, arrivals, await_arrivals
from sweeps import own_file

from harness import provenance, store
from harness.names import HERE

PROVENANCE = [
    "job",
    "status",
    "error",
    "config_hash",
    "started_at",
    "duration_s",
    "git_commit",
    "git_dirty",
    "command",
    "torch_version",
    "cuda_version",
    "python_version",
    "packages_digest",
    "device_name",
    "threads",
    "hostname",
    "seed",
    "slurm_job_id",
    "slurm_array_task_id",
    "slurm_node",
    "slurm_restarts",
    "gpus",
    "run_dir",
]


def only_sweep(results, experiment="exp014_tiled"):
    (sweep,) = store.sweeps(results, experiment)
    return sweep


@pytest.mark.slow
def test_the_seeded_sweep_end_to_end(harness):
    result = harness("+experiment=exp014_tiled")
    assert result.returncode == 0, result.stderr
    sweep = only_sweep(harness.results)
    assert f"sweep {sweep}" in result.stdout
    assert "claim PASS" in result.stdout and "9 points: 9 ok;" in result.stdout
    rows = pd.read_parquet(harness.results)
    assert len(rows) == 9 and set(rows["status"]) == {"ok"}
    assert sorted(zip(rows["length"], rows["block"], strict=True)) == [
        (length, block) for length in (128, 512, 1024) for block in (64, 128, 256)
    ]
    assert rows["max_abs_diff"].max() <= 1e-6 and (rows["max_abs_diff"] > 0).all()
    assert set(PROVENANCE) <= set(rows.columns)
    assert rows.columns.is_unique
    assert set(rows["experiment"]) == {"exp014_tiled"} and set(rows["sweep"]) == {sweep}
    assert rows[
        ["batch", "heads", "head_dim", "dtype", "causal"]
    ].drop_duplicates().values.tolist() == [[1, 8, 32, "float32", True]]
    assert rows["command"].iloc[0] == "python -m harness +experiment=exp014_tiled"
    assert rows["torch_version"].str.startswith("2.").all() and (rows["threads"] > 0).all()
    if (ROOT / ".git").exists():  # run from a checkout: its commit, and whether it is dirty
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], text=True,
                              capture_output=True, check=True).stdout.strip()  # fmt: skip
        assert set(rows["git_commit"]) == {head} and rows["git_dirty"].dtype == bool
    assert rows["config_hash"].nunique() == 9
    manifest = store.read_manifest(store.SweepPaths(harness.results, "exp014_tiled", sweep))
    assert [p["job"] for p in manifest["points"]] == list(range(9))
    digest = rows["packages_digest"].iloc[0]
    packages = json.loads(
        (
            store.SweepPaths(harness.results, "exp014_tiled", sweep).folder
            / f"_packages-{digest}.json"
        ).read_text()
    )["packages"]
    assert any(p.startswith("torch==") for p in packages)


def test_the_package_list_is_what_importlib_metadata_reads_in_the_installed_folders():
    """Not a package that a checkout on the path or setuptools' vendored folder lists (which
    setuptools puts on the path when it is imported): a process that imports it would count
    other packages than one that does not."""
    import setuptools  # noqa: F401 (its vendored folder on the path)

    sites = provenance.installed()
    parsed = {(d.metadata["Name"] or "").lower(): d.version for d in metadata.distributions()
              if os.path.join(os.path.dirname(os.path.abspath(d._path)), "") in sites}  # fmt: skip
    listed = dict(p.split("==", 1) for p in provenance.packages())
    assert listed == {name: version for name, version in parsed.items() if name}
    assert any("_vendor" in path for path in sys.path)


def test_a_grid_from_the_command_line_read_back_by_duckdb(harness):
    result = harness("+experiment=exp014_tiled", "length=96,130", "block=32,200", "heads=2")
    assert result.returncode == 0, result.stderr
    glob = harness.results / "**" / "*.parquet"
    rows = (
        duckdb.connect()
        .execute(
            f"select length, block, heads, status, max_abs_diff, sweep from read_parquet('{glob}', "
            "hive_partitioning=true, union_by_name=true) order by job"
        )
        .df()
    )
    assert rows[["length", "block"]].values.tolist() == [[96, 32], [96, 200], [130, 32], [130, 200]]
    assert set(rows["heads"]) == {2} and set(rows["status"]) == {"ok"}
    assert set(rows["sweep"]) == {only_sweep(harness.results)}
    assert "length (rows) by block (columns)" in result.stdout


def test_a_failing_point_is_a_failed_row_and_the_rest_still_run(probe, gate):
    # One after another, point N sees N + 1 arrivals: the first two give up at once (timeout 0).
    result = probe("point=0,1,2,3", f"folder={gate}", "expect=3", "timeout_s=0")
    assert result.returncode == 1
    assert "2 of 4 points have no answer" in result.stderr and "resume=" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    rows = store.read(probe.results).sort_values("job")
    assert rows["status"].tolist() == ["failed", "failed", "ok", "ok"]
    failed = rows[rows["status"] == "failed"]
    assert failed["error"].str.startswith("TimeoutError: ").all()
    assert failed["arrivals"].isna().all() and rows["arrivals"].tolist()[2:] == [3, 4]
    log = failed["run_dir"].iloc[0] + "/harness.log"
    with open(log) as text:
        assert "Traceback" in text.read()


def test_resume_runs_only_the_points_without_an_ok_row(harness):
    grid = ("+experiment=exp014_tiled", "length=64,96", "block=16,32", "heads=2", "seed=7")
    assert harness(*grid).returncode == 0
    sweep = only_sweep(harness.results)
    folder = store.SweepPaths(harness.results, "exp014_tiled", sweep).folder
    first = store.read(harness.results)
    own_file(harness.results, "exp014_tiled", sweep, 1).unlink()
    store.write_rows(folder / "job-000002.parquet", [{"job": 2, "status": "failed", "error": "x"}])
    result = harness("+experiment=exp014_tiled", "resume=last")  # the newest of exp014_tiled
    assert result.returncode == 0, result.stderr
    assert f"sweep {sweep}: exp014_tiled, 2 points to run" in result.stdout
    assert (
        "job 1 length=64 block=32" in result.stdout and "job 2 length=96 block=16" in result.stdout
    )
    rows = store.read(harness.results).sort_values("job")
    assert rows["job"].tolist() == [0, 1, 2, 3] and set(rows["status"]) == {"ok"}
    assert set(rows["heads"]) == {2} and set(rows["seed"]) == {7}, "the sweep's own overrides"
    kept = rows.set_index("job").loc[[0, 3], "started_at"]
    assert kept.tolist() == first.set_index("job").loc[[0, 3], "started_at"].tolist()
    again = harness("+experiment=exp014_tiled", f"resume={sweep}")
    assert again.returncode == 0 and "0 points to run" in again.stdout
    changed = harness("+experiment=exp014_tiled", f"resume={sweep}", "seed=1")
    assert changed.returncode == 2 and "drop seed=1" in changed.stderr
    shown = harness("status", "last")
    assert shown.returncode == 0 and shown.stdout.startswith(f"sweep {sweep} (exp014_tiled)")
    none = harness("+experiment=exp017_recall", "resume=last")
    assert none.returncode == 2 and none.stderr.startswith("error: no sweep of exp017_recall in")


@pytest.mark.process
def test_resume_completes_a_sweep_that_was_killed(probe, gate):
    # Point 0 ends; point 1 arrives and waits for the file "open": the kill finds it running.
    args = ["point=0,1,2,3,4,5", f"folder={gate}", "release=open", "hold=1"]
    sweeping = probe.start(*args)
    await_arrivals(gate, 2)
    os.killpg(sweeping.pid, signal.SIGKILL)
    sweeping.wait()
    (sweep,) = store.sweeps(probe.results, "rendezvous")
    assert store.read(probe.results)["job"].tolist() == [0]
    (gate / "open").touch()
    result = probe(f"resume={sweep}")
    assert result.returncode == 0, result.stderr
    assert "5 points to run" in result.stdout
    rows = store.read(probe.results)
    assert sorted(rows["job"]) == list(range(6)) and set(rows["status"]) == {"ok"}


@pytest.mark.process
def test_a_resume_of_a_sweep_another_command_runs_is_refused_in_one_line(probe, gate):
    sweeping = probe.start("point=0,1", f"folder={gate}", "release=open", "hold=1")
    await_arrivals(gate, 1)  # the sweep's command runs its first point, which waits
    (sweep,) = store.sweeps(probe.results, "rendezvous")
    second = probe(f"resume={sweep}")
    assert second.returncode == 2 and second.stderr.count("\n") == 1, second.stderr
    assert second.stderr.startswith(f"error: sweep {sweep} is being run by another command (pid ")
    assert f"see its points with: python -m harness status {sweep}" in second.stderr
    (gate / "open").touch()
    assert sweeping.wait(timeout=300) == 0
    again = probe(f"resume={sweep}")
    assert again.returncode == 0 and "0 points to run" in again.stdout, again.stderr


LINKS = {  # where a resume of sweep S of exp014_tiled would write, under the out dir
    "run lock": "results/experiment=exp014_tiled/sweep=S/_run.lock",
    "columns lock": "results/_columns.lock",
    "columns file": "results/columns",
    "job log": "runs/exp014_tiled/S/job-0/harness.log",
    "job config": "runs/exp014_tiled/S/job-0/.hydra/config.yaml",
    "runs folder": "runs/exp014_tiled/S",
    "experiment folder": "results/experiment=exp014_tiled",
}


@pytest.mark.parametrize("place", LINKS)
def test_nothing_is_written_through_a_link_under_the_out_dir(harness, tmp_path, place):
    """A link where a resume would write (a lock, the columns file, a job's log or config, a
    folder) is refused in one line before anything runs, and what it points to stays as it
    was."""
    made = harness("+experiment=exp014_tiled", "length=16", "block=16", "seed=0,1")
    assert made.returncode == 0, made.stderr
    (sweep,) = store.sweeps(harness.results, "exp014_tiled")
    folder = store.SweepPaths(harness.results, "exp014_tiled", sweep).folder
    for path in folder.glob("*.parquet"):
        path.unlink()  # points to rerun
    link = harness.cwd / "outputs" / LINKS[place].replace("S", sweep)
    victim = tmp_path / "precious"
    if link.is_dir():  # the folder moved away, a link to it in its place
        shutil.move(link, victim)
        before = sorted(p.relative_to(victim) for p in victim.rglob("*"))
    else:
        victim.write_text("a user's own words\n")
        link.unlink(missing_ok=True)
    link.symlink_to(victim)
    resumed = harness("+experiment=exp014_tiled", f"resume={sweep}")
    assert resumed.returncode == 2 and resumed.stderr.count("\n") == 1, resumed.stderr
    assert "is a symlink: the harness writes nothing through a link" in resumed.stderr
    if victim.is_dir():
        assert sorted(p.relative_to(victim) for p in victim.rglob("*")) == before
    else:
        assert victim.read_text() == "a user's own words\n"
    assert not list(folder.glob("*.parquet")), "nothing ran"


LEAVES = """
import json, logging, os, sys
import torch, pandas, pyarrow, hydra, numpy, octlm_experiments.tiled, probes  # what a sweep imports
import harness.command.cli, harness.running.job, harness.command.sweep
from harness.launchers import fresh
before = fresh.ProcessState()
raising, real_exit = logging.raiseExceptions, os._exit
try:
    harness.command.cli.main(sys.argv[1:])
except SystemExit as stop:
    code = stop.code
print(json.dumps({
    "code": code,
    "left": before.left(),
    "raiseExceptions": logging.raiseExceptions == raising,
    "os._exit": os._exit is real_exit,
}))
"""  # python -c LEAVES ARGS...: what a sweep in this process left changed, as one JSON line


@pytest.mark.process
@pytest.mark.parametrize(
    "args, code",
    [(["+experiment=exp014_tiled", "length=16", "block=16", "seed=0,1"], 0),
     (["--config-dir", str(SUPPORT / "conf"), "+experiment=rendezvous", "point=0,1", "fail=1",
       "folder=."], 1)],
    ids=["ok", "a point fails"],
)  # fmt: skip
def test_a_sweep_in_this_process_leaves_its_settings_as_they_were(tmp_path, args, code):
    """The points of the basic launcher run in the command's process: what a job changes for
    its point (logging's raiseExceptions, os._exit refused) is its alone, and what a warm
    worker would have to put back or retire for (harness.launchers.fresh: settings, library
    functions, threads) is as it was when the command ends."""
    ran = subprocess.run([sys.executable, "-c", LEAVES, *args],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": PROBE_PATH})  # fmt: skip
    left = json.loads(ran.stdout.strip().splitlines()[-1])
    assert left == {"code": code, "left": [], "raiseExceptions": True, "os._exit": True}, ran.stderr


EXITS = """
import os, threading
from harness.running import calling
with calling._exits_refused():
    try:
        os._exit(3)
    except SystemExit as refused:
        print("refused", refused, flush=True)
    threading.Thread(target=os._exit, args=(7,)).start()
    threading.Event().wait(120)
print("survived", flush=True)
"""  # python -c EXITS: os._exit in the experiment's thread, then in another thread


@pytest.mark.process
def test_only_the_experiments_own_thread_has_its_exit_refused():
    """While a point runs, os._exit called by the experiment's thread is a failed point, but
    another thread's (a library's, the harness's own) ends the process as it would."""
    ran = subprocess.run([sys.executable, "-c", EXITS], cwd=HERE.parent, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert ran.returncode == 7 and ran.stdout == "refused os._exit(3)\n", ran.stdout + ran.stderr


LOCAL = ["+experiment=exp014_tiled", "hydra/launcher=local"]
SLURM = ["+experiment=exp014_tiled", "hydra/launcher=slurm"]
BAD_INPUT = [
    ([], "usage"),
    (["-m"], "usage"),
    (["length=5"], "no experiment given"),
    (["+experiment=nope"], "unknown experiment 'nope' (available: "),
    (["+experiment=exp014_tiled", "foo=1"], "unknown key 'foo'"),
    (["+experiment=exp014_tiled", "foo=1,2"], "does not take foo"),
    (["+experiment=exp014_tiled", "+foo=1"], "does not take foo"),
    (["+experiment=exp014_tiled", "length=0"], "length must be positive, got 0"),
    (["+experiment=exp014_tiled", "length=128,-4"], "length must be positive, got -4"),
    (["+experiment=exp014_tiled", "block=64,0"], "block must be positive, got 0"),
    (["+experiment=exp014_tiled", "block=-1"], "block must be positive"),
    (["+experiment=exp014_tiled", "dtype=float8"], "dtype must be one of float32, float64"),
    (["+experiment=exp014_tiled", "dtype=float32,int8"], "got 'int8'"),
    (["+experiment=exp014_tiled", "length=abc"], "length must be an integer"),
    (["+experiment=exp014_tiled", "length=[1"], "cannot parse 'length=[1'"),
    (["+experiment=exp014_tiled", "length=interval(1,2)"], "can be swept"),
    (["+experiment=exp014_tiled", "hydra/launcher=nope"], "unknown hydra/launcher 'nope'"),
    (["+experiment=exp014_tiled", "resume=20990101-000000-0000"], "no sweep 20990101-000000-0000"),
    (["+experiment=exp014_tiled", "wait=false"], "wait=false needs"),
    (["+experiment=exp014_tiled", "length=range(0)"], "the grid has no points (length=[])"),
    (["+experiment=exp014_tiled", "device=tpu"], "device must be cpu, cuda or cuda:N"),
    (
        ["+experiment=exp014_tiled", "hydra/launcher=local", "hydra.launcher.max_parallel=0"],
        "max_parallel must be a whole number of 1 or more, got 0",
    ),
    (["+experiment=exp014_tiled", "hydra/launcher=local", "wait=false"], "wait=false needs"),
    (["--config-dir", "/no/such/dir", "+experiment=exp014_tiled"], "--config-dir takes a folder"),
    (["+experiment=exp014_tiled", "length=range(128,1000000000)"], "the grid has 2,999,999,616"),
    (
        ["+experiment=exp014_tiled", "length=range(1,31)", "max_points=20"],
        "more than max_points=20",
    ),
    (["+experiment=exp014_tiled", "max_points=0"], "max_points must be a positive integer"),
    (["+experiment=exp014_tiled", "length=128", "length=256"], "length given more than once"),
    (["+experiment=exp014_tiled", "sweep_id=x"], "sweep_id is set by the harness"),
    (["+experiment=exp014_tiled", "job=3"], "job is set by the harness"),
    (["+experiment=exp014_tiled", "wait=maybe"], "wait must be true or false, got maybe"),
    (["+experiment=exp014_tiled", "resume="], "resume takes a sweep id"),
    (LOCAL + ["hydra.launcher.timeout_min=-1"], "timeout_min must be a whole number of 1 or more"),
    (LOCAL + ["hydra.launcher.cpus_per_task=-2"], "cpus_per_task must be a whole number of 1"),
    (LOCAL + ["hydra.launcher.max_parallel=1.5"], "max_parallel must be a whole number of 1"),
    (LOCAL + ["hydra.launcher.max_parallel=abc"], "of 1 or more, got 'abc'"),
    (LOCAL + ["hydra.launcher.mem_gb=-5"], "mem_gb must be a number above 0, got -5"),
    (LOCAL + ["hydra.launcher.gpus=[99]"], "gpus [99] are not distinct GPUs of the ones visible"),
    (LOCAL + ["hydra.launcher.gpus=[0,0]"], "are not distinct GPUs"),
    (["+experiment=rendezvous"], "unknown experiment 'rendezvous'"),
    (SLURM + ["hydra.launcher.timeout_min=2"], "signal_delay_s=120 with timeout_min=2: SLURM may"),
    (SLURM + ["hydra.launcher.timeout_min=2", "hydra.launcher.signal_delay_s=51"], "at most 50"),
    (SLURM + ["hydra.launcher.timeout_min=1", "hydra.launcher.signal_delay_s=0"], "of 2 or more"),
    (["+experiment=exp014_tiled", "seed=${nope}"], "seed: Interpolation key 'nope' not found"),
    (["+experiment=exp014_tiled", "seed=${hydra:job.num}"], "seed: ValueError raised while"),
    (["+experiment=exp014_tiled", "seed=${oc.env:NO_SUCH_VAR}"], "'NO_SUCH_VAR' not found"),
]


@pytest.mark.parametrize("argv, message", BAD_INPUT)
def test_bad_input_is_one_line_and_exit_code_2_before_anything_runs(argv, message, harness):
    result = harness(*argv, env={"CUDA_VISIBLE_DEVICES": "0,1"})  # 2 GPUs, whatever the machine
    assert result.returncode == 2, result.stdout + result.stderr
    err = result.stderr
    assert message in err
    if "usage" not in message:
        assert err.startswith("error: ") and err.count("\n") == 1
    assert not (harness.cwd / "outputs").exists()


def test_bad_input_from_the_real_command_line(harness):
    result = harness("+experiment=exp014_tiled", "length=128,4096", "block=32,0")
    assert result.returncode == 2
    assert result.stderr == "error: block must be positive, got 0\n"
    assert result.stdout == "" and not (harness.cwd / "outputs").exists()


@pytest.mark.slow
def test_the_model_equivalence_sweep_end_to_end(harness):
    result = harness(
        "+experiment=exp014_equivalence", "kv_heads=8,1", "window=0,5", "length=37",
        "width=64", "layers=2", "vocab_size=64", "path=sdpa,tiled",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = store.read(harness.results, "exp014_equivalence")
    assert len(rows) == 8 and set(rows["status"]) == {"ok"}
    assert set(zip(rows["kv_heads"], rows["path"], rows["window"], strict=True)) == {
        (kv, path, window) for kv in (8, 1) for path in ("sdpa", "tiled") for window in (0, 5)
    }
    assert rows["max_abs_diff"].max() <= 1e-5 and rows["max_grad_diff"].max() <= 1e-5
    assert set(rows["heads"]) == {8} and set(rows["length"]) == {37}
    assert result.stdout.count("claim PASS") == 4  # every claim, none N/A or INCOMPLETE


@pytest.mark.slow
def test_the_backends_sweep_end_to_end_at_small_lengths(harness, analysis):
    result = harness(
        "+experiment=exp015_backends", "length=128,256", "dtype=float32",
        "backend=math,flash,efficient", "min_time_s=0.05", "num_threads=1", "device=cpu",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = store.read(harness.results).set_index(["backend", "length"])
    assert rows.loc[("efficient", 128), "status"] == "unsupported"
    assert "No viable backend" in rows.loc[("efficient", 128), "error"]
    ok = rows[rows["status"] == "ok"]
    assert len(ok) == 4 and "cuda_peak_mib" not in rows
    # Flash's few KiB at length 128 may fit in pages the process already holds (measured: 0.0
    # here); the math path's 128 x 128 scores per head, and every length 256, need new ones.
    rss = ok["rss_delta_mib"]
    assert (rss >= 0).all() and (rss.drop(("flash", 128)) > 0).all()
    assert (ok["time_ms"] > 0).all() and (ok["repeats"] >= 5).all()
    assert ok["time_samples_ms"].map(len).tolist() == ok["repeats"].tolist()
    assert (ok["pct_of_peak"] > 0).all() and (ok["gflops"] > 0).all()
    assert analysis().returncode == 0
    report = (harness.cwd / "outputs" / "report" / "REPORT.md").read_text()
    assert "## exp015_backends" in report and "exp015_backends-memory.png" in report


@pytest.mark.slow
def test_resume_keeps_the_sweeps_launcher_settings(harness):
    launcher = ("hydra/launcher=local", "hydra.launcher.max_parallel=1")
    first = harness("+experiment=exp014_tiled", "length=64,96", "block=16", *launcher)
    assert first.returncode == 0, first.stderr
    sweep = only_sweep(harness.results)
    own_file(harness.results, "exp014_tiled", sweep, 1).unlink()
    result = harness("+experiment=exp014_tiled", f"resume={sweep}")
    assert result.returncode == 0, result.stderr
    (rerun,) = store.read(harness.results).query("job == 1")["run_dir"]
    # Hydra's config of the run that ran the point, beside the sweep's job folders
    hydra_config = (harness.cwd / rerun).parent.joinpath(".hydra", "hydra.yaml").read_text()
    assert "harness.launchers.local.LocalLauncher" in hydra_config
    assert "max_parallel: 1" in hydra_config


def test_a_users_own_experiment_runs_and_resumes_through_config_dir(probe, gate):
    result = probe("point=0,1,2", f"folder={gate}")
    assert result.returncode == 0, result.stderr
    (sweep,) = store.sweeps(probe.results, "rendezvous")
    manifest = store.read_manifest(store.SweepPaths(probe.results, "rendezvous", sweep))
    assert manifest["command"].startswith("python -m harness --config-dir ")
    own_file(probe.results, "rendezvous", sweep, 1).unlink()
    resumed = probe(f"resume={sweep}")
    assert resumed.returncode == 0, resumed.stderr
    assert "1 points to run" in resumed.stdout
    rows = store.read(probe.results).sort_values("job")
    assert rows["job"].tolist() == [0, 1, 2] and set(rows["status"]) == {"ok"}
    assert len(arrivals(gate)) == 4, "only point 1 ran again"


def test_the_slurm_launcher_without_slurm_is_one_line_and_leaves_nothing(harness):
    nowhere = harness.cwd / "bin"
    nowhere.mkdir()
    result = harness("+experiment=exp014_tiled", "hydra/launcher=slurm", env={"PATH": str(nowhere)})
    assert result.returncode == 2
    said = "error: hydra.launcher: slurm needs SLURM, and sbatch is not on this machine's PATH\n"
    assert result.stderr == said
    assert [p.name for p in harness.cwd.iterdir()] == ["bin"]


@pytest.mark.parametrize("out", ["/proc/forbidden", "a-file", "a-file/below"])
def test_an_out_dir_that_cannot_be_written_is_one_line_before_any_point_runs(out, harness):
    (harness.cwd / "a-file").write_text("not a folder")
    result = harness("+experiment=exp014_tiled", f"out={out}")
    assert result.returncode == 2
    err = result.stderr
    assert err.startswith("error: cannot write to ") and err.count("\n") == 1, err
    assert sorted(p.name for p in harness.cwd.iterdir()) == ["a-file"]


@pytest.mark.process
def test_a_store_that_fails_mid_sweep_stops_it_with_the_resume_command(probe, gate, tmp_path):
    sweeping = probe.start("point=0,1,2", f"folder={gate}", "release=open", "hold=1")
    await_arrivals(gate, 2)
    (sweep,) = store.sweeps(probe.results, "rendezvous")
    folder = store.SweepPaths(probe.results, "rendezvous", sweep).folder
    folder.rename(tmp_path / "kept")
    folder.write_text("in the way")  # point 1's rows cannot be written now
    (gate / "open").touch()
    output, _ = sweeping.communicate(timeout=120)
    assert sweeping.returncode == 1, output
    last = output.strip().splitlines()[-1]
    assert last.startswith("error: cannot write the sweep's outputs") and "Traceback" not in output
    assert f"resume={sweep}" in last
    folder.unlink()
    (tmp_path / "kept").rename(folder)
    resumed = probe(f"resume={sweep}")
    assert resumed.returncode == 0, resumed.stderr
    assert sorted(store.read(probe.results)["job"]) == [0, 1, 2]


@pytest.mark.process
def test_a_link_met_mid_sweep_stops_it_in_one_line_and_keeps_the_points_rows(probe, gate):
    """The columns file's lock made a link while point 0 computes: its rows are written, the
    sweep stops with one line, nothing goes through the link, and the resume has nothing to
    run again."""
    sweeping = probe.start("point=0", f"folder={gate}", "release=open", "hold=0")
    await_arrivals(gate, 1)
    victim = gate / "precious"
    victim.write_text("a user's own words\n")
    lock = probe.results / "_columns.lock"
    lock.unlink(missing_ok=True)
    lock.symlink_to(victim)
    (gate / "open").touch()
    output, _ = sweeping.communicate(timeout=120)
    assert sweeping.returncode == 1 and "Traceback" not in output, output
    last = output.strip().splitlines()[-1]
    assert last.startswith("error: cannot write the sweep's outputs") and "is a symlink" in last
    assert victim.read_text() == "a user's own words\n"
    assert store.read(probe.results)["status"].tolist() == ["ok"], "its rows kept"
    lock.unlink()
    (sweep,) = store.sweeps(probe.results, "rendezvous")
    resumed = probe(f"resume={sweep}")
    assert resumed.returncode == 0 and "0 points to run" in resumed.stdout, resumed.stderr


@pytest.mark.process
@pytest.mark.parametrize("stop, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_sigterm_and_ctrl_c_stop_a_sweep_with_the_resume_command(probe, gate, stop, code):
    sweeping = probe.start("point=0,1,2", f"folder={gate}", "release=open", "hold=1")
    await_arrivals(gate, 2)
    sweeping.send_signal(stop)
    output, _ = sweeping.communicate(timeout=120)
    assert sweeping.returncode == code, output
    assert "interrupted; finish it with: python -m harness --config-dir" in output
    assert "Traceback" not in output
    assert store.read(probe.results)["job"].tolist() == [0]


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["basic", "local"])
def test_random_sigkills_then_resume_leave_every_point_exactly_once(probe, gate, launcher):
    """The fault-injection campaign: SIGKILL the whole sweep (harness and points) at random
    moments, resume each time, then once more to the end: every point has exactly one row, in
    every reader."""
    points = 40 if launcher == "basic" else 12  # a local point is a process of its own
    args = [f"point=range({points})", f"folder={gate}"]
    args += ["hydra/launcher=local", "hydra.launcher.max_parallel=2"] if launcher == "local" else []
    chance = random.Random(7)
    sweep = None
    for _ in range(5):
        running = probe.start(*(args if sweep is None else [f"resume={sweep}"]))
        try:
            running.wait(timeout=chance.uniform(0.5, 4.0))
        except subprocess.TimeoutExpired:
            os.killpg(running.pid, signal.SIGKILL)
            running.wait()
        sweep = sweep or next(iter(store.sweeps(probe.results, "rendezvous")), None)
    final = probe(f"resume={sweep}") if sweep else probe(*args)
    assert final.returncode == 0, final.stderr
    for rows in (store.read(probe.results), pd.read_parquet(probe.results)):
        assert sorted(rows["job"]) == list(range(points)) and set(rows["status"]) == {"ok"}


@pytest.mark.process
def test_resume_may_give_an_oom_point_more_room_and_nothing_else(harness):
    grid = ("+experiment=exp016_backward_memory", "method=naive", "length=1024")
    result = harness(*grid, "memory_cap_mib=64")  # naive needs 100 MiB here
    assert result.returncode == 1 and "1 oom" in result.stdout, result.stdout + result.stderr
    (sweep,) = store.sweeps(harness.results, "exp016_backward_memory")
    refused = harness("+experiment=exp016_backward_memory", f"resume={sweep}", "length=64")
    may = "a resume may set out, wait, reuse, code, code_store, sinks, hydra.*, memory_cap_mib"
    assert refused.returncode == 2 and may in refused.stderr
    resumed = harness("+experiment=exp016_backward_memory", f"resume={sweep}", "memory_cap_mib=0")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    rows = store.read(harness.results).sort_values("job")
    assert rows["status"].tolist() == ["ok"] and rows["memory_cap_mib"].tolist() == [0]


def test_threads_sets_each_points_torch_threads_and_its_rows_record_them(harness):
    before = torch.get_num_threads()
    asked = 1 if before != 1 else 2  # not what the point would have had anyway
    result = harness("+experiment=exp014_tiled", "length=64", "block=16", f"threads={asked}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert store.read(harness.results, "exp014_tiled")["threads"].tolist() == [asked]
    assert torch.get_num_threads() == before, "the process's own threads are given back"
    result = harness("+experiment=exp014_tiled", "threads=0")
    assert result.returncode == 2 and "threads must be a positive integer, got 0" in result.stderr


def test_a_package_installed_again_at_the_same_version_is_another_install(tmp_path, monkeypatch):
    """packages_digest covers each install (its metadata folder's inode and mtime), so that an
    answer of a package of one's own, edited and installed again as 0.1.0, is not taken for
    the new one's."""
    from harness import lifetime

    site = tmp_path / "site-packages"
    info = site / "mylib-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mylib\nVersion: 0.1.0\n\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(provenance, "installed", lambda: (f"{site}{os.sep}",))
    lifetime.forget()
    before = provenance.packages_digest()
    assert provenance.packages() == ("mylib==0.1.0",)
    shutil.rmtree(info)  # reinstalled: its metadata written anew
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mylib\nVersion: 0.1.0\n\n")
    os.utime(info, ns=(time.time_ns() + 10**9,) * 2)
    lifetime.forget()
    assert provenance.packages() == ("mylib==0.1.0",) and provenance.packages_digest() != before
    lifetime.forget()
