"""python -m harness again, in parts: its settings checked before anything runs, a sweep's
recorded command read back, and the sweep a rerun made found in the store (the whole command
runs in tests/test_compare.py and tests/test_code.py)."""

import shlex

import pytest

from harness import store
from harness.command.again import again, new_reruns, recorded_arguments
from harness.errors import BadInput


@pytest.mark.parametrize(
    "arguments",
    [
        ["+experiment=own", "x=1,2"],
        ["--config-dir", "/a folder/with spaces", "+experiment=own", "tag=it's mine"],
        ["+experiment=own", 'note="a b"', "x=range(1,3)", "~seed"],
        [],
    ],
)
def test_a_recorded_command_reads_back_as_its_arguments(arguments):
    """As harness.command.sweep records it: shlex.join of python -m harness and the arguments."""
    assert recorded_arguments(shlex.join(["python", "-m", "harness", *arguments])) == arguments


@pytest.mark.parametrize(
    "command", ["", "python -m other +experiment=own", "python -m harness 'unclosed"]
)
def test_a_command_of_another_form_is_bad_input(command):
    with pytest.raises(BadInput, match="recorded command"):
        recorded_arguments(command)


@pytest.mark.parametrize(
    "settings, said",
    [
        ({"times": 1}, "times=1"),
        ({"times": 4, "most": 3}, "most=3 is fewer than times=4"),
        ({"factor": 1.0}, "factor is a number above 1, got 1.0"),
        ({"factor": float("nan")}, "factor is a number above 1, got nan"),
        ({"budget_s": -1}, "budget_s is a number of seconds, 0 or more: got -1"),
    ],
)
def test_settings_out_of_range_are_bad_input_before_anything_runs(tmp_path, settings, said):
    """Checked first: the store need not even hold the sweep."""
    with pytest.raises(BadInput, match=said.replace("(", r"\(")):
        again(["20261206-090000-aaaa"], str(tmp_path / "outputs"), None, **settings)


def test_the_sweep_a_rerun_made_is_the_new_one_that_names_its_original(tmp_path):
    """Among the experiment's sweeps, those not there before the rerun and whose manifests say
    again_of the original: not an older rerun, nor a new sweep of another original."""
    results = tmp_path / "results"
    made = {"20261206-090000-aaaa": None, "20261206-100000-bbbb": "20261206-090000-aaaa"}
    write_manifests(results, made)
    before = set(store.sweeps(results, "own"))
    write_manifests(results, {"20261206-110000-cccc": "20261206-090000-aaaa",
                              "20261206-110000-dddd": "20261206-050000-zzzz",
                              "20261206-110000-eeee": None})  # fmt: skip
    assert new_reruns(results, "own", "20261206-090000-aaaa", before) == ["20261206-110000-cccc"]
    assert (
        new_reruns(results, "own", "20261206-090000-aaaa", set(store.sweeps(results, "own"))) == []
    )


def write_manifests(results, again_of: dict) -> None:
    """A manifest of experiment `own` for each sweep, naming what it runs again (or nothing)."""
    for sweep, original in again_of.items():
        manifest = {"experiment": "own", "sweep": sweep, "command": "python -m harness",
                    "points": [{"job": 0, "overrides": [], "params": {}}]}  # fmt: skip
        store.write_manifest(results, {**manifest, **({"again_of": original} if original else {})})
