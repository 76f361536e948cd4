"""Hydra's basic launcher at the speed of a loop: a sweep's points one after another here.

Hydra's BasicLauncher composes the whole config again for every job (some 50 ms: the search
path, the defaults list, deep copies), and its run_job deep-copies it twice more, writes three
YAML files and configures logging from scratch; for a cheap point that is nearly all it costs.
Here Hydra composes the config once for each distinct shape of a job's overrides (the config
groups it chooses, the keys it sets), and each point's values are set on that config as Hydra's
own override step sets them (OmegaConf.update, merge=True); tests/test_inprocess.py checks that
the result equals what BasicLauncher composes, for every experiment.

Each job keeps what Hydra gives it: its run folder with its log (harness.log), the config it
ran with and its overrides (.hydra/config.yaml, .hydra/overrides.yaml), and Hydra's own config,
which only differs between jobs in their numbers, once per sweep (.hydra/hydra.yaml in the
sweep's run folder). What this cannot reproduce exactly goes through Hydra's own launcher:
hydra.callbacks, hydra.job.env_set or hydra.job.chdir in the config; an override that adds or
deletes a key, or sets one the config lacks, is composed by Hydra for that point.
"""

import logging
from pathlib import Path

import yaml
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.core.utils import configure_log
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from harness import store
from harness.experiment import config_values, with_type

UNSET = object()
DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class InProcess:
    """Configs and runs of a sweep's jobs in this process, for Hydra's basic launcher."""

    def __init__(self, cfg: DictConfig, task_function):
        self.master, self.task_function = cfg, task_function
        self.loader = GlobalHydra.instance().config_loader()
        self.parser = OverridesParser.create()
        self.parsed: dict[str, Override] = {}
        self.groups = set(cfg.hydra.runtime.choices)  # the config groups its defaults choose
        self.composed: dict[tuple, DictConfig] = {}
        self.uses_hydra_resolver: dict[int, bool] = {}
        self.log_dir: Path | None = None
        self.saved_hydra = False

    @staticmethod
    def suits(cfg: DictConfig) -> bool:
        """Whether this reproduces Hydra's job for this config (else Hydra's launcher runs it)."""
        job = cfg.hydra.job
        return not (cfg.hydra.callbacks or job.env_set or job.chdir)

    def config(self, overrides: list[str], job: int) -> DictConfig:
        """The config that Hydra's BasicLauncher composes for this job."""
        parsed = [self._parse(line) for line in overrides]
        shape = tuple(o.key_or_group if self._settable(o) else o.input_line for o in parsed)
        cfg = self.composed.get(shape)
        if cfg is None:
            cfg = self.loader.load_sweep_config(self.master, overrides)
            if all(self._settable(o, cfg) for o in parsed if o.key_or_group in shape):
                self.composed[shape] = cfg  # later points of this shape only set values on it
        else:
            with read_write(cfg), open_dict(cfg):
                for override in parsed:
                    if override.key_or_group in shape:
                        OmegaConf.update(cfg, override.key_or_group, override.value(), merge=True)
                cfg.hydra.overrides.task = [o.input_line for o in parsed]
                cfg.hydra.job.override_dirname = _override_dirname(cfg, parsed)
        with read_write(cfg.hydra), open_dict(cfg.hydra):
            cfg.hydra.job.id = cfg.hydra.job.num = job
        return cfg

    def run(self, overrides: list[str], job: int) -> dict:
        """Run one job as Hydra's run_job would; its summary (a failed one for an exception
        outside the experiment, which the job itself turns into a row)."""
        try:
            cfg = self.config(overrides, job)
            run_dir = Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)
            with read_write(cfg.hydra), open_dict(cfg.hydra):
                cfg.hydra.runtime.output_dir = str(run_dir.absolute())
            if self._uses_hydra_resolver(cfg):
                HydraConfig.instance().set_config(cfg)
            self._log_to(cfg, run_dir)
            values = config_values(cfg)
            self._save(cfg, values, run_dir)
            return self.task_function.run(values, str(run_dir.absolute()))
        except Exception as error:
            return {"status": "failed", "error": f"harness error: {with_type(error)}"}
        finally:
            _flush_logs()

    def _parse(self, line: str) -> Override:
        if line not in self.parsed:
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

    def _uses_hydra_resolver(self, cfg: DictConfig) -> bool:
        """Whether the job's config reads Hydra's state through ${hydra:...}, which needs
        HydraConfig set for each job (as Hydra sets it)."""
        if id(cfg) not in self.uses_hydra_resolver:
            task = OmegaConf.masked_copy(cfg, [key for key in cfg if key != "hydra"])
            self.uses_hydra_resolver[id(cfg)] = "${hydra:" in OmegaConf.to_yaml(task)
        return self.uses_hydra_resolver[id(cfg)]

    def _log_to(self, cfg: DictConfig, run_dir: Path) -> None:
        """The job's log in its run folder: Hydra's job logging, configured for the first job,
        its files moved to each next job's folder."""
        run_dir.mkdir(parents=True, exist_ok=True)
        if self.log_dir is None:
            configure_log(cfg.hydra.job_logging, cfg.hydra.verbose)
        else:
            for handler in _file_handlers():
                path = Path(handler.baseFilename)
                if path.parent == self.log_dir:
                    handler.close()  # reopened, in the new folder, by its next record
                    handler.baseFilename = str(run_dir.absolute() / path.name)
                    Path(handler.baseFilename).touch()
        self.log_dir = run_dir.absolute()

    def _save(self, cfg: DictConfig, values: dict, run_dir: Path) -> None:
        """The job's config (resolved, as it ran) and overrides; Hydra's config once per sweep."""
        folder = run_dir / str(cfg.hydra.output_subdir or ".hydra")
        folder.mkdir(exist_ok=True)
        (folder / "config.yaml").write_text(yaml.dump(values, Dumper=DUMPER, sort_keys=False))
        task = list(cfg.hydra.overrides.task)
        (folder / "overrides.yaml").write_text(yaml.dump(task, Dumper=DUMPER))
        if not self.saved_hydra:  # this run's: a resume may have changed the launcher
            shared = run_dir.parent / folder.name / "hydra.yaml"
            store.write_text(shared, OmegaConf.to_yaml(OmegaConf.masked_copy(cfg, "hydra")))
            self.saved_hydra = True


def _override_dirname(cfg: DictConfig, overrides: list[Override]) -> str:
    """hydra.job.override_dirname as Hydra computes it from a job's overrides."""
    settings = cfg.hydra.job.config.override_dirname
    lines = sorted(o.input_line for o in overrides if o.key_or_group not in settings.exclude_keys)
    return settings.item_sep.join(lines).replace("=", settings.kv_sep)


def _file_handlers() -> list[logging.FileHandler]:
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    handlers = [h for lg in loggers if isinstance(lg, logging.Logger) for h in lg.handlers]
    return [h for h in dict.fromkeys(handlers) if isinstance(h, logging.FileHandler)]


def _flush_logs() -> None:
    for handler in _file_handlers():
        handler.flush()
