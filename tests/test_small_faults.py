"""Smaller faults of the command line and of status, each as a user met it: a search's mapping
given whole, a mistyped key of a node, a suggestion said twice, --help's claims, an unknown
experiment, SLURM's reason and a task's queue in status, and a search's trials as status counts
them."""

import os

import pytest
import yaml
from commands import ROOT, SUPPORT
from test_slurm_parsing import fake_command

from harness import store
from harness.launchers import slurm
from harness.names import closest
from harness.searching import search

STUDENT = ["--config-dir", str(SUPPORT / "conf"), "+experiment=student"]
PATH = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(SUPPORT)])}


@pytest.fixture
def tuned(harness):
    """`python -m harness --config-dir tests/support/conf +experiment=tuned ARGS`."""
    given = ["--config-dir", str(SUPPORT / "conf"), "+experiment=tuned"]
    run = lambda *args: harness(*given, *args, env=PATH)  # noqa: E731
    run.results, run.harness = harness.results, harness
    return run


def test_a_searchs_mappings_are_taken_whole_on_the_command_line(tuned):
    shown = tuned(
        "search.params={lr: tag(log, interval(1e-4, 1)), steps: 'choice(10, 20)'}",
        "search.where={phase: train}",
        "search.prune_on={phase: eval}",
        "search.sampler=tpe",
        "search.sampler_options={n_startup_trials: 3}",
        "+search.pruner_options={n_warmup_steps: 2}",
        "--cfg",
        "job",
    )
    assert shown.returncode == 0, shown.stderr
    config = yaml.safe_load(shown.stdout)["search"]
    assert config["params"] == {
        "lr": "tag(log, interval(0.0001, 1.0))",  # Hydra reads an interval's ends as floats
        "steps": "choice(10, 20)",
    }
    assert (config["where"], config["prune_on"]) == ({"phase": "train"}, {"phase": "eval"})
    assert config["sampler_options"] == {"n_startup_trials": 3}
    assert config["pruner_options"] == {"n_warmup_steps": 2}


def test_a_where_given_whole_is_the_row_each_trial_tells(tuned):
    """The score climbs to its value over 20 steps: the train row of step 10 holds half of it,
    and that is what each trial tells its study."""
    ran = tuned("search.params.lr=interval(1e-3, 1e-1)", "search.trials=2", "variant=a",
                "search.pruner=none", "search.where={phase: train, step: 10}")  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    (sweep,) = store.sweeps(tuned.results, "tuned")
    rows = store.read(tuned.results, "tuned", sweep)
    (study,) = search.studies(store.SweepPaths(tuned.results, "tuned", sweep).folder).values()
    for trial in study.get_trials():
        evaluated = rows[(rows["trial"] == trial.number) & (rows["phase"] == "eval")]["score"]
        assert trial.value == pytest.approx(evaluated.item() / 2)


@pytest.mark.parametrize(
    "given, said",
    [
        ("search.trails=5", "unknown key 'search.trails'; did you mean search.trials? (search's "
                            "keys: params, trials, objective,"),
        ("checkpoint.kep=2", "unknown key 'checkpoint.kep'; did you mean checkpoint.keep?"),
        ("hydra.launcher.max_paralel=2", "unknown key 'hydra.launcher.max_paralel'; did you mean "
                                         "hydra.launcher.max_parallel (with hydra/launcher=local)"),
    ],
)  # fmt: skip
def test_a_mistyped_key_of_a_node_is_told_the_key_it_is_near(harness, given, said):
    refused = harness(*STUDENT, given, "--cfg", "job", env=PATH)
    assert refused.returncode == 2 and refused.stderr.startswith(f"error: {said}"), refused.stderr
    assert len(refused.stderr.splitlines()) == 1


def test_a_mistyped_key_of_the_chosen_launcher_is_told_its_own_key(harness):
    given = ["hydra/launcher=local", "hydra.launcher.max_paralel=2", "--cfg", "job"]
    refused = harness(*STUDENT, *given, env=PATH)
    assert refused.returncode == 2
    assert refused.stderr == (
        "error: unknown key 'hydra.launcher.max_paralel'; did you mean "
        "hydra.launcher.max_parallel? (see conf/hydra/ and Hydra's own)\n"
    )


def test_each_suggestion_is_said_once(harness):
    """steps is both a key of student's config and a parameter of its function."""
    assert closest("step", ["steps", "seed", "steps", "stream_s"]) == "; did you mean steps?"
    refused = harness(*STUDENT, "step=3", "--cfg", "job", env=PATH)
    assert refused.returncode == 2
    assert "; did you mean steps? (its keys:" in refused.stderr, refused.stderr


