"""What the command line shows without running anything: --help (the experiments, or one
experiment's parameters) and --cfg (the config of a sweep's first point, and its grid)."""

import inspect
import textwrap
import types
import typing
from pathlib import Path

from hydra.core.override_parser.types import Override
from omegaconf import DictConfig, OmegaConf

from harness.errors import BadInput
from harness.launchers.hydra_internals import show_info
from harness.names import USER_KEYS, Flags, experiment_file, key_of
from harness.planning.config import (
    check_harness_keys,
    compose_config,
    experiment_name,
    with_searchpath,
)
from harness.planning.experiment import Experiment, config_values
from harness.planning.plan import Sweep, plan_command, seeded_grid
from harness.results.claims import statement
from harness.searching import search

MISSING_KEY = object()


def show(overrides: list[Override], flags: Flags) -> int:
    """--help +experiment=NAME, --info or --cfg: print what they show; nothing runs and nothing
    is written. --help and --cfg check the config and every point as a sweep of this command
    line would, and refuse in one line what it would refuse."""
    config_dirs = flags.config_dirs
    experiment = experiment_name(overrides, config_dirs)
    check_harness_keys(overrides)
    if any(key_of(o.input_line) == "resume" for o in overrides):
        raise BadInput("--help, --cfg and --info show a new sweep: drop resume")
    if flags.info:
        overrides, space = search.command_line(overrides)  # the search's space: no grid axes
        fixed = [*(o.input_line for o in overrides if not o.is_sweep_override()), *space]
        show_info(flags.info, with_searchpath([*fixed, "sweep_id=SWEEP_ID"], config_dirs))
        return 0
    _, sweep, fixed = plan_command(overrides, experiment, config_dirs, "SWEEP_ID")
    if flags.help:
        print(experiment_help(experiment, config_dirs))
        return 0
    first = sweep.points[0]
    point = [*fixed, *first.overrides, "sweep_id=SWEEP_ID", f"job={first.job}"]
    print(config_text(compose_config(point, experiment, config_dirs), sweep, flags), end="")
    return 0


def experiment_help(name: str, config_dirs: list[Path]) -> str:
    """An experiment's function, its parameters (type, the function's default, the config's
    value, the seeded grid), its claims, and how to run it."""
    cfg = compose_config([f"+experiment={name}", "sweep_id=SWEEP_ID"], name, config_dirs)
    values = config_values(cfg)
    experiment = Experiment.load(values["experiment"])
    grid = seeded_grid(cfg)
    summary = " ".join((inspect.getdoc(experiment.run) or "").split("\n\n")[0].split())
    lines = [
        f"{name}: {values['experiment']['run']}",
        textwrap.fill(summary, 96, initial_indent="  ", subsequent_indent="  "),
        f"  config: {experiment_file(name, config_dirs)}",
        "",
        "parameters (key=value fixes one, key=a,b,c sweeps it):",
    ]
    rows = [("name", "type", "default", "config", "seeded grid")]
    for key, parameter in experiment.parameters.items():
        default = parameter.default
        rows.append(
            (
                key,
                _type_name(experiment.hints.get(key)),
                "(required)" if default is inspect.Parameter.empty else _text(default),
                _text(values[key]) if key in values else "",
                str(grid.get(key, "")),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
              for r in rows]  # fmt: skip
    lines += ["", f"harness keys: {', '.join(USER_KEYS)} (conf/config.yaml)"]
    claims = values["experiment"].get("claims") or []
    if claims:
        lines += ["", "claims (checked over the sweep's planned points):"]
        lines += [f"  - {_claim_said(claim)}" for claim in claims]
    folders = "".join(f"--config-dir {folder} " for folder in config_dirs)
    lines += ["", f"run: python -m harness {folders}+experiment={name}"]
    return "\n".join(line for i, line in enumerate(lines) if line or lines[i - 1])


def _claim_said(claim: dict) -> str:
    """A claim as --help lists it: its statement (its bounds and needs), the rows it judges
    (where) and the table it reads, where it names them."""
    said = statement(claim)
    if claim.get("where"):
        said += f", where {claim['where']}"
    if claim.get("table"):
        said += f", on the {claim['table']} table"
    return said


def config_text(cfg: DictConfig, sweep: Sweep, flags: Flags) -> str:
    """--cfg: the config the sweep's first point runs with (job, hydra or all; one node of it
    with --package), after a comment with the grid; nothing runs."""
    first = sweep.points[0]
    header = [
        f"# {sweep.experiment.name}: {len(sweep.points):,} points; this is the first, job "
        f"{first.job}: {' '.join(first.overrides) or '(the only point)'}"
    ]
    header += [f"#   {key}: {', '.join(values)}" for key, values in _grid(sweep).items()]
    if flags.resolve:
        OmegaConf.resolve(cfg)
    if flags.package:  # a key of the whole config, whichever part --cfg names
        cfg = OmegaConf.select(cfg, flags.package, default=MISSING_KEY)
        if cfg is MISSING_KEY:
            raise BadInput(f"--package {flags.package}: the config has no such key")
    elif flags.cfg == "job":
        cfg = OmegaConf.masked_copy(cfg, [key for key in cfg if key != "hydra"])
    elif flags.cfg == "hydra":
        cfg = cfg.hydra
    text = OmegaConf.to_yaml(cfg) if isinstance(cfg, DictConfig) else f"{cfg}\n"
    return "\n".join(header) + "\n" + text


def _grid(sweep: Sweep) -> dict[str, list[str]]:
    """key -> its values in the grid, for the keys the grid sweeps."""
    axes: dict[str, dict[str, None]] = {}
    for point in sweep.points:
        for override in point.overrides:
            key, _, value = override.partition("=")
            axes.setdefault(key, {})[value] = None
    return {key: list(values) for key, values in axes.items() if len(values) > 1}


def _type_name(hint) -> str:
    if hint is None:
        return "any"
    if typing.get_origin(hint) is typing.Literal:
        return " | ".join(str(choice) for choice in typing.get_args(hint))
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(arg) for arg in typing.get_args(hint))
    return "null" if hint is type(None) else getattr(hint, "__name__", str(hint))


def _text(value) -> str:
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return str(value)
