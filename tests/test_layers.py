"""The layers: the harness (runner) never imports the report layer (analysis) or the experiments;
experiments never import the report layer, nor the report layer the experiments (it reads their
rows, not their code); harness modules import each other without a cycle."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness import store

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("harness", "experiments", "analysis")


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


def top_levels(package: str) -> dict[str, set[str]]:
    """module -> the top-level packages of this project it imports."""
    return {
        module_name(path): {name.split(".")[0] for name in imports(path)} & set(PACKAGES)
        for path in sorted((ROOT / package).rglob("*.py"))
    }


@pytest.mark.parametrize(
    "package, forbidden",
    [
        ("harness", {"analysis", "experiments"}),
        ("experiments", {"analysis"}),
        ("analysis", {"experiments"}),
    ],
)
def test_a_layer_does_not_import_the_ones_above_it(package, forbidden):
    offending = {m: sorted(names & forbidden) for m, names in top_levels(package).items()}
    assert not {m: names for m, names in offending.items() if names}


@pytest.mark.process
def test_the_command_line_loads_no_report_or_experiment_module():
    """What the static check cannot see: nothing the harness's entry points import at load time
    pulls analysis or experiments in."""
    code = (
        "import sys, harness.cli, harness.sweep, harness.job, harness.dispatch, harness.status;"
        "import harness.launchers.local, harness.launchers.slurm;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('analysis', 'experiments')))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "[]"


def module_name(path: Path) -> str:
    """harness/launchers/local.py -> harness.launchers.local; a package's __init__ -> it."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_harness_modules_import_each_other_without_a_cycle():
    modules = {module_name(path) for path in (ROOT / "harness").rglob("*.py")}
    graph = {
        module_name(path): {name for name in imports(path) if name in modules} - {module_name(path)}
        for path in (ROOT / "harness").rglob("*.py")
    }
    visiting, done = set(), set()

    def visit(module: str, trail: list[str]) -> None:
        assert module not in visiting, f"import cycle: {' -> '.join([*trail, module])}"
        if module in done:
            return
        visiting.add(module)
        for imported in graph.get(module, ()):
            visit(imported, [*trail, module])
        visiting.discard(module)
        done.add(module)

    for module in graph:
        visit(module, [])


CONFIG_TARGETS = [  # what a config may name for the harness to import at run time
    ("experiment/*.yaml", ("experiment", "run"), "experiments."),
    ("experiment/*.yaml", ("experiment", "check"), "experiments."),
    ("experiment/*.yaml", ("experiment", "report"), "analysis."),
    ("hydra/launcher/*.yaml", ("_target_",), "harness.launchers."),
    ("sinks/*.yaml", (None, "_target_"), "harness.sinks."),
]


@pytest.mark.parametrize("pattern, keys, package", CONFIG_TARGETS)
def test_what_configs_name_to_import_is_of_its_layer(pattern, keys, package):
    """The run-time imports that configs name (an experiment's function, check and report
    module; a launcher; a sink) are of the layer each belongs to, so that the harness reaches
    the experiments and the report only through what a config names."""
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
RUNS = ("harness.launchers", "harness.tracking", "harness.job", "harness.status",
        "harness.dispatch", "harness.slurm_cli")  # fmt: skip
NEVER = {"torch", "hydra", "omegaconf", "optuna", "submitit"}  # what no command but a sweep needs


@pytest.mark.process
@pytest.mark.parametrize(
    "command, absent",
    [
        (["harness", "--help"], {*NEVER, "pandas", "pyarrow"}),
        (["harness", "status", "SWEEP"], {*NEVER, "pandas"}),
        (["harness", "compact", "SWEEP"], {*NEVER, "pandas"}),
        (["analysis"], NEVER),
    ],
    ids=["help", "status", "compact", "analysis"],
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
    if command == ["analysis"]:  # a report only reads: no launcher, job, tracker or scheduler
        running = [m for m in modules if m.startswith(RUNS)]
        assert not running, f"the report loaded {running}"
