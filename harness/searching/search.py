"""A search within each cell of the grid: Optuna trials as the sweep's points.

The config's `search` (conf/config.yaml) gives a space in Hydra's sweeper grammar (interval,
tag(log, interval), range, choice), an objective (a metric of the point's rows), its direction,
a number of trials, a sampler and a pruner. Each cell of the grid (a point it would run) becomes
`trials` points, one per trial: job cell * trials + slot, planned as any point, so every launcher
runs them as it runs a grid, as many at once as it allows, a new one as soon as one ends. Each
cell is an Optuna study (named cell-N) in the sweep's journal (_study.journal, Optuna's journal
file storage: appends under a file lock, which processes on a shared file system can share).

A trial's point asks its study for parameters when it starts (study.ask: the sampler sees every
trial told so far) and records its job in the trial; run again (resume, a requeue) it takes the
same trial back, and so the same parameters and checkpoint, unless that trial failed: then it
asks for a new one. While it trains, the objective of each row that matches `prune_on` is
reported to the pruner every `report_every` such rows; a pruned trial stops at that row, and
its point ends with a row of status "pruned" (an answer: resume does not rerun it). When it ends,
the objective of its last row that matches `where` is told to the study (a point that failed,
or has no such value, is a failed trial). Its rows carry `cell` and `trial` (the trial's number
in its cell's study) and the trial's parameters as their columns.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import types
import typing
from pathlib import Path
from typing import TYPE_CHECKING

from harness import files
from harness.errors import BadInput, one_line
from harness.lifetime import per_command
from harness.names import key_of, setting
from harness.store.search_settings import shape_fault

if TYPE_CHECKING:  # Hydra and Optuna load where a search is planned or run, not for a report
    from hydra.core.override_parser.types import Override

JOURNAL = "_study.journal"
PARAMS = "search.params."  # the command line's search space: search.params.KEY=interval(...)
GRAMMAR = "interval(a, b), tag(log, interval(a, b)), range(a, b, step) or choice(a, b, ...)"


class Pruned(Exception):
    """The pruner stopped the trial: its point ends with a row of status "pruned"."""


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
    import yaml

    from harness.names import CONF

    node = yaml.safe_load((CONF / "config.yaml").read_text()).get("search") or {}
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
        _sampler(checked, 0), _pruner(checked)
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


def storage(folder: Path):
    """The sweep's studies: Optuna's journal file storage in its folder, one per process (it
    reads the journal once, then only what other processes appended since); files.Linked for a
    journal that is a symlink, which would take the trials' writes elsewhere."""
    path = Path(folder).resolve() / JOURNAL
    files.no_links(path)
    return _storage(str(path))


@per_command
@functools.lru_cache(maxsize=8)
def _storage(path: str):
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    lock = _JournalLock(path)  # the lock every append takes
    _cut_partial_line(path, lock)
    return JournalStorage(JournalFileBackend(path, lock_obj=lock))


class _JournalLock:
    """The journal's lock, as Optuna's file backend takes it (acquire, release): files.lock on
    JOURNAL.flock, which the kernel lets go when its holder dies, so that a trial killed while
    it appended holds up no one. (Optuna's own symlink lock stays behind a kill, and the next
    writer waits out its grace period, 30 s, before it takes it over.)"""

    def __init__(self, journal: str):
        self.path, self.opened = Path(journal + ".flock"), None

    def acquire(self) -> bool:
        opened = files.lock(self.path)
        self.opened = opened  # set once held: one holder at a time, across threads too
        return True

    def release(self) -> None:
        opened, self.opened = self.opened, None
        if opened is not None:
            files.unlock(opened)


def _cut_partial_line(path: str, lock) -> None:
    """Cut a last line without its end off the journal: what a writer killed mid-append left
    (under the lock every append takes, so no live writer's). Optuna skips such a line, but
    the next append would join it into one line that no read could parse again."""
    journal = Path(path)
    if not _ends_cut(journal):
        return
    lock.acquire()
    try:
        if not _ends_cut(journal):
            return
        text = journal.read_bytes()
        kept = text.rfind(b"\n") + 1
        os.truncate(journal, kept)
        print(f"warning: {journal}: cut off a partial last line ({len(text) - kept} bytes) that "
              "a killed trial left", file=sys.stderr)  # fmt: skip
    finally:
        lock.release()


def _ends_cut(journal: Path) -> bool:
    """Whether the journal's last byte is not a line's end (False for none or an empty one)."""
    try:
        with open(journal, "rb") as f:
            if f.seek(0, os.SEEK_END) == 0:
                return False
            f.seek(-1, os.SEEK_END)
            return f.read(1) != b"\n"
    except FileNotFoundError:
        return False


