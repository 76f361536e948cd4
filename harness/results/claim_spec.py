"""A claim as an experiment's config writes it, checked before any sweep runs: its keys, its
bounds (a number, arithmetic of columns, or a list of these), its where and needs within
harness.results.expressions' grammar, its table one there is, the names it gives none that is a
typo of a parameter's, its constants of a kind the parameters' values have (validate). A
manifest's claims are anyone's to edit: harness.results.claims judges them with these checks
too."""

import importlib
import math
from collections.abc import Callable, Mapping

from harness.names import refuse_typo
from harness.results import expressions

# A constant's kind (int and float alike), which a parameter's values must have for a where
# comparing them to select any; how a parameter of those kinds is said.
KINDS = {bool: "truth value", int: "number", float: "number", str: "text"}
ADJECTIVES = {"number": "number", "text": "text", "truth value": "true-or-false"}
MOST_BOUNDS = (
    16  # in one min or max: a claim's text is anyone's to edit (harness.results.expressions)
)
KEYS = ("metric", "min", "max", "where", "needs", "table", "text")  # a claim's keys
HARNESS_TABLES = ("rows", "best")  # the tables there are without a derive (best: a search's)


def deriving(config: dict) -> Callable | None:
    """The experiment's function of its derived tables (config `derive`), or None; a name that
    does not import as a function is a ValueError of one line."""
    named = config.get("derive")
    if not named:
        return None
    module, _, function = str(named).rpartition(".")
    try:
        found = getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError, ValueError) as error:
        raise ValueError(f"cannot import experiment.derive={named}: {error}") from None
    if not callable(found):
        raise ValueError(f"experiment.derive={named} is not a function of the rows")
    return found


def checked_bound(bound) -> None:
    """A bound as validate reads it (a manifest's claims are anyone's to edit): a number, or
    arithmetic of numbers and columns (harness.results.expressions.arithmetic); ValueError
    otherwise."""
    if isinstance(bound, str):
        expressions.arithmetic(bound)
    elif not _a_number(bound):
        raise ValueError(
            f"a bound is a number, arithmetic of columns (2 * sdpa_err64 + 1e-6) or a list of "
            f"them, not {_what(bound)}"
        )


def validate(config: dict, names=(), values: Mapping[str, list] | None = None) -> None:
    """Refuse a claims spec that cannot work, with a ValueError of one line: a `derive` that does
    not import, `claims` not a list of mappings, each with a metric and no unknown keys, its
    bounds numbers or expressions (or lists of them), its where and bounds within
    harness.results.expressions' grammar, its table one there is (without a derive:
    HARNESS_TABLES). `names`: the parameters and the harness's columns, which a claim on the rows
    may name; a name it gives that is none of them but a typo of one is refused (others are
    the experiment's metrics, known once it ran: a claim naming none is an ERROR then).
    `values`: each parameter's values over the planned points, with which a where or needs on
    the rows compares constants of a kind they have (None: not checked)."""
    deriving(config)
    claims = config.get("claims")
    if claims is None:
        return
    if not isinstance(claims, list):
        raise ValueError(f"claims must be a list of claims, not {_what(claims)}")
    for number, claim in enumerate(claims, 1):
        try:
            _validate_claim(claim)
            if names and claim.get("table", "rows") in HARNESS_TABLES:
                _check_names(claim, names)
            if values is not None and claim.get("table", "rows") in HARNESS_TABLES:
                _check_kinds(claim, values)
            if claim.get("table") not in (None, *HARNESS_TABLES) and not config.get("derive"):
                raise ValueError(
                    f"its table {claim['table']!r} is none the experiment derives: name the "
                    "function that makes it as experiment.derive (tables(rows) -> {name: "
                    "table}, as experiments/derived/ do)"
                )
        except ValueError as error:
            metric = claim.get("metric") if isinstance(claim, Mapping) else None
            named = f" ({metric})" if isinstance(metric, str) else ""
            raise ValueError(f"claim {number}{named}: {error}") from None


def _validate_claim(claim) -> None:
    """validate's checks of one claim; ValueError for the first thing wrong."""
    if not isinstance(claim, Mapping):
        raise ValueError(f"a claim is a mapping of {', '.join(KEYS)}, not {_what(claim)}")
    unknown = [str(key) for key in claim if key not in KEYS]
    if unknown:
        raise ValueError(f"unknown keys {', '.join(unknown)} (a claim has {', '.join(KEYS)})")
    if "metric" not in claim:
        raise ValueError("it has no metric (the column its bounds are about)")
    for key in ("metric", "where", "needs", "table"):
        if key in claim and not isinstance(claim[key], str):
            raise ValueError(f"its {key} must be text, not {_what(claim[key])}")
    for key in ("where", "needs"):
        if key in claim:
            _parsed(key, claim[key])
    for key in ("min", "max"):
        if claim.get(key) == []:
            raise ValueError(f"its {key} is an empty list")
        count_bounds(claim.get(key), f"its {key}")
        for bound in listed(claim.get(key)):
            try:
                checked_bound(bound)
            except ValueError as error:
                raise ValueError(f"its {key}: {error}") from None


