"""A training run's value: a point whose rows have steps is summed up by its last row (per
phase where it has them) in the sweep's table, REPORT.md, the page's points and the progress
line; a table's where and reduce; a wide table folded; a sweep named with tag=NAME."""

import math

import pandas as pd
import pytest
from commands import SUPPORT
from sweeps import write_jobs, write_plan

from harness import store
from harness.results import runs
from harness.results.tables import WIDTH, markdown, sweep_table
from harness.running import job

STUDENT = ["--config-dir", str(SUPPORT / "conf"), "+experiment=student"]
PATH = {"PYTHONPATH": str(SUPPORT)}  # the harness is installed


def run_rows(job: int, losses: list[float], held: float) -> list[dict]:
    """A run's rows as a store holds them: a train row a step, then an eval row."""
    rows = [{"job": job, "phase": "train", "step": step, "loss": loss}
            for step, loss in enumerate(losses)]  # fmt: skip
    return [*rows, {"job": job, "phase": "eval", "step": len(losses), "loss": held}]


def test_a_runs_final_rows_are_its_last_step_of_each_phase_whatever_the_rows_order():
    rows = pd.DataFrame(run_rows(0, [0.9, 0.5, 0.2], 0.3) + run_rows(1, [0.8, 0.1, 0.05], 0.07))
    rows = rows.iloc[[2, 0, 1, 3, 7, 4, 6, 5]]  # segments read in another order
    final = runs.finals(rows)
    assert final[["job", "phase", "step", "loss"]].values.tolist() == [
        [0, "train", 2, 0.2], [0, "eval", 3, 0.3],
        [1, "train", 2, 0.05], [1, "eval", 3, 0.07]]  # fmt: skip
    assert runs.reduce(rows, "loss", "min")["loss"].tolist() == [0.2, 0.05]  # a row a point
    assert runs.reduce(rows, "loss", "mean", ["phase"])["loss"].tolist() == pytest.approx(
        [1.6 / 3, 0.3, 0.95 / 3, 0.07])  # fmt: skip
    plain = pd.DataFrame({"job": [0, 0, 1], "value": [1.0, 3.0, 2.0]})  # no steps: as they are
    assert runs.finals(plain).equals(plain) and not runs.stepped(plain)
    assert runs.reduce(plain, "value", "last")["value"].tolist() == [3.0, 2.0]
    with pytest.raises(ValueError, match="reduce is one of last, min, max, mean, not 'median'"):
        runs.reduce(rows, "loss", "median")


def test_a_summary_row_without_a_step_is_a_runs_last():
    rows = pd.DataFrame([{"job": 0, "step": 1, "loss": 0.5}, {"job": 0, "tokens": 10.0},
                         {"job": 0, "step": 2, "loss": 0.4}])  # fmt: skip
    assert runs.finals(rows).index.tolist() == [1]
    assert runs.finals(rows, "loss")["loss"].tolist() == [0.4]  # the last that holds it


def table_rows() -> pd.DataFrame:
    losses = {(0.1, 4): ([0.9, 0.5], 0.6), (0.1, 16): ([0.7, 0.2], 0.25),
              (0.3, 4): ([0.8, 0.1], 0.15), (0.3, 16): ([0.95, 0.05], 0.08)}  # fmt: skip
    frames = [pd.DataFrame(run_rows(job, *values)).assign(lr=lr, width=width)
              for job, ((lr, width), values) in enumerate(losses.items())]  # fmt: skip
    return pd.concat(frames, ignore_index=True).assign(status="ok")


