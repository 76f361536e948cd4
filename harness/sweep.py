"""A sweep from the command line: compose, expand the grid, check every point, launch, summarize.

The harness composes the config with Hydra's compose API and hands the points to the Hydra
launcher the config names, one job per point. It expands the grid itself (with Hydra's
override parser, and BasicSweeper's rule: the command line replaces the experiment's
hydra.sweeper.params key by key) so that it can check every point before any runs, give each
point a stable job number, and on resume launch only the points without an answer.
"""

import itertools
import math
import secrets
import shlex
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, Override, RangeSweep
from hydra.errors import (
    ConfigCompositionException,
    HydraException,
    MissingConfigException,
    OverrideParseException,
)
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from harness import store
from harness.experiment import BadInput, Experiment, config_hash, config_values, one_line
from harness.launch import launch, prepare_launcher
from harness.launchers import SlurmLauncher
from harness.status import still_scheduled

CONF = Path(__file__).resolve().parent.parent / "conf"
HARNESS_KEYS = ("out", "resume", "wait", "seed", "max_points", "sweep_id", "job")  # config.yaml
USER_KEYS = ("out", "resume", "wait", "seed", "max_points")  # the harness keys for users
SET_BY_HARNESS = ("out", "sweep_id", "job")  # given to every job by the harness
RESUME_SETTINGS = ("out", "resume", "wait")  # what a resume may set besides Hydra's settings


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


def available_experiments(config_dirs: list[Path] = ()) -> list[str]:
    """The experiments in conf/experiment/ and in each config dir's experiment/."""
    folders = [CONF, *config_dirs]
    return sorted({p.stem for folder in folders for p in (folder / "experiment").glob("*.yaml")})


def run(argv: list[str]) -> int:
    """Run the sweep that the overrides in `argv` describe; returns the exit code."""
    arguments, config_dirs = split_config_dirs(argv)
    overrides = _parse(arguments)
    experiment = _experiment_name(overrides, config_dirs)
    _check_harness_keys(overrides)
    resume = next((o.value() for o in overrides if o.get_key_element() == "resume"), None)
    with initialize_config_dir(config_dir=str(CONF), job_name="harness", version_base=None):
        if resume:
            sweep, cfg = _resumed(overrides, experiment, str(resume), config_dirs)
            launcher = prepare_launcher(cfg)
        else:
            fixed = [o.input_line for o in overrides if not o.is_sweep_override()]
            cfg = _compose([*fixed, f"sweep_id={new_sweep_id()}"], experiment, config_dirs)
            launcher = prepare_launcher(cfg)
            sweep = plan(cfg, [o for o in overrides if o.is_sweep_override()])
            _write_manifest(sweep, argv)
        sweep.config_dirs = config_dirs
        print(f"sweep {sweep.id}: {experiment}, {len(sweep.points)} points to run", flush=True)
        started = time.perf_counter()
        try:
            with _terminate_as_interrupt():
                ended = launch(cfg, sweep, launcher)
        except KeyboardInterrupt as stop:
            if isinstance(launcher, SlurmLauncher):
                advice = f"its SLURM tasks run on; follow them with: {status_command(sweep)}"
            else:
                advice = f"finish it with: {resume_command(sweep)}"
            print(f"\ninterrupted; {advice}", file=sys.stderr)
            return 143 if isinstance(stop, Terminated) else 130
        except BadInput:  # nothing was launched: a new sweep leaves no trace
            if not resume:
                _discard(sweep)
            raise
        except OSError as error:  # the store cannot be written: disk full, permissions
            said = f"{error.strerror or error}: {error.filename}" if error.filename else error
            print(
                f"error: cannot write the sweep's rows ({said}); the sweep stopped. Once it "
                f"can be written, finish it with: {resume_command(sweep)}",
                file=sys.stderr,
            )
            return 1
    if not ended:
        print(f"sweep {sweep.id}: follow it with: {status_command(sweep)}")
        return 0
    return report(sweep, time.perf_counter() - started)


class Terminated(KeyboardInterrupt):
    """SIGTERM, stopping a sweep as Ctrl-C does (exit code 143)."""


@contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """While a sweep runs here, SIGTERM stops it as Ctrl-C does: its points keep what they
    wrote and the resume command is printed."""

    def stop(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def split_config_dirs(argv: list[str]) -> tuple[list[str], list[Path]]:
    """Hydra's --config-dir DIR (or --config-dir=DIR, -cd DIR): folders with experiment/NAME.yaml
    files of the user's own, searched after conf/. Returns the other arguments and the folders."""
    rest, folders, args = [], [], iter(argv)
    for arg in args:
        name, equals, value = arg.partition("=")
        if name not in ("--config-dir", "-cd") or (name == "-cd" and equals):
            rest.append(arg)
            continue
        value = value if equals else next(args, "")
        folder = Path(value).expanduser().resolve()
        if not value or not folder.is_dir():
            raise BadInput(f"--config-dir takes a folder, got {value!r}")
        folders.append(folder)
    return rest, folders


def new_sweep_id() -> str:
    """A sweep id that sorts by start time (UTC): 20261129-141503-3fa2."""
    return f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def plan(cfg: DictConfig, sweeps: list[Override]) -> Sweep:
    """The sweep's points, in grid order, each checked against the experiment's signature."""
    values = config_values(cfg)
    grid = OmegaConf.to_container(cfg.hydra.sweeper.get("params") or {})
    chosen = _chosen(grid, sweeps, cfg)
    _check_size(chosen, values["max_points"])  # before the experiment (and torch) is imported
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
    return _sweep(cfg, experiment, points)


def _sweep(cfg: DictConfig, experiment: Experiment, points: list[Point]) -> Sweep:
    task = [o for o in cfg.hydra.overrides.task if _key(o) not in SET_BY_HARNESS]
    results = Path(cfg.out).resolve() / "results"
    return Sweep(cfg.sweep_id, experiment, results, task, points, list(cfg.hydra.overrides.hydra))


def report(sweep: Sweep, seconds: float) -> int:
    """Print the sweep's table, claims and counts; the exit code says whether any point failed."""
    from analysis.claims import claims_table, outcome, planned
    from analysis.report import markdown, sweep_table

    manifest = store.read_manifest(sweep.results, sweep.experiment.name, sweep.id)
    rows = store.read(sweep.results, sweep.experiment.name, sweep.id)
    rows = store.as_planned(rows, manifest, sweep.results)
    points = manifest["points"]
    statuses, total = store.job_statuses(rows), len(points)
    unfinished = total - int(statuses.isin(store.DONE).sum())
    params = list(points[0]["params"]) if points else []
    table = sweep_table(planned(rows, points), sweep.experiment.config, params)
    if table is not None:
        print(f"{table.columns.name}:\n{markdown(table)}")
    for line in claims_table(rows, sweep.experiment.config, points).itertuples():
        print(f"claim {line.result}: {line.claim} ({outcome(line)})")
    print(
        f"sweep {sweep.id}: {store.status_counts(statuses, total)}; in {seconds:.1f} s; "
        f"rows in {store.sweep_dir(sweep.results, sweep.experiment.name, sweep.id)}"
    )
    if unfinished:
        print(
            f"{unfinished} of {total} points have no answer; rerun them with: "
            f"{resume_command(sweep)}",
            file=sys.stderr,
        )
    return 1 if unfinished else 0


def resume_command(sweep: Sweep) -> str:
    folders = "".join(f"--config-dir {shlex.quote(str(folder))} " for folder in sweep.config_dirs)
    return f"python -m harness {folders}+experiment={sweep.experiment.name} resume={sweep.id}"


def status_command(sweep: Sweep) -> str:
    return f"python -m harness status {sweep.id}"


def _parse(argv: list[str]) -> list[Override]:
    try:
        return OverridesParser.create().parse_overrides(argv)
    except OverrideParseException as error:
        raise BadInput(f"cannot parse {error.override!r}: {one_line(error)}") from None


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _check_harness_keys(overrides: list[Override]) -> None:
    """No key twice (the last would silently win), none of the keys the harness sets, and the
    harness's own keys with values of their kind."""
    keys = [o.get_key_element().lstrip("+~") for o in overrides]
    twice = sorted({key for key in keys if keys.count(key) > 1})
    if twice:
        raise BadInput(f"{', '.join(twice)} given more than once: give each key once")
    for override in overrides:
        key, value = override.get_key_element().lstrip("+~"), override.value()
        if key in ("sweep_id", "job"):
            raise BadInput(f"{key} is set by the harness for each job, not on the command line")
        if key == "wait" and not isinstance(value, bool):
            raise BadInput(f"wait must be true or false, got {override.get_value_element_as_str()}")
        if key == "resume" and not (isinstance(value, str) and value):
            raise BadInput("resume takes a sweep id: resume=SWEEP_ID")


def _experiment_name(overrides: list[Override], config_dirs: list[Path]) -> str:
    names = [o for o in overrides if o.get_key_element().lstrip("+") == "experiment"]
    available = ", ".join(available_experiments(config_dirs))
    if not names:
        raise BadInput(f"no experiment given: add +experiment=NAME (one of {available})")
    if names[0].is_sweep_override():
        raise BadInput("one experiment per sweep: +experiment takes one name")
    name = str(names[0].value())
    if name not in available_experiments(config_dirs):
        raise BadInput(f"unknown experiment '{name}' (available: {available})")
    return name


def _compose(overrides: list[str], experiment: str, config_dirs: list[Path]) -> DictConfig:
    """The config, with the config dirs on Hydra's search path (so every job's config has them)."""
    if config_dirs:
        folders = ",".join(f"file://{folder}" for folder in config_dirs)
        overrides = [f"hydra.searchpath=[{folders}]", *overrides]
    try:
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    except MissingConfigException as error:
        group, _, name = str(error.missing_cfg_file).rpartition("/")
        options = ", ".join(error.options or [])
        raise BadInput(f"unknown {group} '{name}' (available: {options})") from None
    except ConfigCompositionException as error:
        cause = error.__cause__
        if isinstance(cause, OmegaConfBaseException) and "not in struct" in str(cause):
            key = cause.full_key or str(cause).split("'")[1]
            if key.startswith("hydra."):
                raise BadInput(f"unknown key '{key}' (see conf/hydra/ and Hydra's own)") from None
            keys = _keys(experiment, config_dirs)
            raise BadInput(f"unknown key '{key}' for {experiment} ({keys})") from None
        raise BadInput(one_line(error)) from None
    except (HydraException, OmegaConfBaseException) as error:
        raise BadInput(one_line(error)) from None
    with open_dict(cfg):  # jobs elsewhere (SLURM) and run dirs get it absolute
        cfg.out = str(Path(cfg.out).resolve())
    return cfg


def _keys(experiment: str, config_dirs: list[Path]) -> str:
    files = [folder / "experiment" / f"{experiment}.yaml" for folder in (CONF, *config_dirs)]
    node = OmegaConf.load(next(path for path in files if path.exists()))
    names = [k for k in node if k not in ("experiment", "hydra")]
    return "its keys: " + ", ".join(sorted(names) + list(USER_KEYS))


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
    fixed = {_key(o) for o in cfg.hydra.overrides.task}
    parser = OverridesParser.create()
    grid = parser.parse_overrides([f"{k}={v}" for k, v in yaml_params.items() if k not in fixed])
    return {override.get_key_element().lstrip("+"): override for override in [*grid, *sweeps]}


def _check_size(chosen: dict[str, Override], max_points) -> None:
    """Refuse a grid of more than max_points points, counted without expanding any axis."""
    if isinstance(max_points, bool) or not isinstance(max_points, int) or max_points < 1:
        raise BadInput(f"max_points must be a positive integer, got {max_points!r}")
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


def _write_manifest(sweep: Sweep, argv: list[str]) -> None:
    """The sweep's own record: its command, config and every point, for resume and reports;
    the sweep's first write, so an out dir that cannot be written is bad input here."""
    manifest = {
        "experiment": sweep.experiment.name,
        "sweep": sweep.id,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": shlex.join(["python", "-m", "harness", *argv]),
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
        _discard(sweep)
        folder = store.sweep_dir(sweep.results, sweep.experiment.name, sweep.id)
        raise BadInput(f"cannot write to {folder}: {error.strerror or error}") from None


def _discard(sweep: Sweep) -> None:
    """Remove a new sweep's folders while it holds no rows (only its manifest): its store
    folder and its run folder (hydra.sweep.dir: Hydra's and submitit's files)."""
    folder = store.sweep_dir(sweep.results, sweep.experiment.name, sweep.id)
    if not store.result_files(sweep.results, sweep.experiment.name, sweep.id):
        shutil.rmtree(folder, ignore_errors=True)
        runs = sweep.results.parent / "runs" / sweep.experiment.name / sweep.id
        shutil.rmtree(runs, ignore_errors=True)


def _resumed(
    overrides: list[Override], experiment: str, sweep_id: str, config_dirs: list[Path]
) -> tuple[Sweep, DictConfig]:
    """The sweep to resume, with its points that have no answer yet, and its config.

    The config is composed from the sweep's own overrides, its launcher settings unless the
    command line names a launcher, and the command line's settings (out, wait, Hydra's, and
    the experiment's `resources`: parameters such as memory_cap_mib that change how a point
    runs, not what it computes), so each job recomposes what it first ran, with more room if
    asked; users' experiments come from the command line's --config-dir. Points that SLURM
    still queues or runs are left to it.
    """
    results = _results_root(overrides)
    manifest = store.read_manifest(results, experiment, sweep_id)
    if manifest is None:
        folder = store.sweep_dir(results, experiment, sweep_id)
        if folder.is_dir():
            raise BadInput(f"{folder / store.MANIFEST} is missing or unreadable: cannot resume")
        known = ", ".join(store.sweeps(results, experiment)[-3:]) or "none yet"
        raise BadInput(f"no sweep {sweep_id} of {experiment} in {results} (latest: {known})")
    _check_writable(store.sweep_dir(results, experiment, sweep_id))
    resources = manifest.get("experiment_config", {}).get("resources") or []
    allowed = (*RESUME_SETTINGS, *resources)
    settings = [
        o.input_line for o in overrides if o.is_hydra_override() or _key(o.input_line) in allowed
    ]
    extra = [o.input_line for o in overrides if o.input_line not in settings]
    extra = [line for line in extra if _key(line) != "experiment"]
    if extra:
        may = ", ".join(["out", "wait", "hydra.*", *resources])
        raise BadInput(
            f"resume={sweep_id} reruns that sweep's own points; drop {' '.join(extra)} "
            f"(a resume may set {may})"
        )
    replaced = {_key(line) for line in settings} | {*SET_BY_HARNESS, "hydra.searchpath"}
    original = [line for line in manifest["overrides"] if _key(line) not in replaced]
    launcher = manifest.get("hydra_overrides", [])
    if any(_key(line) == "hydra/launcher" for line in settings):  # another launcher: its own
        launcher = []
    launcher = [line for line in launcher if _key(line) not in replaced]
    cfg = _compose(
        [*original, *launcher, *settings, f"sweep_id={sweep_id}"], experiment, config_dirs
    )
    values = config_values(cfg)
    experiment_ = Experiment.load(values["experiment"])
    sweep = _sweep(cfg, experiment_, [])
    scheduled = set(still_scheduled(manifest))
    if scheduled:
        print(f"{len(scheduled)} points are still queued or running on SLURM: left to it")
    changed = {key: values[key] for key in resources if _key_given(key, settings)}
    sweep.points = [
        Point(p.job, p.overrides, experiment_.params({**p.params, **changed}))
        for p in _unfinished(sweep, manifest)
        if p.job not in scheduled
    ]
    if changed:  # the manifest says what each point runs with, so its rerun's rows match it
        rerun = {p.job: p.params for p in sweep.points}
        for point in manifest["points"]:
            if point["job"] in rerun:
                point["params"] = rerun[point["job"]]
                point["config_hash"] = config_hash(experiment, rerun[point["job"]])
        store.write_manifest(results, manifest)
    return sweep, cfg


def _key_given(key: str, lines: list[str]) -> bool:
    return any(_key(line) == key for line in lines)


def _check_writable(folder: Path) -> None:
    """One line (bad input) unless a file can be written in `folder`."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as error:
        raise BadInput(f"cannot write to {folder}: {error.strerror or error}") from None


def _results_root(overrides: list[Override]) -> Path:
    out = next((o.value() for o in overrides if o.get_key_element() == "out"), None)
    if out is None:
        out = OmegaConf.load(CONF / "config.yaml").out
    return Path(str(out)).resolve() / "results"


def _unfinished(sweep: Sweep, manifest: dict) -> list[Point]:
    """The manifest's points without an answer yet (store.DONE: ok, unsupported).

    Their rows in a compacted file move back into job files of their own, which their reruns
    replace, so that the folder as it lies holds each row once after the resume too; the files
    the read skipped as damaged (their points count as not run) are moved aside.
    """
    rows = store.read(sweep.results, sweep.experiment.name, sweep.id)
    statuses = store.job_statuses(store.as_planned(rows, manifest, sweep.results))
    for moved in store.set_aside(sweep.results, sweep.experiment.name, sweep.id):
        print(f"moved a damaged file aside: {moved}")
    done = set(statuses[statuses.isin(store.DONE)].index)
    points = [
        Point(p["job"], p["overrides"], p["params"])
        for p in manifest["points"]
        if p["job"] not in done
    ]
    store.release(sweep.results, sweep.experiment.name, sweep.id, [p.job for p in points])
    return points
