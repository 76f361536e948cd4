"""The checks a new sweep's plan makes before anything runs: each a BadInput of one line for a
config, grid or experiment that cannot work (harness.planning.plan calls them)."""

import math
import re

from hydra.core.override_parser.types import ChoiceSweep, Override, RangeSweep
from omegaconf import DictConfig

from harness import store
from harness.errors import BadInput
from harness.names import HARNESS_KEYS, check_name, closest
from harness.planning.experiment import Experiment
from harness.results.claims import validate as validate_claims
from harness.results.tables import check_table_names, validate_plots, validate_table


def check_code(choice, null: str = "") -> None:
    """code= is current (this tree's code) or null (`null`: what that runs, said in the
    message); BadInput otherwise."""
    if choice not in (None, "current"):
        raise BadInput(f"code must be current (this tree's code) or null{null}, got {choice!r}")


def check_file_name(cfg: DictConfig, node: dict) -> None:
    """experiment.name is its file's name: the store's folders, resume and status find the
    sweep by it."""
    name, chosen = node.get("name"), cfg.hydra.runtime.choices.get("experiment")
    if chosen is not None and name != chosen:
        raise BadInput(
            f"experiment.name is {name!r} in experiment/{chosen}.yaml: an experiment's name is "
            f"its file's name, set experiment.name: {chosen}"
        )
    check_name("experiment", str(name))


def check_report_spec(experiment: Experiment, points: list) -> None:
    """The experiment's table, plots and claims can be read (harness.results.tables,
    harness.results.claims): one line before anything runs, not a traceback after every sweep.
    A claim's where is checked against the parameters' values on the planned `points` (their
    params) too
    (`n == '2'` where n is a number would select none of them)."""
    try:
        names = list(experiment.parameters)
        values = {name: [point.params.get(name) for point in points] for name in names}
        validate_table(experiment.config.get("table"))
        check_table_names(experiment.config.get("table"), names)
        validate_plots(experiment.config.get("plots"))
        validate_claims(experiment.config, names, values=values)
    except ValueError as error:
        raise BadInput(f"{experiment.name}: {error}") from None


def check_parameter_names(experiment: Experiment) -> None:
    """No parameter is named as a column the harness writes in every row (store.RESERVED,
    compared without case): its value would be taken for the harness's, or the reverse."""
    taken = [name for name in experiment.parameters if name.lower() in store.RESERVED]
    if taken:
        raise BadInput(
            f"{experiment.name}'s parameter {taken[0]} is named as a column the harness writes in "
            f"every row (names compared without case): rename it in {experiment.config['run']}'s "
            f"signature ({taken[0]}_value, say)"
        )


def check_keys(experiment: Experiment, values: dict, sweeps: list[Override]) -> None:
    """Every key the experiment's config sets, or the command line sweeps, is a parameter."""
    keys = [k for k in values if k not in HARNESS_KEYS and k != "experiment"]
    keys += [o.get_key_element().lstrip("+") for o in sweeps]
    unknown = sorted({k for k in keys if k not in experiment.parameters})
    if unknown:
        names, near = ", ".join(experiment.parameters), closest(unknown[0], experiment.parameters)
        raise BadInput(
            f"{experiment.name} does not take {', '.join(unknown)}{near} (it takes {names})"
        )
    for override in sweeps:
        if not override.is_discrete_sweep():
            raise BadInput(f"{override.input_line}: only lists, range() and choice() can be swept")


def check_streaming(values: dict) -> None:
    """stream_rows is a whole number of rows, stream_s a number of seconds, both above 0."""
    check_positive_int("stream_rows", values["stream_rows"])
    seconds = values["stream_s"]
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
        raise BadInput(f"stream_s must be a number of seconds above 0, got {seconds!r}")


ENVIRONMENT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_environment(names) -> None:
    """experiment.environment: the names of environment variables the experiment's numbers
    depend on (recorded in its rows and part of reuse's key), a list."""
    if names is None:
        return
    if not isinstance(names, list) or not all(
        isinstance(name, str) and ENVIRONMENT_NAME.fullmatch(name) for name in names
    ):
        raise BadInput(f"experiment.environment must be a list of environment variables' names "
                       f"(environment: [MY_FLAG]), got {names!r}")  # fmt: skip


def check_fail_fast(value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadInput(f"fail_fast must be a whole number of points (0: never stop), got {value!r}")


def check_positive_int(key: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadInput(f"{key} must be a positive integer, got {value!r}")


def check_size(chosen: dict[str, Override], max_points) -> None:
    """Refuse a grid of more than max_points points, counted without expanding any axis."""
    check_positive_int("max_points", max_points)
    sizes = {key: axis_size(override) for key, override in chosen.items()}
    total = math.prod(sizes.values())
    if total > max_points:
        shape = " x ".join(f"{key} {size:,}" for key, size in sizes.items() if size > 1)
        raise BadInput(
            f"the grid has {total:,} points ({shape}), more than max_points={max_points:,}; "
            "narrow it, or raise max_points"
        )


def axis_size(override: Override) -> int:
    """How many values an axis has, without listing them."""
    value = override.value()
    if isinstance(value, RangeSweep):
        return max(0, math.ceil((value.stop - value.start) / value.step))
    return len(value.list) if isinstance(value, ChoiceSweep) else 1
