"""A search within each cell of the grid (harness.searching.search), run for real: Optuna's journal
in the sweep's folder, trials as points on the local launcher's two workers, pruning on the rows
they stream, a kill mid-search and a resume that continues the study."""

import os
import signal

import optuna
import pandas as pd
import pytest
from commands import ROOT, SUPPORT, call_command
from probes import held, wait_for

from harness import files, store
from harness.names import setting
from harness.searching import search
from harness.searching.journal import JOURNAL, _JournalLock, storage
from octlm_analysis import point_lines

SEARCH = [
    "search.params.lr=tag(log, interval(1e-4, 1))",
    "+search.pruner_options.n_startup_trials=2",
]
LOCAL = ["hydra/launcher=local", "hydra.launcher.max_parallel=2"]


@pytest.fixture
def tuned(harness):
    """`python -m harness --config-dir tests/support/conf +experiment=tuned ARGS`."""
    given = ["--config-dir", str(SUPPORT / "conf"), "+experiment=tuned"]
    path = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(SUPPORT)])}

    def run(*args, **kwargs):
        return harness(*given, *args, env=path, **kwargs)

    run.start = lambda *args: harness.start(*given, *args, env=path)
    run.results, run.cwd, run.harness = harness.results, harness.cwd, harness
    return run


def _sweep(results) -> tuple[str, dict, pd.DataFrame, dict]:
    (sweep,) = store.sweeps(results, "tuned")
    manifest = store.read_manifest(store.SweepPaths(results, "tuned", sweep))
    studies = search.studies(store.SweepPaths(results, "tuned", sweep).folder)
    return sweep, manifest, store.read(results, "tuned", sweep), studies


def _trials_by_job(studies: dict) -> dict[int, optuna.trial.FrozenTrial]:
    return {t.user_attrs["job"]: t for s in studies.values() for t in s.get_trials()}