def test_a_training_table_shows_each_runs_final_value_not_its_largest():
    spec = {"index": "lr", "columns": "width", "values": "loss"}
    table = sweep_table(table_rows(), {"table": spec}, ["lr", "width"])
    assert table.values.tolist() == [[0.6, 0.25], [0.15, 0.08]]  # the eval rows: each run's last
    assert table.attrs["caption"] == "loss, lr (rows) by width (columns), each point's last row"
    train = {**spec, "where": "phase == 'train'", "reduce": "min"}
    table = sweep_table(table_rows(), {"table": train}, ["lr", "width"])
    assert table.values.tolist() == [[0.5, 0.2], [0.1, 0.05]]
    assert table.attrs["caption"].endswith("each point's least, where phase == 'train'")
    by_phase = {"index": ["lr", "width"], "columns": "phase", "values": "loss"}
    table = sweep_table(table_rows(), {"table": by_phase}, ["lr", "width"])
    assert table.loc[(0.3, 16)].tolist() == [0.05, 0.08]  # train's last step, and eval
    typo = {**spec, "where": "phse == 'eval'"}
    assert sweep_table(table_rows(), {"table": typo}, ["lr", "width"]) is None


def test_a_wide_table_is_folded_into_tables_that_fit_each_with_the_index():
    wide = pd.DataFrame([[i * 0.001 + j for j in range(60)] for i in range(3)],
                        index=pd.Index([0.01, 0.1, 1.0], name="lr"))  # fmt: skip
    text = markdown(wide, width=WIDTH)
    folds = text.split("\n\n")
    assert len(folds) > 1 and max(len(line) for line in text.splitlines()) <= WIDTH
    heads = [[c.strip() for c in fold.splitlines()[0].strip("|").split("|")] for fold in folds]
    assert all(head[0] == "lr" for head in heads)
    assert [c for head in heads for c in head[1:]] == [str(c) for c in range(60)]
    assert markdown(wide) == markdown(wide, width=None) and "\n\n" not in markdown(wide)


def test_a_users_training_sweep_says_each_runs_final_value(harness):
    done = harness(*STUDENT, env=PATH)
    assert done.returncode == 0, done.stderr
    rows = store.read(harness.results)
    final = rows[rows["phase"] == "eval"].set_index(["lr", "width"])["loss"]
    first = rows[rows["step"] == 0].set_index(["lr", "width"])["loss"]
    assert (first > final).all()  # the largest over the steps is the first step's
    lines = done.stdout.splitlines()
    table = lines[lines.index("loss, lr (rows) by width (columns), each point's last row:") + 3]
    cells = [float(c) for c in table.strip("|").split("|")[1:]]
    assert cells == pytest.approx([final[(0.03, 4)], final[(0.03, 16)]], rel=1e-2)
    progress = next(line for line in lines if "job 0 lr=0.03 width=4: ok" in line)
    assert f"loss={final[(0.03, 4)]:.3g}" in progress and "step=30" in progress
    assert "on every row of 4 runs, each step's (a where picks rows)" in done.stdout


def test_a_copied_training_points_summary_is_its_final_row():
    """What the progress line of a point whose rows are copied (reuse) shows: not its first
    row, step 0, but its last, as for one that ran."""
    rows = [{**row, "status": "ok", "duration_s": 1.0, "lr": 0.1}
            for row in run_rows(0, [0.9, 0.5], 0.4)]  # fmt: skip
    told = job.summarize(rows, {"lr": 0.1})
    assert told["metrics"] == {"step": 2, "loss": 0.4}
    plain = [{"status": "ok", "duration_s": 1.0, "value": v} for v in (1.0, 2.0)]
    assert job.summarize(plain, {})["metrics"] == {"value": 1.0}  # as before: the first row's


def test_a_tagged_sweep_is_found_by_its_name_and_a_narrow_one_is_said_to_stand_in(
    harness, analysis
):
    for tag in ("base", "base", "other"):
        assert harness(*STUDENT, f"tag={tag}", "lr=0.3", env=PATH).returncode == 0
    ids = store.sweeps(harness.results, "student")
    done = analysis("--config-dir", str(SUPPORT / "conf"), "--check", "--sweep", "tag:base")
    assert done.returncode == 0, done.stderr
    assert f"sweeps shown and checked: student {ids[1]}" in done.stdout  # the newest so named
    assert f"sweep {ids[1]} (student): 2 of the 4 points of student's own grid" in done.stderr
    missing = analysis("--sweep", "tag:nope")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert "is tagged 'nope'" in missing.stderr
    bad = harness(*STUDENT, "tag=a b", env=PATH)
    assert bad.returncode == 2 and "tag 'a b' is not a plain name" in bad.stderr
    assert not math.isnan(store.read(harness.results)["loss"].max())


