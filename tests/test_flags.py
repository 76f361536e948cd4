"""Hydra's own flags: --cfg, --resolve, --package, --info, --help and -m; none of the showing
ones runs anything or writes anything. And the options of the commands beside a sweep (status,
compact, code, again): key=value as a sweep's overrides are written, or --key value."""

import pytest
from commands import SUPPORT
from omegaconf import OmegaConf

from harness import store
from harness.command.cli import as_flags, commands


def shown(result) -> tuple[list[str], dict]:
    """--cfg's output: its comment lines, and the YAML after them as a plain dict."""
    lines = result.stdout.splitlines()
    comments = [line for line in lines if line.startswith("#")]
    yaml = "\n".join(line for line in lines if not line.startswith("#"))
    return comments, OmegaConf.to_container(OmegaConf.create(yaml))


def test_cfg_job_prints_the_first_points_config_and_the_grid(harness):
    result = harness("+experiment=exp014_tiled", "length=96,32", "dtype=float64", "--cfg", "job")
    assert result.returncode == 0, result.stderr
    comments, config = shown(result)
    assert comments[0].startswith("# exp014_tiled: 6 points; this is the first, job 0: length=96")
    assert "#   length: 96, 32" in comments and "#   block: 64, 128, 256" in comments
    point = (config["length"], config["block"], config["dtype"], config["job"])
    assert point == (96, 64, "float64", 0)
    assert config["experiment"]["name"] == "exp014_tiled" and "hydra" not in config
    assert not (harness.cwd / "outputs").exists()


def test_cfg_hydra_with_a_package_and_resolve(harness):
    args = ("+experiment=exp014_tiled", "hydra/launcher=local", "hydra.launcher.max_parallel=3")
    launcher = harness(*args, "--cfg", "hydra", "--package", "hydra.launcher")
    assert launcher.returncode == 0, launcher.stderr
    _, config = shown(launcher)
    assert config["_target_"] == "harness.launchers.local.LocalLauncher"
    assert config["max_parallel"] == 3
    resolved = harness(*args, "-c", "all", "--resolve", "-p", "hydra.sweep.dir")
    assert resolved.returncode == 0, resolved.stderr
    assert resolved.stdout.splitlines()[-1] == str(
        harness.cwd / "outputs" / "runs" / "exp014_tiled" / "SWEEP_ID"
    )
    assert not (harness.cwd / "outputs").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--cfg", "everything"], "--cfg takes one of job, hydra, all, got 'everything'"),
        (["--cfg", "job", "-p", "no.such"], "--package no.such: the config has no such key"),
        (["--cfg", "job", "block=0"], "block must be positive, got 0"),  # every point checked
        (["--cfg", "job", "resume=20261130-000000-abcd"], "drop resume"),
        (["--verbose"], "unknown option --verbose"),
    ],
)
def test_bad_flags_are_one_line(harness, args, message):
    result = harness("+experiment=exp014_tiled", *args)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert result.stderr.count("\n") == 1 and not (harness.cwd / "outputs").exists()


def test_info_prints_hydras_search_path_with_the_users_config_dir(harness, tmp_path):
    mine = tmp_path / "mine"
    (mine / "experiment").mkdir(parents=True)
    result = harness("--config-dir", str(mine), "+experiment=exp014_tiled", "--info", "searchpath")
    assert result.returncode == 0, result.stderr
    assert "Config search path" in result.stdout and f"file://{mine}" in result.stdout
    defaults = harness("+experiment=exp014_tiled", "-i", "defaults")
    assert "experiment/exp014_tiled" in defaults.stdout
    assert not (harness.cwd / "outputs").exists()


def test_help_lists_the_experiments_and_an_experiments_parameters(harness):
    listed = harness("--help")
    assert listed.returncode == 0 and "exp015_backends" in listed.stdout
    described = harness("+experiment=exp015_backends", "--help")
    assert described.returncode == 0, described.stderr
    lines = described.stdout.splitlines()
    assert lines[0] == "exp015_backends: octlm_experiments.backends.run"
    (backend,) = [line.split() for line in lines if line.strip().startswith("backend ")]
    assert backend == ["backend", "math", "|", "flash", "|", "efficient", "|", "cudnn",
                       "(required)", "math", "math,flash,efficient,cudnn"]  # fmt: skip
    (cap,) = [line.split() for line in lines if line.strip().startswith("memory_cap_mib ")]
    assert cap == ["memory_cap_mib", "int", "or", "null", "null", "null"]
    assert any(line.startswith("  - ") for line in lines), "its claims"


def test_help_describes_a_users_own_experiment(probe):
    result = probe("--help")
    assert result.returncode == 0, result.stderr
    assert "rendezvous: probes.rendezvous" in result.stdout
    lines = result.stdout.splitlines()
    assert any(line.split()[:3] == ["folder", "str", "(required)"] for line in lines)


def test_multirun_flag_is_accepted(harness):
    result = harness("-m", "+experiment=exp014_tiled", "length=16", "block=16", "--multirun")
    assert result.returncode == 0, result.stderr
    assert len(store.read(harness.results)) == 1