@pytest.mark.slow
def test_a_search_runs_each_cells_trials_on_two_workers_and_prunes_on_streamed_rows(tuned):
    done = tuned(*SEARCH, "search.trials=6", *LOCAL)
    assert done.returncode == 0, done.stderr
    sweep, manifest, rows, studies = _sweep(tuned.results)
    assert [(p["job"], p["cell"], p["slot"]) for p in manifest["points"]] == [
        (cell * 6 + slot, cell, slot) for cell in range(2) for slot in range(6)
    ]
    statuses = store.job_statuses(rows)
    assert sorted(statuses.index) == list(range(12))
    assert set(statuses) <= {"ok", "pruned"} and "pruned" in set(statuses), statuses.to_dict()
    assert sorted(studies) == [0, 1]
    trials = _trials_by_job(studies)
    assert sorted(trials) == list(range(12))  # each job one trial: none twice, none lost
    for study in studies.values():
        assert sorted(t.number for t in study.get_trials()) == list(range(6))
    state = {"ok": "COMPLETE", "pruned": "PRUNED"}
    for job, trial in trials.items():
        own = rows[rows["job"] == job]
        assert trial.state.name == state[statuses[job]]
        assert set(own["trial"]) == {trial.number} and set(own["cell"]) == {job // 6}
        assert set(own["lr"]) == {trial.params["lr"]}  # the trial's parameters are its columns
        assert set(own["variant"]) == {"ab"[job // 6]}
        train = own[own["phase"] == "train"]
        if statuses[job] == "pruned":
            (said,) = own.loc[own["status"] == "pruned", "error"]
            assert said.startswith("at step")
            # Pruned where it was worse than the median of the trials complete by then: at its
            # last train row (the last step too, when the median is of trials already done),
            # and before its evaluation.
            step = int(said.split()[2].rstrip(":"))
            assert train["step"].max() == step <= 20 and "eval" not in set(own["phase"])
            assert trial.intermediate_values[step] == pytest.approx(train["score"].iloc[-1])
        else:
            assert train["step"].tolist() == list(range(1, 21))
            (value,) = own.loc[own["phase"] == "eval", "score"]
            assert trial.value == pytest.approx(value)
    # The report's points (the page's table) show what each trial ran, not the config's lr.
    points = point_lines.of_rows(rows, manifest, sweep).set_index("job")
    for job, trial in trials.items():
        assert points.loc[job, "lr"] == trial.params["lr"]
        assert points.loc[job, "trial"] == trial.number
    # The best trial per cell: the claim on it, the report's table and plots.
    for cell, study in studies.items():
        best = rows[(rows["cell"] == cell) & (rows["phase"] == "eval")]["score"].max()
        assert study.best_value == pytest.approx(best)
    assert "claim PASS: each variant's best trial" in done.stdout
    shown = tuned.harness("status", sweep)
    assert "cell 0: 6 trials asked of 6" in shown.stdout and "best score=" in shown.stdout
    for job, trial in trials.items():  # each trial's line names what its study drew
        (line,) = [line for line in shown.stdout.splitlines() if line.startswith(f"| {job} ")]
        assert f"trial {trial.number} {setting('lr', trial.params['lr'])}" in line, line
    again = tuned(f"resume={sweep}")
    assert again.returncode == 0 and "0 points to run" in again.stdout  # pruned is an answer
    analysis = call_command("analysis", cwd=tuned.cwd)
    assert analysis.returncode == 0, analysis.stderr
    report = (tuned.cwd / "outputs" / "report" / "REPORT.md").read_text()
    assert "Best trial per cell (maximize score)" in report
    page = (tuned.cwd / "outputs" / "report" / "index.html").read_text()
    assert "cell 1: optimization history" in page and "cell 1: parameter importance" in page


@pytest.mark.slow
def test_a_killed_search_resumes_its_trials_from_their_checkpoints(tuned):
    """SIGKILL the sweep while two trials hold mid-run: the resume takes the same trials back
    (same numbers, same parameters), each continues from its checkpoint, and the study ends
    with one trial per point."""
    gate = tuned.cwd / "gate"
    gate.mkdir()
    args = [SEARCH[0], "search.trials=4", "search.pruner=none", "variant=a", f"folder={gate}"]
    running = tuned.start(*args, "hold_at=5", *LOCAL)
    try:
        wait_for(lambda: len(held(gate)) == 2 or running.poll() is not None, 120, "two trials")
        assert running.poll() is None, running.communicate()
    finally:
        os.killpg(running.pid, signal.SIGKILL)
        running.wait()
    sweep, _, _, studies = _sweep(tuned.results)
    before = {job: (t.number, t.params) for job, t in _trials_by_job(studies).items()}
    assert len(before) == 2 and all(t.state.name == "RUNNING" for t in studies[0].get_trials())
    (gate / "release").touch()
    resumed = tuned(f"resume={sweep}", *LOCAL)
    assert resumed.returncode == 0, resumed.stderr
    _, _, rows, studies = _sweep(tuned.results)
    after = _trials_by_job(studies)
    assert sorted(after) == [0, 1, 2, 3] and len(studies[0].get_trials()) == 4
    assert all(t.state.name == "COMPLETE" for t in after.values())
    for job, (number, params) in before.items():
        assert (after[job].number, after[job].params) == (number, params)
        train = rows[(rows["job"] == job) & (rows["phase"] == "train")]
        assert train["step"].tolist() == list(range(1, 21))  # each step once
        # Steps up to the checkpoint at 4 are the killed run's; the rest the resumed one's.
        assert train["pid"].iloc[0] != train["pid"].iloc[-1]
        assert train.loc[train["step"] <= 4, "pid"].nunique() == 1


@pytest.mark.parametrize(
    "given, said",
    [
        (["search.params.lr=3"], "search.params.lr=3: give interval(a, b)"),
        (["search.params.nope=interval(0, 1)"], "takes no parameter nope"),
        (["search.params.variant=choice(a, b)"], "both an axis of the grid and searched"),
        (["search.params.lr=interval(0, 1)"], "0.0 is out of its domain"),
        (["search.params.lr=interval(0.1, 1)", "search.trials=0"], "search.trials must be"),
        (["search.params.lr=interval(0.1, 1)", "search.pruner=best"], "search.pruner must be"),
        (["search.params.lr=interval(0.1, 1)", "+search.pruner_options.x=1"], "unexpected"),
        (["search.params.lr=interval(0.1, 1)", "search.trials=60000"], "more than max_points"),
    ],
)
def test_a_search_that_cannot_work_is_one_line_before_anything_runs(tuned, given, said):
    done = tuned(*given)
    assert done.returncode == 2, done.stderr
    assert said in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not store.sweeps(tuned.results, "tuned")


def test_a_cells_best_is_the_value_its_trials_told_and_counts_once_every_trial_ended():
    """The best row of a cell is the last `where` row of a trial that ended ok: not an earlier
    row of it, nor a row of a failed trial; and "running" while any trial has no answer."""
    spec = {"objective": "score", "direction": "maximize", "where": {"phase": "eval"}}
    rows = pd.DataFrame(
        [
            {
                "job": 0,
                "cell": 0,
                "trial": 0,
                "lr": 0.1,
                "phase": "eval",
                "score": 0.9,
                "status": "ok",
            },
            {
                "job": 0,
                "cell": 0,
                "trial": 0,
                "lr": 0.1,
                "phase": "eval",
                "score": 0.5,
                "status": "ok",
            },
            {
                "job": 1,
                "cell": 0,
                "trial": 1,
                "lr": 0.2,
                "phase": "eval",
                "score": 0.99,
                "status": "ok",
            },
            {"job": 1, "cell": 0, "trial": 1, "lr": 0.2, "phase": "eval", "status": "failed"},
            {
                "job": 2,
                "cell": 0,
                "trial": 2,
                "lr": 0.3,
                "phase": "train",
                "score": 0.7,
                "status": "ok",
            },
            {"job": 2, "cell": 0, "trial": 2, "lr": 0.3, "status": "pruned"},
        ]
    )
    (best,) = search.best_rows(rows, spec).itertuples()
    assert (best.job, best.score, best.status) == (0, 0.5, "running")  # job 1 has no answer
    ended = rows[rows["job"] != 1]
    (best,) = search.best_rows(ended, spec).itertuples()
    assert (best.job, best.score, best.status) == (0, 0.5, "ok")
    minimized = search.best_rows(ended, {**spec, "direction": "minimize"})
    assert minimized["score"].tolist() == [0.5]


def test_cfg_shows_a_searchs_space_and_runs_nothing(tuned):
    done = tuned("search.params.lr=tag(log, interval(1e-4, 1))", "--cfg", "job")
    assert done.returncode == 0, done.stderr
    assert "lr: tag(log, interval(1e-4, 1))" in done.stdout
    assert not store.sweeps(tuned.results, "tuned")


PLAIN = {"direction": "maximize", "sampler": "random", "pruner": "none"}


def test_a_journal_line_a_killed_trial_cut_short_is_cut_off_before_the_next_append(
    tmp_path, capsys
):
    """Optuna skips a last line without its end, but the next append would glue itself to it,
    and no read would parse the journal again."""
    from harness.lifetime import forget

    first = search.study(tmp_path, PLAIN, 0)
    first.tell(first.ask(), 0.5)
    journal = tmp_path / JOURNAL
    with open(journal, "ab") as f:
        f.write(b'{"op_code": 4, "worker_id": "killed-mid-wri')
    forget()  # a new process's storage
    again = search.study(tmp_path, PLAIN, 0)
    assert "cut off a partial last line (43 bytes)" in capsys.readouterr().err
    again.tell(again.ask(), 0.75)
    forget()
    (cell,) = search.studies(tmp_path).values()
    assert [t.value for t in cell.get_trials()] == [0.5, 0.75]
    assert capsys.readouterr().err == "" and journal.read_bytes().endswith(b"}\n")


@pytest.mark.parametrize("damage", ["a line that is no JSON", "an op code Optuna lacks", "a link"])
def test_a_journal_that_cannot_be_read_leaves_status_without_trials_not_a_traceback(
    tmp_path, capsys, damage
):
    from harness.lifetime import forget

    study = search.study(tmp_path, PLAIN, 0)
    study.tell(study.ask(), 0.5)
    journal = tmp_path / JOURNAL
    if damage == "a link":
        journal.rename(tmp_path / "elsewhere")
        journal.symlink_to(tmp_path / "elsewhere")
    else:
        line = b"{not json\n" if damage == "a line that is no JSON" else b'{"op_code": 99}\n'
        journal.write_bytes(line + journal.read_bytes())
    forget()
    assert search.progress(tmp_path, {"trials": 4, "objective": "accuracy"}) == []
    said = capsys.readouterr().err
    assert (
        said.startswith("warning: the sweep's trials cannot be read from ")
        and said.count("\n") == 1
    ), said
    if damage == "a link":
        assert "is a symlink" in said
        with pytest.raises(files.Linked):
            storage(tmp_path)


def test_a_trial_that_failed_before_its_study_answered_counts_in_its_cell(tmp_path):
    """The row the harness writes for a point that ended without one (its worker died, or the
    trial failed before the study gave it parameters) carries the trial's cell: the cell's
    best then waits for it, rather than passing on the trials that ended ok."""
    from types import SimpleNamespace

    from harness.launchers.dispatch import finish
    from harness.planning.plan import Point

    sweep = SimpleNamespace(paths=store.SweepPaths(tmp_path, "tuned", "s1"))
    progress = SimpleNamespace(update=lambda point, summary: None)
    for job, status in enumerate(["ok", "failed", "killed"]):
        point = Point(job, [], {"variant": "a"}, f"hash{job}", cell=0, slot=job)
        if status == "ok":
            path = store.SweepPaths(tmp_path, "tuned", "s1").job(job).file
            row = {"job": job, "cell": 0, "trial": job, "status": "ok", "phase": "eval",
                   "accuracy": 0.97, "variant": "a"}  # fmt: skip
            store.write_rows(path, [row])
        finish(sweep, point, {"status": status, "error": "the study could not be read"}, progress)
    rows = store.read(tmp_path, "tuned", "s1")
    assert rows["cell"].tolist() == [0, 0, 0]
    spec = {"objective": "accuracy", "direction": "maximize", "where": {"phase": "eval"}}
    (best,) = search.best_rows(rows, spec).itertuples()
    assert (best.job, best.status) == (0, "running"), "two trials of three have no answer"


def test_a_trial_a_kill_left_running_is_failed_at_the_next_resume(tuned):
    """Killed between study.ask and the trial's record of its job, a trial would stay running
    for ever: no point takes it back. The resume fails it; the point's own trials stand."""
    ran = tuned(SEARCH[0], "search.trials=2", "search.pruner=none", "variant=a")
    assert ran.returncode == 0, ran.stderr
    sweep, manifest, _, studies = _sweep(tuned.results)
    folder = store.SweepPaths(tuned.results, "tuned", sweep).folder
    orphan = studies[0].ask()  # as a kill before set_user_attr("job") leaves it
    resumed = tuned(f"resume={sweep}")
    assert resumed.returncode == 0, resumed.stderr
    said = f"cell 0: failed trial {orphan.number}, which a killed run left running"
    assert said in resumed.stdout, resumed.stdout
    states = {t.number: t.state.name for t in search.studies(folder)[0].get_trials()}
    assert states == {0: "COMPLETE", 1: "COMPLETE", orphan.number: "FAIL"}
    again = tuned(f"resume={sweep}")
    assert again.returncode == 0 and "failed trial" not in again.stdout


def test_fail_orphans_keeps_the_running_trials_of_the_points_still_to_run(tmp_path):
    study = search.study(tmp_path, PLAIN, 0)
    asked = [study.ask() for _ in range(3)]
    asked[1].set_user_attr("job", 1)  # rerun by the resume: it takes its trial back
    asked[2].set_user_attr("job", 2)  # answered already, yet left running
    assert search.fail_orphans(tmp_path, {1}) == [
        "cell 0: failed trials 0, 2, which a killed run left running"
    ]
    states = [t.state.name for t in search.studies(tmp_path)[0].get_trials()]
    assert states == ["FAIL", "RUNNING", "FAIL"]


@pytest.mark.process
def test_a_holder_of_the_journals_lock_killed_mid_append_holds_up_no_one(tmp_path):
    """Optuna's symlink lock outlives a kill (the next writer waits out 30 s); the journal's
    lock is the kernel's, let go when its holder dies."""
    import fcntl
    import subprocess
    import sys

    journal = tmp_path / JOURNAL
    code = (
        "import sys, time; from harness.searching.journal import _JournalLock; "
        f"_JournalLock({str(journal)!r}).acquire(); print('held', flush=True); "
        "time.sleep(600)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        assert holder.stdout.readline() == "held\n"
        lock = os.open(f"{journal}.flock", os.O_RDONLY)
        with pytest.raises(BlockingIOError):  # held while it lives
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        holder.kill()
        holder.wait()
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free as soon as it died
    os.close(lock)
    study = search.study(tmp_path, PLAIN, 0)
    study.tell(study.ask(), 0.5)
    assert [t.value for t in study.get_trials()] == [0.5]
    (tmp_path / "aside").touch()
    journal.with_name(journal.name + ".flock").unlink()
    journal.with_name(journal.name + ".flock").symlink_to(tmp_path / "aside")
    with pytest.raises(files.Linked):
        _JournalLock(str(journal)).acquire()
