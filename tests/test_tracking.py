"""Training points: rows that land while the point runs, survive a SIGKILL, and continue from
the last checkpoint on resume with each step once (harness.tracking), through the trainer probe
(tests/support/probes.py), run by the harness as a user would run it."""

import contextlib
import itertools
import os
import signal
import types

import duckdb
import pandas as pd
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import torch
from probes import held, wait_for

from harness import files, store, tracking
from harness.errors import StoreUnwritable
from harness.running import calling

STEPS = 20


def landed(results) -> pd.DataFrame:
    return store.read(results, "trainer")


def sweep_of(results) -> str:
    (found,) = store.sweeps(results, "trainer")
    return found


@pytest.mark.process
def test_rows_land_while_the_point_runs_and_every_reader_sees_them(trainer):
    running = trainer.start(f"steps={STEPS}", "hold_at=10", "stream_s=0.2")
    wait_for(lambda: held(trainer.gate), 60, "the run to hold at step 10")
    wait_for(lambda: len(landed(trainer.results)) == 10, 60, "10 rows")
    rows = landed(trainer.results)
    assert rows["step"].tolist() == list(range(1, 11))
    assert set(rows["status"]) == {"running"}
    folder = store.SweepPaths(trainer.results, "trainer", sweep_of(trainer.results)).folder
    assert len(pd.read_parquet(folder)) == 10
    assert ds.dataset(folder, format="parquet").count_rows() == 10
    query = f"select count(distinct step) from read_parquet('{folder}/*.parquet')"
    assert duckdb.connect().execute(query).fetchone() == (10,)
    (trainer.gate / "release").touch()
    output, _ = running.communicate(timeout=120)
    assert running.returncode == 0, output
    assert "job 0: step=10 value=100" in output, "the progress line shows the latest step"
    rows = landed(trainer.results)
    assert rows["step"].tolist() == [*range(1, STEPS + 1), 0]
    assert set(rows["status"]) == {"ok"}


@pytest.mark.process
def test_rows_land_every_stream_rows_rows(trainer):
    # No time-based landing for an hour and no checkpoint before step 10: only batches of 3.
    running = trainer.start(
        f"steps={STEPS}", "hold_at=10", "stream_rows=3", "stream_s=3600", "checkpoint_every=100"
    )
    wait_for(lambda: held(trainer.gate), 60, "the run to hold at step 10")
    assert len(landed(trainer.results)) == 9
    (trainer.gate / "release").touch()
    running.communicate(timeout=120)
    assert len(landed(trainer.results)) == STEPS + 1


def killed_at_step_10(trainer) -> str:
    """Run the trainer (checkpoints every 4 steps) until its 10 rows landed, SIGKILL it and its
    process group; the sweep's id."""
    running = trainer.start(f"steps={STEPS}", "hold_at=10", "checkpoint_every=4", "stream_s=0.2")
    wait_for(lambda: held(trainer.gate), 60, "the run to hold at step 10")
    wait_for(lambda: len(landed(trainer.results)) == 10, 60, "its 10 rows to land")
    os.killpg(running.pid, signal.SIGKILL)
    running.wait(timeout=60)
    return sweep_of(trainer.results)


@pytest.mark.process
def test_a_sigkilled_run_keeps_its_rows_and_resume_continues_from_its_checkpoint(trainer):
    sweep = killed_at_step_10(trainer)
    rows = landed(trainer.results)
    assert rows["step"].tolist() == list(range(1, 11)), "every row landed before the kill"
    first_pid = rows["pid"].iloc[0]
    shown = trainer.harness("status", sweep).stdout
    assert "| killed" in shown and "its process is gone" in shown and "step=10" in shown
    assert f"resume={sweep}" in shown, "status says how to finish it"
    folder = store.SweepPaths(trainer.results, "trainer", sweep).folder
    assert not list(folder.glob("compacted-*")), "a sweep with a point still running stays"
    checkpoints = store.SweepPaths(trainer.results, "trainer", sweep).job(0).checkpoints
    left = checkpoints / ".checkpoint.pt.999.abcd1234.tmp"  # what a kill mid-save leaves
    left.write_bytes(b"half a checkpoint")

    resumed = trainer.resume(sweep)
    assert not left.exists(), "the rerun's tracker removes its killed run's temporaries"
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from the checkpoint at step 8" in resumed.stdout
    rows = landed(trainer.results)
    train = rows[rows["step"] > 0]
    assert train["step"].tolist() == list(range(1, STEPS + 1)), "each step once"
    assert set(rows["status"]) == {"ok"}
    # Steps 9 and 10 of the killed run, past its last checkpoint, gave way to the rerun's.
    assert (train.loc[train["step"] <= 8, "pid"] == first_pid).all()
    assert (train.loc[train["step"] > 8, "pid"] != first_pid).all()
    assert train["value"].tolist() == [step * 10 for step in range(1, STEPS + 1)]


