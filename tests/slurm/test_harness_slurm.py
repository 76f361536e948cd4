"""Sweeps on the real SLURM test cluster: job arrays, submit-and-exit, kills, requeue, resume.

Every test runs `python -m harness ... hydra/launcher=slurm` as a user would, against the
cluster that tests/slurm/cluster.sh starts (two fake GPUs, MaxArraySize 8), and reads the
rows back from Parquet.
"""

import os
import re
import signal
import time
from types import SimpleNamespace

import contracts
import pandas as pd
import pytest
from probes import PROBE_PATH, SUPPORT, arrivals, held, steps_by_rank
from slurm_testing import SlurmCluster, skip_module_unless_available, wait_for
from sweeps import own_file

from harness import store
from harness.searching import search

pytestmark = pytest.mark.slurm
skip_module_unless_available()
# The tests that wait minutes on SLURM's clock (a time limit, arrays one after another): on a
# worker and a cluster of their own, beside the others (tests/conftest.py).
WAITS = pytest.mark.xdist_group("slurm-waits")

SLURM = [
    "hydra/launcher=slurm",
    "hydra.launcher.mem_gb=1",
    "hydra.launcher.cpus_per_task=1",
    "hydra.launcher.timeout_min=10",
]


@pytest.fixture
def sweep(cluster: SlurmCluster, harness):
    """`python -m harness +experiment=exp014_tiled ARGS hydra/launcher=slurm` in a scratch dir."""

    def run(*args: str, wait: bool = True, timeout: float = 300):
        extra = [] if wait else ["wait=false"]
        return harness("+experiment=exp014_tiled", *args, *SLURM, *extra,
                       env=environment(cluster), timeout=timeout)  # fmt: skip

    run.results, run.cwd, run.cluster, run.harness = harness.results, harness.cwd, cluster, harness
    return run


def environment(cluster: SlurmCluster) -> dict:
    return {**cluster.env, "HARNESS_SLURM_PARTITION": cluster.partition}


def sweep_id(results) -> str:
    (found,) = store.sweeps(results, "exp014_tiled")
    return found


def status(runner, sweep_id: str) -> str:
    """`python -m harness status SWEEP_ID` (runner: the sweep or the probe fixture; the test
    cluster's SLURM_CONF is in the environment for the whole session)."""
    result = runner.harness("status", sweep_id)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_tiled_sweep_is_one_job_array_with_a_gpu_per_task(sweep):
    started = time.monotonic()
    result = sweep("length=64,96,128", "block=16,32")
    seconds = time.monotonic() - started
    assert result.returncode == 0, result.stderr + result.stdout
    rows = pd.read_parquet(sweep.results).sort_values("job")
    assert len(rows) == 6 and set(rows["status"]) == {"ok"}
    arrays = rows["slurm_job_id"].str.split("_").str[0]
    assert arrays.nunique() == 1, "one sbatch array for the whole sweep"
    assert rows["slurm_array_task_id"].tolist() == list(range(6))
    assert set(rows["gpus"]) <= {"0", "1"} and rows["gpus"].notna().all()
    assert set(rows["slurm_node"]) == set(rows["hostname"])
    assert (rows["slurm_restarts"] == 0).all()
    assert f"submitted as SLURM job {arrays.iloc[0]}" in result.stdout
    print(f"\n6-point job array, submit to rows read back: {seconds:.1f} s")


def test_an_answered_grid_submits_nothing_and_a_widened_one_only_its_new_point(sweep):
    """The cluster's node is this machine, so the sweep's process knows what a task would get
    and finds the answers itself (harness.reuse): no task only to copy rows."""
    first = sweep("length=64,96", "block=16")
    assert first.returncode == 0 and "submitted as SLURM job" in first.stdout, first.stdout
    widened = sweep("length=64,96,128", "block=16")
    assert widened.returncode == 0, widened.stdout + widened.stderr
    said = widened.stdout
    assert "2 points reused" in said and "submitted as SLURM job" in said, said
    answered = sweep("length=64,96,128", "block=16")
    assert answered.returncode == 0, answered.stdout + answered.stderr
    assert "3 points reused" in answered.stdout, answered.stdout
    assert "submitted as SLURM job" not in answered.stdout, answered.stdout
    newest = store.newest_sweep(sweep.results, "exp014_tiled")
    assert "launches" not in store.read_manifest(
        store.SweepPaths(sweep.results, "exp014_tiled", newest)
    )
    rows = store.read(sweep.results, "exp014_tiled", newest).sort_values("job")
    assert rows["reused_from"].notna().all() and set(rows["status"]) == {"ok"}
    assert rows["slurm_job_id"].notna().all(), "each copied from a task's answer"


