"""Every experiment config: it composes, its keys are its function's parameters with one default
each, its claims name what a tiny point's rows and tables have, and no broken measurement
(zeros, a constant, NaN) passes any of its claims on its seeded grid."""

import functools
import inspect
import re

import pandas as pd
import pytest
from commands import call_command
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from harness import store
from harness.names import CONF, HARNESS_KEYS
from harness.planning.experiment import Experiment, config_values
from harness.planning.plan import plan
from harness.results import expressions
from harness.results.claims import claims_table, derived_tables
from harness.results.tables import planned

EXPERIMENTS = sorted(path.stem for path in (CONF / "experiment").glob("*.yaml"))
# The same, each experiment's tests on one of pytest-xdist's workers (--dist loadgroup), which
# runs its tiny point once.
RUN_ONCE = [
    pytest.param(name, marks=pytest.mark.xdist_group(f"tiny-{name}")) for name in EXPERIMENTS
]

# One small, quick point (or a few, where a claim's table needs two lengths or two methods).
TINY = {
    "exp014_tiled": ["length=64", "block=16", "heads=2"],
    "exp014_equivalence": ["kv_heads=2", "path=tiled", "length=16", "width=32", "layers=1",
                           "vocab_size=64", "block=8"],
    "exp015_backends": ["backend=math,flash", "length=128,256", "dtype=float32", "device=cpu",
                        "min_repeats=2", "min_time_s=0", "num_threads=1"],
    "exp016_backward_memory": ["method=naive,tiled", "length=64,128"],
    "exp016_tiled_backward": ["length=32", "block=16", "kv_heads=2"],
    "exp017_recall": ["attention=sdpa,tiled", "window=0,4", "steps=12", "batch=8",
                      "device=cpu"],
    # flex's row has the same metrics as tiled's (tests/test_window.py), and a compile of 30 s
    "exp018_window": ["method=sdpa,tiled", "length=256", "window=64", "device=cpu",
                      "min_repeats=2", "min_time_s=0", "num_threads=1"],
    "exp019_precision": ["precision=float32,float16_unscaled", "width=16", "length=16",
                         "steps=6", "batch=2", "warmup_steps=2", "device=cpu"],
}  # fmt: skip
# Grids beside the seeded one, for the claims about points it does not plan (exp017's across
# processes, ddp=true, which the seeded grid leaves to the launcher's tasks_per_node).
# A search (its claims are on each cell's best trial), 2 trials a cell.
SEARCHED = ["++search.params.lr='tag(log, interval(1e-3, 3e-2))'", "search.trials=2"]
BESIDE = {"exp017_recall": [["ddp=true"], SEARCHED]}
IDENTIFIER = r"(?<![\d.])[A-Za-z_]\w*"  # a column in a bound's expression, not 1.0e-6's e
CLAIM_KEYS = {"metric", "min", "max", "where", "needs", "table", "text"}  # harness.results.claims
BROKEN = {"zeros": 0.0, "a constant": 1.0, "NaN": float("nan")}


def composed(name: str, *overrides: str):
    with initialize_config_dir(config_dir=str(CONF), job_name="test", version_base=None):
        return compose(
            "config",
            overrides=[f"+experiment={name}", "sweep_id=test", *overrides],
            return_hydra_config=True,
        )


def test_the_harness_keys_are_declared_once_each_with_its_default_in_config_yaml():
    """names.KEYS declares each key of the harness once, with whether it decides a point's
    answer and whether resume or again may set it; config.yaml holds exactly those keys' defaults
    (sinks: its config group)."""
    from harness.names import KEYS, NOT_IN_KEY, RESUME_SETTINGS

    root = OmegaConf.load(CONF / "config.yaml")
    assert {key for key in root if key not in ("defaults", "hydra")} | {"sinks"} == set(
        HARNESS_KEYS
    )
    assert len(KEYS) == len(HARNESS_KEYS) == len(set(HARNESS_KEYS))
    assert "seed" not in NOT_IN_KEY and "threads" in NOT_IN_KEY and "reuse" in RESUME_SETTINGS


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_key_is_a_parameter_and_each_default_has_one_value(name):
    cfg = composed(name)
    values = config_values(cfg)
    experiment = Experiment.load(values["experiment"])
    assert experiment.name == name
    keys = [key for key in values if key not in HARNESS_KEYS and key != "experiment"]
    assert set(keys) <= set(experiment.parameters), "keys the function does not take"
    for key in keys:
        default = experiment.parameters[key].default
        if default is not inspect.Parameter.empty:
            assert values[key] == default, f"{key}: the YAML says {values[key]}, run {default}"
    for key in OmegaConf.to_container(cfg.hydra.sweeper.params):
        assert key in experiment.parameters, f"the grid sweeps {key}, not a parameter"
    assert set(experiment.config.get("resources", [])) <= set(experiment.parameters)
    for claim in experiment.config.get("claims", []):
        assert set(claim) <= CLAIM_KEYS and {"metric", "text"} <= set(claim), claim


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    """Each experiment's tiny point(s), run once through the harness's command line, by name."""

    @functools.cache
    def run(name: str) -> tuple:
        folder = tmp_path_factory.mktemp(name)
        result = call_command("harness", f"+experiment={name}", *TINY[name], cwd=folder)
        assert result.returncode == 0, result.stderr + result.stdout
        results = folder / "outputs" / "results"
        (sweep,) = store.sweeps(results, name)
        return store.read(results, name, sweep), store.read_manifest(
            store.SweepPaths(results, name, sweep)
        )

    return run