def _check_names(claim: Mapping, names: list[str]) -> None:
    """ValueError for a name in the claim's where, needs or bounds that is none of `names` but
    a typo of one (harness.names.typo_of: `lenght` for length)."""
    for key in ("where", "needs", "min", "max"):
        for text in listed(claim.get(key)):
            if not isinstance(text, str):
                continue
            for name in sorted(expressions.parse(text).names - {*names, claim["metric"]}):
                refuse_typo(f"its {key}", name, names)


def _check_kinds(claim: Mapping, values: Mapping[str, list]) -> None:
    """ValueError for a where or needs that compares a parameter with a constant of a kind none
    of its planned values has (`n == '2'` where n is a number on every point; `causal == 1`
    where it is true or false): it would select no point, and say nothing. None is no kind (a
    value missing); a parameter with values of other types (lists) is not checked."""
    for key in ("where", "needs"):
        if not claim.get(key):
            continue
        for column, op, constant in expressions.compared(expressions.parse(claim[key])):
            taken = [value for value in values.get(column, ()) if value is not None]
            kinds = {KINDS.get(type(value)) for value in taken}
            if not kinds or None in kinds or KINDS[type(constant)] in kinds:
                continue
            raise ValueError(
                f"its {key} compares {column}, {_parameter(taken, kinds)}, with the "
                f"{KINDS[type(constant)]} {constant!r}{_write(column, op, constant, kinds)}"
            )


def _parameter(taken: list, kinds: set[str]) -> str:
    """A parameter by the kinds of its values: "an integer parameter", "a text parameter"."""
    if all(type(value) is int for value in taken):
        return "an integer parameter"
    return f"a {' or '.join(ADJECTIVES[kind] for kind in sorted(kinds))} parameter"


def _write(column: str, op: str, constant, kinds: set[str]) -> str:
    """What to write instead, where the constant reads plainly as a kind the parameter has:
    ": write n == 2"; "" where it does not."""
    fixed = _rewritten(constant, kinds)
    if fixed is None:
        return ""
    return f": write {fixed!r} in its list" if op in ("in", "not in") else (
        f": write {column} {op} {fixed!r}")  # fmt: skip


def _rewritten(constant, kinds: set[str]):
    """The constant as one of the kinds a parameter has, where it reads plainly as one (the
    text '2' as 2, 1 as '1' or True, True as 1); None otherwise."""
    if "number" in kinds and isinstance(constant, bool):
        return int(constant)
    if "number" in kinds and isinstance(constant, str):
        for number in (int, float):
            try:
                value = number(constant)
            except ValueError:
                continue
            return value if math.isfinite(value) else None
    if "text" in kinds and not isinstance(constant, bool | str):
        return str(constant)
    if "truth value" in kinds and constant in (0, 1, "true", "false", "True", "False"):
        return constant in (1, "true", "True")
    return None


def _parsed(key: str, text: str) -> None:
    """A where or bound checked against the grammar: ValueError, naming the key, if outside."""
    try:
        expressions.parse(text)
    except expressions.ExpressionError as error:
        raise ValueError(f"its {key}: {error}") from None


def _a_number(bound) -> bool:
    """Whether a bound is a number a value can be compared with (not a bool, not NaN)."""
    return isinstance(bound, int | float) and not isinstance(bound, bool) and not math.isnan(bound)


def _what(value) -> str:
    """A value in a message: itself if short, else its type."""
    text = repr(value)
    return text if len(text) <= 40 else type(value).__name__


def count_bounds(bound, what: str = "a bound") -> None:
    """ValueError for a list of more than MOST_BOUNDS bounds."""
    if isinstance(bound, list | tuple) and len(bound) > MOST_BOUNDS:
        raise ValueError(f"{what} lists {len(bound)} bounds, over the {MOST_BOUNDS} it may have")


def listed(bound) -> list:
    """A claim's min or max as a list of bounds (none, one, or several)."""
    return [] if bound is None else list(bound) if isinstance(bound, list | tuple) else [bound]