def test_help_lists_each_claim_with_the_rows_it_judges(harness):
    shown = harness(*STUDENT, "--help", env=PATH)
    assert shown.returncode == 0, shown.stderr
    claims = shown.stdout.split("claims (checked over the sweep's planned points):\n")[1]
    assert claims.splitlines()[:2] == [
        "  - the student fits its teacher (loss <= 0.5), where phase == 'eval'",
        "  - no step's loss runs away (loss <= 100)",
    ]


def test_an_unknown_experiment_is_told_of_config_dir(harness):
    refused = harness("+experiment=nope")
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1
    assert refused.stderr.rstrip().endswith(
        "; an experiment of your own: --config-dir DIR with DIR/experiment/nope.yaml"
    )


@pytest.mark.process
def test_a_running_task_shows_no_reason_where_slurm_gives_none(tmp_path, monkeypatch):
    fake_command(tmp_path, "squeue", "12_0|RUNNING|None\\n13_0|PENDING|Priority\\n")
    monkeypatch.setenv("PATH", str(tmp_path))
    placement = {"tasks": {"12_0": [0], "13_0": [1]}, "submitit_folder": str(tmp_path)}
    assert slurm.SlurmLauncher.states(placement) == {
        0: ("running", "SLURM 12_0"), 1: ("pending", "SLURM 13_0 (Priority)")
    }  # fmt: skip


@pytest.mark.process
def test_points_behind_another_in_their_task_are_pending(harness, tmp_path, monkeypatch):
    """Three points packed in one SLURM task (points_per_task=3) that runs: the first ended,
    the second runs, the third waits for it; a task of its own runs the fourth."""
    results, sweep = harness.results, "20261201-100000-0000"
    points = [{"job": job, "overrides": [f"x={job}"], "params": {"x": job}} for job in range(4)]
    placement = {"tasks": {"12_0": [0, 1, 2], "12_1": [3]}, "submitit_folder": str(tmp_path)}
    launch = {"at": "2026-12-01T10:00:00+00:00", "launcher": slurm.__name__ + ".SlurmLauncher",
              "detached": True, "jobs": [0, 1, 2, 3], "placement": placement}  # fmt: skip
    manifest = {"experiment": "packed", "sweep": sweep, "points": points, "launches": [launch],
                "command": "python -m harness"}  # fmt: skip
    store.write_manifest(results, manifest)
    store.write_rows(
        store.SweepPaths(results, "packed", sweep).job(0).file, [{"job": 0, "status": "ok"}]
    )
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    fake_command(bin_, "squeue", "12_0|RUNNING|None\\n12_1|RUNNING|None\\n")
    shown = harness("status", sweep, env={"PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}"})
    assert shown.returncode == 0, shown.stderr
    lines = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:5]]
             for line in shown.stdout.splitlines() if line.startswith("| ")}  # fmt: skip
    assert lines["0"] == ["x=0", "ok", ""]
    assert lines["1"] == ["x=1", "running", "SLURM 12_0"]
    assert lines["2"] == ["x=2", "pending", "after job 1 in SLURM 12_0"]
    assert lines["3"] == ["x=3", "running", "SLURM 12_1"]


SPEC = {"direction": "maximize", "sampler": "random", "pruner": "none", "trials": 4,
        "objective": "score"}  # fmt: skip


def test_a_killed_trial_is_counted_as_killed_not_running(tmp_path):
    """A kill tells the study nothing: its trial stays running there, and status counts it as
    the store says its point ended."""
    study = search.study(tmp_path, SPEC, 0)
    for job in range(3):
        study.ask().set_user_attr("job", job)
    study.tell(0, 0.5)
    said = search.progress(tmp_path, SPEC, {0: "ok", 1: "killed", 2: "running"})
    assert said == [
        "cell 0: 3 trials asked of 4 (1 complete, 1 killed, 1 running); best score=0.5, trial 0 ()"
    ]


def test_a_pruned_trial_is_said_pruned_once(tuned):
    """Trials of lr 1e-2 score far above those of 1e-4 at every step: once one has ended, the
    median pruner stops one of 1e-4 at its first report."""
    ran = tuned("search.params.lr=choice(0.01, 0.0001)", "search.trials=6", "variant=a",
                "+search.pruner_options={n_startup_trials: 1}")  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    (sweep,) = store.sweeps(tuned.results, "tuned")
    shown = tuned.harness("status", sweep)
    assert "pruned at step" in ran.stdout and "| pruned | at step" in shown.stdout, ran.stdout
    assert "pruned pruned" not in ran.stdout + shown.stdout