class Planted:
    """What a tampered checkpoint holds: unpickling it would run `touch PATH`."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return os.system, (f"touch {self.path}",)


@pytest.mark.process
def test_a_tampered_checkpoint_runs_nothing_and_its_point_starts_afresh(trainer, tmp_path):
    sweep = killed_at_step_10(trainer)
    folder = store.SweepPaths(trainer.results, "trainer", sweep).job(0).checkpoints
    saved = torch.load(folder / tracking.CHECKPOINT, weights_only=True)
    planted = tmp_path / "planted"
    torch.save({**saved, "state": Planted(planted)}, folder / tracking.CHECKPOINT)
    (trainer.gate / "release").touch()  # started afresh, the run holds at step 10 again

    resumed = trainer.resume(sweep)
    assert resumed.returncode == 0, resumed.stderr
    assert not planted.exists(), "loading the checkpoint ran its code"
    assert f"refused the checkpoint {folder / tracking.CHECKPOINT}" in resumed.stdout
    rows = landed(trainer.results)
    train = rows[rows["step"] > 0]
    assert train["step"].tolist() == list(range(1, STEPS + 1)), "each step once, from step 1"
    assert train["pid"].nunique() == 1 and set(rows["status"]) == {"ok"}


@pytest.mark.process
def test_a_full_disk_while_a_point_trains_stops_the_sweep_with_one_line(trainer, small_disk):
    """Its checkpoint (1 MiB of weights) is what the disk cannot take."""
    (small_disk / "filler").write_bytes(os.urandom(3 * 1024 * 1024 - 512 * 1024))
    out = small_disk / "out"
    result = trainer(f"steps={STEPS}", "state_kib=1024", f"out={out}")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "Logging error" not in result.stderr
    (said,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert "No space left on device" in said and "the sweep stopped" in said
    assert "resume=" in said


def test_a_point_that_fails_mid_run_keeps_its_rows_and_says_why(trainer):
    # steps=20 hold_at=10 with timeout_s=0: the probe gives up at step 10 (a TimeoutError).
    result = trainer(f"steps={STEPS}", "hold_at=10", "timeout_s=0")
    assert result.returncode == 1, result.stderr
    rows = landed(trainer.results)
    assert rows["step"].dropna().tolist()[:10] == list(range(1, 11))
    assert rows["status"].tolist() == ["ok"] * 10 + ["failed"]
    assert "TimeoutError" in rows["error"].iloc[-1]


def tracker_for(tmp_path, config_hash="a", **kwargs) -> tracking.Tracker:
    def prepare(row):
        return {"job": 0, "status": "ok", **row}

    return tracking.Tracker(tmp_path / "job-000000.parquet", tmp_path / "checkpoint",
                            prepare, config_hash=config_hash, **kwargs)  # fmt: skip


def full_disk(*args, **kwargs):
    raise OSError(28, "No space left on device")


@pytest.mark.parametrize("fails", ["landing", "checkpoint", "end"])
def test_a_write_the_store_cannot_take_is_the_named_error_and_the_tracker_keeps_it(
    tmp_path, monkeypatch, fails
):
    tracker = tracker_for(tmp_path, every_rows=2, every_s=3600)
    tracker.log({"step": 1})
    tracker.land()  # what follows writes only what fails
    target = {"landing": (store, "write_file"), "checkpoint": (files, "replace_atomically"),
              "end": (store, "end_segments")}[fails]  # fmt: skip
    monkeypatch.setattr(*target, full_disk)
    with pytest.raises(StoreUnwritable) as caught:
        if fails == "landing":
            tracker.log({"step": 2})
            tracker.log({"step": 3})
        elif fails == "checkpoint":
            tracker.save({"step": 1})
        else:
            tracker.end([])
    assert caught.value is tracker.unwritable and caught.value.__cause__.errno == 28
    assert str(caught.value) == "[Errno 28] No space left on device"
    assert caught.value.kind == "OSError"
    tracker.close()
    if fails == "landing":  # they land with the next rows, if the store takes them then
        assert len(tracker.landing.waiting) == 2


@pytest.mark.parametrize("full", [False, True], ids=["store-writable", "store-full"])
def test_a_store_failure_the_experiment_swallowed_still_stops_the_sweep(
    tmp_path, monkeypatch, full
):
    """harness.running.calling.measure raises the tracker's StoreUnwritable whatever the experiment
    raised after it (here its own ValueError): no failed row for a store that could not take it."""

    def run(tracker):
        with contextlib.suppress(OSError):
            tracker.log({"step": 1})
        raise ValueError("the experiment's own")

    experiment = types.SimpleNamespace(name="swallows", run=run)
    if full:
        monkeypatch.setattr(store, "write_file", full_disk)
    tracker = tracker_for(tmp_path, every_rows=1, every_s=3600)
    try:
        if full:
            with pytest.raises(StoreUnwritable) as caught:
                calling.measure(experiment, {}, 0, tracker)
            assert caught.value is tracker.unwritable
        else:
            [row] = calling.measure(experiment, {}, 0, tracker)
            assert row["status"] == "failed" and "the experiment's own" in row["error"]
    finally:
        tracker.close()


def five_steps_saved_at_three(tmp_path) -> None:
    """A run that logs steps 1 to 5, checkpoints at step 3, and ends: all 5 rows landed."""
    first = tracker_for(tmp_path)
    for step in range(1, 6):
        first.log({"step": step})
        if step == 3:
            first.save({"step": step})
    first.land()
    first.close()


def test_a_checkpoint_cuts_the_rows_back_to_its_own(tmp_path):
    five_steps_saved_at_three(tmp_path)
    assert len(store.job_rows(tmp_path / "job-000000.parquet")) == 5
    again = tracker_for(tmp_path)
    assert again.restore() == {"step": 3}
    assert [row["step"] for row in store.job_rows(tmp_path / "job-000000.parquet")] == [1, 2, 3]
    again.close()


def test_a_checkpoint_of_another_point_or_of_lost_rows_is_not_restored(tmp_path):
    first = tracker_for(tmp_path)
    first.log({"step": 1})
    first.save({"step": 1})
    first.close()
    other = tracker_for(tmp_path, config_hash="b")
    assert other.restore() is None, "another config's checkpoint"
    other.close()
    for segment in store.segments(tmp_path / "job-000000.parquet"):
        segment.unlink()
    lost = tracker_for(tmp_path)
    assert lost.restore() is None, "the rows it counts are gone: start over"
    lost.close()


def test_the_streaming_settings_are_checked_before_anything_runs(trainer):
    for setting, said in (("stream_rows=0", "stream_rows must be"), ("stream_s=-1", "stream_s")):
        result = trainer(setting)
        assert result.returncode == 2 and said in result.stderr
        assert not trainer.results.exists()


@pytest.mark.process
def test_a_point_killed_under_the_local_launcher_ends_with_its_rows_and_why(trainer):
    """The point's own process dies (SIGKILL) mid-run under hydra/launcher=local: its landed rows
    stay, as measurements (ok), and a row of its own says it did not end (not "running")."""
    running = trainer.start(f"steps={STEPS}", "hold_at=10", "stream_s=0.2",
                            "hydra/launcher=local")  # fmt: skip
    (marker,) = wait_for(lambda: held(trainer.gate), 60, "the run to hold at step 10")
    wait_for(lambda: len(landed(trainer.results)) == 10, 60, "its 10 rows to land")
    os.kill(int(marker.name.removeprefix("held-")), signal.SIGKILL)
    output, _ = running.communicate(timeout=120)
    assert running.returncode == 1, output
    rows = landed(trainer.results)
    assert rows["step"].tolist()[:10] == list(range(1, 11))
    assert rows["status"].tolist()[:10] == ["ok"] * 10
    assert rows["status"].iloc[-1] in ("killed", "failed") and len(rows) == 11
    assert "1 of 1 points have no answer" in output


def test_a_row_parquet_cannot_hold_is_refused_where_it_is_logged(tmp_path):
    tracker = tracker_for(tmp_path)
    tracker.log({"step": 1})
    with pytest.raises(Exception, match="object"):
        tracker.log({"step": 2, "loss": object()})
    tracker.end([])
    assert [row["step"] for row in store.job_rows(tmp_path / "job-000000.parquet")] == [1]


def segment_sizes(path) -> list[int]:
    return [len(store.job_rows(segment)) for segment in store.segments(path)]


def test_a_landing_writes_only_the_rows_logged_since_the_last_one(tmp_path, monkeypatch):
    written = []
    write = files.write_table
    monkeypatch.setattr(files, "write_table", lambda path, table, sync=True: (
        written.append(table.num_rows), write(path, table, sync)))  # fmt: skip
    tracker = tracker_for(tmp_path, every_rows=10, every_s=3600)
    for step in range(1, 401):
        tracker.log({"step": step, "loss": 1 / step})
        assert len(tracker.landing.waiting) == step % 10, "it holds only the rows not landed yet"
    tracker.close()
    path = tmp_path / "job-000000.parquet"
    assert written == [10] * 40 and segment_sizes(path) == [10] * 40
    assert not path.exists(), "no job file until the point ends"
    sizes = [segment.stat().st_size for segment in store.segments(path)]
    assert max(sizes) <= 1.1 * min(sizes), "the 40th landing writes what the 1st did"


def sweep_tracker(root, **kwargs) -> tracking.Tracker:
    """A tracker of job 0 of sweep s of experiment exp under root, as the harness makes one."""
    path = store.SweepPaths(root, "exp", "s").job(0).file
    path.parent.mkdir(parents=True, exist_ok=True)

    def prepare(row):
        return {"job": 0, "status": "ok", "lr": 0.1, **row, "error": None, "duration_s": 0.0}

    return tracking.Tracker(path, root.parent / "checkpoint", prepare, config_hash="a",
                            clock=0.0, **kwargs)  # fmt: skip


def seen_once(root, steps: list[int]) -> None:
    """Every reader sees each of `steps` once in sweep s (of experiment exp) under root."""
    folder = store.SweepPaths(root, "exp", "s").folder
    assert sorted(store.read(root)["step"]) == sorted(steps)
    assert sorted(pq.read_table(folder)["step"].to_pylist()) == sorted(steps)
    assert ds.dataset(folder, format="parquet").count_rows() == len(steps)
    assert sorted(pd.read_parquet(folder)["step"]) == sorted(steps)
    query = f"select count(*), count(distinct step) from read_parquet('{folder}/*.parquet')"
    assert duckdb.connect().execute(query).fetchone() == (len(steps), len(steps))


def test_every_reader_sees_each_landed_row_once_while_the_point_runs_and_after(tmp_path):
    root = tmp_path / "results"
    tracker = sweep_tracker(root, every_rows=10, every_s=3600)
    for step in range(1, 26):
        tracker.log({"step": step})
    seen_once(root, list(range(1, 21)))  # two landings; 5 rows wait
    rows = store.read(root)
    assert set(rows["status"]) == {"running"} and set(rows["lr"]) == {0.1}
    assert rows["duration_s"].is_monotonic_increasing, "each row's own time"
    told = tracker.end([{"job": 0, "status": "ok", "lr": 0.1, "step": 0, "duration_s": 9.0}])
    assert [row["step"] for row in told] == [0], "the summary's rows: the last"
    path = store.SweepPaths(root, "exp", "s").job(0).file
    assert [row["step"] for row in store.job_rows(path)] == [*range(1, 26), 0]
    seen_once(root, [*range(1, 26), 0])
    assert store.segments(path) == [] and set(store.read(root)["status"]) == {"ok"}


def test_a_job_file_beside_the_segments_it_replaced_is_read_alone_and_compaction_ends_it(tmp_path):
    """What a SIGKILL between the job file's rename and the removal of its segments leaves."""
    root = tmp_path / "results"
    tracker = sweep_tracker(root, every_rows=5, every_s=3600)
    for step in range(1, 11):
        tracker.log({"step": step})
    tracker.close()
    path = store.SweepPaths(root, "exp", "s").job(0).file
    store.write_rows(path, store.settled(store.job_rows(path)))  # the segments stay
    assert len(store.segments(path)) == 2
    assert sorted(store.read(root)["step"]) == list(range(1, 11))
    compacted, _ = store.compact(store.SweepPaths(root, "exp", "s"))
    assert [p.name for p in store.result_files(root)] == [compacted.name]
    seen_once(root, list(range(1, 11)))