def test_points_per_task_runs_several_points_in_each_array_task(sweep):
    result = sweep("length=64,96,128", "block=16,32,48", "hydra.launcher.points_per_task=4")
    assert result.returncode == 0, result.stderr + result.stdout
    rows = store.read(sweep.results).sort_values("job")
    assert rows["job"].tolist() == list(range(9)) and set(rows["status"]) == {"ok"}
    assert rows["slurm_array_task_id"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 2]
    sweep_ = sweep_id(sweep.results)
    (launch,) = store.read_manifest(store.SweepPaths(sweep.results, "exp014_tiled", sweep_))[
        "launches"
    ]
    assert launch["launcher"] == "harness.launchers.slurm.SlurmLauncher" and launch["detached"]
    assert sorted(launch["placement"]["tasks"].values()) == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]
    assert "9 ok" in status(sweep, sweep_)
    runs = sweep.cwd / "outputs" / "runs" / "exp014_tiled" / sweep_
    assert all((runs / f"job-{job}" / ".hydra" / "config.yaml").is_file() for job in range(9))


def test_a_cancelled_pack_keeps_the_rows_of_the_points_it_finished(cluster, probe, gate):
    # One task runs points 0, 1 and 2: point 0 ends, point 1 waits for "open", which never comes.
    args = ["point=0,1,2", f"folder={gate}", "release=open", "hold=1", "timeout_s=300", *SLURM,
            "hydra.launcher.points_per_task=3"]  # fmt: skip
    waiting = probe.start(*args, env=environment(cluster))
    wait_for(lambda: len(arrivals(gate)) == 2, 120, "point 1 to arrive")
    (sweep_,) = store.sweeps(probe.results, "rendezvous")
    shown = status(probe, sweep_)  # point 0's row is there, while its task runs point 1
    assert "| ok" in shown and "| running" in shown, shown
    cluster.run("scancel", wait_for(lambda: _running_task(cluster), 60, "the task to run"))
    output, _ = waiting.communicate(timeout=120)
    assert waiting.returncode == 1, output
    rows = store.read(probe.results).set_index("job").sort_index()
    assert rows["status"].tolist() == ["ok", "killed", "killed"]
    assert "cancelled" in rows.loc[1, "error"].lower()


def test_wait_false_returns_at_submission_and_status_follows_it_to_the_end(
    cluster, probe, analysis, gate
):
    # The points wait for the file "open": none can end before the test opens it.
    result = probe("point=0,1,2", f"folder={gate}", "release=open", "timeout_s=300", *SLURM,
                   "wait=false", env=environment(cluster))  # fmt: skip
    assert result.returncode == 0, result.stderr
    (sweep_,) = store.sweeps(probe.results, "rendezvous")
    assert f"python -m harness status {sweep_}" in result.stdout

    def shown() -> str:
        return status(probe, sweep_)

    first = shown()
    assert "pending" in first or "running" in first
    assert analysis().returncode == 0
    assert "3 not run" in (probe.cwd / "outputs" / "report" / "REPORT.md").read_text()
    (gate / "open").touch()
    wait_for(lambda: "3 ok" in shown(), 180, "the sweep to finish", interval=1, describe=shown)
    assert len(store.read(probe.results)) == 3


@pytest.mark.parametrize("launcher", contracts.launchers(detached=True))
def test_a_detached_launchers_points_run_once_a_failure_is_a_row_and_resume_reruns_it(
    cluster, probe, gate, launcher
):
    """The launchers' contract (tests/support/contracts.py) on a launcher whose jobs run on
    without the harness (SLURM's), on the test cluster; Ctrl-C leaves such jobs running, and
    status follows them (test_wait_false_...)."""
    settings = [f"hydra/launcher={launcher}", *SLURM[1:]]
    contracts.points_run_once_and_a_failure_is_a_row(probe, gate, settings, environment(cluster))


