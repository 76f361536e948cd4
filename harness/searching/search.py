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

Here: a trial's point as it runs (Trial) and each cell's best rows. The space and the settings
are harness.searching.space's, the studies harness.searching.journal's; what callers use of
them is importable from here too.
"""

from __future__ import annotations

import math
from pathlib import Path

from harness.searching.journal import JOURNAL, fail_orphans, progress, studies, study, values_said
from harness.searching.space import (
    check_launcher,
    command_line,
    distribution,
    of_manifest,
    sampler,
    slots,
    spec,
)

__all__ = [  # what the harness, the report and the tests use of the search, by this module
    "JOURNAL", "Pruned", "Trial", "best_rows", "check_launcher", "command_line", "fail_orphans",
    "of_manifest", "progress", "slots", "spec", "studies", "study", "values_said",
]  # fmt: skip


class Pruned(Exception):
    """The pruner stopped the trial: its point ends with a row of status "pruned"."""


class Trial:
    """A trial's point as it runs: its parameters, the pruner's reports, what it tells."""

    def __init__(self, folder: Path, search: dict, planned: dict, job: int, seed: int, hints: dict):
        import optuna

        self.search, self.cell = search, planned["cell"]
        self.study = study(folder, search, self.cell)
        own = [t for t in self.study.get_trials(deepcopy=False) if t.user_attrs.get("job") == job]
        last = own[-1] if own else None
        # Seeded by job and attempt: a new trial after a failed one draws afresh.
        self.study.sampler = sampler(search, (seed * 1_000_003 + job) * 1_009 + len(own))
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
