"""The launchers' contract, on every launcher the configs name (tests/support/contracts.py; the
detached ones on the SLURM test cluster, tests/slurm); the local launcher's points in parallel
processes here, under a cap, a GPU of their own each."""

import os
import pickle
import signal
import time
from pathlib import Path

import contracts
import pytest
from probes import arrivals, await_arrivals

from harness import store
from harness.errors import StoreUnwritable, os_error
from harness.launchers import protocol
from harness.launchers.local import LocalLauncher, visible_gpus

# Each launcher that runs here; Hydra's basic launcher runs the points in the harness's process.
LAUNCHERS = [
    pytest.param(name, marks=[] if name == "basic" else [pytest.mark.process])
    for name in contracts.launchers(detached=False)
]


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_launchers_points_run_once_a_failure_is_a_row_and_resume_reruns_it(probe, gate, launcher):
    contracts.points_run_once_and_a_failure_is_a_row(probe, gate, [f"hydra/launcher={launcher}"])


@pytest.mark.process
@pytest.mark.parametrize("launcher", contracts.launchers(detached=False))
def test_ctrl_c_ends_a_launchers_points_and_resume_finishes_them(probe, gate, launcher):
    contracts.ctrl_c_ends_the_points_and_resume_finishes_them(
        probe, gate, [f"hydra/launcher={launcher}"]
    )


UUIDS = "GPU-8d3c1f7a-0b2e-4c55-9f1d-2a6b7e0c4d11,MIG-5f0e2b9c-7d41-4a8e-b3c6-91d2e8f4a705"


