"""A note's bindings computed from the store, read as `python -m harness report` reads it.

Each binding reads one sweep: the one it names (`sweep ID`, `tag:NAME`, `last`), else the one
the report judges for its experiment (octlm_analysis.report_config.latest_sweep: the newest that
`again` did not make, with rows). Its rows are the sweep's planned points' (store.as_planned);
a value reducer reads the ok rows its where selects, or a table the experiment derives
(METRIC as TABLE.COLUMN, harness.results.claims.derived_tables); a verdict is the report's own
(claims_table over the sweep's planned points, with the config the report takes,
trusted_config), the worst of the claims on METRIC where several are (N/A only where every one
is: a claim for CUDA says nothing of a sweep on the CPU). Each sweep is read once however many
bindings name it.

A value comes with what it read: its sweep, how many rows, their digest (sha256 of the rows'
job, metric and where columns), the code digests that made them. A binding that names
what is not there is a BadBinding (exit 2); one whose sweep or rows are gone is a value with a
`problem` (stale: --check fails on it).
"""

import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from harness import store
from harness.errors import BadInput
from harness.names import available_experiments, closest
from harness.results import expressions, runs
from harness.results.claims import claims_table, derived_tables, parameters
from octlm_analysis.notes import VERDICTS, BadBinding, Binding, stands, written_like
from octlm_analysis.report_config import latest_sweep, trusted_config

WORST_FIRST = ("ERROR", "FAIL", "INCOMPLETE", "PASS", "N/A")  # of several claims on a metric


@dataclass
class Value:
    """A binding's value as the store gives it now, and what it read; `problem`: why there is
    none (its sweep or rows gone; `unswept`: its experiment has no sweep in the store)."""

    binding: Binding
    value: object = None
    problem: str | None = None
    sweep: str | None = None
    rows: int = 0
    digest_of: Callable[[], str] | None = field(default=None, repr=False)  # see digest
    code: tuple[str, ...] = ()
    table: pd.DataFrame | None = None  # a block's: what it shows
    params: tuple[str, ...] = ()  # the sweep's planned parameters
    unswept: bool = False

    @functools.cached_property
    def digest(self) -> str:
        """sha256 of what it read, taken when first asked: a written note names it, a check
        reads the rows alone."""
        return self.digest_of() if self.digest_of is not None else ""


class Sweeps:
    """The store as the bindings read it: each experiment's judged sweep and each sweep's rows,
    manifest, tables and claims, read once."""

    def __init__(self, root: Path, config_dirs: list[Path] = ()):
        self.root, self.config_dirs = Path(root), list(config_dirs)
        self._judged: dict[str, str | None] = {}
        self._read: dict[tuple[str, str], tuple] = {}
        self._claims: dict[tuple[str, str], pd.DataFrame] = {}
        self._listed: dict[str, list[str]] = {}
        self.experiments = set(store.experiments(self.root)) if self.root.is_dir() else set()
        self.known = self.experiments | set(available_experiments(self.config_dirs))

    def sweep_of(self, binding: Binding) -> str | None:
        """The sweep a binding reads (None: the experiment has none); BadInput for a tag no
        sweep has."""
        experiment, named = binding.experiment, binding.sweep
        if named is None:
            if experiment not in self._judged:
                found = latest_sweep(self.root, experiment)[0] if experiment in self.experiments \
                    else None  # fmt: skip
                self._judged[experiment] = found
            return self._judged[experiment]
        if experiment not in self.experiments:
            return None
        return store.named_sweep(self.root, named, experiment)

    def listed(self, experiment: str) -> list[str]:
        """The experiment's sweeps in the store (store.sweeps), listed once."""
        if experiment not in self._listed:
            self._listed[experiment] = store.sweeps(self.root, experiment)
        return self._listed[experiment]

    def sweep(self, experiment: str, sweep: str) -> tuple[pd.DataFrame, dict | None, dict]:
        """A sweep's planned points' rows, its manifest and its config as the report takes it."""
        key = (experiment, sweep)
        if key not in self._read:
            manifest = store.read_manifest(store.SweepPaths(self.root, experiment, sweep))
            # The planned points' rows as Arrow, then pandas: a twentieth of the time of
            # as_planned over a DataFrame (an integer with gaps is a float here, as exact).
            table = store.read_table(self.root, experiment, sweep)
            rows = store.as_planned(table, manifest, self.root).to_pandas()
            config = trusted_config(manifest, experiment, self.config_dirs)
            self._read[key] = rows, manifest, config
        return self._read[key]

    def claims(self, experiment: str, sweep: str) -> pd.DataFrame:
        """The sweep's claims judged as the report judges them (claims_table), once."""
        key = (experiment, sweep)
        if key not in self._claims:
            rows, manifest, config = self.sweep(experiment, sweep)
            self._claims[key] = claims_table(rows, config, (manifest or {}).get("points"))
        return self._claims[key]


