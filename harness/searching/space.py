"""A search's space and settings, read and checked where the sweep is planned: the command
line's search.params (the sweeper grammar's interval, tag(log, interval), range, choice) and
the search's mappings taken apart from the grid's axes; the config's `search` checked, each
space an Optuna distribution whose ends the experiment takes; a cell's trials as points; the
sampler and pruner the search names."""

from __future__ import annotations

import functools
import math
import types
import typing
from typing import TYPE_CHECKING

from harness.errors import BadInput, one_line
from harness.names import key_of
from harness.store.search_settings import shape_fault

if TYPE_CHECKING:  # Hydra and Optuna load where a search is planned or run, not for a report
    from hydra.core.override_parser.types import Override

PARAMS = "search.params."  # the command line's search space: search.params.KEY=interval(...)
GRAMMAR = "interval(a, b), tag(log, interval(a, b)), range(a, b, step) or choice(a, b, ...)"


def command_line(overrides: list[Override]) -> tuple[list[Override], list[str]]:
    """The command line's overrides without its search space and the search's mappings, and
    those as plain lines: the space (++search.params.lr='tag(log, interval(1e-4, 1e-2))'), where
    a sweep override is the space of a search, not an axis of the grid, and a key the config may
    not have yet; a mapping given whole (search.where={phase: eval}) as ++search.where=..., whose
    keys its empty mapping in conf/config.yaml would refuse otherwise."""
    from harness.names import override

    others, lines = [], []
    for given in overrides:
        key, text = key_of(given.input_line), given.input_line.partition("=")[2]
        mapping = isinstance(given.value(), dict) and not given.input_line.startswith("~")
        if key.startswith(PARAMS):
            lines.append(f"++{override(key, text)}")
        elif key == PARAMS.rstrip(".") and mapping:  # search.params={lr: interval(0.01, 0.1)}
            lines += [f"++{override(PARAMS + str(name), _said(value))}"
                      for name, value in given.value().items()]  # fmt: skip
        elif key.removeprefix("search.") in _mappings() and mapping:
            lines.append(f"++{key}={text}")
        else:
            others.append(given)
    return others, lines


@functools.cache
def _mappings() -> tuple[str, ...]:
    """The keys of conf/config.yaml's search that are mappings (where, prune_on, params, the
    sampler's and the pruner's options)."""
    from harness.names import CONF
    from harness.yaml_files import read_yaml

    node = read_yaml(CONF / "config.yaml").get("search") or {}
    return tuple(key for key, value in node.items() if isinstance(value, dict))


def _said(value) -> str:
    """A search.params value as the sweeper grammar writes it: what Hydra read inside a mapping
    given whole (an IntervalSweep, a ChoiceSweep, a RangeSweep, or a string of them)."""
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep

    if isinstance(value, IntervalSweep):
        text = f"interval({value.start}, {value.end})"
    elif isinstance(value, RangeSweep):
        text = f"range({value.start}, {value.stop}, {value.step})"
    elif isinstance(value, ChoiceSweep):
        text = f"choice({', '.join(map(str, value.list))})"
    else:
        return str(value)
    tags = sorted(getattr(value, "tags", None) or ())
    return f"tag({', '.join(tags)}, {text})" if tags else text


def of_manifest(manifest: dict | None) -> dict | None:
    """The sweep's search as its manifest records it (plan: in its experiment_config), or None."""
    return ((manifest or {}).get("experiment_config") or {}).get("search")


