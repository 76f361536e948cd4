"""What a sweep of one's own experiment refuses before anything runs (a bound that is no
number, a name near a parameter's, a grid value given twice or of two types, a mistyped key:
one line, exit 2, no sweep), and what its end says (check=true's exit code, the progress line's
numbers, a table naming no column), called as a user types it."""

import os
import textwrap

import pytest
from commands import call_command

from harness import store

KERNEL = '''
import numpy as np


def run(*, n, scale: float = 1.0, seed: int = 0):
    """A point of one's own: its value and a NumPy scalar."""
    return [{"a": 1.0, "b": 2.0, "c": 3.0, "value": np.float32(n * scale), "flag": True}]
'''


@pytest.fixture
def mine(harness, tmp_path):
    """An experiment of one's own (mine.yaml: `experiment` holds its table and claims as YAML
    text); mine(yaml, *args) runs it."""
    folder = tmp_path / "conf"
    (folder / "experiment").mkdir(parents=True)
    (tmp_path / "minekernel.py").write_text(KERNEL)

    def run(experiment: str, *args: str, top: str = ""):
        (folder / "experiment" / "mine.yaml").write_text(
            "# @package _global_\nexperiment:\n  name: mine\n  run: minekernel.run\n"
            + textwrap.indent(textwrap.dedent(experiment).strip() + "\n", "  ")
            + f"n: 1\n{top}hydra:\n  sweeper:\n    params:\n      n: 1,2,3\n"
        )
        given = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
        return call_command("harness", "--config-dir", str(folder), "+experiment=mine", *args,
                            cwd=tmp_path, env=given)  # fmt: skip

    run.results = harness.results
    return run


def refused(result, said: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    assert said in result.stderr and result.stderr.count("\n") == 1, result.stderr


@pytest.mark.parametrize(
    ("experiment", "said"),
    [
        ("claims: [{metric: value, min: 'value > 3'}]", "has the comparison `value > 3`"),
        ("claims: [{metric: value, max: 'true'}]", "has the word true, which is no number"),
        ("claims: [{metric: value, max: true}]", "its max: a bound is a number"),
        ("claims: [{metric: value, max: \"'ten'\"}]", "has the text 'ten'"),
        (
            "claims: [{metric: value, max: 10, where: 'scael > 1'}]",
            "its where names 'scael', no parameter; did you mean scale?",
        ),
        (
            "claims: [{metric: value, max: 2 * scal}]",
            "its max names 'scal', no parameter; did you mean scale?",
        ),
        (
            "table: {index: scal, values: value}",
            "table names 'scal', no parameter; did you mean scale?",
        ),
    ],
)
@pytest.mark.parametrize("flag", [[], ["--help"]])
def test_what_cannot_be_judged_or_shown_is_refused_before_anything_runs(
    mine, experiment, said, flag
):
    refused(mine(experiment, *flag), said)
    assert not mine.results.exists()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["n=1,2,2"], "n lists 2 twice: give each value once"),
        (["n=1,'1',1.0"], "n's values 1 (int) and '1' (str) would share a cell"),
        (["n=2,2.0"], "n's values 2 (int) and 2.0 (float) would share a cell"),
        (["scal=2"], "unknown key 'scal' for mine; did you mean scale?"),
        (["scale=2"], "mine's config does not set its parameter scale: give it as +scale=VALUE"),
        (["+scal=2"], "mine does not take scal; did you mean scale?"),
    ],
)
def test_a_grid_or_key_that_would_mislead_is_one_line(mine, args, said):
    refused(mine("", *args), said)
    assert not mine.results.exists()


def test_the_key_list_names_each_key_once(mine):
    result = mine("", "zzz=1", top="seed: 3\n")
    refused(
        result, "unknown key 'zzz' for mine (its keys: n, seed, out, resume, wait, tag, threads,"
    )
    assert result.stderr.count("seed") == 1


def test_check_true_makes_a_failing_claim_the_sweeps_exit_code(mine):
    claims = "claims: [{metric: value, max: 2.5, text: small}]\n"
    unchecked = mine(claims)
    assert unchecked.returncode == 0, unchecked.stdout + unchecked.stderr
    assert "claim FAIL: small (value <= 2.5) (at n=3: 3 > 2.5; 2 of 3 pass)" in unchecked.stdout
    checked = mine(claims, "check=true")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "check=true: 1 of 1 claims do not pass" in checked.stderr
    assert mine("claims: [{metric: value, max: 5}]\n", "check=true").returncode == 0


def test_the_progress_line_shows_the_tables_values_first_numpy_scalars_too(mine):
    result = mine("table: {index: n, values: value}\n", "n=2,3")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "job 0 n=2: ok value=2 a=1 b=2  (" in result.stdout


def test_a_table_naming_a_column_no_row_has_says_so(mine):
    result = mine("table: {index: n, values: valeu}\n", "n=1,2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no table: table names valeu, which no row has; did you mean value" in result.stdout


def test_every_harness_column_is_read_before_anything_was_reused(mine):
    assert mine("", "n=1").returncode == 0
    rows = store.read(mine.results)
    assert set(store.HARNESS_COLUMNS) <= set(rows.columns)
    assert rows["reused_from"].isna().all() and rows["cell"].isna().all()
    import pandas as pd

    assert "reused_from" in pd.read_parquet(mine.results)


def test_a_truth_value_beside_a_number_is_a_cell_of_its_own(mine):
    result = mine("", "n=1,true")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 points: 2 ok" in result.stdout


def test_a_config_group_given_a_number_is_one_line(harness):
    """`size` is a config group of the test configs (size/small.yaml, size/large.yaml): size=128
    is no file of it, said in one line, exit 2, not Hydra's traceback."""
    from tests.support.probes import PROBE_PATH, SUPPORT

    given = ["--config-dir", str(SUPPORT / "conf"), "+experiment=sized", "size=128"]
    refused = harness(*given, env={"PYTHONPATH": PROBE_PATH})
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "a config group takes the name of one of its files" in refused.stderr
    assert "Traceback" not in refused.stderr and not harness.results.exists()
