"""One point across processes (harness.running.distributed): hydra.launcher.tasks_per_node=2 on the
local launcher, two real processes meeting through torch.distributed (gloo, CPU); each logs its
rows, rank 0 checkpoints, and a kill of one process is continued from the checkpoint, each
step's rows once per rank. The SLURM side is in tests/slurm/test_harness_slurm.py."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from probes import PROBE_PATH, SUPPORT, held, steps_by_rank, wait_for

from harness import store, tracking

ROOT = Path(__file__).resolve().parent.parent

# A group's process waits this long for the others: far more than any load keeps them apart (the
# test of the timeout itself sets its own).
TWO = ["hydra/launcher=local", "hydra.launcher.tasks_per_node=2",
       "hydra.launcher.group_timeout_s=600"]  # fmt: skip


def test_segments_of_each_rank_are_named_apart_and_read_in_rank_order(tmp_path):
    path = store.SweepPaths(tmp_path, "e", "s").job(3).file
    path.parent.mkdir(parents=True)
    for rank, number in [(1, 2), (None, 1), (1, 1), (0, 1), (0, 2)]:
        part = store.segment_file(path, number, rank)
        store.write_rows(part, pa.table({"job": [3], "rank": [rank], "n": [number]}))
    found = store.segments(path)
    assert [(store.segment_rank(p), store.segment_number(p)) for p in found] == [
        (None, 1), (0, 1), (0, 2), (1, 1), (1, 2)]  # fmt: skip
    assert found[1].name == "job-000003.rank-0000.part-00000001.parquet"
    rows = store.read(tmp_path, "e", "s")
    assert list(zip(rows["rank"].fillna(-1), rows["n"], strict=True)) == [
        (-1, 1), (0, 1), (0, 2), (1, 1), (1, 2)]  # fmt: skip


class RankOneAlone:
    """Rank 1 of a group of two whose other process is not there: each collective answers with
    this process's own value (what the code under test sees when the other agrees)."""

    rank, world_size, local_rank = 1, 2, 1

    def any(self, flag: bool) -> bool:
        return flag

    all = any

    def gather(self, value) -> list:
        return [value, value]

    def first(self, value):
        return value

    def barrier(self) -> None:
        pass


def test_a_rank_that_fails_before_its_first_landing_leaves_none_of_an_earlier_runs_rows(tmp_path):
    path = store.SweepPaths(tmp_path, "e", "s").job(0).file
    path.parent.mkdir(parents=True)
    for number in (1, 2, 3):  # an earlier run of rank 1, killed without a checkpoint
        table = pa.table({"job": [0], "status": ["running"], "step": [number]})
        store.write_rows(store.segment_file(path, number, 1), table)
    tracker = tracking.Tracker(path, tmp_path / "checkpoints", lambda row: {"job": 0, **row},
                               config_hash="h", group=RankOneAlone())  # fmt: skip
    assert tracker.restore() is None
    tracker.raised = True
    tracker.end([{"job": 0, "status": "failed", "error": "boom"}])
    rows = store.read(tmp_path, "e", "s")
    assert rows["status"].tolist() == ["failed"] and rows["error"].tolist() == ["boom"]
    assert [store.segment_number(p) for p in store.segments(path)] == [1]