def evaluate(binding: Binding, sweeps: Sweeps) -> Value:
    """A binding's value now; BadBinding where it names what no experiment, claim or column
    is (with the name meant where one is near), or its where cannot be evaluated."""
    try:
        return _evaluate(binding, sweeps)
    except expressions.ExpressionError as error:
        raise BadBinding(f"its where: {error}") from None


def _evaluate(binding: Binding, sweeps: Sweeps) -> Value:
    if binding.experiment not in sweeps.known:
        raise BadBinding(f"no experiment {binding.experiment!r} in the store or the configs"
                         f"{closest(binding.experiment, sweeps.known)}")  # fmt: skip
    try:
        sweep = sweeps.sweep_of(binding)
    except BadInput as error:
        return Value(binding, problem=str(error))
    if sweep is None:
        problem = f"{binding.experiment} has no sweep in {sweeps.root}"
        return Value(binding, problem=problem, unswept=True)
    if sweep not in sweeps.listed(binding.experiment):
        near = closest(sweep, sweeps.listed(binding.experiment))
        return Value(binding, sweep=sweep, problem=f"sweep {sweep} of {binding.experiment} is "
                     f"no longer in the store{near}")  # fmt: skip
    rows, manifest, config = sweeps.sweep(binding.experiment, sweep)
    code = tuple(sorted({str(c) for c in rows.get("code_digest", pd.Series()).dropna()}))
    params = tuple(parameters((manifest or {}).get("points")))
    found = Value(binding, sweep=sweep, code=code, params=params)
    if binding.reducer == "verdict":
        return _verdict(found, sweeps.claims(binding.experiment, sweep), config)
    table, metric = _table(rows, config, manifest, binding)
    if binding.block == "harness-table":
        return _shown(found, rows, config, list(params))
    selected = _selected(table, binding, metric)
    found.rows = len(selected)
    found.digest_of = functools.partial(_digest, selected, binding, metric)
    if binding.block == "harness-figure":
        found.table = selected
        return found if len(selected) else _gone(found, "has no rows with a value")
    values = pd.to_numeric(selected[metric], errors="coerce") if len(selected) else selected
    if binding.reducer == "count":
        found.value = int(values.notna().sum()) if len(selected) else 0
        return found
    if not len(selected) or values.isna().all():
        return _gone(found, "has no rows with a value")
    found.value = _reduced(selected, values, binding.reducer, metric)
    return found


def _table(rows: pd.DataFrame, config: dict, manifest: dict | None, binding: Binding):
    """The table a binding reads (the rows, or a derived table for TABLE.COLUMN) and its
    column; BadBinding for a table or column the sweep does not have."""
    name, _, column = (binding.metric or "").rpartition(".")
    if binding.block == "harness-table":
        return rows, None
    table = rows
    if name:
        tables = derived_tables(rows, config) if len(rows) else {}
        if name not in tables:
            raise BadBinding(f"{binding.experiment} derives no table {name!r}"
                             f"{closest(name, tables)}")  # fmt: skip
        table = tables[name]
    answered = len(table) and ("status" not in table or (table["status"] == "ok").any())
    if column not in table and answered:
        raise BadBinding(f"no column {column!r} in {binding.experiment}'s "
                         f"{name or 'rows'}{closest(column, table.columns)}")  # fmt: skip
    for used in expressions.parse(binding.where).names if binding.where else ():
        if used not in table and answered:
            raise BadBinding(f"its where names {used!r}, no column of {binding.experiment}'s "
                             f"{name or 'rows'}{closest(used, table.columns)}")  # fmt: skip
    return table, column


