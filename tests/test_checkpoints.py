"""What a training point keeps of its checkpoints (the config's `checkpoint`: keep, best, mode;
harness.tracking.checkpoints), a checkpoint folder that cannot be written found at the point's
start, a link above the job's folder followed, and every resume saying where it continued."""

import json
import os
import signal

import numpy as np
import pytest
import torch
from probes import held, wait_for

from harness import store, tracking
from harness.errors import BadInput, StoreUnwritable
from harness.names import Keeping, keeping
from harness.running import job


def tracker_for(tmp_path, heard=None, **keeping) -> tracking.Tracker:
    def prepare(row):
        return {"job": 0, "status": "ok", **row}

    return tracking.Tracker(
        tmp_path / "job-000000.parquet", tmp_path / "checkpoint", prepare, config_hash="a",
        say=heard.append if heard is not None else None, keeping=Keeping(**keeping),
    )  # fmt: skip


LOSSES = [0.9, 0.5, 0.2, 0.4, 0.3, 0.6]  # at steps 1..6, a save at each


def trained(tmp_path, heard=None, metric="loss", **keeping) -> tracking.Tracker:
    """A run that logs LOSSES (as `metric`) and saves {"step": step} at each step."""
    tracker = tracker_for(tmp_path, heard, **keeping)
    for step, loss in enumerate(LOSSES, 1):
        tracker.log({"step": step, metric: loss})
        tracker.save({"step": step})
    return tracker


def saved_step(path) -> int:
    return torch.load(path, weights_only=True)["state"]["step"]


def numbered(folder) -> list[str]:
    names = (path.name for path in folder.iterdir())
    return sorted(name for name in names if tracking.checkpoints.NUMBERED.fullmatch(name))


@pytest.mark.parametrize("keep", [1, 3])
def test_keep_keeps_the_latest_checkpoints_by_step_and_restore_takes_the_latest(tmp_path, keep):
    trained(tmp_path, keep=keep).close()
    folder = tmp_path / "checkpoint"
    assert numbered(folder) == [f"step-{step}.pt" for step in range(7 - keep, 7)]
    assert [saved_step(folder / name) for name in numbered(folder)] == list(range(7 - keep, 7))
    latest = folder / tracking.CHECKPOINT
    assert os.path.samefile(latest, folder / "step-6.pt"), "checkpoint.pt is the latest, linked"
    assert not (folder / tracking.BEST).exists()
    again = tracker_for(tmp_path, keep=keep)
    assert again.restore() == {"step": 6}
    assert again.resumed == "resumed from the checkpoint at step 6"
    again.log({"step": 7})
    again.save({"step": 7})  # continues the run's list: the oldest of it goes
    assert numbered(folder) == [f"step-{step}.pt" for step in range(8 - keep, 8)]
    again.close()


@pytest.mark.parametrize(("mode", "best_step"), [("min", 3), ("max", 1)])
def test_best_keeps_the_checkpoint_where_the_metric_was_best_as_best_pt(tmp_path, mode, best_step):
    trained(tmp_path, keep=2, best="loss", mode=mode).close()
    folder = tmp_path / "checkpoint"
    assert numbered(folder) == ["step-5.pt", "step-6.pt"], "the best's numbered file is not kept"
    assert saved_step(folder / tracking.BEST) == best_step
    index = json.loads((folder / tracking.INDEX).read_text())
    assert index["best"] == {"file": "best.pt", "step": best_step, "rows": best_step,
                             "metric": "loss", "mode": mode,
                             "value": LOSSES[best_step - 1]}  # fmt: skip
    assert index["latest"] == "step-6.pt" and index["kept"] == ["step-5.pt", "step-6.pt"]


def test_the_best_survives_a_resume_and_a_better_one_after_it_replaces_it(tmp_path):
    trained(tmp_path, best="loss").close()
    folder = tmp_path / "checkpoint"
    again = tracker_for(tmp_path, best="loss")
    assert again.restore() == {"step": 6}
    again.log({"step": 7, "eval": 1.0})  # no loss: the latest row holding it is step 6's (0.6)
    again.save({"step": 7})
    assert saved_step(folder / tracking.BEST) == 3, "0.6 is no better than 0.2"
    again.log({"step": 8, "loss": 0.1})
    again.save({"step": 8})
    assert saved_step(folder / tracking.BEST) == 8
    assert json.loads((folder / tracking.INDEX).read_text())["best"]["value"] == 0.1
    again.close()


