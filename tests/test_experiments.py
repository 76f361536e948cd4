"""What every experiment module keeps to: no Hydra, no Parquet, not even through its imports."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"
MODULES = sorted(path.stem for path in EXPERIMENTS.glob("*.py") if path.stem != "__init__")
HARNESS_SIDE = ("hydra", "omegaconf", "pyarrow", "pandas")
# One interpreter imports torch, then forks a child for each module, which imports it alone and
# says which of the harness's side it loaded: a fresh interpreter's answer, at a fork's cost.
EACH_ALONE = f"""
import importlib, json, os, sys, torch
for module in {MODULES!r}:
    reading, writing = os.pipe()
    if os.fork() == 0:
        importlib.import_module("experiments." + module)
        found = sorted(set({HARNESS_SIDE!r}) & sys.modules.keys())
        os.write(writing, json.dumps([module, found]).encode())
        os._exit(0)
    os.close(writing)
    print(os.read(reading, 65536).decode(), flush=True)
    os.wait()
"""


@pytest.fixture(scope="module")
def loaded() -> dict[str, list[str]]:
    result = subprocess.run([sys.executable, "-c", EACH_ALONE], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return dict(json.loads(line) for line in result.stdout.splitlines())


@pytest.mark.process
@pytest.mark.parametrize("module", MODULES)
def test_an_experiment_module_imports_nothing_of_hydra_or_parquet(module, loaded):
    assert loaded[module] == []


CHECKED = """
def check(*, length: int, lenght: int = 0) -> None:
    pass


def check_loose(*, length: int, **rest) -> None:
    pass


def check_strict(*, length: int) -> None:
    if length > 8:
        raise ValueError(f"length must be 8 or less, got {length}")


def run(*, length: int, block: int = 4) -> list[dict]:
    return [{"length": length}]
"""


@pytest.fixture
def checked(tmp_path, monkeypatch):
    (tmp_path / "checked_module.py").write_text(CHECKED)
    monkeypatch.syspath_prepend(str(tmp_path))
    return {"name": "checked", "run": "checked_module.run"}


@pytest.mark.parametrize(
    "check, message",
    [
        (None, "checked_module.check checks lenght, which checked_module.run does not take"),
        ("checked_module.check_loose", "takes \\*args or \\*\\*kwargs"),
        ("checked_module.no_such_check", "cannot import experiment.check"),
    ],
)
def test_a_check_that_names_what_the_function_does_not_take_is_refused(checked, check, message):
    from harness.errors import BadInput
    from harness.planning.experiment import Experiment

    with pytest.raises(BadInput, match=message):
        Experiment.load({**checked, **({"check": check} if check else {})})


def test_a_check_gets_the_parameters_it_names(checked):
    from harness.errors import BadInput
    from harness.planning.experiment import Experiment

    experiment = Experiment.load({**checked, "check": "checked_module.check_strict"})
    assert experiment.params({"length": 8}) == {"length": 8, "block": 4}
    with pytest.raises(BadInput, match="length must be 8 or less, got 9"):
        experiment.params({"length": 9})


@pytest.mark.parametrize("module", ["tiled", "equivalence", "backends", "tiled_backward"])
def test_an_experiment_check_refuses_a_name_it_does_not_know(module):
    """No **kwargs that would swallow a misspelled name."""
    import importlib
    import inspect

    check = importlib.import_module(f"experiments.{module}").check
    kinds = {p.kind for p in inspect.signature(check).parameters.values()}
    assert inspect.Parameter.VAR_KEYWORD not in kinds
    with pytest.raises(TypeError, match="lenght"):
        check(lenght=64)