def test_compact_by_hand_leaves_a_sweep_alone_while_a_point_restores_and_ends_it_after(tmp_path):
    """A group's restore writes each rank's checkpointed rows back as segments beside the job
    file, which rank 0 removes once every rank has: a compaction then would take the fresh
    segments for replaced ones. While the point's process holds its running mark, it waits."""
    root = tmp_path / "results"
    first = sweep_tracker(root, every_rows=100, every_s=3600)
    for step in range(1, 6):
        first.log({"step": step})
        if step == 3:
            first.save({"step": step})
    first.end([])
    path = store.SweepPaths(root, "exp", "s").job(0).file
    again = sweep_tracker(root, every_rows=100, every_s=3600)  # holds the running mark
    kept = store.job_table(path).slice(0, 3)
    store.write_file(store.segment_file(path, 1), store.as_running(kept))  # as a rank's cut
    assert store.compact(store.SweepPaths(root, "exp", "s")) == (None, [])
    assert path.exists() and len(store.segments(path)) == 1
    assert sorted(store.read(root)["step"]) == [1, 2, 3, 4, 5], "the job file's rows, once"
    assert again.restore() == {"step": 3} and not path.exists()
    again.log({"step": 4})
    again.end([])
    assert [row["step"] for row in store.job_rows(path)] == [1, 2, 3, 4]
    compacted, absorbed = store.compact(store.SweepPaths(root, "exp", "s"))
    assert compacted is not None and absorbed == [path.name]
    seen_once(root, [1, 2, 3, 4])