def study(folder: Path, search: dict, cell: int):
    """The cell's study (created by the first trial that asks), with the search's sampler
    (unseeded: a trial seeds its own) and pruner."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(
        storage=storage(folder),
        study_name=f"cell-{cell}",
        direction=search["direction"],
        sampler=_sampler(search, None),
        pruner=_pruner(search),
        load_if_exists=True,
    )


def _sampler(search: dict, seed: int | None):
    import optuna

    kind = {"tpe": optuna.samplers.TPESampler, "random": optuna.samplers.RandomSampler}
    return kind[search["sampler"]](seed=seed, **search.get("sampler_options", {}))


def _pruner(search: dict):
    import optuna

    kind = {
        "median": optuna.pruners.MedianPruner,
        "successive_halving": optuna.pruners.SuccessiveHalvingPruner,
        "hyperband": optuna.pruners.HyperbandPruner,
        "none": optuna.pruners.NopPruner,
    }
    return kind[search["pruner"]](**search.get("pruner_options", {}))


def studies(folder: Path) -> dict[int, object]:
    """cell -> its study, of those the sweep's journal holds (none before a trial asked)."""
    import optuna

    if not (Path(folder) / JOURNAL).exists():
        return {}
    try:
        held = storage(folder)
        return {
            int(s.study_name.removeprefix("cell-")): optuna.load_study(
                study_name=s.study_name, storage=held
            )
            for s in optuna.get_all_study_summaries(held)
            if s.study_name.startswith("cell-")
        }
    except Exception as error:  # a link, a damaged or foreign line: whatever replaying raises
        print(f"warning: the sweep's trials cannot be read from {Path(folder) / JOURNAL}: "
              f"{type(error).__name__}: {one_line(error)[:200]}", file=sys.stderr)  # fmt: skip
        return {}


def fail_orphans(folder: Path, kept: set[int]) -> list[str]:
    """Fail the trials a kill left running that no point will take back: asked but killed
    before the trial recorded its job, or of a job that `kept` (the points a resume reruns,
    and those SLURM still runs) does not hold. A line per cell saying which."""
    import optuna

    said = []
    for cell, held in sorted(studies(folder).items()):
        running = held.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        orphans = [t.number for t in running if t.user_attrs.get("job") not in kept]
        for number in orphans:
            held.tell(number, state=optuna.trial.TrialState.FAIL)
        if orphans:
            listed = ", ".join(map(str, orphans))
            trials = "trial" if len(orphans) == 1 else "trials"
            said.append(f"cell {cell}: failed {trials} {listed}, which a killed run left running")
    return said


def progress(folder: Path, search: dict, points: dict[int, str] | None = None) -> list[str]:
    """A line per cell's study: its trials by state (Optuna's: running, complete, pruned,
    fail), and the best so far with its parameters. A trial its study still holds running whose
    point `points` (job -> its state, as status says) says ended otherwise (killed, failed)
    is counted as that: a kill tells the study nothing."""
    lines = []
    for cell, held in sorted(studies(folder).items()):
        trials = held.get_trials(deepcopy=False)
        states = {}
        for trial in trials:
            state = trial.state.name.lower()
            said = (points or {}).get(trial.user_attrs.get("job"))
            if state == "running" and said in ("killed", "failed", "not run"):
                state = said
            states[state] = states.get(state, 0) + 1
        counts = ", ".join(f"{n} {state}" for state, n in states.items())
        line = f"cell {cell}: {len(trials)} trials asked of {search['trials']} ({counts})"
        done = [t for t in trials if t.state.name == "COMPLETE"]
        if done:
            best = held.best_trial
            said = f"trial {best.number} ({values_said(best.params)})"
            line += f"; best {search['objective']}={best.value:.4g}, {said}"
        lines.append(line)
    return lines


