"""The layers, beside import-linter's contracts (pyproject.toml; make test runs lint-imports:
harness's stages in order, no cycle, the harness below the experiments and the report): the
report imports none of the experiments' code (it reads their rows, and the tables they derive
from them: octlm_experiments.derived, pandas alone); harness modules share no private names; and at
run time, a sweep loads no report module, a report none of the launchers, the tracker, torch or
the code that measures."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness import store

ROOT = Path(__file__).resolve().parent.parent
# Each folder of the project and the package it installs as (pyproject.toml's package-dir).
PACKAGES = {"harness": "harness", "experiments": "octlm_experiments", "analysis": "octlm_analysis"}
DERIVED = "octlm_experiments.derived"  # the experiments' tables, which the report reads too


def imports(path: Path) -> set[str]:
    """The modules a file imports, anywhere in it (functions too), as dotted names."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def test_the_report_imports_of_the_experiments_only_their_derived_tables():
    """The rest of the layers (harness's stages, the harness below the experiments and the
    report) are import-linter's contracts in pyproject.toml, checked by make test."""
    offending = {
        m: sorted(names & {"octlm_experiments"}) for m, names in top_levels("analysis").items()
    }
    assert not {m: names for m, names in offending.items() if names}


def top_levels(package: str) -> dict[str, set[str]]:
    """module -> the top-level packages of this project it imports (octlm_experiments.derived's
    tables counted apart, as DERIVED)."""
    return {
        module_name(path): {_layer(name) for name in imports(path)} & {*PACKAGES.values(), DERIVED}
        for path in sorted((ROOT / package).rglob("*.py"))
    }


def _layer(name: str) -> str:
    return DERIVED if name == DERIVED or name.startswith(DERIVED + ".") else name.split(".")[0]


def test_the_derived_tables_import_pandas_and_the_harness_alone():
    """octlm_experiments.derived is read by the report as well as by the sweep: none of the code
    that measures (torch, the subjects), so that a report loads it in a moment."""
    allowed = {"pandas", "numpy", "harness", *sys.stdlib_module_names}
    for path in sorted((ROOT / "experiments" / "derived").rglob("*.py")):
        found = {n for n in imports(path) if _layer(n) != DERIVED and _layer(n) not in allowed}
        assert not found, f"{module_name(path)} imports {sorted(found)}"


