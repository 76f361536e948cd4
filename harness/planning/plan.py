"""A new sweep's plan: the grid expanded (Hydra's override parser, BasicSweeper's rule: the
command line replaces the experiment's hydra.sweeper.params key by key), every point checked
against the experiment's signature before any runs, each with a stable job number, and the
manifest that records them."""

import functools
import glob
import itertools
import math
import os
import secrets
import shutil
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, QuotedString
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from harness import provenance, reuse, store
from harness.errors import BadInput, one_line
from harness.measuring import columns
from harness.names import (
    SET_BY_HARNESS,
    check_name,
    experiment_file,
    keeping,
    key_of,
    typo_of,
)
from harness.names import (
    override as override_line,
)
from harness.pinning import codestore, sources
from harness.planning.checks import (
    axis_size,
    check_code,
    check_environment,
    check_fail_fast,
    check_file_name,
    check_keys,
    check_parameter_names,
    check_positive_int,
    check_report_spec,
    check_size,
    check_streaming,
)
from harness.planning.config import compose_config
from harness.planning.experiment import Experiment, config_values, hasher, keyed_config
from harness.searching import search

ABSENT = object()


@dataclass
class Point:
    job: int
    overrides: list[str]  # this point's grid values, as Hydra overrides
    params: dict  # the experiment function's keyword arguments: what the point computes
    config_hash: str  # their digest (experiment.config_hash), which the point's rows carry
    cell: int | None = None  # a search's trial: its cell of the grid, and its place in it
    slot: int | None = None

    def planned(self) -> dict:
        """Its manifest entry's params and config_hash (a trial's cell and slot)."""
        trial = {"cell": self.cell, "slot": self.slot} if self.cell is not None else {}
        return {"params": self.params, "config_hash": self.config_hash, **trial}

    def job_of(self, sweep: "Sweep", decided: bool = False) -> "Job":
        """The point as its job: what a launcher ships and run_point runs."""
        searched = sweep.experiment.config.get("search") if self.cell is not None else None
        return Job(self.job, tuple(job_overrides(sweep, self)), self.params, self.config_hash,
                   self.cell, self.slot, sweep.reuse, decided, searched)  # fmt: skip


def job_overrides(sweep: "Sweep", point: Point) -> list[str]:
    """A job's overrides: the sweep's own, the point's grid values, then the harness's (out
    quoted for Hydra: a folder's name may hold spaces, "=" or brackets)."""
    return [
        *sweep.overrides,
        *point.overrides,
        override_line("out", str(sweep.results.parent)),
        f"sweep_id={sweep.id}",
        f"job={point.job}",
    ]


@dataclass(frozen=True)
class Job:
    """One job of a sweep, fixed when the sweep was planned (or resumed): what a launcher ships as
    it is and harness.running.job.run_point runs. Its number, the overrides its config is
    composed from, the parameters it computes and their config_hash; a search's trial's cell
    and slot, and the sweep's search; the sweep's reuse (harness.reuse.setting) and whether
    its answer was looked up before it was launched (`decided`: else the point's process
    looks)."""

    job: int
    overrides: tuple[str, ...]
    params: dict
    config_hash: str
    cell: int | None = None
    slot: int | None = None
    reuse: dict | None = None
    decided: bool = False
    search: dict | None = None


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
    code: str | None = None  # the digest of the code its points run (harness.pinning.codestore)
    code_store: Path | None = None  # where that code is kept
    keyed: dict | None = None  # its config's keys in its points' config_hash beside their params
    again_of: str | None = None  # the sweep it runs again (python -m harness again), if it does
    tag: str | None = None  # the name the user gave it (tag=NAME), if any
    own_grid: int | None = None  # the points of its experiment's own grid (its YAML's)
    reuse: dict | None = None  # what it copies, and its inputs (harness.reuse.setting)
    # the commit of the repository holding its experiment's code, and whether it was dirty
    code_commit: tuple[str | None, bool | None] = (None, None)

    @property
    def paths(self) -> store.SweepPaths:
        """Where its files lie."""
        return store.SweepPaths(self.results, self.experiment.name, self.id)


class SweepExists(Exception):
    """The new sweep's id is taken: another sweep started in the same millisecond."""


def new_sweep_id(now: datetime | None = None) -> str:
    """A sweep id that sorts by start time (UTC) to the millisecond: 20261129-141503-3fa2, its
    last part the millisecond times 64 plus 6 random bits (two sweeps of one millisecond differ
    by chance, and record_plan refuses an id that is taken)."""
    now = now or datetime.now(UTC)
    return f"{now:%Y%m%d-%H%M%S}-{now.microsecond // 1000 * 64 + secrets.randbelow(64):04x}"