def test_a_best_metric_no_row_holds_is_said_once_at_the_end(tmp_path):
    heard = []
    tracker = trained(tmp_path, heard, metric="loss", best="los")
    tracker.end([])
    said = [line for line in heard if "checkpoint.best" in line]
    assert said == ["checkpoint.best names los, which no row logged holds: no best checkpoint "
                    "kept; did you mean loss?"]  # fmt: skip
    assert not (tmp_path / "checkpoint" / tracking.BEST).exists()


def test_a_run_that_starts_over_removes_the_earlier_runs_checkpoints(tmp_path):
    trained(tmp_path, keep=3, best="loss").close()
    for segment in store.segments(tmp_path / "job-000000.parquet"):
        segment.unlink()  # the rows it counts are gone: the point starts over
    again = tracker_for(tmp_path, keep=3, best="loss")
    assert again.restore() is None
    again.log({"step": 1, "loss": 5.0})
    again.save({"step": 1})
    folder = tmp_path / "checkpoint"
    assert numbered(folder) == ["step-1.pt"]
    assert saved_step(folder / tracking.BEST) == 1
    again.close()


def test_a_checkpoint_of_the_single_file_layout_is_restored(tmp_path):
    """A folder holding only checkpoint.pt, of no step (as the tracker wrote them before)."""
    tracker = tracker_for(tmp_path)
    for step in (1, 2, 3):
        tracker.log({"step": step})
    tracker.save({"step": 3})
    tracker.close()
    folder = tmp_path / "checkpoint"
    saved = torch.load(folder / tracking.CHECKPOINT, weights_only=True)
    for name in [*numbered(folder), tracking.INDEX, tracking.CHECKPOINT]:
        (folder / name).unlink()
    old = {k: v for k, v in saved.items() if k not in ("step", "value")}
    torch.save(old, folder / tracking.CHECKPOINT)
    again = tracker_for(tmp_path)
    assert again.restore() == {"step": 3}
    assert again.resumed == "resumed from the checkpoint at 3 rows"
    again.log({"step": 4})
    again.save({"step": 4})
    assert numbered(folder) == ["step-4.pt"] and saved_step(folder / tracking.CHECKPOINT) == 4
    again.close()


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ({"keep": 0}, "checkpoint.keep must be a whole number of checkpoints, 1 or more, got 0"),
        ({"keep": True}, "checkpoint.keep must be"),
        ({"mode": "lowest"}, "checkpoint.mode must be min or max, got 'lowest'"),
        ({"best": 3}, "checkpoint.best must be a metric's name"),
        (
            {"kep": 2},
            "checkpoint.kep is no setting of checkpoint: it takes keep, best and mode; "
            "did you mean keep?",
        ),  # fmt: skip
    ],
)
def test_a_bad_checkpoint_setting_is_refused_naming_its_key(setting, said):
    with pytest.raises(BadInput) as refused:
        keeping(setting)
    assert said in str(refused.value) and "\n" not in str(refused.value)


def test_a_bad_checkpoint_setting_is_refused_before_the_sweep_is_planned(trainer):
    result = trainer("steps=6", "checkpoint.mode=lowest")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "checkpoint.mode must be min or max, got 'lowest'" in result.stderr
    assert not (trainer.out / "checkpoints").exists() and not trainer.results.exists()


