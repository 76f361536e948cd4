"""An experiment as the harness sees it: its config node and a plain function of typed keywords.

The function's signature is the experiment's schema: its parameters are the config keys the
harness passes (defaults filled in), and their annotations (int, float, bool, str, Literal)
are checked for every point before anything runs. Check functions reject out-of-domain values
with a ValueError: those the config's `experiment.check` names (a dotted name, or a list of
them), else the module's `check` beside the function, when there is one. Each names the
parameters it looks at, each one of the function's (a name it does not know is refused when
the experiment loads), and gets those.

A parameter named `tracker` is no config key: a training experiment takes it to hand over rows
while it runs and to checkpoint its state (harness.tracking); the harness passes one.
"""

import functools
import hashlib
import importlib
import inspect
import json
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue

from harness import reuse
from harness.errors import BadInput, one_line, with_type
from harness.lifetime import per_point
from harness.names import NOT_IN_KEY, NOT_IN_KEY_OF_EXPERIMENT
from harness.pinning import codestore

TRACKER = "tracker"  # the parameter through which a training experiment gets its Tracker


@dataclass(frozen=True)
class Experiment:
    name: str
    run: Callable[..., list[dict]]
    checks: tuple[tuple[Callable[..., None], tuple[str, ...]], ...]  # each with the names it takes
    parameters: dict[str, inspect.Parameter]
    hints: dict[str, Any]
    config: dict  # the config's `experiment` node: name, run, table, claims
    tracked: bool = False  # whether the function takes a `tracker` (harness.tracking)
    typed: dict = field(default_factory=dict, compare=False, repr=False)  # values checked once

    @classmethod
    def load(cls, node: dict) -> "Experiment":
        """The experiment that a config's `experiment` node describes. Its function and check
        are looked up once per process (a sweep's jobs load the same one)."""
        name, target = node.get("name"), node.get("run")
        if not name or not target:
            raise BadInput("the experiment config needs experiment.name and experiment.run")
        named = node.get("check") or ()
        named = (named,) if isinstance(named, str) else tuple(named)
        return replace(_loaded(cls, name, target, named), config=node)

    @classmethod
    def _load(cls, name: str, target: str, named: tuple[str, ...]) -> "Experiment":
        module_name, _, function_name = target.rpartition(".")
        with reuse.importing():  # what its modules read as they are imported
            try:
                module = importlib.import_module(module_name)
                run = getattr(module, function_name)
            except Exception as error:  # the module's own error too (a SyntaxError): one line
                said = _said(error)
                raise BadInput(f"{name}: cannot import experiment.run={target}: {said}") from None
            functions = [_imported(name, t) for t in named] or [getattr(module, "check", None)]
        parameters = dict(inspect.signature(run).parameters)
        tracked = parameters.pop(TRACKER, None) is not None
        return cls(
            name=name,
            run=run,
            checks=tuple(_check(name, f, target, parameters) for f in functions if f),
            parameters=parameters,
            hints=typing.get_type_hints(run),
            config={"name": name, "run": target},
            tracked=tracked,
        )

    def params(self, values: dict) -> dict:
        """The keyword arguments for one point, from the config's values: typed and checked."""
        kwargs = {}
        for name, parameter in self.parameters.items():
            if name in values:
                kwargs[name] = self._typed(name, values[name])
            elif parameter.default is not inspect.Parameter.empty:
                kwargs[name] = parameter.default
            else:
                raise BadInput(f"{self.name} needs a value for {name}")
        for check, names in self.checks:
            try:
                check(**{name: kwargs[name] for name in names})
            except ValueError as error:
                raise BadInput(str(error)) from None
        return kwargs

    def _typed(self, name: str, value: Any) -> Any:
        """_typed, once per distinct value of a parameter (a grid repeats its values)."""
        try:
            key = (name, type(value), value)
            return self.typed[key]
        except TypeError:  # a value that cannot be a key (a list): typed each time
            return _typed(name, value, self.hints.get(name))
        except KeyError:
            self.typed[key] = _typed(name, value, self.hints.get(name))
            return self.typed[key]


@per_point  # an experiment's function: its module is imported anew once its file changes
@functools.lru_cache(maxsize=64)
def _loaded(cls, name: str, target: str, named: tuple[str, ...]) -> Experiment:
    return cls._load(name, target, named)


