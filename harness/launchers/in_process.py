"""Running jobs in a process, the way every launcher of the harness runs a point (a third-party
Hydra launcher plugin runs it through Hydra's run_job instead: hydra_plugin): job_runner
composes a job's config and calls the task function (harness.running.job, whose run_point runs
the point), in the command's process (run_here, InProcessLauncher: Hydra's basic launcher), in a
warm worker, or in a process of its own (work; pack and work_packed carry jobs there as bytes).

Hydra's basic launcher at the speed of a loop: a sweep's points one after another here, each
from the state the first one started from (SameStart), as on a warm worker.

Hydra's BasicLauncher composes the whole config again for every job (some 50 ms: the search
path, the defaults list, deep copies), and its run_job deep-copies it twice more, writes three
YAML files and configures logging from scratch; for a cheap point that is nearly all it costs.
Here Hydra composes the config once for each distinct shape of a job's overrides (the config
groups it chooses, the keys it sets), and each point's values are set on that config as Hydra's
own override step sets them (OmegaConf.update, merge=True); tests/test_in_process.py checks that
the result equals what BasicLauncher composes, for every experiment.

Each job keeps what Hydra gives it: its run folder with its log (harness.log), the config it
ran with and its overrides (.hydra/config.yaml, .hydra/overrides.yaml), and Hydra's own config,
which only differs between jobs in their numbers, once per sweep (.hydra/hydra.yaml in the
sweep's run folder). What this cannot reproduce exactly goes through Hydra's own launcher:
hydra.callbacks, hydra.job.env_set or hydra.job.chdir in the config; an override that adds or
deletes a key, or sets one the config lacks, is composed by Hydra for that point.
"""

import contextlib
import copy
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path

import cloudpickle
import yaml
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType, ValueType
from hydra.core.singleton import Singleton
from hydra.core.utils import configure_log, run_job, setup_globals
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from harness import files
from harness.errors import StoreUnwritable, with_type
from harness.launchers.fresh import ProcessState
from harness.launchers.hydra_internals import hydra_context
from harness.launchers.protocol import Job, Launcher, PointProcess, summary_of, unwritable
from harness.planning.experiment import config_values
from harness.running.job import run_point

UNSET = object()
PLACE = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")  # an interpolation of a plain key: ${sweep_id}
INTEGER = re.compile(r"([A-Za-z_][\w.]*)=(-?(?:0|[1-9][0-9]*))")  # as Hydra's grammar reads it
YAML = {"Dumper": getattr(yaml, "CSafeDumper", yaml.SafeDumper), "sort_keys": False}

log = logging.getLogger(__name__)


