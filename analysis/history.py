"""python -m harness history EXPERIMENT [METRIC ...] [out=DIR] [--check]: the steps in an
experiment's history, each between the two sweeps (their codes and commits) where it lies.

A series is one metric of one point (its parameters) over the experiment's sweeps in the order
they were planned, one value a sweep: the point's value as the report's point lines hold it
(octlm_analysis.point_lines; a timing's value is the median of its repeats, its sweep's process
the unit, as in the gate). Only measurements count, as in the gate: a point not ok is no value,
a timing copied by reuse counts once (an answer's copy is its sweep's answer, and counts), and a
timing taken while other processes used more than compare.BUSY of the CPUs beside it is
set aside, as are the timings of a sweep a busy moment slowed as a whole (steps.slowed_sweeps:
the median of its timings more than the factor above their neighbouring sweeps'). Sweeps of
different machines (the rows' device_name) make histories of their own; a sweep whose points
ran on several is refused. The series are judged together by
octlm_analysis.steps (binary segmentation by Welch's t, Holm's rule over every series).

Sweeps that `python -m harness again` made (history --confirm makes them) are another sweep's
code run later: no part of the history.

The metrics: those named, else every metric the points have (numbers, no timing's
housekeeping: harness.measuring.columns). A step is worse where a timing grew, or where a
claimed metric moved toward the bound it is nearer (a claim with only a max: it grew; only a
min: it fell); --check exits 1 where a step is worse, 0 otherwise, 2 on bad input.
"""

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from harness import store
from harness.errors import BadInput
from harness.measuring.columns import LOAD, is_housekeeping, is_number_column, is_timing
from harness.names import point_words
from octlm_analysis import plots, point_lines, steps

MACHINE = "device_name"  # the machine a sweep ran on, as its rows say


@dataclass(frozen=True)
class Series:
    metric: str
    point: dict  # the point's varying parameters
    machine: str
    sweeps: list[str]  # the sweeps with a value, in the order they were planned
    values: np.ndarray
    direction: int  # +1 higher is worse, -1 lower is, 0 neither


@dataclass
class History:
    experiment: str
    sweeps: pd.DataFrame  # a line per sweep: sweep, planned, machine, code_digest, git_commit
    series: list[Series]
    found: list[steps.Step] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # what had too few sweeps, and why
    slowed: list[str] = field(default_factory=list)  # sweeps a busy moment slowed as a whole

    def is_worse(self, step: steps.Step) -> bool:
        return steps.worse(step, self.series[step.series].direction)


def history(root: Path, experiment: str, metrics: list[str], report_dir: Path,
            side: int = steps.SIDE) -> History:  # fmt: skip
    """The experiment's history judged: its series (of `metrics`, or its own) and their steps."""
    if experiment not in store.experiments(root):
        raise BadInput(f"no experiment {experiment} in {root}")
    points = point_lines.of_experiment(root, experiment, report_dir)
    return judge(root, experiment, points, metrics, side)


def judge(root: Path, experiment: str, points: pd.DataFrame, metrics: list[str],
          side: int = steps.SIDE) -> History:  # fmt: skip
    """The history of the experiment's points (point_lines.of_experiment) judged; BadInput
    where it has nothing to judge."""
    params = points.attrs.get("params", [])
    points = points[~points["sweep"].isin(reruns(root, experiment))]
    sweeps = sweep_lines(points)
    config = _newest_config(root, experiment, sweeps)
    metrics = chosen_metrics(points, params, metrics)
    varying = [p for p in params if p in points and points[p].astype(str).nunique() > 1]
    judged = History(experiment, sweeps, [])
    for machine, own in sweeps.groupby("machine", sort=True):
        if len(own) < 2 * side:
            judged.skipped.append(f"{machine} ({len(own)} sweeps)")
            continue
        lines = points[points["sweep"].isin(own["sweep"])]
        found = series_of(lines, own, metrics, varying, machine, config, side, judged.skipped)
        judged.series += without_slowed(found, own["sweep"].tolist(), side, judged.slowed)
    if not judged.series:
        most = int(sweeps.groupby("machine").size().max()) if len(sweeps) else 0
        if most >= 2 * side and judged.skipped:
            raise BadInput(f"no series of {experiment} to judge: {judged.skipped[0]}")
        raise BadInput(f"{most} sweeps of {experiment} on one machine: a step needs at least "
                       f"{side} either side ({2 * side} sweeps)")  # fmt: skip
    judged.found = steps.find_steps([s.values for s in judged.series], side)
    return judged