def test_a_failing_point_is_a_failed_row_and_status_shows_its_error(sweep):
    result = sweep("length=64", "block=16", "device=cpu,cuda,cpu:0")  # the fake GPUs have no CUDA
    assert result.returncode == 1
    rows = store.read(sweep.results).sort_values("job")
    assert rows["status"].tolist() == ["ok", "failed", "ok"]
    error = rows.loc[rows["status"] == "failed", "error"].iloc[0]
    assert error.startswith("RuntimeError")
    shown = status(sweep, sweep_id(sweep.results))
    assert "failed" in shown and error[:40] in shown and "2 ok, 1 failed" in shown


def test_a_task_that_slurm_cancels_is_a_killed_row(cluster, probe, gate):
    # Point 1 waits for the file "open", which never comes; point 0 ends at once.
    args = ["point=0,1", f"folder={gate}", "release=open", "hold=1", "timeout_s=300", *SLURM]
    waiting = probe.start(*args, env=environment(cluster))
    task = wait_for(lambda: _running_task(cluster, index=1), 60, "the held point to run")
    wait_for(lambda: len(arrivals(gate)) == 2, 60, "both points to arrive")
    cluster.run("scancel", task)
    output, _ = waiting.communicate(timeout=120)
    assert waiting.returncode == 1, output
    rows = store.read(probe.results).set_index("job")
    assert rows.loc[1, "status"] == "killed" and "cancelled" in rows.loc[1, "error"].lower()
    assert rows.loc[0, "status"] == "ok"
    (sweep_,) = store.sweeps(probe.results, "rendezvous")
    assert "killed" in status(probe, sweep_)


def held_point(cluster: SlurmCluster, probe, gate) -> tuple[str, str]:
    """A one-point sweep submitted with wait=false whose point arrives, then waits for the file
    "open" in gate: (its sweep id, its SLURM task), once it runs."""
    result = probe("point=0", f"folder={gate}", "release=open", "timeout_s=300", *SLURM,
                   "wait=false", env=environment(cluster))  # fmt: skip
    assert result.returncode == 0, result.stderr
    (sweep_,) = store.sweeps(probe.results, "rendezvous")
    task = wait_for(lambda: _running_task(cluster), 60, "the point to run")
    wait_for(lambda: len(arrivals(gate)) == 1, 60, "the point to arrive")
    return sweep_, task


def test_a_cancelled_task_of_a_submitted_sweep_shows_as_killed_in_status(cluster, probe, gate):
    sweep_, task = held_point(cluster, probe, gate)
    cluster.run("scancel", task)
    shown = wait_for(lambda: (text := status(probe, sweep_)) and "killed" in text and text, 60,
                     "status to call the point killed")  # fmt: skip
    assert "CANCELLED" in shown or "cancelled" in shown


def test_a_requeued_task_runs_again_and_leaves_one_row(cluster, probe, gate):
    sweep_, task = held_point(cluster, probe, gate)  # it cannot end before the requeue
    cluster.run("scontrol", "requeue", task)
    cluster.release_requeued(task, lambda: len(arrivals(gate)) == 2, timeout=120)
    (gate / "open").touch()

    def shown() -> str:
        return status(probe, sweep_)

    wait_for(lambda: "1 ok" in shown(), 120, "the rerun's row", describe=shown)
    rows = store.read(probe.results)
    assert len(rows) == 1 and rows["status"].tolist() == ["ok"]
    assert rows["slurm_restarts"].tolist() == [1], "the row is the rerun's"