def spec(values: dict, experiment, grid: list[str]) -> dict | None:
    """The config's search, checked (one line of BadInput for what cannot work) and plain;
    None where it has no params (a grid alone)."""
    node = values.get("search") or {}
    params = node.get("params") or {}
    if not params:
        return None
    for key in params:
        if key not in experiment.parameters:
            raise BadInput(f"search.params.{key}: {experiment.name} takes no parameter {key}")
        if key in grid:
            raise BadInput(f"{key} is both an axis of the grid and searched: give it to one")
    fault = shape_fault(node)
    if fault:
        raise BadInput(fault)
    checked = {**node, "params": {key: str(text) for key, text in params.items()}}
    for key in ("where", "prune_on", "sampler_options", "pruner_options"):
        checked[key] = dict(node.get(key) or {})
    if "seed" in checked["sampler_options"]:
        raise BadInput("search.sampler_options.seed: each trial's sampler is seeded from seed")
    try:
        sampler(checked, 0), pruner(checked)
    except (TypeError, ValueError) as error:
        said = f"sampler={checked['sampler']}, pruner={checked['pruner']}"
        raise BadInput(f"search: {said}: {one_line(error)}") from None
    for key, text in checked["params"].items():
        _check_bounds(experiment, values, key, distribution(key, text, experiment.hints.get(key)))
    return checked


def distribution(key: str, text: str, hint=None):
    """The Optuna distribution of a search.params value; an int parameter's interval and range
    are of whole numbers."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep
    from hydra.errors import HydraException
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    try:
        value = OverridesParser.create().parse_override(f"{key}={text}").value()
    except HydraException as error:
        raise BadInput(f"search.params.{key}={text}: {one_line(error)}") from None
    whole = hint is int or (typing.get_origin(hint) in (typing.Union, types.UnionType)
                            and int in typing.get_args(hint))  # fmt: skip
    log = "log" in getattr(value, "tags", set())
    try:
        if isinstance(value, IntervalSweep):
            kind = IntDistribution if whole else FloatDistribution
            low, high = (int(v) if whole else float(v) for v in (value.start, value.end))
            return kind(low, high, log=log)
        if isinstance(value, RangeSweep) and not log:
            last = (
                value.start + (math.ceil((value.stop - value.start) / value.step) - 1) * value.step
            )
            if whole or all(isinstance(v, int) for v in (value.start, value.stop, value.step)):
                return IntDistribution(int(value.start), int(last), step=int(value.step))
            return FloatDistribution(float(value.start), float(last), step=float(value.step))
        if isinstance(value, ChoiceSweep) and not log:
            return CategoricalDistribution(value.list)
    except (ValueError, TypeError) as error:
        raise BadInput(f"search.params.{key}={text}: {error}") from None
    raise BadInput(f"search.params.{key}={text}: give {GRAMMAR}")


def _check_bounds(experiment, values: dict, key: str, space) -> None:
    """The space's ends (each choice) are values the experiment takes: one line before any
    trial runs, not a failed trial each."""
    ends = getattr(space, "choices", None) or (space.low, space.high)
    for end in ends:
        try:
            experiment.params({**values, key: end})
        except BadInput as error:
            raise BadInput(f"search.params.{key}: {end!r} is out of its domain: {error}") from None


def check_launcher(launcher) -> None:
    """A trial is one process: a point of several would ask for (and tell) a trial in each."""
    if launcher.get("tasks_per_node", 1) * launcher.get("nodes", 1) > 1:
        raise BadInput("a search's trials run as one process each: tasks_per_node=1, nodes=1")


def slots(points: list, search: dict, renumber) -> list:
    """Each cell's `trials` points, in cell order: renumber(point, job, cell, slot) makes one."""
    trials = search["trials"]
    return [
        renumber(point, cell * trials + slot, cell, slot)
        for cell, point in enumerate(points)
        for slot in range(trials)
    ]


def sampler(search: dict, seed: int | None):
    """The search's sampler (tpe, random) with its options, seeded with `seed`."""
    import optuna

    kind = {"tpe": optuna.samplers.TPESampler, "random": optuna.samplers.RandomSampler}
    return kind[search["sampler"]](seed=seed, **search.get("sampler_options", {}))


def pruner(search: dict):
    """The search's pruner (median, successive_halving, hyperband, none) with its options."""
    import optuna

    kind = {
        "median": optuna.pruners.MedianPruner,
        "successive_halving": optuna.pruners.SuccessiveHalvingPruner,
        "hyperband": optuna.pruners.HyperbandPruner,
        "none": optuna.pruners.NopPruner,
    }
    return kind[search["pruner"]](**search.get("pruner_options", {}))