def test_a_checkpoint_folder_that_cannot_be_written_is_found_before_the_first_step(trainer):
    trainer.out.mkdir()
    (trainer.out / "checkpoints").write_text("a file where the folder goes")
    result = trainer("steps=6")
    assert result.returncode == 1, result.stdout + result.stderr
    (said,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert "the checkpoint folder cannot be written (Not a directory)" in said
    assert f"{trainer.out / 'checkpoints'}/experiment=trainer/sweep=" in said
    assert "Traceback" not in result.stderr
    rows = store.read(trainer.results, "trainer")
    assert "step" not in rows or rows["step"].isna().all(), "found before the first step"


def test_a_tracker_whose_checkpoint_folder_cannot_be_made_names_it(tmp_path):
    (tmp_path / "blocked").write_text("a file")

    def prepare(row):
        return row

    with pytest.raises(StoreUnwritable) as caught:
        tracking.Tracker(tmp_path / "job-000000.parquet", tmp_path / "blocked" / "job-000000",
                         prepare, config_hash="a")  # fmt: skip
    assert caught.value.filename == str(tmp_path / "blocked" / "job-000000")
    assert "the checkpoint folder cannot be written" in caught.value.strerror


def test_a_checkpoints_folder_linked_to_another_disk_is_written_through(trainer, tmp_path):
    """A link the user made to keep checkpoints elsewhere (outputs/checkpoints) is followed."""
    elsewhere = tmp_path / "other-disk"
    elsewhere.mkdir()
    trainer.out.mkdir()
    (trainer.out / "checkpoints").symlink_to(elsewhere, target_is_directory=True)
    result = trainer("steps=8", "checkpoint_every=4", "checkpoint.keep=2")
    assert result.returncode == 0, result.stdout + result.stderr
    (folder,) = elsewhere.glob("experiment=trainer/sweep=*/job-000000")
    assert numbered(folder) == ["step-4.pt", "step-8.pt"]
    assert saved_step(folder / tracking.CHECKPOINT) == 8


def test_a_job_checkpoint_folder_that_is_a_link_is_refused(tmp_path):
    """The job's own folder, where the tracker removes files of its names: never a link."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "step-1.pt").write_text("a user's file of that name")
    (tmp_path / "checkpoint").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(OSError, match="checkpoint is a symlink"):
        tracker_for(tmp_path)
    assert (elsewhere / "step-1.pt").read_text() == "a user's file of that name"


def killed_at_step_10(trainer, *args: str) -> str:
    running = trainer.start("steps=20", "hold_at=10", "checkpoint_every=4", "stream_s=0.2", *args)
    wait_for(lambda: held(trainer.gate), 60, "the run to hold at step 10")
    wait_for(lambda: len(store.read(trainer.results, "trainer")) == 10, 60, "its 10 rows")
    os.killpg(running.pid, signal.SIGKILL)
    running.wait(timeout=60)
    (sweep,) = store.sweeps(trainer.results, "trainer")
    return sweep


@pytest.mark.process
def test_a_resume_in_this_process_says_where_the_point_continued(trainer):
    sweep = killed_at_step_10(trainer)
    resumed = trainer.resume(sweep)
    assert resumed.returncode == 0, resumed.stderr
    assert "job 0: resumed from the checkpoint at step 8" in resumed.stdout


@pytest.mark.process
def test_a_resume_under_the_local_launcher_says_where_the_point_continued(trainer):
    sweep = killed_at_step_10(trainer, "hydra/launcher=local")
    resumed = trainer.resume(sweep, "hydra/launcher=local")
    assert resumed.returncode == 0, resumed.stderr
    (line,) = [line for line in resumed.stdout.splitlines() if line.startswith("[1/1] job 0")]
    assert line.split("  (")[0].endswith("(resumed from the checkpoint at step 8)"), line


def test_the_resumed_note_is_what_a_progress_line_adds():
    assert job.resumed_note({"status": "ok"}) == ""
    said = {"resumed": "resumed from the checkpoint at step 8"}
    assert job.resumed_note(said) == " (resumed from the checkpoint at step 8)"


def test_a_step_logged_as_a_numpy_integer_names_its_checkpoint(tmp_path):
    tracker = tracker_for(tmp_path, best="loss")
    tracker.log({"step": np.int64(5), "loss": np.float32(0.5)})
    tracker.save({"step": 5})
    tracker.close()
    folder = tmp_path / "checkpoint"
    assert numbered(folder) == ["step-5.pt"]
    assert json.loads((folder / tracking.INDEX).read_text())["best"]["step"] == 5
    assert tracker_for(tmp_path).restore() == {"step": 5}


def test_a_checkpoint_setting_that_is_no_mapping_is_one_line(trainer):
    result = trainer("steps=6", "checkpoint=5")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "checkpoint must be a mapping of keep, best and mode" in result.stderr
