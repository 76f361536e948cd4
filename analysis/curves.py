"""A training experiment's curves on the page, with no report module of its own: every metric its
points log (rows with a `step`, harness.results.runs), a figure per metric against step, a line
per point named by the parameters that vary, the rows of a phase other than `train` (a held-out
evaluation) marked rather than joined.

Readable at hundreds of runs: the HIGHLIGHT points of lowest and of highest final value
(runs.finals: the evaluation's where the metric has one) are drawn in colour and named in the
legend with their final value, every other thin and grey with no legend entry, its hover still
naming its point; the page's box above each figure shows only the runs whose names hold every
word typed (octlm_analysis.page). Where a sweep has at most ALL_NAMED points each is drawn and
named. A search's pruned trial is dotted. Each curve is downsampled (plots.downsample), a grey
one to GREY_POINTS points, so that the page keeps its size.
"""

import numpy as np
import pandas as pd

from harness import store
from harness.measuring.columns import is_housekeeping, is_number_column
from harness.results import runs
from octlm_analysis import plots

HIGHLIGHT = 3  # the points drawn in colour at each end of the final values' order
ALL_NAMED = 2 * HIGHLIGHT + 4  # a sweep of at most this many points has every one named
GREY_POINTS = 200  # at most this many points a grey curve (2 per bucket: min and max)
GREY = "rgba(120, 120, 120, 0.35)"
COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#17becf", "#bcbd22", "#7f7f7f"]  # fmt: skip
DASHES = {"pruned": "dot"}  # a point that ended so: a line of this dash (others: solid)
TRAIN = "train"  # the phase drawn as a line; rows of any other phase are marked
NOT_METRICS = {"experiment", "sweep", runs.STEP, runs.PHASE, "trial", "cell"}


def figures(rows: pd.DataFrame, params: list[str], config: dict, drawn=()) -> list[dict]:
    """A figure per metric of a training experiment's rows (none for rows without steps): those
    its `plots` names, in its order, else every numeric one that is no parameter (`params`, a
    search's), no harness column and no timing's housekeeping, up to plots.FIGURES; less those
    that a figure in `drawn` (a report module's own) already draws against step."""
    if not runs.stepped(rows):
        return []
    searched = list((config.get("search") or {}).get("params") or {})
    named = [*params, *(p for p in searched if p not in params)]
    own = {f["layout"]["yaxis"]["title"]["text"] for f in drawn if _against_step(f)}
    shown = [m for m in metrics(rows, named, config) if plots.plain(plots.title(m)) not in own]
    kept = ["job", runs.STEP, runs.PHASE, "status", "trial", *named, *shown[: plots.FIGURES]]
    stepped = rows[rows[runs.STEP].notna()][[c for c in dict.fromkeys(kept) if c in rows]]
    stepped = runs.ordered(stepped)  # the columns drawn alone: each copy of the rows is small
    points = _points(stepped, named)
    made = (curves(stepped, points, m) for m in shown[: plots.FIGURES])
    return [figure for figure in made if figure is not None]


def metrics(rows: pd.DataFrame, params: list[str], config: dict) -> list[str]:
    """The metrics drawn: `plots` (the experiment's config) where it names any, else each
    numeric column with a value, in the rows' order, that is no parameter, no harness column,
    no step or phase and no timing's housekeeping."""
    skip = {*params, *store.HARNESS_COLUMNS, *NOT_METRICS}
    named = config.get("plots")
    listed = named if named is not None else [c for c in rows if not is_housekeeping(c)]
    return [
        c
        for c in dict.fromkeys(listed)
        if c in rows and c not in skip and is_number_column(rows[c]) and rows[c].notna().any()
    ]


def _against_step(figure: dict) -> bool:
    return figure["layout"].get("xaxis", {}).get("title", {}).get("text") == runs.STEP


def _points(rows: pd.DataFrame, params: list[str]) -> pd.DataFrame:
    """A line per job: its name (the parameters that vary between the jobs, else its job),
    what the page's box reads of it (job, trial, name), its number (job, trial) and how it
    ended (pruned where any row says so)."""
    last = runs.ordered(rows).drop_duplicates("job", keep="last").set_index("job", drop=False)
    names = plots.varying(last, params)
    status = store.job_statuses(rows.reset_index(drop=True))
    pruned = rows.groupby("job")["status"].agg(lambda s: (s == "pruned").any())
    said = []
    for job, point in last.iterrows():
        name = plots.label(point, names) if names else f"job {job}"
        trial = f"trial {int(point['trial'])} · " if pd.notna(point.get("trial")) else ""
        said.append({"job": job, "name": name, "hover": f"job {job} · {trial}{name}",
                     "number": f"job {job} · {trial}"})  # fmt: skip
    points = pd.DataFrame(said).set_index("job")
    points["status"] = status.where(~pruned, "pruned").reindex(points.index)
    return points


def finals(rows: pd.DataFrame, metric: str) -> pd.Series:
    """Each job's final value of `metric` (runs.finals): its evaluation's where a row of phase
    eval holds the metric, else its training's; sorted, lowest first."""
    last = runs.finals(rows, metric)
    if runs.PHASE in last:
        held_out = last[last[runs.PHASE] == "eval"]
        last = held_out if not held_out.empty else last[_training(last)]
    return last.drop_duplicates("job", keep="last").set_index("job")[metric].sort_values()