@pytest.mark.slow
@pytest.mark.parametrize("visible", ["0,1", "2,3", UUIDS])
def test_points_run_under_the_cap_on_distinct_visible_gpus(probe, gate, most_at_once, visible):
    """Each point's CUDA_VISIBLE_DEVICES (its rows' gpus) is one of this process's own entries:
    with CUDA_VISIBLE_DEVICES=2,3 a point runs on 2 or 3, never on GPUs 0 and 1."""
    # Points 0 and 1 start first and can only end once both have arrived: they ran at once.
    result = probe(
        "point=0,1,2,3", f"folder={gate}", "expect=2", "timeout_s=120",
        "hydra/launcher=local", "hydra.launcher.max_parallel=2", "hydra.launcher.gpus=[0,1]",
        env={"CUDA_VISIBLE_DEVICES": visible},  # two GPUs to hand out, whatever the machine has
    )  # fmt: skip
    assert result.returncode == 0, result.stderr + result.stdout
    rows = store.read(probe.results).set_index("job").sort_index()
    assert len(rows) == 4 and set(rows["status"]) == {"ok"}
    assert len(arrivals(gate)) == 4 and rows.loc[0, "gpus"] != rows.loc[1, "gpus"]
    assert set(rows["gpus"]) == set(visible.split(","))
    # Each row's span lies within its process's life, so more than two overlapping spans would
    # mean more than two processes at once.
    assert most_at_once(rows) <= 2, rows[["started_at", "duration_s"]]
    assert set(rows["threads"]) == {max(1, len(os.sched_getaffinity(0)) // 2)}, "CPUs shared"


@pytest.mark.slow
def test_the_gpus_setting_picks_among_the_visible_ones(probe, gate):
    result = probe(
        "point=0,1",
        f"folder={gate}",
        "hydra/launcher=local",
        "hydra.launcher.gpus=[1]",
        env={"CUDA_VISIBLE_DEVICES": UUIDS},
    )
    assert result.returncode == 0, result.stderr + result.stdout
    assert set(store.read(probe.results)["gpus"]) == {UUIDS.split(",")[1]}


@pytest.mark.slow
@pytest.mark.parametrize("visible", [None, ""])
def test_a_point_without_a_gpu_of_its_own_sees_what_this_process_sees(
    probe, gate, monkeypatch, visible
):
    """submitit's local executor gives a job it has no GPU for CUDA_VISIBLE_DEVICES="", which
    would hide a GPU that this process sees (here none to hand out: no nvidia-smi, or none
    listed): device=auto would quietly run on the CPU. A point inherits this process's value."""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no nvidia-smi: no GPU to hand out
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    result = probe("point=0,1", f"folder={gate}", "hydra/launcher=local")
    assert result.returncode == 0, result.stderr + result.stdout
    gpus = store.read(probe.results)["gpus"]
    assert gpus.isna().all() if visible is None else set(gpus) == {""}


@pytest.mark.parametrize(
    "visible, expected",
    [
        ("2,3", ["2", "3"]),
        (UUIDS, UUIDS.split(",")),
        (" 1 , 0 ", ["1", "0"]),
        ("0,-1,1", ["0"]),  # CUDA stops at an invalid entry
        ("-1", []),
        ("", []),
    ],
)
def test_visible_gpus_are_this_process_s_own_entries(monkeypatch, visible, expected):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert visible_gpus() == expected


def test_gpus_that_are_not_visible_are_refused(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    LocalLauncher.preflight({"gpus": [0, 1]})
    with pytest.raises(ValueError, match=r"gpus \[2\] are not distinct GPUs .*: 0 \(2\), 1 \(3\)"):
        LocalLauncher.preflight({"gpus": [2]})
    with pytest.raises(ValueError, match="not distinct"):
        LocalLauncher.preflight({"gpus": [1, 1]})


def test_the_cap_is_the_gpu_count_where_there_are_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    assert LocalLauncher(max_parallel=8, gpus=[0, 1, 2], submitit_folder="x").max_parallel == 3
    assert LocalLauncher(max_parallel=8, submitit_folder="x").max_parallel == 3
    assert LocalLauncher(max_parallel=3, gpus=[], submitit_folder="x").max_parallel == 3
    with pytest.raises(ValueError, match="max_parallel"):
        LocalLauncher.preflight({"max_parallel": 0})


@pytest.mark.process
def test_a_local_sweep_sent_sigterm_stops_its_points_without_tracebacks(probe, gate):
    """SIGTERM to the harness alone (Ctrl-C, to the whole group, is in the contract above): the
    points still running are stopped with it, and only the resume hint is printed."""
    args = ["point=0,1,2,3", f"folder={gate}", "release=open", "hydra/launcher=local"]
    sweeping = probe.start(*args)
    await_arrivals(gate, 2)
    os.kill(sweeping.pid, signal.SIGTERM)
    output, _ = sweeping.communicate(timeout=120)
    assert sweeping.returncode == 143, output
    assert "Traceback" not in output and "interrupted; finish it with:" in output
    points = [Path(f"/proc/{path.name.rsplit('-', 1)[1]}") for path in arrivals(gate)]
    deadline = time.monotonic() + 60
    while any(p.exists() for p in points) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(p.exists() for p in points), "a point outlived its sweep"


@pytest.mark.process
def test_a_launcher_of_ones_own_runs_points_at_once(probe, gate):
    """tests/support/pool_launcher.py, through the launchers' protocol alone, named by
    hydra/launcher=pool in the probes' config dir (tests/support/conf/hydra/launcher); the
    contract above runs it too."""
    # Points 0 and 1 can only end once both have arrived: the pool ran them at once.
    met = probe("point=0,1", f"folder={gate}", "expect=2", "hydra/launcher=pool")
    assert met.returncode == 0, met.stdout + met.stderr
    (sweep,) = store.sweeps(probe.results, "rendezvous")
    hydra = probe.cwd / "outputs" / "runs" / "rendezvous" / sweep / ".hydra" / "hydra.yaml"
    assert "PoolLauncher" in hydra.read_text()


def test_hydras_own_launcher_runs_in_batches_what_the_loop_cannot_reproduce(harness):
    """hydra.job.env_set: Hydra composes and runs each job itself (its run_job writes each
    job's .hydra/hydra.yaml), handed the jobs in batches; each job runs its planned point."""
    grid = ["+experiment=exp014_tiled", "length=64,80,96", "block=16", "heads=2"]
    result = harness(*grid, "+hydra.job.env_set.HARNESS_PROBE=seen")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 points: 3 ok" in result.stdout
    (sweep,) = store.sweeps(harness.results, "exp014_tiled")
    runs = harness.cwd / "outputs" / "runs" / "exp014_tiled" / sweep
    assert all((runs / f"job-{job}" / ".hydra" / "hydra.yaml").is_file() for job in range(3))
    rows = store.read(harness.results).sort_values("job")
    assert rows["length"].tolist() == [64, 80, 96] and set(rows["status"]) == {"ok"}


STORE_ERRORS = [
    OSError(28, "No space left on device"),
    PermissionError(13, "Permission denied", "/out/results/job-000001.parquet"),
    FileNotFoundError(2, "No such file or directory", "/a", None, "/b"),
    OSError("rank 0 could not write job-000000.parquet"),
]


@pytest.mark.parametrize("error", STORE_ERRORS, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("tracked", [False, True], ids=["store", "tracker"])
def test_a_store_error_crosses_to_the_sweep_as_the_named_error_it_was(error, tracked):
    """What a job's process sends back for a store that cannot be written (the store's own
    OSError, or the tracker's StoreUnwritable of it) reads as before, names the store's error's
    type, survives the pipe (pickle), and is raised by name in the sweep's process."""
    raised = StoreUnwritable.of(error) if tracked else error
    assert str(raised) == str(error) and os_error(raised) == os_error(error)
    sent = pickle.loads(pickle.dumps(protocol.unwritable(raised)))
    said = f"harness error: the store cannot be written ({type(error).__name__}: {error})"
    assert str(sent) == os_error(sent) == said and sent.kind == type(error).__name__
    with pytest.raises(StoreUnwritable) as caught:
        protocol.raise_if_unwritable(sent)
    assert caught.value is sent
    summary = {"status": "ok", "error": None}
    assert protocol.raise_if_unwritable(summary) is summary
