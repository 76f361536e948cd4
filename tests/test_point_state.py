"""Points run one after another in one process (harness.launchers.in_process.run_here: Hydra's
basic launcher in the command's process, a SLURM task's pack of points) each start from the
state the first one started from, as a warm worker's do (tests/test_workers.py): a point's
value does not depend on the points run before it. What cannot be put back is said, once."""

import numpy
import pytest
import torch
from probes import PROBE_PATH, SUPPORT, UNSETTLE, _seen_state

from harness import store
from harness.launchers import in_process
from harness.launchers.fresh import ProcessState
from harness.planning.config import compose_config
from harness.planning.plan import plan
from harness.running.job import Task

STATE = list(_seen_state())  # what the unsettling probe sees, a column each
SEEN = ["dtype", "draw", "precision", "grad", "cpu_threads"]

EXPERIMENT = """# @package _global_
experiment:
  name: drifting
  run: drifting.run

x: 1
"""

DRIFTING = '''import numpy
import torch


def run(x: int = 1) -> list[dict]:
    """What the point starts from; point x=1 then leaves all of it changed."""
    seen = {"dtype": str(torch.get_default_dtype()), "draw": float(numpy.random.random()),
            "precision": torch.get_float32_matmul_precision(), "grad": torch.is_grad_enabled(),
            "cpu_threads": torch.get_num_threads()}
    if x == 1:
        torch.set_default_dtype(torch.float64)
        torch.set_float32_matmul_precision("medium")
        torch.set_grad_enabled(False)
        torch.set_num_threads(1 if seen["cpu_threads"] > 1 else 2)
        numpy.random.random(7)
    return [seen]
'''


@pytest.fixture
def drifting(harness, tmp_path):
    """An experiment of one's own (drifting: its point x=1 leaves torch's default dtype, matmul
    precision, grad mode and threads and NumPy's generator changed), run in this process;
    drifting(*args) runs a sweep of it and returns its rows by job."""
    folder = tmp_path / "drifting"
    (folder / "experiment").mkdir(parents=True)
    (folder / "experiment" / "drifting.yaml").write_text(EXPERIMENT)
    (folder / "drifting.py").write_text(DRIFTING)

    def run(*args: str):
        given = ["--config-dir", str(folder), "+experiment=drifting", "reuse=false", *args]
        result = harness(*given, env={"PYTHONPATH": str(folder)})
        assert result.returncode == 0, result.stdout + result.stderr
        sweep = store.newest_sweep(harness.results, "drifting")
        return store.read(harness.results, "drifting", sweep).set_index("job").sort_index()

    return run


def test_a_points_value_run_after_another_in_this_process_is_its_value_alone(drifting):
    """x=2 after x=1 in the command's own process (Hydra's basic launcher) gives what x=2 gives
    run alone: float32, the same draw of NumPy's generator, the same precision, grad mode and
    threads."""
    after = drifting("x=1,2")
    alone = drifting("x=2")
    assert after["x"].tolist() == [1, 2] and alone["x"].tolist() == [2]
    assert after.iloc[1][SEEN].to_dict() == alone.iloc[0][SEEN].to_dict()
    assert after.iloc[1][SEEN].to_dict() == after.iloc[0][SEEN].to_dict()
    assert alone.iloc[0]["dtype"] == "torch.float32"


def test_in_this_process_rows_do_not_depend_on_the_order_of_the_points(harness):
    """One point for each setting a point may leave changed (tests/support/probes.py UNSETTLE,
    but a patched function and a thread, which no process can put back), in one order and
    then in the other, in the command's own process: every point saw what the first saw."""
    kinds = [kind for kind in UNSETTLE if kind not in ("patch", "thread")]
    given = ["--config-dir", str(SUPPORT / "conf"), "+experiment=unsettling",
             f"folder={harness.cwd}", "reuse=false"]  # fmt: skip
    seen = {}
    for order in (kinds, kinds[::-1]):
        result = harness(*given, f"change={','.join(order)}", env={"PYTHONPATH": PROBE_PATH})
        assert result.returncode == 0, result.stdout + result.stderr
        assert "cannot put back" not in result.stderr, result.stderr
        sweep = store.newest_sweep(harness.results, "unsettling")
        rows = store.read(harness.results, "unsettling", sweep)
        seen[order[0]] = rows.set_index("change")[STATE].sort_index()
    forward, backward = seen.values()
    baseline = forward.loc["nothing"]
    differing = {(kind, column) for frame in (forward, backward) for kind in kinds
                 for column in STATE if frame.loc[kind, column] != baseline[column]}  # fmt: skip
    assert not differing, f"points saw another point's leftovers: {sorted(differing)}"


def test_what_a_point_leaves_that_cannot_be_put_back_is_said_once(harness):
    """A point that replaces torch.matmul, in the command's own process: a warning names it, in
    the console and in that job's log, once, however many points follow it."""
    given = ["--config-dir", str(SUPPORT / "conf"), "+experiment=unsettling",
             f"folder={harness.cwd}", "reuse=false", "change=patch,nothing,umask"]  # fmt: skip
    matmul = torch.matmul
    try:
        result = harness(*given, env={"PYTHONPATH": PROBE_PATH})
    finally:
        torch.matmul = matmul  # what no process can put back: this test's own process's
    assert result.returncode == 0, result.stdout + result.stderr
    said = "job 0 left what this process cannot put back (torch.matmul replaced)"
    assert result.stderr.count("cannot put back") == 1 and said in result.stderr, result.stderr
    (runs,) = (harness.cwd / "outputs" / "runs" / "unsettling").iterdir()
    assert said in (runs / "job-0" / "harness.log").read_text()


def test_run_here_starts_each_point_from_the_state_the_first_started_from(
    initialized, tmp_path, monkeypatch
):
    """Three jobs through run_here, each point (run_point, replaced) leaving torch's default
    dtype, matmul precision, grad mode and threads and NumPy's generator changed: each saw what
    the first saw, and this process is as it was after the last."""
    master = compose_config(
        ["+experiment=exp014_tiled", f"out={tmp_path}", "sweep_id=S"], "exp014_tiled", []
    )
    sweep = plan(master, [])
    jobs = [p.job_of(sweep) for p in sweep.points[:3]]
    seen = []

    def point(values: dict, run_dir: str, command, job) -> dict:
        seen.append((str(torch.get_default_dtype()), float(numpy.random.random()),
                     torch.get_float32_matmul_precision(), torch.is_grad_enabled(),
                     torch.get_num_threads()))  # fmt: skip
        torch.set_default_dtype(torch.float64)
        torch.set_float32_matmul_precision("medium")
        torch.set_grad_enabled(False)
        torch.set_num_threads(1 if seen[-1][-1] > 1 else 2)
        return {"status": "ok"}

    monkeypatch.setattr(in_process, "run_point", point)
    before = ProcessState()
    try:
        ran = list(in_process.run_here(master, Task(), jobs))
        after = (str(torch.get_default_dtype()), torch.get_float32_matmul_precision())
    finally:
        before.restore(command=False)  # the job log's handlers gone, and all else as it was
    assert [job for job, _ in ran] == [spec.job for spec in jobs]
    assert len(seen) == 3 and seen == [seen[0]] * 3, seen
    assert after == ("torch.float32", "highest")