def _selected(table: pd.DataFrame, binding: Binding, metric: str) -> pd.DataFrame:
    """The ok lines the binding's where selects that hold the metric."""
    if metric not in table or not len(table):
        return table.iloc[:0]
    kept = table[metric].notna()
    if "status" in table:
        kept &= table["status"] == "ok"
    if binding.where:
        kept &= expressions.holds(binding.where, table, "a binding's where")
    return table[kept]


def _reduced(selected: pd.DataFrame, values: pd.Series, reducer: str, metric: str):
    """min, max, mean, median of the numbers; last: the last row's (a run's last step)."""
    if reducer == "last":
        last = runs.ordered(selected).iloc[-1][metric] if runs.stepped(selected) else (
            selected.sort_values("job", kind="stable") if "job" in selected else selected
        ).iloc[-1][metric]  # fmt: skip
        return last if isinstance(last, str) else float(last)
    return float(getattr(values.dropna(), reducer)())


def _verdict(found: Value, claims: pd.DataFrame, config: dict) -> Value:
    """The verdict of the claims on the binding's metric (the worst, of several)."""
    metric = found.binding.metric
    on = [i for i, c in enumerate(config.get("claims") or []) if c.get("metric") == metric]
    if not on:
        metrics = [c.get("metric") for c in config.get("claims") or []]
        raise BadBinding(f"{found.binding.experiment} has no claim on {metric!r} (its claims "
                         f"are on {', '.join(map(str, metrics)) or 'nothing'})"
                         f"{closest(metric, metrics)}")  # fmt: skip
    results = [claims.iloc[i]["result"] for i in on]
    found.value = min(results, key=lambda r: WORST_FIRST.index(r) if r in VERDICTS else 0)
    found.rows = len(on)
    chosen = claims.iloc[on]
    found.digest_of = lambda: hashlib.sha256(chosen.to_csv(index=False).encode()).hexdigest()
    return found


def _shown(found: Value, rows: pd.DataFrame, config: dict, params: list[str]) -> Value:
    """A harness-table block: the experiment's declared table of the sweep."""
    from harness.results.tables import sweep_table

    if not config.get("table"):
        raise BadBinding(f"{found.binding.experiment} declares no table: (`table:` in its YAML)")
    ok = rows[rows["status"] == "ok"] if "status" in rows else rows
    if found.binding.where and len(ok):
        ok = expressions.select(ok, found.binding.where)
    found.table = sweep_table(ok, config, params)
    found.rows, found.digest_of = len(ok), functools.partial(_digest, ok, found.binding, None)
    return found if found.table is not None else _gone(found, "has no rows for its table")


def _digest(selected: pd.DataFrame, binding: Binding, metric: str | None) -> str:
    """sha256 of the rows read: of pandas' hash of each row's job, metric and where's columns
    (every column, for a table block), in order."""
    names = expressions.parse(binding.where).names if binding.where else set()
    columns = [c for c in ["job", metric, *sorted(names)] if c and c in selected]
    if metric is None:
        columns = list(selected.columns)
    read = selected[list(dict.fromkeys(columns))]
    hashed = pd.util.hash_pandas_object(read, index=False).to_numpy()
    return hashlib.sha256(b"".join([",".join(read.columns).encode(), hashed.tobytes()])).hexdigest()


def _gone(found: Value, what: str) -> Value:
    where = f" where {found.binding.where}" if found.binding.where else ""
    found.problem = f"sweep {found.sweep} {what}{where}"
    return found


def shown(found: Value) -> str:
    """A value as the rendered note shows it."""
    return written_like(found.value, found.binding.written)


def accepted(text: str, values: list[Value]) -> str:
    """The note with each inline binding that no longer stands given the store's value (those
    that stand, those whose sweep or rows are gone, and blocks, as written)."""
    for found in sorted(values, key=lambda v: v.binding.start, reverse=True):
        binding = found.binding
        if (
            binding.block
            or found.problem
            or (binding.written and stands(binding.written, found.value))
        ):
            continue
        inside = binding.text
        left = inside.rpartition("->")[0] if "->" in inside else inside.rstrip() + " "
        replaced = f"{{{{{left}-> {shown(found)} }}}}"
        text = text[: binding.start] + replaced + text[binding.end :]
    return text