def test_the_sweep_list_says_killed_where_status_does(tmp_path, analysis):
    """A sweep whose rows say running: killed where the point's process let its running mark
    go (as status says), running while a process holds it."""
    results = tmp_path / "outputs" / "results"
    config = {"name": "student", "run": "students.student"}
    for sweep, held in (("20261206-090000-aaaa", False), ("20261206-100000-bbbb", True)):
        write_plan(results, "student", sweep, [{"lr": 0.1}, {"lr": 0.3}], config)
        rows = [{"job": 0, "status": "ok", "step": 1, "loss": 0.5},
                {"job": 1, "status": "running", "step": 1, "loss": 0.4}]  # fmt: skip
        write_jobs(results, "student", sweep, rows)
        path = store.SweepPaths(results, "student", sweep).job(1).file
        marker = store.hold_running(path)
        if not held:
            store.release_running(marker)
            marker[0].touch()  # what a killed process leaves: its mark, held by no one
    assert analysis("--all").returncode == 0
    report = (tmp_path / "outputs" / "report" / "REPORT.md").read_text()
    listed = {line.split("|")[1].strip(): line.split("|")[3].strip()
              for line in report.splitlines() if line.startswith("| 20261206")}  # fmt: skip
    assert listed == {"20261206-090000-aaaa": "killed", "20261206-100000-bbbb": "running"}


def test_a_plain_sweeps_rows_over_a_column_of_its_own_each_fill_their_cell():
    """Not a run (no step): a point's rows over a column it measures along (size) are a cell
    each, as before runs were summed up."""
    rows = pd.DataFrame({"job": [0, 0, 0, 1, 1, 1], "impl": ["a"] * 3 + ["b"] * 3,
                         "size": [1, 2, 4] * 2, "ms": [1.0, 2.0, 4.0, 1.5, 2.5, 4.5],
                         "status": "ok"})  # fmt: skip
    spec = {"index": "size", "columns": "impl", "values": "ms"}
    table = sweep_table(rows, {"table": spec}, ["impl"])
    assert table.values.tolist() == [[1.0, 1.5], [2.0, 2.5], [4.0, 4.5]]


def test_a_run_that_did_not_end_ok_is_a_gap_and_ranks_are_summed_up_by_rank_0():
    rows = table_rows()
    failed = rows.index[(rows["job"] == 3) & (rows["phase"] == "eval")]
    rows.loc[failed, ["status", "loss"]] = ["failed", None]
    spec = {"index": "lr", "columns": "width", "values": "loss"}
    table = sweep_table(rows, {"table": spec}, ["lr", "width"])
    assert table.loc[0.3].tolist()[0] == 0.15 and math.isnan(table.loc[0.3].tolist()[1])
    ranks = pd.DataFrame([{"job": 0, "rank": rank, "step": step, "loss": 10 * rank + step}
                          for step in range(3) for rank in (0, 1)])  # fmt: skip
    assert runs.finals(ranks)["loss"].tolist() == [2] and runs.finals(ranks)["rank"].tolist() == [0]
    assert runs.reduce(ranks, "loss", "mean")["loss"].tolist() == [1.0]
    text = pd.DataFrame({"job": [0, 0], "step": [0, 1], "name": ["a", "b"]})
    assert runs.reduce(text, "name", "mean").empty  # no number: no value, no error


def test_a_tag_names_an_original_sweep_never_its_rerun(tmp_path):
    for sweep, again_of in (("20261206-090000-aaaa", None), ("20261206-100000-bbbb", "x")):
        points = [{"job": 0, "overrides": [], "params": {}}]
        store.write_manifest(tmp_path, {"experiment": "e", "sweep": sweep, "points": points,
                                        "tag": "base", "again_of": again_of})  # fmt: skip
    assert store.named_sweep(tmp_path, "tag:base") == "20261206-090000-aaaa"