class InProcess:
    """Configs and runs of a sweep's jobs in this process, for Hydra's basic launcher."""

    def __init__(self, cfg: DictConfig, task_function, same: "SameStart | None" = None):
        self.master, self.task_function = cfg, task_function
        self.same = same  # each point from the first one's state (run_here's); None: as it is
        self.loader = GlobalHydra.instance().config_loader()
        self.parser = OverridesParser.create()
        self.parsed: dict[str, Override] = {}
        # The config groups: those its defaults chose, and every top-level one (a list of a
        # group's options, sinks=[a,b], is not among the choices Hydra records).
        self.groups = set(cfg.hydra.runtime.choices) | set(self.loader.list_groups(""))
        self.composed: dict[tuple, DictConfig] = {}
        self.log_dir: Path | None = None
        self.files: list[logging.FileHandler] = []  # the job log's files
        self.saved_hydra = False
        self.yaml: dict[str, tuple[object, str]] = {}  # each top-level key's value and its YAML

    @staticmethod
    def suits(cfg: DictConfig) -> bool:
        """Whether this reproduces Hydra's job for this config (else Hydra's launcher runs it)."""
        job = cfg.hydra.job
        return not (cfg.hydra.callbacks or job.env_set or job.chdir)

    def prepare(self, overrides: list[str], job: int) -> "Shape":
        """The job's config, as the Shape that holds it: for the first job of its shape, the
        sweep's own config with the job's values set when the job's other lines are the sweep's
        own, else composed by Hydra; for the next ones, only the lines that differ from the last
        job's are set."""
        parsed = [self._parse(line) for line in overrides]
        key = tuple(o.key_or_group if self._settable(o) else o.input_line for o in parsed)
        shape = self.composed.get(key)
        if shape is None:
            cfg = self._from_master(parsed) or self.loader.load_sweep_config(self.master, overrides)
            shape = Shape(cfg, parsed)
            if all(self._settable(o, cfg) for o in parsed if o.key_or_group in key):
                self.composed[key] = shape  # later jobs of this shape set values on it
        else:
            shape.set(parsed)
        shape.job = job
        return shape

    def _from_master(self, parsed: list[Override]) -> DictConfig | None:
        """The sweep's config (Hydra's composition of its own lines) with the job's plain values
        set on a copy: what Hydra composes for the job when every line of the job that is not a
        plain value is one of the sweep's own; None otherwise."""
        own = set(self.master.hydra.overrides.task)
        plain = [o for o in parsed if self._settable(o, self.master)]
        if any(o.input_line not in own for o in parsed if o not in plain):
            return None
        cfg = copy.deepcopy(self.master)
        with read_write(cfg), open_dict(cfg):
            for override in plain:
                OmegaConf.update(cfg, override.key_or_group, override.value(), merge=True)
            cfg.hydra.overrides.task = [o.input_line for o in parsed]
            cfg.hydra.job.override_dirname = _override_dirname(cfg, parsed)
        return cfg

    def run(self, spec: Job) -> dict:
        """Run one job as Hydra's run_job would; its summary (a failed one for an exception
        outside the experiment, which the job itself turns into a row). An OSError, a store or
        folder that cannot be written, is raised: the sweep stops rather than compute points
        whose rows cannot land."""
        overrides, job = list(spec.overrides), spec.job
        try:
            shape = self.prepare(overrides, job)
            run_dir = shape.run_dir()
            configure = self.log_dir is None or not self._logging()
            if configure or shape.hydra_resolver:  # what reads the whole config
                cfg = shape.cfg
                with read_write(cfg.hydra), open_dict(cfg.hydra):
                    cfg.hydra.runtime.output_dir = str(run_dir)
                if shape.hydra_resolver:
                    HydraConfig.instance().set_config(cfg)
            self._log_to(shape, run_dir, configure)
            self._save(shape, overrides, run_dir)
            with self.same.point(job) if self.same else contextlib.nullcontext():
                return run_point(shape.values, str(run_dir), self.task_function.command, spec)
        except OSError:
            raise
        except Exception as error:
            return {"status": "failed", "error": f"harness error: {with_type(error)}"}
        finally:
            for handler in self.files:
                handler.flush()

    def _parse(self, line: str) -> Override:
        """A job's override line as Hydra parses it. A key set to an integer (job=17, and a
        grid's integers), the most common line and a new one for every job, is read here:
        what Hydra's grammar makes of it is that integer."""
        if line not in self.parsed:
            whole = INTEGER.fullmatch(line)
            if whole:
                key, value = whole[1], int(whole[2])
                self.parsed[line] = Override(
                    type=OverrideType.CHANGE, key_or_group=key, value_type=ValueType.ELEMENT,
                    _value=value, input_line=line,
                )  # fmt: skip
            else:
                (self.parsed[line],) = self.parser.parse_overrides([line])
        return self.parsed[line]

    def _settable(self, override: Override, cfg: DictConfig | None = None) -> bool:
        """A plain value that changes a key: not a config group (one the defaults list chooses:
        hydra.runtime.choices), no package, no + or ~; and, given the config, a key it has."""
        key = override.key_or_group
        plain = override.type == OverrideType.CHANGE and override.package is None
        if not plain or key in self.groups or override.is_sweep_override():
            return False
        return cfg is None or OmegaConf.select(cfg, key, default=UNSET) is not UNSET

    def _logging(self) -> bool:
        """Whether the job log's files are still logging's: a warm worker puts logging back as it
        was before each point (harness.launchers.fresh), and the next job configures it again."""
        return all(handler in logging.getLogger().handlers for handler in self.files)

    def _log_to(self, shape: "Shape", run_dir: Path, configure: bool) -> None:
        """The job's log in its run folder: Hydra's job logging, configured for the first job
        (and again where it was taken away), its files moved to each next job's folder."""
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / ".hydra").mkdir(exist_ok=True)  # _save's folder
        if configure:
            configure_log(shape.cfg.hydra.job_logging, shape.cfg.hydra.verbose)
            self.files = [h for h in _file_handlers() if Path(h.baseFilename).parent == run_dir]
        else:
            for handler in self.files:
                handler.close()  # reopened, in the new folder, by its next record
                handler.baseFilename = str(run_dir / Path(handler.baseFilename).name)
                open(handler.baseFilename, "a").close()  # the log is there from the start
        self.log_dir = run_dir

    def _save(self, shape: "Shape", overrides: list[str], run_dir: Path) -> None:
        """The job's config (resolved, as it ran) and overrides; Hydra's config once per sweep."""
        folder = run_dir / ".hydra"
        (folder / "config.yaml").write_text(self.config_yaml(shape.values))
        (folder / "overrides.yaml").write_text(yaml.dump(list(overrides), **YAML))
        if not self.saved_hydra:  # this run's: a resume may have changed the launcher
            shared = run_dir.parent / folder.name / "hydra.yaml"
            files.write_text(shared, OmegaConf.to_yaml(OmegaConf.masked_copy(shape.cfg, "hydra")))
            self.saved_hydra = True

    def config_yaml(self, values: dict) -> str:
        """A job's values as YAML (yaml.dump's text), a top-level key at a time: the text of a
        key whose value is the very object the last job had (a job's values share what did not
        change with the last job's: Shape.set) is not made again."""
        parts = []
        for key, value in values.items():
            known = self.yaml.get(key)
            if known is None or known[0] is not value:
                known = self.yaml[key] = (value, yaml.dump({key: value}, **YAML))
            parts.append(known[1])
        return "".join(parts)