def test_resume_resubmits_only_the_points_without_an_ok_row(sweep):
    assert sweep("length=64,80", "block=16,32").returncode == 0
    # A task that has written its rows may still be completing in SLURM's queue for a moment,
    # and a resume leaves a point SLURM still holds to it: wait until the queue is empty.
    wait_for(lambda: sweep.cluster.queue() == [], 120, "the first array to leave the queue")
    sweep_ = sweep_id(sweep.results)
    folder = store.SweepPaths(sweep.results, "exp014_tiled", sweep_).folder
    own_file(sweep.results, "exp014_tiled", sweep_, 1).unlink()
    store.write_rows(folder / "job-000003.parquet", [{"job": 3, "status": "failed"}])
    result = sweep(f"resume={sweep_}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 points to run" in result.stdout
    manifest = store.read_manifest(store.SweepPaths(sweep.results, "exp014_tiled", sweep_))
    assert sorted(manifest["launches"][-1]["placement"]["tasks"].values()) == [[1], [3]]
    rows = store.read(sweep.results).sort_values("job")
    assert rows["job"].tolist() == [0, 1, 2, 3] and set(rows["status"]) == {"ok"}


@WAITS
def test_a_grid_beyond_max_array_size_runs_as_chained_arrays_under_one_cap(sweep, most_at_once):
    size = sweep.cluster.max_array_size
    lengths = ",".join(str(64 + i) for i in range(size + 2))
    result = sweep(f"length={lengths}", "block=16", "hydra.launcher.array_parallelism=2")
    assert result.returncode == 0, result.stderr
    rows = store.read(sweep.results).sort_values("job")
    assert len(rows) == size + 2 and set(rows["status"]) == {"ok"}
    arrays = rows["slurm_job_id"].str.split("_").str[0]
    assert arrays.nunique() == 2 and (arrays == arrays.iloc[0]).sum() == size
    assert most_at_once(rows) <= 2


def _running_task(cluster: SlurmCluster, index: int | None = None) -> str | None:
    """The id of a task SLURM runs now (array task `index` when given: ID_INDEX), or None."""
    listed = cluster.run("squeue", "-h", "-r", "-t", "RUNNING", "-o", "%i").stdout.split()
    wanted = [task for task in listed if index is None or task.endswith(f"_{index}")]
    return wanted[0] if wanted else None


def _where(cluster: SlurmCluster, gate, outputs) -> str:
    """For a wait that timed out: the queue, the hold files, the tasks' logs and the daemons'."""
    queue = cluster.run("squeue", "-h", "-r", "-o", "%i %T %r", check=False).stdout
    logs = [f"----- {path}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-15:])
            for path in sorted(outputs.glob("**/.submitit/*/*_log.*"))]  # fmt: skip
    held_ = [path.name for path in held(gate)]
    return "\n".join([f"squeue: {queue.strip() or 'empty'}", f"held: {held_}", *logs,
                      cluster.log_tails()])  # fmt: skip


def test_a_request_no_node_can_satisfy_is_refused_before_submitting(sweep):
    """CPUs, memory and GPUs beyond what the test cluster's node has: each is named in one
    line, with what would fit."""
    asks = ["hydra.launcher.cpus_per_task=4096", "hydra.launcher.mem_gb=100000",
            "hydra.launcher.gpus_per_node=3"]  # fmt: skip
    others = [arg for arg in SLURM if arg.split("=")[0] not in [a.split("=")[0] for a in asks]]
    result = sweep.harness("+experiment=exp014_tiled", "length=64", "block=16", *others, *asks,
                           env=environment(sweep.cluster))  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    said = result.stderr
    assert said.startswith("error: hydra.launcher: no node of ") and said.count("\n") == 1
    for asked in ("cpus_per_task=4096 asks for 4,096 CPUs",
                  "mem_gb=100000 asks for 102,400,000 MB of memory",
                  "gpus_per_node=3 asks for 3 GPUs"):  # fmt: skip
        assert asked in said
    assert re.search(r"lower them \(hydra.launcher.cpus_per_task=\d+ hydra.launcher.mem_gb=\d+ "
                     r"hydra.launcher.gpus_per_node=2 fits\)", said), said  # fmt: skip
    assert not (sweep.cwd / "outputs").exists()
    assert sweep.cluster.queue() == []


@WAITS
@pytest.mark.parametrize("tasks", [1, 2])
def test_a_training_task_at_its_time_limit_checkpoints_requeues_and_finishes(
    cluster, harness, tasks
):
    """The trainer probe holds at step 10 until SLURM warns that its two minutes are nearly up
    (USR2, signal_delay_s before the limit); it saves there, submitit requeues the task, and
    the rerun continues from that checkpoint to the end: each step once (with 2 tasks, a point
    of two processes: each step once per rank, both warned, both continued). SLURM may send the
    warning up to 60 s before it is due (sbatch(1), --signal): 40 s before a 2-minute limit
    comes 20 s after the start at the earliest, once submitit's handler is there (a warning
    before it would kill the task)."""
    gate = harness.cwd / "gate"
    gate.mkdir()
    limited = [arg for arg in SLURM if not arg.startswith("hydra.launcher.timeout_min=")]
    result = harness(
        "--config-dir", str(SUPPORT / "conf"), "+experiment=trainer", f"folder={gate}",
        "steps=20", "hold_at=10", "until=stopping", "checkpoint_every=100", "timeout_s=600",
        "stream_s=0.2",
        *limited, "hydra.launcher.timeout_min=2", "hydra.launcher.signal_delay_s=40",
        "hydra.launcher.max_num_timeout=2", "wait=false", f"hydra.launcher.tasks_per_node={tasks}",
        env={**environment(cluster), "PYTHONPATH": PROBE_PATH},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (sweep_,) = store.sweeps(harness.results, "trainer")
    task = wait_for(lambda: _running_task(cluster), 60, "the task to run")
    wait_for(lambda: len(held(gate)) == tasks, 60, "the run to hold at step 10")
    wait_for(lambda: len(store.read(harness.results, "trainer")) == 10 * tasks, 60, "its rows")
    landed = store.read(harness.results, "trainer")
    assert landed["step"].tolist() == list(range(1, 11)) * tasks
    assert set(landed["status"]) == {"running"}
    runner = SimpleNamespace(harness=harness)  # what status() runs `python -m harness` with
    assert "step=10" in status(runner, sweep_)

    def finished() -> bool:
        return "1 ok" in status(runner, sweep_)

    cluster.release_requeued(task, finished, timeout=240)
    rows = store.read(harness.results, "trainer")
    train = rows[rows["step"] > 0]
    assert train["step"].tolist() == list(range(1, 21)) * tasks, "each step once (per rank)"
    assert set(rows["status"]) == {"ok"}
    assert len(held(gate)) == tasks, "the rerun resumed past the hold"
    before, after = train["step"] <= 10, train["step"] > 10
    restarts = train["slurm_restarts"]
    assert (restarts[before] == 0).all() and (restarts[after] == 1).all()
    if tasks > 1:
        assert steps_by_rank(train) == {0: list(range(1, 21)), 1: list(range(1, 21))}


def test_a_two_task_point_with_a_killed_process_resumes_from_its_checkpoint(cluster, harness):
    """ntasks_per_node=2: both processes hold at step 10 (checkpoint at 8); rank 1's is
    killed, rank 0's fails at the next all-reduce; resume submits the point again, and both
    continue from the checkpoint: each step once per rank."""
    gate = harness.cwd / "gate"
    gate.mkdir()
    given = ["--config-dir", str(SUPPORT / "conf"), "+experiment=trainer"]
    env = {**environment(cluster), "PYTHONPATH": PROBE_PATH}
    running = harness.start(*given, f"folder={gate}", "steps=16", "hold_at=10", "stream_s=0.1",
                            *SLURM, "hydra.launcher.tasks_per_node=2", env=env)  # fmt: skip
    try:
        wait_for(lambda: len(held(gate)) == 2, 120, "both processes to hold",
                 describe=lambda: _where(cluster, gate, harness.cwd / "outputs"))  # fmt: skip
        wait_for(lambda: len(store.read(harness.results, "trainer")) == 20, 60, "their rows")
        landed = store.read(harness.results, "trainer")
        victim = int(landed.loc[landed["rank"] == 1, "pid"].iloc[0])
        os.kill(victim, signal.SIGKILL)  # the cluster's node is this machine
        (gate / "release").touch()
        output, _ = running.communicate(timeout=120)
    finally:
        running.kill()
    assert running.returncode == 1 and "1 failed" in output, output
    (sweep_,) = store.sweeps(harness.results, "trainer")
    # The point's answer lands before SLURM lets its task go (its other process ends, the
    # step is cleaned up): a resume meanwhile would leave the point to it.
    wait_for(lambda: not cluster.queue(), 120, "SLURM to let the task go")
    resumed = harness(*given, f"resume={sweep_}", env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    rows = store.read(harness.results, "trainer")
    train = rows[rows["step"] > 0]
    assert steps_by_rank(train) == {0: list(range(1, 17)), 1: list(range(1, 17))}
    assert set(rows["status"]) == {"ok"}
    kept, reran = train[train["step"] <= 8], train[train["step"] > 8]
    assert victim in set(kept["pid"]) and not set(kept["pid"]) & set(reran["pid"])


def test_a_search_on_slurm_killed_mid_run_resumes_the_same_trials(cluster, harness, tmp_path):
    """A search as a SLURM array of trials, two at once (array_parallelism): scancel the array
    while both hold mid-run, then resume: the killed trials come back with their numbers and
    parameters, continue from their checkpoints, and the study ends with a trial per point."""
    gate = tmp_path / "gate"
    gate.mkdir()
    env = {**environment(cluster), "PYTHONPATH": PROBE_PATH}
    given = ["--config-dir", str(SUPPORT / "conf"), "+experiment=tuned", "variant=a"]
    args = ["search.params.lr=tag(log, interval(1e-4, 1))", "search.trials=4", "search.pruner=none"]
    args += [f"folder={gate}", "hold_at=5", *SLURM, "hydra.launcher.array_parallelism=2"]
    submitted = harness(*given, *args, "wait=false", env=env)
    assert submitted.returncode == 0, submitted.stderr
    wait_for(lambda: len(held(gate)) == 2, 120, "two trials holding at step 5")
    array = _running_task(cluster).partition("_")[0]
    cluster.run("scancel", array)
    wait_for(lambda: _running_task(cluster) is None, 60, "the array to go")
    (sweep_,) = store.sweeps(harness.results, "tuned")
    folder = store.SweepPaths(harness.results, "tuned", sweep_).folder
    before = {t.user_attrs["job"]: (t.number, t.params) for t in search.studies(folder)[0].trials}
    assert len(before) == 2
    (gate / "release").touch()
    resumed = harness(*given[:3], f"resume={sweep_}", "wait=true", env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    trials = search.studies(folder)[0].trials
    after = {t.user_attrs["job"]: t for t in trials}
    assert sorted(after) == [0, 1, 2, 3] and len(trials) == 4, resumed.stdout
    assert {t.state.name for t in trials} == {"COMPLETE"}
    rows = store.read(harness.results, "tuned", sweep_)
    for job, (number, params) in before.items():
        assert (after[job].number, after[job].params) == (number, params)
        train = rows[(rows["job"] == job) & (rows["phase"] == "train")]
        assert train["step"].tolist() == list(range(1, 21))
    assert "cell 0: 4 trials asked of 4 (4 complete)" in status(
        SimpleNamespace(harness=harness), sweep_
    )


OWN_KERNEL = """import pathlib
import time

VALUE = {value}


def run(x: int = 1, gate: str = "") -> list[dict]:
    if x == 1:  # the first task holds until the test lets it go
        pathlib.Path(gate, "started").touch()
        while not pathlib.Path(gate, "go").exists():
            time.sleep(0.05)
    return [{{"value": VALUE * x}}]
"""


def test_an_array_runs_the_code_it_was_submitted_with_whatever_is_edited_meanwhile(
    cluster, harness, gate, tmp_path
):
    """wait=false, one task at a time: while the first holds, the experiment's file is edited
    to return another value; the tasks that start after the edit still run the submitted code,
    from its snapshot, and every row carries the planned value and code_digest."""
    folder = tmp_path / "mine"
    (folder / "experiment").mkdir(parents=True)
    (folder / "experiment" / "own.yaml").write_text(
        "# @package _global_\nexperiment:\n  name: own\n  run: ownkernel.run\n"
    )
    kernel = folder / "ownkernel.py"
    kernel.write_text(OWN_KERNEL.format(value=1))
    env = {**environment(cluster), "PYTHONPATH": str(folder)}
    given = ["--config-dir", str(folder), "+experiment=own", "+x=1,2,3", f"+gate={gate}",
             *SLURM, "hydra.launcher.array_parallelism=1", "wait=false"]  # fmt: skip
    submitted = harness(*given, env=env)
    assert submitted.returncode == 0, submitted.stderr
    (sweep_,) = store.sweeps(harness.results, "own")
    wait_for(lambda: (gate / "started").exists(), 180, "the first task to start", interval=0.5)
    kernel.write_text(OWN_KERNEL.format(value=1000))
    (gate / "go").touch()

    def shown() -> str:
        return status(SimpleNamespace(harness=harness), sweep_)

    wait_for(lambda: "3 ok" in shown(), 240, "the sweep to finish", interval=1, describe=shown)
    rows = store.read(harness.results, "own", sweep_).sort_values("job")
    planned = store.read_manifest(store.SweepPaths(harness.results, "own", sweep_))["code_digest"]
    assert rows["value"].tolist() == [1, 2, 3]
    assert rows["code_digest"].eq(planned).all() and rows["slurm_job_id"].notna().all()