@pytest.mark.process
def test_the_command_line_loads_no_report_or_experiment_module():
    """What the static check cannot see: nothing the harness's entry points import at load time
    pulls the report (octlm_analysis) or the experiments (octlm_experiments) in."""
    code = (
        "import sys, harness.command.cli, harness.command.sweep, harness.running.job;"
        "import harness.launchers.dispatch, harness.command.status;"
        "import harness.launchers.local, harness.launchers.slurm;"
        "print(sorted(m for m in sys.modules"
        " if m.split('.')[0] in ('octlm_analysis', 'octlm_experiments')))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "[]"


def module_name(path: Path) -> str:
    """harness/launchers/local.py -> harness.launchers.local, experiments/tiled.py ->
    octlm_experiments.tiled (its installed name); a package's __init__ -> it."""
    folder, *parts = path.relative_to(ROOT).with_suffix("").parts
    parts = [PACKAGES[folder], *parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_private_name_is_shared_across_harness_modules():
    """What modules of the harness share is public: no module imports another's private name
    (from m import _x, or m._x on an imported module)."""
    modules = {module_name(path) for path in (ROOT / "harness").rglob("*.py")}
    shared = []
    for path in sorted((ROOT / "harness").rglob("*.py")):
        tree, bound = ast.parse(path.read_text()), {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in modules:
                for alias in node.names:
                    if _private(alias.name):
                        shared.append(f"{module_name(path)}: {node.module}.{alias.name}")
                    bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                imported = bound.get(getattr(node.value, "id", None))
                if imported in modules:
                    shared.append(f"{module_name(path)}: {imported}.{node.attr}")
    assert not shared


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_harness_root_holds_a_handful_of_modules():
    """harness/ is arranged by stage (its subpackages); its root keeps what every stage uses."""
    root = sorted(path.name for path in (ROOT / "harness").glob("*.py"))
    assert len(root) <= 9, root


CONFIG_TARGETS = [  # what a config may name for the harness to import at run time
    ("experiment/*.yaml", ("experiment", "run"), "octlm_experiments."),
    ("experiment/*.yaml", ("experiment", "check"), "octlm_experiments."),
    ("experiment/*.yaml", ("experiment", "derive"), "octlm_experiments.derived."),
    ("experiment/*.yaml", ("experiment", "report"), "octlm_analysis."),
    ("hydra/launcher/*.yaml", ("_target_",), "harness.launchers."),
    ("sinks/*.yaml", (None, "_target_"), "harness.running.sinks."),
]


@pytest.mark.parametrize("pattern, keys, package", CONFIG_TARGETS)
def test_what_configs_name_to_import_is_of_its_layer(pattern, keys, package):
    """The run-time imports that configs name (an experiment's function, check, derived tables
    and report module; a launcher; a sink) are of the layer each belongs to, so that the
    harness reaches the experiments and the report only through what a config names."""
    named = []
    for path in sorted((ROOT / "conf").glob(pattern)):
        node = yaml.safe_load(path.read_text()) or {}
        values = [node]
        for key in keys:  # None: every value of a mapping (sinks: name -> its node)
            values = [v for value in values if isinstance(value, dict)
                      for v in (value.values() if key is None else [value.get(key)])]  # fmt: skip
        named += [(path.name, t) for v in values for t in ([v] if isinstance(v, str) else v or [])]
    assert named, f"no config names a {'.'.join(map(str, keys))}"
    assert all(target.startswith(package) for _, target in named), named


LOADS = """
import atexit, json, runpy, sys
listed = sys.argv.pop()
atexit.register(lambda: open(listed, "w").write(json.dumps(sorted(sys.modules))))
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""  # python -c LOADS MODULE ARGS... FILE: the modules loaded, written to FILE at exit
RUNS = ("harness.launchers", "harness.tracking", "harness.running.job", "harness.command.status",
        "harness.launchers.dispatch", "harness.launchers.slurm_cli")  # fmt: skip
NEVER = {"torch", "hydra", "omegaconf", "optuna", "submitit"}  # what no command but a sweep needs


@pytest.mark.process
@pytest.mark.parametrize(
    "command, absent",
    [
        (["harness", "--help"], {*NEVER, "pandas", "pyarrow"}),
        (["harness", "status", "SWEEP"], {*NEVER, "pandas"}),
        (["harness", "compact", "SWEEP"], {*NEVER, "pandas"}),
        (["harness", "report"], NEVER),
    ],
    ids=["help", "status", "compact", "report"],
)
def test_a_command_loads_only_what_it_needs(harness, tmp_path, command, absent):
    """What python -X importtime shows, kept: --help loads neither Hydra, pandas nor torch;
    status and compact of a finished sweep neither torch, Hydra, Optuna nor pandas (pyarrow
    reads the rows), and the report neither torch, Hydra nor Optuna. Each in a new
    interpreter, its modules read at exit."""
    made = harness("+experiment=exp014_tiled", "length=16", "block=16", "seed=0,1")
    assert made.returncode == 0, made.stderr
    (sweep,) = store.sweeps(harness.results, "exp014_tiled")
    listed = tmp_path / "modules.json"
    args = [sweep if arg == "SWEEP" else arg for arg in command]
    ran = subprocess.run([sys.executable, "-c", LOADS, *args, str(listed)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    modules = json.loads(listed.read_text())
    loaded = {name.split(".")[0] for name in modules}
    assert not loaded & absent, f"{' '.join(command)} loaded {sorted(loaded & absent)}"
    assert "harness" in loaded
    if command == ["harness", "report"]:  # a report only reads: no launcher, job or tracker
        running = [m for m in modules if m.startswith(RUNS)]
        assert not running, f"the report loaded {running}"


@pytest.mark.process
def test_a_sweep_loads_no_report_module_and_a_report_no_code_that_runs_or_measures(tmp_path):
    """The layers at run time (python -c LOADS): a sweep whose claims read derived tables checks
    them with the experiment's own (octlm_experiments.derived) and loads no module of the
    report; the report of it loads neither the launchers, the tracker, the job, torch nor any
    experiment's code but the tables it derives."""
    sweep_modules, report_modules = tmp_path / "sweep.json", tmp_path / "report.json"
    grid = ["backend=math,flash", "length=64,128", "dtype=float32", "device=cpu",
            "min_repeats=2", "min_time_s=0", "num_threads=1"]  # fmt: skip
    for command, listed in (
        (["harness", "+experiment=exp015_backends", *grid], sweep_modules),
        (["harness", "report"], report_modules),
    ):
        ran = subprocess.run([sys.executable, "-c", LOADS, *command, str(listed)], cwd=tmp_path,
                             capture_output=True, text=True, timeout=300)  # fmt: skip
        assert ran.returncode == 0, ran.stdout + ran.stderr
        if command[1] != "report":  # every claim's verdict at the sweep's end
            assert ran.stdout.count("claim ") == 7, ran.stdout
    swept = json.loads(sweep_modules.read_text())
    assert "octlm_experiments.derived.backends" in swept  # the claims' tables were derived here
    assert not [m for m in swept if m.split(".")[0] == "octlm_analysis"]
    reported = json.loads(report_modules.read_text())
    assert (
        "octlm_experiments.derived.backends" in reported and "octlm_analysis.backends" in reported
    )
    code = [m for m in reported if _layer(m) == "octlm_experiments"]
    assert code == ["octlm_experiments"], f"the report loaded {code}"  # the package: derived/
    assert not [m for m in reported if m.startswith(RUNS) or m.split(".")[0] in NEVER]