class Shape:
    """A config Hydra composed for a job, and the lines and resolved values of the last job set
    on it. When the job's own config (all but Hydra's node) has no interpolation, a job's values
    are the last job's with its changed plain values set, without resolving the config again;
    and the config itself, which then only the first job reads, is brought up to date only when
    it is asked for (`cfg`)."""

    def __init__(self, cfg: DictConfig, parsed: list[Override]):
        self._cfg, self.parsed = cfg, list(parsed)
        self.pending: dict[int, Override] = {}  # lines not yet set on the config, by position
        self.job: int | None = None
        self.numbered: int | None = None  # the job number the config holds
        self.dirname = _dirname_settings(cfg)
        task = OmegaConf.to_yaml(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]))
        self.hydra_resolver = "${hydra:" in task  # needs HydraConfig set for each job
        self.interpolated = "${" in task
        self.values = config_values(cfg)
        raw = OmegaConf.to_container(cfg.hydra.sweep, resolve=False)
        self.dirs = {name: raw[name] for name in ("dir", "subdir")}

    @property
    def cfg(self) -> DictConfig:
        """The job's config: the lines set since it was last asked for, and the job's number."""
        cfg = self._cfg
        if self.pending or self.numbered != self.job:
            with read_write(cfg), open_dict(cfg):
                for i, override in self.pending.items():
                    OmegaConf.update(cfg, override.key_or_group, override.value(), merge=True)
                    cfg.hydra.overrides.task[i] = override.input_line
                if self.pending:
                    dirname = _override_dirname(cfg, self.parsed, self.dirname)
                    cfg.hydra.job.override_dirname = dirname
                if self.job is not None:
                    cfg.hydra.job.id = cfg.hydra.job.num = self.job
            self.pending.clear()
            self.numbered = self.job
        return cfg

    def set(self, parsed: list[Override]) -> None:
        """The job's lines: those that differ from the last job's."""
        changed = [
            (i, o) for i, o in enumerate(parsed) if o.input_line != self.parsed[i].input_line
        ]
        for i, override in changed:
            self.pending[i] = self.parsed[i] = override
        scalars = all(isinstance(o.value(), int | float | str | bool) for _, o in changed)
        if self.interpolated or not scalars:
            self.values = config_values(self.cfg)
            return
        self.values = dict(self.values)
        for _, override in changed:
            _set_path(self.values, override.key_or_group.split("."), override.value())

    def run_dir(self) -> Path:
        """hydra.sweep.dir / hydra.sweep.subdir, absolute, as Hydra's run_job makes it: the
        interpolations of the job's own keys filled from its values (the job's config has none
        of its own), others resolved by OmegaConf."""
        parts = [self._resolved(name, text) for name, text in self.dirs.items()]
        return (Path(parts[0]) / parts[1]).absolute()

    def _resolved(self, name: str, text: str) -> str:
        if not self.interpolated:
            try:
                filled = PLACE.sub(lambda m: str(_get_path(self.values, m[1].split("."))), text)
            except (KeyError, TypeError):  # not a key of the job's own: OmegaConf resolves it
                filled = "${"
            if "${" not in filled:
                return filled
        return str(OmegaConf.select(self.cfg, f"hydra.sweep.{name}"))