def test_a_running_mark_that_is_a_symlink_is_refused_and_its_target_left_as_it_was(tmp_path):
    root = tmp_path / "results"
    path = store.SweepPaths(root, "exp", "s").job(0).file
    path.parent.mkdir(parents=True)
    victim = tmp_path / "precious.txt"
    victim.write_text("a user's own words\n")
    marker = path.with_name(f"_{path.stem}{store.RUNNING_MARK}")
    marker.symlink_to(victim)
    with pytest.raises(files.Linked, match="is a symlink"):
        sweep_tracker(root)
    assert victim.read_text() == "a user's own words\n" and store.still_running(path) is None


def test_a_restore_removes_the_segments_past_its_checkpoint(tmp_path):
    path = tmp_path / "job-000000.parquet"
    first = tracker_for(tmp_path, every_s=3600)
    for step in range(1, 8):
        first.log({"step": step})
        if step in (2, 5):
            first.save({"step": step})
    first.land()
    first.close()
    assert segment_sizes(path) == [2, 3, 2]
    again = tracker_for(tmp_path, every_s=3600)
    assert again.restore() == {"step": 5}
    assert segment_sizes(path) == [2, 3], "the first two segments stay as they were"
    again.log({"step": 6})
    again.end([])
    assert [row["step"] for row in store.job_rows(path)] == [1, 2, 3, 4, 5, 6]
    assert store.segments(path) == [] and len(store.job_rows(path)) == 6


