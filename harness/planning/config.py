"""The command line as Hydra sees it: parse its overrides, find the experiment (conf/ and the
users' --config-dir folders), and compose the config with Hydra's compose API, each mistake a
one-line BadInput."""

import itertools
import re
import shlex
from pathlib import Path

import yaml
from hydra import compose
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import (
    ConfigCompositionException,
    HydraException,
    MissingConfigException,
    OverrideParseException,
)
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from harness.errors import BadInput, one_line
from harness.names import (
    CONF,
    USER_KEYS,
    available_experiments,
    closest,
    experiment_file,
    key_of,
    nearest,
    override,
)
from harness.yaml_files import read_yaml


def parse(argv: list[str]) -> list[Override]:
    try:
        return OverridesParser.create().parse_overrides(argv)
    except OverrideParseException as error:
        raise BadInput(f"cannot parse {error.override!r}: {one_line(error)}") from None


def check_harness_keys(overrides: list[Override]) -> None:
    """No key twice (the last would silently win), none of the keys the harness sets, and the
    harness's own keys with values of their kind."""
    keys = [o.get_key_element().lstrip("+~") for o in overrides]
    twice = sorted({key for key in keys if keys.count(key) > 1})
    if twice:
        raise BadInput(f"{', '.join(twice)} given more than once: give each key once")
    for given in overrides:
        key, value = given.get_key_element().lstrip("+~"), given.value()
        if key in ("sweep_id", "job"):
            raise BadInput(f"{key} is set by the harness for each job, not on the command line")
        if key == "wait" and not isinstance(value, bool):
            raise BadInput(f"wait must be true or false, got {given.get_value_element_as_str()}")
        if key == "resume" and not (isinstance(value, str) and value):
            raise BadInput("resume takes a sweep id: resume=SWEEP_ID")


def experiment_name(overrides: list[Override], config_dirs: list[Path]) -> str:
    names = [o for o in overrides if o.get_key_element().lstrip("+") == "experiment"]
    available = ", ".join(available_experiments(config_dirs))
    if not names:
        raise BadInput(f"no experiment given: add +experiment=NAME (one of {available})")
    if names[0].is_sweep_override():
        raise BadInput("one experiment per sweep: +experiment takes one name")
    name = str(names[0].value())
    if name not in available_experiments(config_dirs):
        raise BadInput(
            f"unknown experiment '{name}' (available: {available}); an experiment of your own: "
            f"--config-dir DIR with DIR/experiment/{name}.yaml"
        )
    return name


def compose_config(overrides: list[str], experiment: str, config_dirs: list[Path]) -> DictConfig:
    """The config, with the config dirs on Hydra's search path (so every job's config has them)."""
    _check_experiment_file(experiment, config_dirs)
    try:
        cfg = compose(
            "config", overrides=with_searchpath(overrides, config_dirs), return_hydra_config=True
        )
    except MissingConfigException as error:
        group, _, name = str(error.missing_cfg_file).rpartition("/")
        options = ", ".join(error.options or [])
        raise BadInput(f"unknown {group} '{name}' (available: {options})") from None
    except ConfigCompositionException as error:
        key = _unknown_key(error.__cause__)
        if key is not None:
            raise BadInput(_unknown(key, overrides, experiment, config_dirs)) from None
        raise BadInput(one_line(error)) from None
    except (HydraException, OmegaConfBaseException) as error:
        raise BadInput(one_line(error)) from None
    except ValueError as error:  # a config group given a number (size=128 where size/ is a group)
        raise BadInput(
            f"{one_line(error)}: a config group takes the name of one of its "
            "files (GROUP=NAME for GROUP/NAME.yaml)"
        ) from None
    with open_dict(cfg):  # jobs elsewhere (SLURM) and run dirs get it absolute
        cfg.out = str(Path(cfg.out).resolve())
    return cfg


def _unknown_key(cause) -> str | None:
    """The key an override names that its node lacks ("Key 'trails' is not in struct", "Key
    'max_paralel' not in 'BasicLauncherConf'"), or None for another error."""
    said = str(cause)
    if not isinstance(cause, OmegaConfBaseException) or not (
        "not in struct" in said or re.search(r"not in '\w+'", said)
    ):
        return None
    return cause.full_key or said.split("'")[1]


def _unknown(key: str, overrides: list[str], experiment: str, config_dirs: list[Path]) -> str:
    """The line that refuses a key the config lacks, with the keys near it: of its own node for
    a dotted key (search.trails: search.trials), else of the experiment's config and
    parameters."""
    near, node = _near_in_node(key, overrides, config_dirs)
    if key.startswith("hydra."):
        return f"unknown key '{key}'{near} (see conf/hydra/ and Hydra's own)"
    if node:
        parent = key.rpartition(".")[0]
        return f"unknown key '{key}'{near} ({parent}'s keys: {', '.join(node)})"
    keys, parameters = _keys(experiment, config_dirs)
    if key in parameters:
        return f"{experiment}'s config does not set its parameter {key}: give it as +{key}=VALUE"
    near = closest(key, [*keys, *parameters])
    return f"unknown key '{key}' for {experiment}{near} (its keys: {', '.join(keys)})"