def sweep_lines(points: pd.DataFrame) -> pd.DataFrame:
    """A line per sweep with rows, in the order planned: its machine (one only: BadInput for
    several), code digest and commit (its own rows', not those it copied from another sweep,
    which name that one's)."""
    ran = points[points["status"] != "not run"]
    planned = ran[point_lines.PLANNED].fillna(ran["started_at"])
    ran = ran.assign(planned=planned)
    lines = []
    for sweep, own in ran.groupby("sweep", sort=False):
        machines = sorted(own[MACHINE].dropna().astype(str).unique())
        if len(machines) > 1:
            raise BadInput(f"sweep {sweep} ran on several machines ({', '.join(machines)}): "
                           "its values are no one machine's")  # fmt: skip
        ran_here = own[own["reused_from"].isna()] if "reused_from" in own else own
        lines.append({"sweep": sweep, "planned": own["planned"].min(),
                      "machine": machines[0] if machines else "unknown machine",
                      "code_digest": _first(own, "code_digest"),
                      "git_commit": _first(ran_here if len(ran_here) else own, "git_commit")
                      })  # fmt: skip
    table = pd.DataFrame(lines, columns=["sweep", "planned", "machine", "code_digest",
                                         "git_commit"])  # fmt: skip
    return table.sort_values(["planned", "sweep"], ignore_index=True)


def without_slowed(found: list[Series], order: list[str], side: int,
                   slowed: list[str]) -> list[Series]:  # fmt: skip
    """The series of one machine, their timings rid of the sweeps a busy moment slowed as a
    whole (steps.slowed_sweeps, over every timing series, the sweeps in `order`), each named
    in `slowed`; a timing series left with fewer than 2 * side values is left out."""
    timings = [s for s in found if is_timing(s.metric)]
    at = {sweep: n for n, sweep in enumerate(order)}
    logs = np.full((len(order), len(timings)), np.nan)
    for column, series in enumerate(timings):
        rows = [at[sweep] for sweep in series.sweeps]
        logs[rows, column] = np.log(np.where(series.values > 0, series.values, np.nan))
    gone = {order[n] for n in np.flatnonzero(steps.slowed_sweeps(logs))}
    slowed += sorted(gone)
    kept = []
    for series in found:
        if is_timing(series.metric) and gone & set(series.sweeps):
            keep = [sweep not in gone for sweep in series.sweeps]
            sweeps = [sweep for sweep, k in zip(series.sweeps, keep, strict=True) if k]
            series = replace(series, sweeps=sweeps, values=series.values[keep])
        if len(series.values) >= 2 * side:
            kept.append(series)
    return kept


def reruns(root: Path, experiment: str) -> set[str]:
    """The experiment's sweeps that `again` made (their manifests' again_of): another sweep's
    code run later, no part of the history (history --confirm makes them)."""
    found = set()
    for sweep in store.sweeps(root, experiment):
        manifest = store.read_manifest(store.SweepPaths(root, experiment, sweep)) or {}
        if manifest.get("again_of"):
            found.add(sweep)
    return found


def _first(lines: pd.DataFrame, column: str) -> str:
    said = lines[column].dropna() if column in lines else []
    return str(said.iloc[0]) if len(said) else ""