def test_a_point_that_ended_restores_its_checkpoints_rows_from_its_job_file(tmp_path):
    path = tmp_path / "job-000000.parquet"
    first = tracker_for(tmp_path, every_s=3600)
    for step in range(1, 6):
        first.log({"step": step})
        if step == 3:
            first.save({"step": step})
    first.end([{"job": 0, "status": "failed", "error": "RuntimeError: boom"}])
    assert [row["status"] for row in store.job_rows(path)] == ["ok"] * 5 + ["failed"]
    again = tracker_for(tmp_path, every_s=3600)
    assert again.restore() == {"step": 3}
    assert not path.exists() and segment_sizes(path) == [3]
    assert [row["status"] for row in store.job_rows(path)] == ["running"] * 3
    again.close()


def test_a_point_without_a_checkpoint_starts_afresh(tmp_path):
    path = tmp_path / "job-000000.parquet"
    first = tracker_for(tmp_path, every_rows=2, every_s=3600)
    for step in range(1, 6):
        first.log({"step": step, "run": 1})
    first.close()
    assert segment_sizes(path) == [2, 2]
    again = tracker_for(tmp_path, every_rows=2, every_s=3600)
    again.log({"step": 1, "run": 2})
    assert len(store.segments(path)) == 2, "the old rows stay until the first landing"
    again.log({"step": 2, "run": 2})
    assert [(r["step"], r["run"]) for r in store.job_rows(path)] == [(1, 2), (2, 2)]
    again.close()