@pytest.mark.slow
@pytest.mark.parametrize("name", RUN_ONCE)
def test_a_tiny_point_runs_and_has_what_every_claim_names(name, tiny_runs):
    assert name in TINY, f"give {name} a tiny point in TINY"
    rows, manifest = tiny_runs(name)
    assert set(rows["status"]) == {"ok"}
    config = manifest["experiment_config"]
    tables = derived_tables(planned(rows, manifest["points"]), config)
    for claim in config["claims"]:
        if claim.get("table") == "best" and "best" not in tables:
            continue  # a search's table (harness.searching.search): tests/test_search.py runs one
        table = tables[claim.get("table", "rows")]
        named = {claim["metric"]} | _names(claim.get("min")) | _names(claim.get("max"))
        assert named <= set(table.columns), f"{claim['text']}: {named - set(table.columns)}"
        if claim.get("where"):
            table.query(claim["where"])  # names only columns the table has
    assert "ERROR" not in set(claims_table(rows, config, manifest["points"])["result"])


@functools.cache
def planned_grids(name: str) -> tuple[set[str], list]:
    """The experiment's parameters, and its seeded grid and those BESIDE it as planned (each
    broken measurement's test reads them, none changes them): composed once for the module."""
    params = set(Experiment.load(config_values(composed(name))["experiment"]).parameters)
    return params, [plan(composed(name, *grid), []) for grid in [[], *BESIDE.get(name, [])]]


@pytest.mark.slow
@pytest.mark.parametrize("kind", BROKEN)
@pytest.mark.parametrize("name", RUN_ONCE)
def test_no_claim_passes_a_broken_measurement_of_the_seeded_grid(name, kind, tiny_runs):
    real, _ = tiny_runs(name)
    params, sweeps = planned_grids(name)
    own = params | set(store.HARNESS_COLUMNS) | set(store.PARTITIONS.names)
    measured = [c for c in real.select_dtypes("number") if c not in own | {"inputs_mib"}]
    # The words of the run's last row (exp017's phase "eval"): a broken run still says them.
    words = {c: real[c].iloc[-1] for c in real.select_dtypes(exclude="number") if c not in own}
    results = []
    for sweep in sweeps:
        for device in ("cpu", "cuda:0"):  # a claim may be about one device's rows only
            rows = [
                {"job": point.job, "status": "ok", **words, **point.params, "device_used": device}
                | ({"capability": 9.0} if device != "cpu" else {})
                | {column: BROKEN[kind] for column in measured}
                | _inputs(real, point.params)
                | ({"cell": point.cell} if point.cell is not None else {})
                for point in sweep.points
            ]
            results.append(claims_table(pd.DataFrame(rows), sweep.experiment.config)["result"])
    assert len(results[0]) and not set().union(*results) & {"PASS", "ERROR"}
    # Every claim applies to some grid's rows; claims that split a metric by a measurement
    # (exp019's speed: matmul-bound or not, by float32_matmul_share) apply as a pair.
    claims = sweeps[0].experiment.config["claims"]
    applies: dict = {}
    for number, (claim, each) in enumerate(zip(claims, zip(*results, strict=True), strict=True)):
        named = expressions.parse(claim["where"]).names if claim.get("where") else set()
        split = named - own - set(words) - {"device_used", "capability"}
        key = (claim.get("table"), claim["metric"]) if split else number
        applies[key] = applies.get(key, False) or set(each) != {"N/A"}
    assert all(applies.values()), "a claim applies to no device's rows of any grid"


def _names(bound) -> set[str]:
    """The columns a bound's expressions name (none for a number)."""
    bounds = bound if isinstance(bound, list) else [bound]
    return {name for b in bounds if isinstance(b, str) for name in re.findall(IDENTIFIER, b)}


def _inputs(real, params: dict) -> dict:
    """inputs_mib is no measurement but the inputs' size: scaled with length from the tiny run."""
    if "inputs_mib" not in real:
        return {}
    first = real.iloc[0]
    return {"inputs_mib": first["inputs_mib"] * params["length"] / first["length"]}