def _newest_config(root: Path, experiment: str, sweeps: pd.DataFrame) -> dict:
    """The experiment config the newest sweep recorded (its claims)."""
    for sweep in reversed(sweeps["sweep"].tolist()):
        manifest = store.read_manifest(store.SweepPaths(root, experiment, sweep))
        if manifest:
            return manifest.get("experiment_config") or {}
    return {}


def chosen_metrics(points: pd.DataFrame, params: list[str], named: list[str]) -> list[str]:
    """The metrics judged: those named (BadInput for one the points do not have), else every
    metric of numbers the points have."""
    measured = [c for c in points if c not in params and c not in point_lines.KEPT
                and c not in store.HARNESS_COLUMNS and c not in ("sweep", point_lines.PLANNED)
                and not is_housekeeping(c) and is_number_column(points[c])]  # fmt: skip
    for metric in named:
        if metric not in measured:
            raise BadInput(f"no metric {metric} in the history: its metrics are "
                           f"{', '.join(measured) or 'none'}")  # fmt: skip
    return list(dict.fromkeys(named)) if named else measured


def series_of(lines, sweeps: pd.DataFrame, metrics: list[str], varying: list[str], machine: str,
              config: dict, side: int, skipped: list[str]) -> list[Series]:  # fmt: skip
    """Each metric's series a point, of one machine's sweeps (`sweeps`, in order): a value a
    sweep, where it measured it (_set_aside); a series with fewer than 2 * side values is left
    out, and where what was set aside left it so, `skipped` says so."""
    from octlm_analysis.compare import own_column

    order = {sweep: n for n, sweep in enumerate(sweeps["sweep"])}
    ok = lines[lines["status"] == "ok"]
    groups = list(ok.groupby(varying, dropna=False, sort=True)) if varying else [((), ok)]
    found = []
    for metric in metrics:
        load = own_column(metric, LOAD, lines.columns) if is_timing(metric) else None
        for key, own in groups:
            own = own.dropna(subset=[metric])
            own = own.assign(n=own["sweep"].map(order)).sort_values("n")
            point = dict(zip(varying, key if isinstance(key, tuple) else (key,), strict=True))
            aside = _set_aside(own, metric, load)
            kept = ~np.any([np.zeros(len(own), bool), *aside.values()], axis=0)
            if kept.sum() < 2 * side <= len(own):
                said = " and ".join(f"{m.sum()} {why}" for why, m in aside.items() if m.any())
                skipped.append(f"{metric} at {point_words(point)}: of {len(own)} sweeps, {said}, "
                               "set aside")  # fmt: skip
            own = own[kept].drop_duplicates("sweep", keep="last")
            if len(own) < 2 * side:
                continue
            values = own[metric].to_numpy(dtype=float)
            direction = _direction(metric, config, float(np.median(values)))
            found.append(Series(metric, point, machine, own["sweep"].tolist(), values, direction))
    return found


def _set_aside(own: pd.DataFrame, metric: str, load: str | None) -> dict[str, np.ndarray]:
    """Of a timing's values at one point (`own`, a line a sweep, in order), those that are no
    measurement of their sweep, by why: a measurement other sweeps copied by reuse counts
    once, in the first sweep that holds it (the same start and value, as in the gate: a copy
    measured nothing); of the rest, one taken while other processes used more than BUSY of
    the CPUs beside it (its `load` column). Any other metric's copy is its sweep's answer too:
    the reuse key holds its code, config, inputs and machine."""
    from octlm_analysis.compare import BUSY  # the gate's rule (compare imports report)

    if not is_timing(metric):
        return {}
    copied = own.duplicated(["started_at", metric]).to_numpy()
    aside = {"copied from another sweep (reuse)": copied}
    if load in own:
        busy = (pd.to_numeric(own[load], errors="coerce") > BUSY).to_numpy()
        aside[f"timed with other processes using over {BUSY:.0%} of the CPUs beside it"] = (
            busy & ~copied)  # fmt: skip
    return aside