def curves(rows: pd.DataFrame, points: pd.DataFrame, metric: str) -> dict | None:
    """`metric` against step, a line per job (its training rows), its other rows marked; the
    highlighted jobs (ends of `finals`, or all of a small sweep) in colour, named in the legend
    with their final value, drawn over the grey rest. `rows`: in step order (runs.ordered).
    None where no row has a value."""
    held = rows[rows[metric].notna()]
    if held.empty:
        return None
    final = finals(held, metric)
    ends = [*final.index[:HIGHLIGHT], *final.index[-HIGHLIGHT:][::-1]]
    bright = list(dict.fromkeys(final.index if len(final) <= ALL_NAMED else ends))
    at = held.groupby("job", sort=False).indices  # each job's rows, in step order
    grey = [job for job in points.index if job in at and job not in bright]
    budget = min(plots.CURVE_POINTS, max(400, plots.FIGURE_POINTS // max(len(bright), 1)))
    arrays = (held[runs.STEP].to_numpy(), held[metric].to_numpy(dtype=float),
              _training(held).to_numpy(), _phases(held))  # fmt: skip
    traces = []
    for job in grey:
        traces += _traces([a[at[job]] for a in arrays], points.loc[job], None, GREY_POINTS)
    for number, job in enumerate(bright):
        said = (COLOURS[number % len(COLOURS)], final.get(job))
        traces += _traces([a[at[job]] for a in arrays], points.loc[job], said, budget)
    name = _title(metric, arrays[2], points, grey)
    finite = arrays[1][np.isfinite(arrays[1])]
    span = [finite.min(), finite.max()] if len(finite) else []  # all that the axis's type reads
    fig = plots.figure(traces, name, runs.STEP, plots.title(metric), (), span)
    fig["layout"]["meta"] = {"runs": len(points)}  # the page puts a box to filter runs above it
    return fig


def _title(metric: str, train: np.ndarray, points: pd.DataFrame, grey: list) -> str:
    """What a figure of curves shows: its metric per step, and what tells its runs apart."""
    said = [f"{len(grey)} more runs in grey, the ends by final value named" if grey else ""]
    said.append("marks: eval rows" if not train.all() else "")
    said.append("dotted: pruned" if points["status"].isin(list(DASHES)).any() else "")
    notes = "; ".join(filter(None, said))
    return f"{metric} per step" + (f" ({notes})" if notes else "")


def _training(rows: pd.DataFrame) -> pd.Series:
    """Which rows are a run's training rows: of phase train, or of none."""
    if runs.PHASE not in rows:
        return pd.Series(True, index=rows.index)
    return rows[runs.PHASE].isna() | (rows[runs.PHASE] == TRAIN)


def _phases(rows: pd.DataFrame) -> np.ndarray:
    if runs.PHASE not in rows:
        return np.full(len(rows), "", dtype=object)
    return rows[runs.PHASE].astype(str).to_numpy()


def _traces(arrays: list[np.ndarray], point: pd.Series, bright, budget: int) -> list:
    """A job's line (its training rows, downsampled to `budget`) and its marked other rows;
    `arrays`: its steps, values, which are training rows and their phases; `bright`: (colour,
    final value) for a highlighted job, None for a grey one. Its hover names it by its number,
    its trace's name and the y axis's title (plots.plain, both); `meta` is what the page's box
    reads."""
    steps, values, train, phases = arrays
    said, value = f"{point['number']}%{{fullData.name}}", "%{yaxis.title.text} %{y:.4g}"
    colour = bright[0] if bright else GREY
    name = point["name"] if bright is None or pd.isna(bright[1]) else (
        f"{point['name']} ({bright[1]:.3g})")  # fmt: skip
    if point["status"] in DASHES:
        name += f" ({point['status']})"
    name = plots.plain(name)
    line = {"type": "scatter", "mode": "lines", "name": name, "legendgroup": point["hover"],
            "showlegend": bright is not None, "meta": point["hover"],
            "hovertemplate": f"{said}<br>step %{{x}}<br>{value}<extra></extra>",
            "line": {"color": colour, "width": 2 if bright else 1,
                     "dash": DASHES.get(point["status"], "solid")}}  # fmt: skip
    traces = []
    if train.any():
        shown = plots.downsample(steps[train], values[train], budget)
        traces.append({**line, "x": plots.steps_array(shown[0]), "y": plots.typed(shown[1])})
    if not train.all():
        marks = {**line, "mode": "markers", "showlegend": bright is not None and not train.any(),
                 "x": steps[~train].astype(float).tolist(), "y": values[~train].tolist(),
                 "text": [plots.plain(phase) for phase in phases[~train]],
                 "marker": {"color": colour, "symbol": "diamond", "size": 9 if bright else 5},
                 "hovertemplate": f"{said}<br>%{{text}} at step %{{x}}<br>{value}"
                                  "<extra></extra>"}  # fmt: skip
        marks.pop("line")
        traces.append(marks)
    return traces