class Trial:
    """A trial's point as it runs: its parameters, the pruner's reports, what it tells."""

    def __init__(self, folder: Path, search: dict, planned: dict, job: int, seed: int, hints: dict):
        import optuna

        self.search, self.cell = search, planned["cell"]
        self.study = study(folder, search, self.cell)
        own = [t for t in self.study.get_trials(deepcopy=False) if t.user_attrs.get("job") == job]
        last = own[-1] if own else None
        # Seeded by job and attempt: a new trial after a failed one draws afresh.
        self.study.sampler = _sampler(search, (seed * 1_000_003 + job) * 1_009 + len(own))
        if last is not None and last.state != optuna.trial.TrialState.FAIL:
            self.trial = optuna.trial.Trial(self.study, last._trial_id)
            self.params = dict(last.params)
            self.ended = last.state if last.state.is_finished() else None
        else:
            spaces = {k: distribution(k, t, hints.get(k)) for k, t in search["params"].items()}
            self.trial = self.study.ask(spaces)
            self.trial.set_user_attr("job", job)
            self.params, self.ended = dict(self.trial.params), None
        self.number = self.trial.number
        self.metric, self.every = search["objective"], search["report_every"]
        self.matched, self.found = 0, None  # rows matching prune_on; the last `where` value
        self.fixed: dict = {}  # the point's parameters, which `where` and `prune_on` may name

    def label(self) -> str:
        """trial 3 (lr=0.0042 warmup=50), for a progress line."""
        return f"trial {self.number} ({values_said(self.params)})"

    def observe(self, row: dict) -> None:
        """A logged row: the objective of a `where` row is kept; of a `prune_on` row, reported
        every report_every such rows (Pruned when the pruner stops the trial)."""
        import optuna

        if self.ended == optuna.trial.TrialState.PRUNED:  # told so before a restart
            raise Pruned(f"at step {row.get('step', '?')} (told so before a restart)")
        value, seen = row.get(self.metric), {**self.fixed, **row}
        if value is None:
            return
        if _matches(seen, self.search["where"]):
            self.found = value
        if not self.search["prune_on"] or not _matches(seen, self.search["prune_on"]):
            return
        self.matched += 1
        step = row.get("step", self.matched)  # a restart's rows report at the same steps
        if step % self.every or self.ended is not None or not math.isfinite(value):
            return
        self.trial.report(float(value), int(step))
        if self.trial.should_prune():
            raise Pruned(f"at step {step}: {self.metric}={value:.4g}")

    def tell(self, rows: list[dict], status: str) -> float | None:
        """Tell the study how the trial ended (its value, pruned, or failed): the objective of
        its last `where` row among `rows` (those returned), else among those it logged."""
        import optuna

        for row in reversed(rows):
            if _matches(row, self.search["where"]) and row.get(self.metric) is not None:
                self.found = row[self.metric]
                break
        value = self.found
        number = float(value) if isinstance(value, int | float) else math.nan
        if self.ended is not None:  # told already: a point restarted after its tell
            return number if self.ended == optuna.trial.TrialState.COMPLETE else None
        State = optuna.trial.TrialState
        if status == "pruned":
            self.study.tell(self.trial, state=State.PRUNED)
        elif status == "ok" and math.isfinite(number):
            self.study.tell(self.trial, number)
            return number
        else:
            self.study.tell(self.trial, state=State.FAIL)
        return None


def values_said(params: dict) -> str:
    """lr=0.006466 warmup=50: a trial's values as a line prints them (names.setting)."""
    return " ".join(setting(k, v) for k, v in params.items())


def _matches(row: dict, where: dict) -> bool:
    return all(row.get(key) == value for key, value in where.items())


def best_rows(rows, search: dict):
    """Each cell's best trial's `where` row (the objective's), with status "ok" only where
    every trial of the cell has an answer (store.DONE: ok, unsupported, pruned), else
    "running": a claim on it is INCOMPLETE until then. A cell without a value yet is a row of
    its parameters alone, "not run"."""
    import pandas as pd

    from harness import store

    if rows.empty or "cell" not in rows:
        return rows.iloc[0:0]
    metric, maximize = search["objective"], search["direction"] == "maximize"
    kept = []
    for _, trials in rows.groupby("cell", sort=True):
        statuses = store.job_statuses(trials)
        ended = statuses.isin(store.DONE).all()
        chosen = trials[trials["job"].isin(statuses.index[statuses == "ok"])]
        for key, value in search["where"].items():
            chosen = chosen[chosen[key] == value] if key in chosen else chosen.iloc[0:0]
        chosen = chosen.drop_duplicates("job", keep="last")  # the value each trial told
        values = pd.to_numeric(chosen.get(metric, pd.Series(dtype=float)), errors="coerce")
        if values.notna().any():
            best = chosen.loc[[values.idxmax() if maximize else values.idxmin()]]
            kept.append(best if ended else best.assign(status="running"))
        else:
            kept.append(trials.iloc[:1][["cell", *_params_of(trials)]].assign(status="not run"))
    return pd.concat(kept, ignore_index=True)


def _params_of(rows) -> list[str]:
    from harness import store

    return [c for c in store.parameter_columns(rows) if c in rows]