@pytest.mark.parametrize("flag", [["--help"], ["--cfg", "job"]])
@pytest.mark.parametrize(
    "spec, said",
    [
        (
            "{index: point, columns: [point], values: point}",
            "table names point twice: each column in one place",
        ),
        (
            "{index: point, value: point}",
            "table takes index, columns, values, where, reduce, not value",
        ),
    ],
)
def test_help_and_cfg_refuse_what_the_run_refuses(harness, tmp_path, flag, spec, said):
    """--help checks the experiment's config as its sweep would: a table spec the run refuses
    is the run's one line and exit code 2, not a help page that exits 0."""
    mine = tmp_path / "mine"
    (mine / "experiment").mkdir(parents=True)
    (mine / "experiment" / "tabled.yaml").write_text(
        "# @package _global_\n"
        f"experiment: {{name: tabled, run: probes.sized, table: {spec}}}\n"
        "point: 0\nwidth: 2\nhydra: {sweeper: {params: {point: '0,1'}}}\n"
    )
    path = {"PYTHONPATH": str(SUPPORT)}
    args = ("--config-dir", str(mine), "+experiment=tabled")
    refused = harness(*args, *flag, env=path)
    ran = harness(*args, env=path)
    for result in (refused, ran):
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stderr == f"error: tabled: {said}\n"
    assert not (harness.cwd / "outputs").exists()


@pytest.mark.parametrize(
    "tokens, flags",
    [
        (["last", "out=o", "+experiment=exp"], ["last", "--out", "o", "--experiment", "exp"]),
        (["A", "B", "times=2", "budget_s=60"], ["A", "B", "--times", "2", "--budget-s", "60"]),
        (["A", "out=a=b", "code_store=~/c"], ["A", "--out", "a=b", "--code-store", "~/c"]),
        (["A", "--out", "x=y", "--out=z"], ["A", "--out", "x=y", "--out=z"]),  # as given
        (["prune", "out=a", "out=b"], ["prune", "--out", "a", "--out", "b"]),
    ],
)
def test_a_commands_key_value_options_are_its_flags(tokens, flags):
    assert as_flags(tokens, {"out", "experiment", "times", "budget_s", "code_store"}) == flags


def test_a_key_value_of_a_key_the_command_lacks_is_refused():
    with pytest.raises(ValueError, match="unknown option seed="):
        as_flags(["A", "seed=1"], {"out"})


def test_again_reads_its_settings_typed_whichever_way_given():
    again = commands()["again"]
    given = again.parse_args(as_flags(["A", "B", "times=2", "most=5", "factor=1.2",
                                       "budget_s=90.5", "out=o"], again.keys))  # fmt: skip
    flagged = again.parse_args(["A", "B", "--times", "2", "--most", "5", "--factor", "1.2",
                                "--budget-s", "90.5", "--out", "o"])  # fmt: skip
    assert given == flagged
    settings = (given.times, given.most, given.factor, given.budget_s, given.out)
    assert settings == (2, 5, 1.2, 90.5, "o") and type(given.times) is int
    assert (given.sweep_ids, given.code_store) == (["A", "B"], None)
    plain = again.parse_args(["A"])
    assert (plain.times, plain.most, plain.factor, plain.budget_s) == (None,) * 4  # again's own


@pytest.mark.parametrize(
    "args, message",
    [
        (["status"], "status: the following arguments are required: SWEEP_ID"),
        (["status", "last", "seed=1"], "status: unknown option seed="),
        (["status", "last", "--seed", "1"], "status: unrecognized arguments: --seed 1"),
        (["compact", "A", "B"], "compact: unrecognized arguments: B"),
        (["status", "a/b"], "sweep id 'a/b' is not a plain name"),
        (["status", "last", "+experiment=a b"], "experiment 'a b' is not a plain name"),
        (["code", "A", "B", "C"], "code: one sweep id, or two to compare, not 3"),
        (["code", "prune", "A"], "code: prune takes out folders (out=DIR), not A"),
        (["again", "A", "times=two"], "again: times: must be a whole number, got 'two'"),
        (["again", "A", "--factor", "x"], "again: factor: must be a number, got 'x'"),
        (["again", "A", "budget_s="], "again: budget_s: must be a number, got ''"),
    ],
)
def test_a_commands_bad_option_is_one_line_and_exit_2(harness, args, message):
    result = harness(*args)
    assert result.returncode == 2 and result.stdout == "", result.stdout + result.stderr
    assert result.stderr.startswith("error: ") and message in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and not (harness.cwd / "outputs").exists()
    if "plain name" not in message:  # argparse's: with the command's usage
        assert f"(usage: python -m harness {args[0]} " in result.stderr


@pytest.mark.parametrize(
    "args", [["status"], ["compact"], ["code"], ["code", "prune"], ["again"]], ids=" ".join
)
def test_each_commands_help_shows_its_key_value_usage(harness, args):
    result = harness(*args, "--help")
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert result.stdout.startswith(f"usage: python -m harness {args[0]} ")
    assert "out=DIR" in result.stdout and not (harness.cwd / "outputs").exists()


def test_status_takes_a_sweep_by_its_tag(harness):
    """status tag:NAME shows the newest sweep tagged NAME; an unknown tag, or one that is no
    plain name, is one line and exit 2."""
    made = harness("+experiment=exp014_tiled", "length=16", "block=16", "heads=1", "tag=base")
    assert made.returncode == 0, made.stderr
    (sweep,) = store.sweeps(harness.results, "exp014_tiled")
    shown = harness("status", "tag:base")
    assert shown.returncode == 0 and f"sweep {sweep} (exp014_tiled)" in shown.stdout
    for tag in ("tag:none", "tag:a b"):
        refused = harness("status", tag)
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