@pytest.mark.process
def test_a_sigkill_with_the_default_settings_keeps_what_landed_and_resume_goes_on(trainer):
    """Rows land every second (and at each checkpoint): the run holding at step 10 has all 10
    landed within about a second, as segments, without waiting for 1,000 rows."""
    running = trainer.start(f"steps={STEPS}", "hold_at=10", "checkpoint_every=4")
    wait_for(lambda: held(trainer.gate), 60, "the run to hold at step 10")
    wait_for(lambda: len(landed(trainer.results)) == 10, 60, "its 10 rows to land")
    sweep = sweep_of(trainer.results)
    path = store.SweepPaths(trainer.results, "trainer", sweep).job(0).file
    sizes = segment_sizes(path)
    assert not path.exists() and sum(sizes) == 10
    assert {4, 8} <= set(itertools.accumulate(sizes)), "each checkpoint ends a segment"
    os.killpg(running.pid, signal.SIGKILL)
    running.wait(timeout=60)
    assert landed(trainer.results)["step"].tolist() == list(range(1, 11))

    resumed = trainer.resume(sweep)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from the checkpoint at step 8" in resumed.stdout
    rows = landed(trainer.results)
    assert rows["step"].tolist() == [*range(1, STEPS + 1), 0], "each step once"
    assert store.segments(path) == [] and set(rows["status"]) == {"ok"}


@pytest.mark.process
def test_a_damaged_segment_is_skipped_and_its_point_reruns_on_resume(trainer):
    sweep = killed_at_step_10(trainer)
    path = store.SweepPaths(trainer.results, "trainer", sweep).job(0).file
    first, *rest = store.segments(path)
    kept = sum(len(store.job_rows(segment)) for segment in rest)
    first.write_bytes(first.read_bytes()[:-20])  # a torn write that no checksum accepts
    shown = trainer.harness("status", sweep)
    assert f"skipping {first}" in shown.stderr
    assert len(landed(trainer.results)) == kept, "the other segments' rows are still read"
    (trainer.gate / "release").touch()  # started afresh, the run holds at step 10 again

    resumed = trainer.resume(sweep)
    assert resumed.returncode == 0, resumed.stderr
    assert "moved a damaged file aside" in resumed.stdout
    assert "not all of them landed: starting over" in resumed.stdout
    rows = landed(trainer.results)
    train = rows[rows["step"] > 0]
    assert train["step"].tolist() == list(range(1, STEPS + 1)), "each step once, from step 1"
    assert train["pid"].nunique() == 1 and set(rows["status"]) == {"ok"}
    assert store.segments(path) == []


def test_a_checkpoint_folder_that_is_a_symlink_is_refused_and_left_as_it_is(tmp_path):
    """Through the link the harness would write its checkpoints into any folder, and remove
    there whatever is named like its temporaries."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    theirs = elsewhere / ".notes.txt.123.abcd1234.tmp"  # named like a harness temporary
    theirs.write_text("a user's")
    (tmp_path / "checkpoint").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(files.Linked, match=r"checkpoint is a symlink: the harness writes nothing"):
        tracker_for(tmp_path)
    assert theirs.read_text() == "a user's" and not (tmp_path / "job-000000.parquet").exists()


@pytest.mark.parametrize(
    ("planted", "said"),
    [
        ({"weights": torch.zeros(2)}, "holds no state"),
        ({"state": {}, "rows": "3"}, "holds row counts that are no whole numbers ('3', None)"),
        ({"state": {}}, "holds row counts that are no whole numbers (None, None)"),
    ],
)
def test_a_checkpoint_of_this_point_that_is_no_checkpoint_is_set_aside_and_the_point_starts_over(
    tmp_path, planted, said
):
    """Weights-only, with this point's hash: loadable, but no checkpoint the tracker wrote.
    Not a KeyError on every resume: set aside, and the run starts from its first step."""
    five_steps_saved_at_three(tmp_path)
    path = tmp_path / "checkpoint" / tracking.CHECKPOINT
    saved = torch.load(path, weights_only=True)
    torch.save({"config_hash": saved["config_hash"], **planted}, path)
    heard = []
    again = tracker_for(tmp_path, say=heard.append)
    assert again.restore() is None
    assert any(f"the checkpoint {path} {said}: set aside as checkpoint.pt.set-aside-" in line
               for line in heard), heard  # fmt: skip
    assert not path.exists() and len(list(path.parent.glob("checkpoint.pt.set-aside-*"))) == 1
    again.log({"step": 1})
    again.land()
    again.close()
    assert [row["step"] for row in store.job_rows(tmp_path / "job-000000.parquet")] == [1]