def _direction(metric: str, config: dict, level: float) -> int:
    """+1 where a higher value is worse, -1 where a lower one is, 0 where neither is said: a
    timing grows worse; a claimed metric worsens toward the bound it has, and of a min and a
    max, toward the one nearer `level` (the series' median) on a log scale where both are
    numbers, else toward the max."""
    if is_timing(metric):
        return 1
    claims = [c for c in config.get("claims") or [] if c.get("metric") == metric]
    lows = [b for c in claims for b in _listed(c.get("min"))]
    highs = [b for c in claims for b in _listed(c.get("max"))]
    if not highs:
        return -1 if lows else 0
    low = max((b for b in lows if _number(b)), default=None)
    high = min((b for b in highs if _number(b)), default=None)
    if low is None or high is None or not (0 < low < level < high):
        return 1
    return 1 if math.log(high / level) <= math.log(level / low) else -1


def _listed(bound) -> list:
    return [] if bound is None else list(bound) if isinstance(bound, list) else [bound]


def _number(bound) -> bool:
    return isinstance(bound, int | float) and not isinstance(bound, bool)


def text(judged: History) -> str:
    """The history's steps in words: a block a step, then what was judged."""
    lines = []
    for n, step in enumerate(judged.found, 1):
        series = judged.series[step.series]
        before, after = series.sweeps[step.at - 1], series.sweeps[step.at]
        kind = "worse" if judged.is_worse(step) else "better" if series.direction else "changed"
        lines += [
            f"step {n}: {series.metric} at {point_words(series.point)}: {steps.said(step)} "
            f"({kind}; {step.at - step.start} sweeps before, {step.end - step.at} after, "
            f"p {step.p:.2g})",
            f"  between sweep {_sweep(judged, before)}",
            f"      and sweep {_sweep(judged, after)}",
            f"  python -m harness code {before} {after}: the two codes' difference",
        ]
        commits = judged.sweeps.set_index("sweep")["git_commit"]
        if commits[before] and commits[after] and commits[before] != commits[after]:
            lines.append(f"  git log --oneline {commits[before][:10]}..{commits[after][:10]}: the "
                         "commits between, in the repository of the experiment's code "
                         "(--bisect finds the first on the far side)")  # fmt: skip
    machines = sorted({s.machine for s in judged.series})
    lines.append(
        f"{judged.experiment}: {len(judged.found)} step(s) in {len(judged.series)} series "
        f"({', '.join(dict.fromkeys(s.metric for s in judged.series))}) over "
        f"{len(judged.sweeps)} sweeps on {'; '.join(machines)}; a step is a change beyond "
        f"x{steps.TOLERANCE:g} either way with at least {steps.SIDE} sweeps either side, that "
        "Welch's t finds at 5% over every series together (Holm's rule)"
    )
    if judged.skipped:
        lines.append(f"not judged, too few sweeps: {'; '.join(judged.skipped)}")
    if judged.slowed:
        lines.append(f"timings set aside, their sweep slowed as a whole (the median of its "
                     f"timings over x{steps.TOLERANCE:g} their neighbours'): "
                     f"{', '.join(judged.slowed)}")  # fmt: skip
    return "\n".join(lines)


def _sweep(judged: History, sweep: str) -> str:
    line = judged.sweeps.set_index("sweep").loc[sweep]
    planned = pd.Timestamp(line["planned"]).strftime("%Y-%m-%d %H:%M")
    code = str(line["code_digest"])[:12] or "none"
    commit = str(line["git_commit"])[:10] or "none"
    return f"{sweep} (planned {planned} UTC, code {code}, commit {commit})"


def on_page(root: Path, experiment: str, points: pd.DataFrame) -> History | None:
    """The experiment's history for the page and the report's --check; None where it has too
    few sweeps, or nothing else to judge."""
    try:
        return judge(root, experiment, points, [])
    except BadInput:
        return None