def _imported(name: str, target: str) -> Callable[..., None]:
    """The check experiment.check names: a dotted name."""
    module_name, _, function_name = target.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), function_name)
    except Exception as error:
        raise BadInput(f"{name}: cannot import experiment.check={target}: {_said(error)}") from None


def _said(error: Exception) -> str:
    """Why a module did not import, in a line: a name not found as Python says it; an error of
    the module's own with its type, and a SyntaxError with its line in the user's file (its path
    inside the sweep's pinned copy, harness.pinning.codestore)."""
    if isinstance(error, (ImportError, AttributeError)):
        return one_line(error)
    if isinstance(error, SyntaxError):
        path = Path(error.filename or "?")
        pinned = codestore.running()
        if pinned and path.is_relative_to(pinned[0]):
            path = Path(*path.relative_to(pinned[0]).parts[1:])  # without its bundle-DIGEST folder
        return f"{type(error).__name__}: {error.msg} ({path}, line {error.lineno})"
    return with_type(error)


def _check(name: str, check: Callable, target: str, parameters: dict) -> tuple:
    """A check with the parameters it names; refused (BadInput) when it names one the experiment
    function (`target`) does not take, or takes *args or **kwargs."""
    names = inspect.signature(check).parameters.values()
    where = f"{name}: {check.__module__}.{check.__name__}"
    if any(p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) for p in names):
        raise BadInput(f"{where} takes *args or **kwargs: it should name the parameters it checks")
    unknown = [p.name for p in names if p.name not in parameters]
    if unknown:
        raise BadInput(f"{where} checks {', '.join(unknown)}, which {target} does not take")
    return check, tuple(p.name for p in names)


def config_values(cfg: DictConfig) -> dict:
    """The config's own keys (not Hydra's), resolved, as plain Python values."""
    own = OmegaConf.masked_copy(cfg, [key for key in cfg if key != "hydra"])
    try:
        return OmegaConf.to_container(own, resolve=True)
    except (InterpolationResolutionError, MissingMandatoryValue) as error:
        raise BadInput(f"{error.full_key}: {str(error).splitlines()[0]}") from None


def keyed_config(values: dict, parameters) -> dict:
    """The keys of the resolved config `values` that decide a point's answer besides its
    `parameters` (names): every one but those the harness declares deciding none
    (harness.names.KEYS), the seed and the experiment's `run` target among them."""
    node = values.get("experiment") or {}
    rest = {key: value for key, value in values.items()
            if key not in (*NOT_IN_KEY, "experiment") and key not in parameters}  # fmt: skip
    return {**rest, "experiment": {k: v for k, v in node.items()
                                   if k not in NOT_IN_KEY_OF_EXPERIMENT}}  # fmt: skip


def config_hash(experiment: str, params: dict, values: dict) -> str:
    """A short digest of what a point computes: the experiment, its parameters and the rest of
    the resolved config its job sees (`values`: keyed_config)."""
    return hasher(experiment, values)(params)


def hasher(experiment: str, values: dict) -> Callable[[dict], str]:
    """config_hash of each point of one config `values`, the config serialized once."""
    texts: dict[frozenset, str] = {}  # the keyed config as text, by the parameters' names

    def digest(params: dict) -> str:
        names = frozenset(params)
        if names not in texts:
            texts[names] = json.dumps(keyed_config(values, names), sort_keys=True, default=str)
        text = json.dumps({"experiment": experiment, "params": params}, sort_keys=True,
                          default=str)  # fmt: skip
        return hashlib.sha256(f"{text}\n{texts[names]}".encode()).hexdigest()[:16]

    return digest


def _typed(name: str, value: Any, annotation: Any) -> Any:
    """`value` checked against a simple annotation, ints widened to float where a float is due."""
    if annotation is None or annotation is Any:
        return value
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        if value not in args or type(value) is not type(args[args.index(value)]):
            choices = ", ".join(str(a) for a in args)
            raise BadInput(f"{name} must be one of {choices}, got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        return _typed(name, value, options[0]) if len(options) == 1 else value
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if annotation in (int, float, bool, str) and (
        not isinstance(value, annotation) or (annotation is int and isinstance(value, bool))
    ):
        raise BadInput(f"{name} must be {_article(annotation)}, got {value!r}")
    return value


def _article(kind: type) -> str:
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}[kind]