def _dirname_settings(cfg: DictConfig) -> tuple[set[str], str, str]:
    settings = cfg.hydra.job.config.override_dirname
    return set(settings.exclude_keys), settings.item_sep, settings.kv_sep


def _override_dirname(cfg: DictConfig, parsed: list[Override], settings=None) -> str:
    """hydra.job.override_dirname as Hydra makes it from a job's lines: sorted, joined."""
    excluded, item_sep, kv_sep = settings or _dirname_settings(cfg)
    lines = sorted(o.input_line for o in parsed if o.key_or_group not in excluded)
    return item_sep.join(lines).replace("=", kv_sep)


def _get_path(values: dict, keys: list[str]):
    for key in keys:
        values = values[key]
    if isinstance(values, dict | list):
        raise TypeError("not a plain value")
    return values


def _set_path(values: dict, keys: list[str], value) -> None:
    """values[k1][k2]... = value, copying the dicts on the way (the last job's stay intact)."""
    for key in keys[:-1]:
        values[key] = values = dict(values[key])
    values[keys[-1]] = value


def _file_handlers() -> list[logging.FileHandler]:
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    handlers = [h for lg in loggers if isinstance(lg, logging.Logger) for h in lg.handlers]
    return [h for h in dict.fromkeys(handlers) if isinstance(h, logging.FileHandler)]


class InProcessLauncher(Launcher):
    def __init__(self, config: DictConfig, task_function):
        self.config, self.task_function = config, task_function

    def point_process(self) -> PointProcess:
        """Its points run in this process, as it is."""
        return PointProcess(dict(os.environ), here=True)

    def follow(self, jobs: list[Job], placement: dict) -> Iterator[tuple[int, dict]]:
        yield from run_here(self.config, self.task_function, jobs)


def run_here(config: DictConfig, task_function, jobs: Iterable[Job]) -> Iterator[tuple]:
    """Run jobs in this process, one after another, each point from the state the first one
    started from (SameStart): (job number, summary) as each ends. A store that cannot be
    written raises its OSError."""
    run = job_runner(config, task_function, SameStart())
    for spec in jobs:
        yield spec.job, run(spec)


def job_runner(
    config: DictConfig, task_function, same: "SameStart | None" = None
) -> Callable[[Job], dict]:
    """What runs one job in this process, its summary returned: its config composed as Hydra's
    basic launcher composes it, at the cost of a loop (harness.launchers.in_process), or by Hydra
    itself where that cannot reproduce it. Kept for job after job (a warm worker's), it composes
    each shape of config once. With `same`, each point starts from the state the first one
    started from (a warm worker puts its state back itself)."""
    if InProcess.suits(config):
        runner = InProcess(config, task_function, same)
        return runner.run
    return lambda spec: _hydra_job(config, task_function, spec, same)