def marked(figure: dict, metric: str, judged: History, points: pd.DataFrame) -> dict:
    """A history figure (octlm_analysis.plots.history) of `metric` with its steps marked: a
    dashed line at the first sweep after each, and a note naming the change and both sweeps
    (its parameters' values and the metric as plain text: plots.plain)."""
    shapes, notes = [], []
    for step in judged.found:
        series = judged.series[step.series]
        if series.metric != metric:
            continue
        before, after = series.sweeps[step.at - 1], series.sweeps[step.at]
        when = points.loc[points["sweep"] == after, "started_at"].min()
        x = pd.Timestamp(when).strftime("%Y-%m-%d %H:%M:%S")
        kind = "worse" if judged.is_worse(step) else "step"
        line = {"dash": "dash", "width": 1, "color": "#d62728" if kind == "worse" else "#7f7f7f"}
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": x, "x1": x, "y0": 0,
                       "y1": 1, "line": line})  # fmt: skip
        change = f"x{step.change:.3g}" if step.log else f"{step.change:+.3g}"
        notes.append({"x": x, "xref": "x", "yref": "paper", "y": 1 - 0.08 * len(notes),
                      "xanchor": "left", "showarrow": False, "font": {"size": 10},
                      "text": plots.plain(f"{kind} {change} at {point_words(series.point)}: "
                                          f"{before} → {after}"),
                      "hovertext": plots.plain(f"{metric}: {steps.said(step)}, p {step.p:.2g}")
                      })  # fmt: skip
    if shapes:
        layout = figure.setdefault("layout", {})
        layout["shapes"] = [*layout.get("shapes", []), *shapes]
        layout["annotations"] = [*layout.get("annotations", []), *notes]
    return figure


def worse_lines(judged: History) -> list[str]:
    """A line for each step that made a metric worse: the report's --check fails on them."""
    lines = []
    for step in filter(judged.is_worse, judged.found):
        series = judged.series[step.series]
        before, after = series.sweeps[step.at - 1], series.sweeps[step.at]
        lines.append(f"{series.metric} at {point_words(series.point)}: {steps.said(step)} between "
                     f"sweeps {before} and {after}")  # fmt: skip
    return lines


def pairs(judged: History) -> list[dict]:
    """The two sweeps each step lies between, once per pair (harness.command.confirm.Pair's
    fields): whether its timings' steps grew, whether any step is worse, the steps' timings
    and other metrics in words, the two sweeps' commits, and the step a bisection follows (its
    metric, point and scale): the pair's first worse step, else its first."""
    found: dict[tuple, dict] = {}
    commit = judged.sweeps.set_index("sweep")["git_commit"]
    for step in judged.found:
        series = judged.series[step.series]
        key = (series.sweeps[step.at - 1], series.sweeps[step.at])
        pair = found.setdefault(key, {"before": key[0], "after": key[1], "grew": True,
                                      "worse": False, "timings": (), "others": (),
                                      "commits": (commit[key[0]], commit[key[1]])})  # fmt: skip
        if "metric" not in pair or judged.is_worse(step) and not pair["worse"]:
            pair.update(metric=series.metric, point=series.point, log=step.log)
        said = f"{series.metric} at {point_words(series.point)} ({steps.said(step)})"
        if is_timing(series.metric):
            pair["timings"] += (said,)
            pair["grew"] = step.change > 1 if len(pair["timings"]) == 1 else pair["grew"]
        else:
            pair["others"] += (said,)
        pair["worse"] |= judged.is_worse(step)
    return list(found.values())


def main(experiment: str, metrics: list[str], out: Path, check: bool) -> tuple[int, list[dict]]:
    """The command: the history's steps printed; with `check`, 1 where one is worse; and the
    pairs of sweeps its steps lie between (for --confirm)."""
    judged = history(out / "results", experiment, metrics, out / "report")
    print(text(judged))
    worse = [s for s in judged.found if judged.is_worse(s)]
    return (1 if check and worse else 0), pairs(judged)
