"""A new sweep's plan: the grid expanded (Hydra's override parser, BasicSweeper's rule: the
command line replaces the experiment's hydra.sweeper.params key by key), every point checked
against the experiment's signature before any runs, each with a stable job number, and the
manifest that records them."""

import itertools
import math
import secrets
import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, Override, RangeSweep
from omegaconf import DictConfig, OmegaConf

from harness import store
from harness.config import HARNESS_KEYS, SET_BY_HARNESS, key_of
from harness.experiment import BadInput, Experiment, config_hash, config_values


@dataclass
class Point:
    job: int
    overrides: list[str]  # this point's grid values, as Hydra overrides
    params: dict  # the experiment function's keyword arguments


@dataclass
class Sweep:
    id: str
    experiment: Experiment
    results: Path
    overrides: list[str]  # what every job gets: the command line's non-grid overrides
    points: list[Point]
    hydra_overrides: list[str]  # the command line's Hydra settings (a launcher and its options)
    config_dirs: list[Path] = field(default_factory=list)  # --config-dir: users' experiments
    command: str | None = None  # the command line that started the sweep


def new_sweep_id() -> str:
    """A sweep id that sorts by start time (UTC): 20261129-141503-3fa2."""
    return f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def plan(cfg: DictConfig, sweeps: list[Override]) -> Sweep:
    """The sweep's points, in grid order, each checked against the experiment's signature."""
    values = config_values(cfg)
    chosen = _chosen(seeded_grid(cfg), sweeps, cfg)
    _check_size(chosen, values["max_points"])  # before the experiment (and torch) is imported
    _check_streaming(values)
    experiment = Experiment.load(values["experiment"])
    _check_keys(experiment, values, sweeps)
    axes = _axes(chosen)
    points = []
    for job, assignment in enumerate(itertools.product(*axes.values())):
        point_values = {key: value for key, (_, value) in zip(axes, assignment, strict=True)}
        params = experiment.params({**values, **point_values})
        point_overrides = [f"{key}={text}" for key, (text, _) in zip(axes, assignment, strict=True)]
        points.append(Point(job, point_overrides, params))
    if not points:
        empty = " ".join(f"{key}=[]" for key, values in axes.items() if not values)
        raise BadInput(f"the grid has no points ({empty})")
    return sweep_of(cfg, experiment, points)


def seeded_grid(cfg: DictConfig) -> dict:
    """The experiment's own grid (hydra.sweeper.params), {} where its config sets none."""
    params = cfg.hydra.sweeper.get("params")
    return OmegaConf.to_container(params) if params else {}


def sweep_of(cfg: DictConfig, experiment: Experiment, points: list[Point]) -> Sweep:
    task = [o for o in cfg.hydra.overrides.task if key_of(o) not in SET_BY_HARNESS]
    results = Path(cfg.out).resolve() / "results"
    return Sweep(cfg.sweep_id, experiment, results, task, points, list(cfg.hydra.overrides.hydra))


def _check_keys(experiment: Experiment, values: dict, sweeps: list[Override]) -> None:
    """Every key the experiment's config sets, or the command line sweeps, is a parameter."""
    keys = [k for k in values if k not in HARNESS_KEYS and k != "experiment"]
    keys += [o.get_key_element().lstrip("+") for o in sweeps]
    unknown = sorted({k for k in keys if k not in experiment.parameters})
    if unknown:
        names = ", ".join(experiment.parameters)
        raise BadInput(f"{experiment.name} does not take {', '.join(unknown)} (it takes {names})")
    for override in sweeps:
        if not override.is_discrete_sweep():
            raise BadInput(f"{override.input_line}: only lists, range() and choice() can be swept")


def _chosen(yaml_params: dict, sweeps: list[Override], cfg: DictConfig) -> dict[str, Override]:
    """key -> its override: the experiment's grid, then the command line's. A key fixed on the
    command line (length=256) leaves the grid; one swept there replaces it."""
    fixed = {key_of(o) for o in cfg.hydra.overrides.task}
    parser = OverridesParser.create()
    grid = parser.parse_overrides([f"{k}={v}" for k, v in yaml_params.items() if k not in fixed])
    return {override.get_key_element().lstrip("+"): override for override in [*grid, *sweeps]}


def _check_streaming(values: dict) -> None:
    """stream_rows is a whole number of rows, stream_s a number of seconds, both above 0."""
    _check_positive_int("stream_rows", values["stream_rows"])
    seconds = values["stream_s"]
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
        raise BadInput(f"stream_s must be a number of seconds above 0, got {seconds!r}")


def _check_positive_int(key: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadInput(f"{key} must be a positive integer, got {value!r}")


def _check_size(chosen: dict[str, Override], max_points) -> None:
    """Refuse a grid of more than max_points points, counted without expanding any axis."""
    _check_positive_int("max_points", max_points)
    sizes = {key: _axis_size(override) for key, override in chosen.items()}
    total = math.prod(sizes.values())
    if total > max_points:
        shape = " x ".join(f"{key} {size:,}" for key, size in sizes.items() if size > 1)
        raise BadInput(
            f"the grid has {total:,} points ({shape}), more than max_points={max_points:,}; "
            "narrow it, or raise max_points"
        )


def _axes(chosen: dict[str, Override]) -> dict:
    """key -> [(text, value)] for each key of the grid."""
    axes = {}
    for key, override in chosen.items():
        if override.is_sweep_override():
            texts = list(override.sweep_string_iterator())
            axes[key] = list(zip(texts, override.sweep_iterator(), strict=True))
        else:
            axes[key] = [(override.get_value_element_as_str(), override.value())]
    return axes


def _axis_size(override: Override) -> int:
    """How many values an axis has, without listing them."""
    value = override.value()
    if isinstance(value, RangeSweep):
        return max(0, math.ceil((value.stop - value.start) / value.step))
    return len(value.list) if isinstance(value, ChoiceSweep) else 1


def write_manifest(sweep: Sweep) -> None:
    """The sweep's own record: its command, config and every point, for resume and reports;
    the sweep's first write, so an out dir that cannot be written is bad input here."""
    manifest = {
        "experiment": sweep.experiment.name,
        "sweep": sweep.id,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": sweep.command,
        "overrides": sweep.overrides,
        "hydra_overrides": sweep.hydra_overrides,
        "experiment_config": sweep.experiment.config,
        "points": [
            {
                "job": p.job,
                "overrides": p.overrides,
                "params": p.params,
                "config_hash": config_hash(sweep.experiment.name, p.params),
            }
            for p in sweep.points
        ],
    }
    try:
        store.write_manifest(sweep.results, manifest)
    except OSError as error:
        discard(sweep)
        folder = store.sweep_dir(sweep.results, sweep.experiment.name, sweep.id)
        raise BadInput(f"cannot write to {folder}: {error.strerror or error}") from None


def discard(sweep: Sweep) -> None:
    """Remove a new sweep's folders while it holds no rows (only its manifest): its store
    folder and its run folder (hydra.sweep.dir: Hydra's and submitit's files)."""
    folder = store.sweep_dir(sweep.results, sweep.experiment.name, sweep.id)
    if not store.result_files(sweep.results, sweep.experiment.name, sweep.id):
        shutil.rmtree(folder, ignore_errors=True)
        runs = sweep.results.parent / "runs" / sweep.experiment.name / sweep.id
        shutil.rmtree(runs, ignore_errors=True)