def _near_in_node(key: str, overrides: list[str], config_dirs: list[Path]) -> tuple[str, list]:
    """For a dotted key, "; did you mean search.trials?" from the keys of the node it would go
    in (the config composed without it), and those keys; for hydra.launcher's, the keys of the
    other launchers in conf/hydra/launcher/ too. ("", []) where there is no such node."""
    parent, _, name = key.rpartition(".")
    if not parent:
        return "", []
    rest = [line for line in overrides if key_of(line) != key]
    try:
        cfg = compose("config", overrides=with_searchpath(rest, config_dirs),
                      return_hydra_config=True)  # fmt: skip
    except Exception:  # noqa: BLE001 - another mistake on the line: said once this one is fixed
        return "", []
    node = OmegaConf.select(cfg, parent, default=None)
    keys = [str(k) for k in node] if isinstance(node, DictConfig) else []
    near = [f"{parent}.{found}" for found in nearest(name, keys)]
    if not near and parent == "hydra.launcher":
        near = [f"{parent}.{found} (with hydra/launcher={launcher})"
                for launcher, found in _other_launchers(name, config_dirs)]  # fmt: skip
    return (f"; did you mean {' or '.join(near)}?" if near else ""), keys


def _other_launchers(name: str, config_dirs: list[Path]) -> list[tuple[str, str]]:
    """(launcher, key) of the keys near `name` of the launchers conf/hydra/launcher/ offers."""
    folders = [folder / "hydra" / "launcher" for folder in (CONF, *config_dirs)]
    found = []
    for path in sorted(path for folder in folders for path in folder.glob("*.yaml")):
        try:
            node = read_yaml(path)
        except (OSError, yaml.YAMLError):
            continue
        keys = [str(k) for k in node] if isinstance(node, dict) else []
        found += [(path.stem, near) for near in nearest(name, keys)]
    return list(dict.fromkeys(found))[:3]


def with_searchpath(overrides: list[str], config_dirs: list[Path]) -> list[str]:
    """The overrides, with the config dirs on Hydra's search path (so every job's config has
    them) where there are any."""
    if not config_dirs:
        return overrides
    folders = ",".join(f"file://{folder}" for folder in config_dirs)
    return [f"hydra.searchpath=[{folders}]", *overrides]


PACKAGE_LINE = "# @package _global_"


def _check_experiment_file(experiment: str, config_dirs: list[Path]) -> None:
    """BadInput of one line for an experiment's YAML that Hydra would read otherwise than it
    means, or not at all: YAML that does not parse, a file that is not a mapping, or one
    without its header PACKAGE_LINE (Hydra would put its keys under experiment.)."""
    path = experiment_file(experiment, config_dirs)
    try:
        text = path.read_text()
        node = read_yaml(text)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise BadInput(f"{path} is not YAML: {where}{error.problem}") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise BadInput(f"{path} cannot be read: {one_line(error)}") from None
    if not isinstance(node, dict):
        raise BadInput(f"{path} holds a {type(node).__name__}: an experiment's YAML is a mapping "
                       "(experiment: name and run, its parameters, hydra: its sweep)")  # fmt: skip
    header = itertools.takewhile(lambda line: line.startswith("#"), text.splitlines())
    if not any(line.split() == PACKAGE_LINE.split() for line in header):
        raise BadInput(f"{path} lacks its header line {PACKAGE_LINE!r}: without it Hydra reads "
                       "every key of the file as experiment.KEY (put it first)")  # fmt: skip


def _keys(experiment: str, config_dirs: list[Path]) -> tuple[list[str], list[str]]:
    """The keys a command line may set: the experiment config's own, then the harness's (each
    once: an experiment's config may set seed, say); and its function's parameters, where it
    imports (for a message: [] where it does not)."""
    node = read_yaml(experiment_file(experiment, config_dirs))
    names = [str(k) for k in node if k not in ("experiment", "hydra")]
    from harness.planning.experiment import Experiment  # an error's message: off the hot path

    try:
        parameters = list(Experiment.load(node["experiment"]).parameters)
    except Exception:  # its own error is said once the key is fixed
        parameters = []
    return list(dict.fromkeys([*sorted(names), *USER_KEYS])), parameters


def command(arguments: list[str], config_dirs: list[Path], out: Path) -> str:
    """`python -m harness ARGUMENTS` as a shell line, with the --config-dir folders first and
    out= last where out is not this directory's outputs/ (quoted for Hydra, then the shell)."""
    folders = [part for folder in config_dirs for part in ("--config-dir", str(folder))]
    given = [] if Path(out).resolve() == results_root([]).parent else [override("out", str(out))]
    return shlex.join(["python", "-m", "harness", *folders, *arguments, *given])


def resume_command(
    experiment: str, sweep_id: str, config_dirs: list[Path], out: Path, settings: list[str]
) -> str:
    """The command that finishes a sweep: resume=ID with its --config-dir and out=, the
    launcher settings of `settings` (the sweep's override lines) repeated, hydra/launcher,
    hydra.launcher.* and wait, so that what the resume runs with is in plain view (it takes
    the sweep's own without them too), and its code_store, which a resume takes from its own
    command line only."""
    own = ("hydra/launcher", "wait", "code_store")
    repeated = [
        line for line in settings
        if key_of(line) in own or key_of(line).startswith("hydra.launcher.")
    ]  # fmt: skip
    arguments = [f"+experiment={experiment}", f"resume={sweep_id}", *repeated]
    return command(arguments, config_dirs, out)


def results_root(overrides: list[Override]) -> Path:
    out = next((o.value() for o in overrides if o.get_key_element() == "out"), None)
    if out is None:
        out = OmegaConf.load(CONF / "config.yaml").out
    return Path(str(out)).resolve() / "results"