def plan_command(
    overrides: list[Override],
    experiment: str,
    config_dirs: list[Path],
    sweep_id: str,
    pin: bool = False,
) -> tuple[DictConfig, Sweep, list[str]]:
    """A new sweep's config and plan from its command line, every point checked (what a sweep
    runs, and what --help and --cfg check before they show anything), and the override lines
    that every job gets; `pin`: its code kept in the code store, and imported from there."""
    overrides, space = search.command_line(overrides)
    fixed = [*(o.input_line for o in overrides if not o.is_sweep_override()), *space]
    grid = [o for o in overrides if o.is_sweep_override()]
    cfg = compose_config([*fixed, f"sweep_id={sweep_id}"], experiment, config_dirs)
    added = absent_keys(cfg, grid)  # grid keys the config lacks, added for every job
    if added:
        cfg = compose_config([*fixed, *added, f"sweep_id={sweep_id}"], experiment, config_dirs)
    return cfg, plan(cfg, grid, added, pin, config_dirs), [*fixed, *added]


def plan(
    cfg: DictConfig, sweeps: list[Override], added: list[str] = (), pin=False, config_dirs=()
) -> Sweep:
    """The sweep's points, in grid order, each checked against the experiment's signature
    (`added`: the lines absent_keys gave, which fix no key). With `pin`, the code the points
    import is hashed and kept first (harness.pinning.codestore), and the experiment imported from
    that snapshot."""
    values = config_values(cfg)
    check_file_name(cfg, values["experiment"])
    chosen = _chosen(seeded_grid(cfg), sweeps, cfg, added)
    check_size(chosen, values["max_points"])  # before the experiment (and torch) is imported
    check_streaming(values)
    keeping(values.get("checkpoint"))  # checkpoint.keep, .best, .mode: one line here
    check_fail_fast(values.get("fail_fast", 0))
    if values.get("threads") is not None:
        check_positive_int("threads", values["threads"])
    if not isinstance(values.get("reuse"), bool):
        raise BadInput(f"reuse must be true or false, got {values.get('reuse')!r}")
    if isinstance(values["seed"], bool) or not isinstance(values["seed"], int):
        raise BadInput(f"seed must be a whole number, got {values['seed']!r}")
    check_code(values.get("code"))
    check_environment(values["experiment"].get("environment"))
    digest, code_store = None, codestore.store_of(values.get("code_store"))
    code_commit = (None, None)
    if pin:  # the experiment's code found where it lies, before it is run from its snapshot
        code_commit = provenance.git_state(sources.code_folder(values["experiment"]))
        digest = codestore.pin(values["experiment"], values["out"], code_store, config_dirs)
        codestore.enter(code_store, digest)
    experiment = Experiment.load(values["experiment"])
    check_parameter_names(experiment)
    check_keys(experiment, values, sweeps)
    axes = _axes(chosen)
    points = []
    interpolated = any(_interpolates(value) for axis in axes.values() for _, value in axis)
    config_hash = hasher(experiment.name, values)
    for job, assignment in enumerate(itertools.product(*axes.values())):
        point_values = {key: value for key, (_, value) in zip(axes, assignment, strict=True)}
        if interpolated:
            point_values = _resolved(cfg, point_values)
        params = experiment.params({**values, **point_values})
        point_overrides = [f"{key}={text}" for key, (text, _) in zip(axes, assignment, strict=True)]
        points.append(Point(job, point_overrides, params, config_hash(params)))
    if not points:
        empty = " ".join(f"{key}=[]" for key, values in axes.items() if not values)
        raise BadInput(f"the grid has no points ({empty})")
    check_report_spec(experiment, points)
    searched = search.spec(values, experiment, list(axes))
    if searched:
        search.check_launcher(cfg.hydra.launcher)
        points = search.slots(points, searched, _trial_point)
        if len(points) > values["max_points"]:
            raise BadInput(
                f"{len(points):,} trials in all, more than max_points={values['max_points']:,}: "
                "narrow the grid or search.trials"
            )
        experiment = replace(experiment, config={**experiment.config, "search": searched})
    keyed = keyed_config(values, experiment.parameters)
    return replace(sweep_of(cfg, experiment, points), code=digest, code_store=code_store,
                   keyed=keyed, reuse=reuse_setting(cfg, experiment, config_dirs),
                   code_commit=code_commit)  # fmt: skip


def reuse_setting(cfg: DictConfig, experiment: Experiment, config_dirs=()) -> dict | None:
    """The sweep's reuse (harness.reuse.setting), None where it copies nothing: with
    reuse=true on the command line it copies measurements too, with the experiment's YAML's
    `reuse: true` only answers; its declared inputs (experiment.inputs) checked, each a
    parameter or a glob relative to the experiment's config folder, made absolute."""
    folder = experiment_file(experiment.name, config_dirs).parent
    inputs = _inputs(experiment.config.get("inputs"), experiment, folder)
    if not cfg.get("reuse"):
        return None
    given = any(key_of(line) == "reuse" for line in cfg.hydra.overrides.task)
    return reuse.setting("all" if given else "answers", inputs, folder)