class SameStart:
    """Points run one after another in this process (run_here: Hydra's basic launcher, a SLURM
    task's pack of points), each from the state the first one started from, as on a warm worker
    (harness.launchers.fresh): a point that leaves torch's default dtype, deterministic
    algorithms, matmul precision, grad mode or threads set, or NumPy's generator drawn from,
    changes nothing of the next one's. The state is taken as the first point starts, its job's
    log set up: the runner's handlers, moved from job to job, stay. What cannot be put back (a
    library function replaced, a thread left running) is said once, in a warning: unlike a
    worker, this process is not replaced, and the points after it may not give the values they
    give alone."""

    def __init__(self):
        self.state: ProcessState | None = None
        self.said: set[str] = set()  # what was left, warned of

    @contextlib.contextmanager
    def point(self, job: int) -> Iterator[None]:
        """Around a point: the state taken before the first, put back after each."""
        if self.state is None:
            self.state = ProcessState()
        try:
            yield
        finally:
            self._put_back(job)

    def _put_back(self, job: int) -> None:
        try:
            left = self.state.reset()
        except Exception as error:  # a state it cannot put back (a CUDA error that sticks)
            left = [with_type(error)]
        new = [what for what in left if what not in self.said]
        if new:
            self.said.update(new)
            log.warning(
                "job %s left what this process cannot put back (%s): the points after it here "
                "may not give the values they give alone (on hydra/launcher=local, such a "
                "point's worker is replaced)", job, "; ".join(new),
            )  # fmt: skip


def work(
    config: DictConfig, task_function, jobs: list[Job], state: dict
) -> list[dict | StoreUnwritable]:
    """What a process of its own (a submitit job, a pool's worker) runs: this process's Hydra
    `state` (Singleton.get_state(), its config search path), then run_here's jobs; their
    summaries. A store that cannot be written ends the rest: each is the StoreUnwritable that
    says so (unwritable), on which the sweep stops."""
    Singleton.set_state(state)
    setup_globals()
    summaries = []
    try:
        for _, summary in run_here(config, task_function, jobs):
            summaries.append(summary)
    except OSError as error:
        summaries += [unwritable(error)] * (len(jobs) - len(summaries))
    return summaries


def pack(launcher: Launcher, jobs: list[Job]) -> bytes:
    """What a process of its own needs to run these jobs of `launcher` (its config, task
    function, this process's Hydra state), as bytes to send it (cloudpickle: Hydra's state
    holds functions pickle cannot take); the process runs them with work_packed."""
    state = Singleton.get_state()
    return cloudpickle.dumps((launcher.config, launcher.task_function, list(jobs), state))


def work_packed(payload: bytes) -> list[dict | StoreUnwritable]:
    """work() on what pack() sent: the jobs' summaries."""
    return work(*cloudpickle.loads(payload))


def _hydra_job(config: DictConfig, task_function, spec: Job, same: SameStart | None) -> dict:
    """One job as Hydra runs it (its composition, run_job): for what the loop cannot reproduce
    (hydra.callbacks, env_set, chdir), its task function given the job's record."""
    loader = GlobalHydra.instance().config_loader()
    sweep_config = loader.load_sweep_config(config, list(spec.overrides))
    with open_dict(sweep_config.hydra.job):
        sweep_config.hydra.job.id = sweep_config.hydra.job.num = spec.job
    try:
        with same.point(spec.job) if same else contextlib.nullcontext():
            result = run_job(
                hydra_context=hydra_context(sweep_config),
                task_function=replace(task_function, jobs=(spec,)),
                config=sweep_config, job_dir_key="hydra.sweep.dir",
                job_subdir_key="hydra.sweep.subdir",
            )  # fmt: skip
    except Exception as error:
        return {"status": "failed", "error": f"harness error: {with_type(error)}"}
    return summary_of(result)