@pytest.mark.slow
def test_two_processes_log_their_rows_and_a_killed_one_is_resumed_from_the_checkpoint(
    harness, gate
):
    """Two processes each log their rows with their rank; both hold at step 10 (checkpoint at
    8); one is killed; the other fails at the next step's all-reduce once released. Resume
    restores both from the checkpoint: steps 9 on run again, each rank has each step once, the
    function's rows are rank 0's, and the point's rows are merged into its job's file."""
    args = ["--config-dir", str(SUPPORT / "conf"), "+experiment=trainer", f"folder={gate}",
            "steps=16", "hold_at=10", "stream_s=0.1", *TWO]  # fmt: skip
    running = harness.start(*args, env={"PYTHONPATH": PROBE_PATH})
    try:
        wait_for(lambda: len(held(gate)) == 2, 120, "both processes to hold")
        wait_for(lambda: len(store.read(harness.results)) == 20, 60, "their 20 rows to land")
        landed = store.read(harness.results)
        victim = int(landed.loc[landed["rank"] == 1, "pid"].iloc[0])
        os.kill(victim, signal.SIGKILL)
        (gate / "release").touch()
        output, _ = running.communicate(timeout=120)
    finally:
        running.kill()
    # Until then each process logged its steps, with its rank: two processes, one a rank.
    assert steps_by_rank(landed) == {0: list(range(1, 11)), 1: list(range(1, 11))}
    assert set(landed["world_size"]) == {2}
    assert landed.groupby("rank")["pid"].nunique().tolist() == [1, 1]
    assert landed["pid"].nunique() == 2, "two processes"
    assert running.returncode == 1, output  # a point failed
    assert "1 failed" in output and "by peer" in output, output  # gloo: closed, or reset
    (sweep,) = store.sweeps(harness.results, "trainer")
    resumed = harness("--config-dir", str(SUPPORT / "conf"), "+experiment=trainer",
                      f"resume={sweep}", env={"PYTHONPATH": PROBE_PATH})  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    rows = store.read(harness.results)
    assert steps_by_rank(rows) == {0: list(range(1, 17)), 1: list(range(1, 17))}
    assert set(rows["world_size"]) == {2} and set(rows["status"]) == {"ok"}
    final = rows[rows["step"] == 0]
    assert final["rank"].tolist() == [0], "the rows the function returns are rank 0's"
    (folder,) = {path.parent for path in harness.results.rglob("job-*.parquet")}
    assert [p.name for p in folder.glob("job-*")] == ["job-000000.parquet"], "merged when done"
    kept, reran = rows[rows["step"].between(1, 8)], rows[rows["step"].between(9, 16)]
    assert kept.groupby("rank")["pid"].nunique().tolist() == [1, 1], "kept from the first run"
    assert reran.groupby("rank")["pid"].nunique().tolist() == [1, 1]
    assert not set(kept["pid"]) & set(reran["pid"]), "steps 9 on ran again, after step 8"
    assert victim in set(kept["pid"]) and len(held(gate)) == 2, "the rerun did not hold again"


@pytest.mark.slow
def test_exp017_across_two_processes_trains_as_one_process_and_its_claim_passes(harness):
    # The claim compares the first 100 steps; a batch of 4 (2 a process) is split as 32 is.
    result = harness("+experiment=exp017_recall", "ddp=true", "attention=sdpa", "window=0",
                     "steps=100", "batch=4", "checkpoint_every=50", *TWO)  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "claim PASS: processes that split the batch train as one" in output
    assert "claim FAIL: with full attention octlm learns to recall" in output
    rows = store.read(harness.results)
    train = rows[rows["phase"] == "train"]
    assert train["step"].tolist() == list(range(1, 101)) and set(train["rank"]) == {0}
    assert train["single_loss_diff"].notna().all()


@pytest.mark.parametrize(
    ("launcher", "said"),
    [
        (["hydra.launcher.nodes=2"], "nodes=2: the local launcher runs on this one"),
        (["hydra.launcher.gpus_per_node=1"], "each process needs a GPU of its own"),
    ],
)
def test_settings_a_group_cannot_run_with_are_refused_in_one_line(harness, launcher, said):
    result = harness("+experiment=exp014_tiled", *TWO, *launcher)
    assert result.returncode == 2, result.stdout + result.stderr
    assert said in result.stderr and result.stderr.count("\n") == 1
    assert not (harness.cwd / "outputs").exists()


def test_ddp_on_a_point_of_one_process_is_a_failed_row_that_says_how(harness):
    result = harness("+experiment=exp017_recall", "ddp=true", "steps=2", "attention=sdpa",
                     "window=0")  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr  # a point failed
    (row,) = store.read(harness.results).to_dict("records")
    assert row["status"] == "failed" and "hydra.launcher.tasks_per_node=2" in row["error"]


JOIN_ALONE = """
import os, socket, sys
probe = socket.socket()
probe.bind(("127.0.0.1", 0))
port = probe.getsockname()[1]
probe.close()
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="2")
from harness.running import distributed
try:
    distributed.join(timeout_s=2)
except Exception as error:
    print(type(error).__name__, str(error).splitlines()[0])
    sys.exit(3)
"""


@pytest.mark.process
def test_a_rank_that_never_comes_fails_the_others_after_the_groups_timeout():
    """Rank 1 died before it could meet (it never starts here): rank 0 fails after its
    group_timeout_s, not after torch's 30 minutes; the test waits for it to end."""
    done = subprocess.run([sys.executable, "-c", JOIN_ALONE], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)  # fmt: skip
    assert done.returncode == 3, done.stdout + done.stderr
    assert "1/2 clients joined" in done.stdout, done.stdout


def test_a_group_timeout_that_is_no_positive_count_is_one_line(harness):
    result = harness("+experiment=exp014_tiled", "hydra/launcher=local",
                     "hydra.launcher.group_timeout_s=0")  # fmt: skip
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "group_timeout_s" in result.stderr