def _inputs(entries, experiment: Experiment, folder: Path) -> list[tuple[str, str]]:
    """experiment.inputs as (entry, the parameter it names or the absolute glob it is);
    BadInput for what is no list of names and globs, or a name one letter off a parameter."""
    if entries is None:
        return []
    if not isinstance(entries, list) or not all(isinstance(e, str) and e for e in entries):
        raise BadInput(f"{experiment.name}: experiment.inputs is a list of parameters whose "
                       f"values are paths, or globs (inputs: [data, 'tables/*.csv']), got "
                       f"{entries!r}")  # fmt: skip
    found = []
    for entry in entries:
        if entry in experiment.parameters:
            found.append((entry, entry))
            continue
        typo = typo_of(entry, experiment.parameters)
        if typo and not any(mark in entry for mark in "/*?["):
            raise BadInput(f"{experiment.name}: experiment.inputs names {entry!r}, no parameter "
                           f"and no file; did you mean {typo}?")  # fmt: skip
        found.append((entry, os.path.join(glob.escape(str(folder)), os.path.expanduser(entry))))
    return found


def _trial_point(point: Point, job: int, cell: int, slot: int) -> Point:
    """A search's trial of the cell `point`: its own job and config_hash (each trial's rows and
    checkpoint are its own)."""
    hashed = hasher("", {})({"cell_hash": point.config_hash, "slot": slot})
    return Point(job, point.overrides, point.params, hashed, cell, slot)


def absent_keys(cfg: DictConfig, sweeps: list[Override]) -> list[str]:
    """For each grid key the config lacks (a parameter with only its function's default), the
    line that adds it with its first value, +KEY=VALUE: every job carries it, so that each
    point's own value is a plain change of a key the config has (as Hydra needs it to be)."""
    lines = []
    for key, override in _chosen(seeded_grid(cfg), sweeps, cfg).items():
        if OmegaConf.select(cfg, key, default=ABSENT) is ABSENT:
            texts = override.sweep_string_iterator() if override.is_sweep_override() else None
            first = next(texts, None) if texts else override.get_value_element_as_str()
            lines += [f"+{key}={first}"] if first is not None else []
    return lines


def seeded_grid(cfg: DictConfig) -> dict:
    """The experiment's own grid (hydra.sweeper.params), {} where its config sets none."""
    params = cfg.hydra.sweeper.get("params")
    return OmegaConf.to_container(params) if params else {}


def sweep_of(cfg: DictConfig, experiment: Experiment, points: list[Point]) -> Sweep:
    task = [o for o in cfg.hydra.overrides.task if key_of(o) not in SET_BY_HARNESS]
    results = Path(cfg.out).resolve() / "results"
    again_of = cfg.get("again_of")
    if again_of is not None:
        check_name("again_of", str(again_of))
    tag = None if cfg.get("tag") is None else check_name("tag", str(cfg.tag))
    grid = seeded_grid(cfg)
    own = math.prod(axis_size(o) for o in OverridesParser.create().parse_overrides(
        [f"{key}={value}" for key, value in grid.items()]))  # fmt: skip
    return Sweep(cfg.sweep_id, experiment, results, task, points, list(cfg.hydra.overrides.hydra),
                 again_of=None if again_of is None else str(again_of), tag=tag,
                 own_grid=own)  # fmt: skip


def _chosen(
    yaml_params: dict, sweeps: list[Override], cfg: DictConfig, added: list[str] = ()
) -> dict[str, Override]:
    """key -> its override: the experiment's grid, then the command line's. A key fixed on the
    command line (length=256) leaves the grid; one swept there replaces it."""
    task = OmegaConf.to_container(cfg.hydra.overrides.task, resolve=False)  # lines as typed
    fixed = {key_of(o) for o in task if o not in added}
    parser = OverridesParser.create()
    grid = parser.parse_overrides([f"{k}={v}" for k, v in yaml_params.items() if k not in fixed])
    return {override.get_key_element().lstrip("+"): override for override in [*grid, *sweeps]}


def _axes(chosen: dict[str, Override]) -> dict:
    """key -> [(text, value)] for each key of the grid."""
    axes = {}
    for key, override in chosen.items():
        if override.is_sweep_override():
            texts = list(override.sweep_string_iterator())
            values = map(_plain, override.sweep_iterator())
            axes[key] = list(zip(texts, values, strict=True))
            _check_distinct(key, axes[key])
        else:
            axes[key] = [(override.get_value_element_as_str(), override.value())]
    return axes


def _check_distinct(key: str, values: list[tuple[str, object]]) -> None:
    """BadInput where a key's grid gives a value twice (n=1,2,2 would run n=2 twice), or two
    values of different types that are equal or read alike (1, '1' and 1.0: points of their
    own, one cell of every table and one key of the store's lines)."""
    seen: dict = {}
    for text, value in values:
        number = float(value) if columns.is_number(value) else None
        for alike in (("text", str(value)), ("number", number)):
            if alike[1] is None:
                continue
            if alike in seen:
                earlier, before = seen[alike]
                if type(before) is type(value):
                    raise BadInput(f"{key} lists {text} twice: give each value once")
                raise BadInput(
                    f"{key}'s values {earlier} ({type(before).__name__}) and {text} "
                    f"({type(value).__name__}) would share a cell of its tables: give them as "
                    "one type"
                )
            seen[alike] = text, value


def _plain(value):
    """A grid value as the job's config holds it: a quoted string as its text, within lists and
    dicts too."""
    if isinstance(value, QuotedString):
        return value.text
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {_plain(key): _plain(item) for key, item in value.items()}
    return value


def _interpolates(value) -> bool:
    """Whether a grid value holds an interpolation ("${...}"), within lists and dicts too."""
    if isinstance(value, str):
        return "${" in value
    if isinstance(value, dict):
        return any(_interpolates(item) for pair in value.items() for item in pair)
    return isinstance(value, list) and any(_interpolates(item) for item in value)


def _resolved(cfg: DictConfig, point_values: dict) -> dict:
    """A point's grid values as its config resolves them (an interpolation such as "${seed}",
    or "${now:...}", resolved here once: what the manifest plans is what runs)."""
    own = OmegaConf.masked_copy(cfg, [key for key in cfg if key != "hydra"])
    with open_dict(own):
        for key, value in point_values.items():
            OmegaConf.update(own, key, value, merge=False)
    try:
        values = OmegaConf.to_container(own, resolve=True)
    except OmegaConfBaseException as error:
        raise BadInput(one_line(error)) from None
    return {key: functools.reduce(dict.get, key.split("."), values) for key in point_values}


def _code_commit(sweep: Sweep) -> tuple[str | None, bool | None]:
    """The commit of the repository that held the experiment's code as it was pinned, and
    whether it was dirty; a sweep that runs another again runs that one's snapshot, and so
    its commit."""
    if sweep.again_of:
        paths = store.SweepPaths(sweep.results, sweep.experiment.name, sweep.again_of)
        original = store.read_manifest(paths) or {}
        return original.get("git_commit"), original.get("git_dirty")
    return sweep.code_commit


def record_plan(sweep: Sweep) -> None:
    """The sweep's own record: its command, config and every point, for resume and reports;
    the sweep's first write, so an out dir that cannot be written is bad input here."""
    manifest = {
        "experiment": sweep.experiment.name,
        "sweep": sweep.id,
        "created_at": datetime.now(UTC).isoformat(timespec="microseconds"),
        "command": sweep.command,
        "code_digest": sweep.code,
        "code_store": str(sweep.code_store) if sweep.code_store else None,
        **dict(zip(("git_commit", "git_dirty"), _code_commit(sweep), strict=True)),
        "keyed_config": sweep.keyed,
        "again_of": sweep.again_of,
        "tag": sweep.tag,
        "own_grid_points": sweep.own_grid,
        "reuse": sweep.reuse,
        "config_dirs": [str(folder) for folder in sweep.config_dirs],
        "overrides": sweep.overrides,
        "hydra_overrides": sweep.hydra_overrides,
        "experiment_config": sweep.experiment.config,
        "points": [
            {
                "job": p.job,
                "overrides": p.overrides,
                "params": p.params,
                "config_hash": p.config_hash,
                **({"cell": p.cell, "slot": p.slot} if p.cell is not None else {}),
            }
            for p in sweep.points
        ],
    }
    try:
        store.write_manifest(sweep.results, manifest, new=True)
    except FileExistsError:  # another sweep's folder: left as it is
        raise SweepExists(sweep.id) from None
    except OSError as error:
        discard(sweep)
        raise BadInput(f"cannot write to {sweep.paths.folder}: {error.strerror or error}") from None


def discard(sweep: Sweep) -> None:
    """Remove a new sweep's folders while it holds no rows (only its manifest): its store
    folder and its run folder (hydra.sweep.dir: Hydra's and submitit's files)."""
    if not store.result_files(sweep.results, sweep.experiment.name, sweep.id):
        shutil.rmtree(sweep.paths.folder, ignore_errors=True)
        shutil.rmtree(sweep.paths.runs, ignore_errors=True)
