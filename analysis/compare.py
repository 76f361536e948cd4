"""python -m harness report compare SWEEP_A SWEEP_B: two sweeps of one experiment, point by point.

Points match by their parameters (the manifest's points[i]["params"]): by those that vary
within either sweep. A parameter fixed in both sweeps, to different values (dtype=float32 in
A, float64 in B), is what the comparison is about: the header shows it and points do not
match on it. Each metric is shown for A and B with the ratio B/A (octlm_analysis.compare_tables);
points that only one sweep has, statuses that differ and claims whose result differs are listed.

A timing (a metric column harness.measuring.columns.is_timing calls one: its name ends in _ms or
_s) is judged over processes. A side may be several sweeps of one grid, each run by a command
of its own and so in processes of its own (`compare A1,A2,A3 B1,B2,B3`; `python -m harness
again A B` makes them): each sweep's value of a timing (the median of its repeats) is one
process's, and the processes are the unit, since the same code timed in two processes differs
by more than either's repeats show. This module gathers each timing's processes a point; the
gate judges them (octlm_analysis.gate: judge, with octlm_analysis.verdicts' statistics). Only
measurements count:
- a process during which other processes used more than BUSY of the CPUs beside the timing
  (its own X_cpu_load_beside, else cpu_load_beside: harness.measuring.timing) is set aside;
- a value that is another's copy (a row reused from another sweep, on either side: the same
  start and the same value) counts once, as the one measurement it is;
- a CUDA timing is judged only where both sides' SM clocks agree (octlm_analysis.gate.CLOCKS).
A timing left with fewer than two processes a side is not judged, and says why.

Sweeps of training runs (rows with a step: harness.results.runs) are compared by their runs'
final values: a line a point, each metric's last value in each phase (train, eval), as a
trainer reads a run; their timings are final values too, judged by no gate.
"""

import math
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from harness import store
from harness.measuring.columns import CLOCK, LOAD, is_housekeeping, is_number_column, is_timing
from harness.results import runs
from octlm_analysis import plots
from octlm_analysis.sides import SWEEP_INDEX, CompareError, Side

RULE = (
    "A timing is judged over processes: each sweep's value (the median of its repeats) is one "
    "process's, and a side of several sweeps of one grid (A1,A2,A3) has several. B/A is the "
    "ratio of the sides' geometric means, with Welch's t interval over the processes; a timing "
    "is slower only where its test of B/A <= the factor passes Holm's rule over all the "
    "timings judged (at most 5% of gates of identical code fail), the same where the "
    "interval lies within the factor both ways, faster where it lies below 1/factor, and "
    "ambiguous where it reaches beyond the factor (the factor: the gate's, 1.10 without one). "
    "A process during which others used over a quarter of the CPUs beside a timing is set "
    "aside, a value copied from another measurement (reuse) counts once, and a CUDA timing is "
    "judged only where the SM clocks agree; a timing left with fewer than two processes a "
    "side is not judged."
)
BUSY = 0.25  # a process whose timing had more than this LOAD beside it is set aside
NOT_METRICS = {"experiment", "sweep", "repeats", LOAD, SWEEP_INDEX, *store.HARNESS_COLUMNS}
# A timing X's processes, on the line of its point (octlm_analysis.compare._processes):
VALUES, IDS = " values", " ids"  # the values that count, and each one's measurement
BUSY_SET, COPIES, CLOCKS_SEEN = " busy", " copies", " clocks"  # set aside; the SM clocks
# plotly.js's own colors, a point's A and B sharing one
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
          "#7f7f7f", "#bcbd22", "#17becf"]  # fmt: skip


@dataclass(frozen=True)
class Comparison:
    a: Side
    b: Side
    keys: list[str]  # the parameters points match on
    settings: pd.DataFrame  # parameters fixed in both sweeps, to different values
    matched: pd.DataFrame  # one line per measurement of either sweep: keys, "side", "X A", "X B"
    timings: list[str]
    others: list[str]
    # of training runs: metric -> {phase (None: rows without one): its column in matched}
    finals: dict[str, dict] = field(default_factory=dict)


def compare(a: Side, b: Side) -> Comparison:
    """Match the two sweeps' measurements; raises CompareError for different experiments."""
    if a.experiment != b.experiment:
        raise CompareError(
            f"sweep {a.id} is {a.experiment} and sweep {b.id} is {b.experiment}: "
            "compare two sweeps of one experiment"
        )
    params_a, params_b = parameters(a.manifest), parameters(b.manifest)
    keys, settings = split_parameters(params_a, params_b)
    names = set(params_a) | set(params_b)
    if runs.stepped(a.rows) or runs.stepped(b.rows):
        return _compare_runs(a, b, keys, settings, names)
    timings, others = metrics([a.rows, b.rows], names)
    sides = [_processes(measurements(s, keys, names), timings) for s in (a, b)]
    matched = match(*sides, keys)
    return Comparison(a, b, keys, settings, matched, timings, others)


def _compare_runs(a: Side, b: Side, keys: list[str], settings: pd.DataFrame,
                  names: set[str]) -> Comparison:  # fmt: skip
    """Two sweeps of training runs matched point by point, by their final values."""
    measured = [m for kind in metrics([a.rows, b.rows], names | {runs.STEP}) for m in kind]
    finals: dict[str, dict] = {m: {} for m in measured}
    sides = []
    for side in (a, b):
        lines, columns = final_values(side.rows, measured)
        for metric, phases in columns.items():
            finals[metric].update(phases)
        sides.append(_processes(measurements(replace(side, rows=lines), keys, names), []))
    finals = {metric: phases for metric, phases in finals.items() if phases}
    others = [column for phases in finals.values() for column in phases.values()]
    return Comparison(a, b, keys, settings, match(*sides, keys), [], others, finals)


def final_values(rows: pd.DataFrame, metrics: list[str]) -> tuple[pd.DataFrame, dict]:
    """A line a point (and SWEEP_INDEX, a side's sweep): its status and error (its last row's, or
    its last row's that is not ok), and each metric's final value in each phase (runs.finals)
    as a column "METRIC PHASE" (METRIC, of rows without a phase); and metric -> {phase (None:
    none): its column}."""
    if rows.empty:
        return rows, {}
    needed = [*runs.POINT, SWEEP_INDEX, "status", "error", runs.PHASE, runs.STEP, *metrics]
    rows = rows[[c for c in dict.fromkeys(needed) if c in rows]]  # a run's many rows: only these
    by = [c for c in ("job", SWEEP_INDEX) if c in rows]
    order = runs.ordered(rows)
    ok = order["status"].eq("ok") if "status" in order else pd.Series(True, index=order.index)
    lines = pd.concat([order[ok], order[~ok]]).groupby(by, sort=False).tail(1)
    gone = [*metrics, runs.STEP, runs.PHASE]
    lines = lines.drop(columns=[c for c in gone if c in lines]).set_index(by)
    columns, finals = {}, {}
    for metric in metrics:
        last = runs.finals(rows, metric)
        last = last[last[metric].notna()] if metric in last else last.iloc[:0]
        phases = last[runs.PHASE] if runs.PHASE in last else pd.Series(None, index=last.index)
        for phase in [*phases.dropna().unique(), *[None] * bool(phases.isna().any())]:
            held = last[phases.isna()] if phase is None else last[phases == phase]
            column = metric if phase is None else f"{metric} {phase}"
            columns[column] = held.groupby(by)[metric].last().reindex(lines.index)
            finals.setdefault(metric, {})[phase] = column
    lines = pd.concat([lines, pd.DataFrame(columns, index=lines.index)], axis=1)
    return lines.reset_index(), finals


def parameters(manifest: dict) -> pd.DataFrame:
    """The manifest's points: one line each, the job and its parameters."""
    points = [{"job": p["job"], **p.get("params", {})} for p in manifest["points"]]
    return pd.DataFrame(points).set_index("job")


def split_parameters(a: pd.DataFrame, b: pd.DataFrame) -> tuple[list[str], pd.DataFrame]:
    """The parameters that vary in either sweep (the keys; the job when none does), and those
    fixed in both to different values (parameter, A, B)."""
    names = list(dict.fromkeys([*a.columns, *b.columns]))
    varying = [n for n in names if _distinct(a, n) > 1 or _distinct(b, n) > 1]
    fixed = [n for n in names if n not in varying]
    changed = [n for n in fixed if not _same(_only_value(a, n), _only_value(b, n))]
    settings = pd.DataFrame(
        {"A": [_only_value(a, n) for n in changed], "B": [_only_value(b, n) for n in changed]},
        index=pd.Index(changed, name="parameter"),
    )
    return varying or ["job"], settings


def measurements(sweep: Side, keys: list[str], params: set[str]) -> pd.DataFrame:
    """One line per row of the sweep: its point's keys (from the manifest), then the row less
    the parameters; a point without rows is a line with status "not run"."""
    grid = (
        parameters(sweep.manifest)
        .reset_index()
        .reindex(columns=list(dict.fromkeys(["job", *keys])))
    )
    rows = (
        sweep.rows
        if not sweep.rows.empty
        else pd.DataFrame({"job": pd.Series(dtype="int64"), "status": []})
    )
    rows = rows.drop(columns=[c for c in rows if c in params or c in ("experiment", "sweep")])
    by = ["job", SWEEP_INDEX] if SWEEP_INDEX in rows else "job"
    rows = rows.assign(row=rows.groupby(by).cumcount())
    lines = grid.merge(rows, on="job", how="left")
    lines["status"] = lines["status"].fillna("not run")
    lines["row"] = lines["row"].fillna(0).astype(int)
    return lines


def _processes(lines: pd.DataFrame, timings: list[str]) -> pd.DataFrame:
    """A side's measurements' lines as one line per point and row, each timing X with its
    processes (a side of one sweep has one): X VALUES, the value of each process that counts,
    in the order of the side's sweeps; X IDS, each one's measurement (its job's start and its
    value: a row reused from another sweep keeps both); X BUSY_SET, how many were set aside
    for a busy machine (LOAD over BUSY); X COPIES, how many were another process's copy; X
    CLOCKS_SEEN, the SM clocks of those that count, where the timing is a GPU's; and X the
    median of all its processes' values. The status is ok only where every sweep's is (else
    the first that is not, its error with it); the load is the largest; the rest the first
    sweep's."""
    if SWEEP_INDEX not in lines:
        lines = lines.assign(**{SWEEP_INDEX: 0})
    lines = lines.sort_values(SWEEP_INDEX, kind="stable").reset_index(drop=True)
    groups = lines.groupby(["job", "row"], sort=True)
    pooled = groups.first()
    failed = lines[~lines["status"].eq("ok")].groupby(["job", "row"]).first()
    pooled.loc[failed.index, ["status", "error"]] = failed.reindex(columns=["status", "error"])
    at = list(groups.indices.values())  # each point and row's lines, in pooled's order
    columns = {}
    ok = lines["status"].eq("ok").to_numpy()
    started = cells(lines, "started_at")
    for timing in [t for t in timings if t in lines]:
        values = pd.to_numeric(lines[timing], errors="coerce").astype(float).to_numpy()
        columns[timing] = [np.nanmedian(values[i]) if np.isfinite(values[i]).any() else np.nan
                          for i in at]  # fmt: skip
        load = numbers(lines, own_column(timing, LOAD, lines.columns)).to_numpy()
        clock = numbers(lines, own_column(timing, CLOCK, lines.columns)).to_numpy()
        counted = ok & np.isfinite(values) & (values > 0)
        busy = counted & (load > BUSY)
        ids = [None if pd.isna(when) else f"{pd.Timestamp(when).value}:{value!r}"
               for when, value in zip(started, values, strict=True)]  # fmt: skip
        kept = {VALUES: [], IDS: [], BUSY_SET: [], COPIES: [], CLOCKS_SEEN: []}
        for lines_at in at:
            seen, taken, copies = [], set(), 0
            for i in lines_at:
                if not counted[i] or busy[i]:
                    continue
                if ids[i] is not None and ids[i] in taken:
                    copies += 1
                    continue
                seen.append(i)
                taken.add(ids[i])
            kept[VALUES].append([float(values[i]) for i in seen])
            kept[IDS].append([ids[i] for i in seen])
            kept[CLOCKS_SEEN].append([float(clock[i]) for i in seen if np.isfinite(clock[i])])
            kept[BUSY_SET].append(int(busy[lines_at].sum()))
            kept[COPIES].append(copies)
        columns |= {timing + part: pd.Series(column, index=pooled.index, dtype=object)
                    for part, column in kept.items()}  # fmt: skip
    for load in [c for c in lines if is_load(c)]:  # each timing's: the largest
        columns[load] = numbers(lines, load).groupby([lines["job"], lines["row"]]).max()
    pooled = pd.concat([pooled.drop(columns=[SWEEP_INDEX, *columns], errors="ignore"),
                        pd.DataFrame(columns, index=pooled.index)], axis=1)  # fmt: skip
    return pooled.reset_index()


def match(a: pd.DataFrame, b: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """The two sweeps' lines side by side on the keys ("X A", "X B"); side: both, A or B."""
    on = list(dict.fromkeys([*keys, "row"]))

    def named(frame: pd.DataFrame, side: str) -> pd.DataFrame:
        return frame.rename(columns={c: f"{c} {side}" for c in frame.columns if c not in on})

    matched = named(a, "A").merge(named(b, "B"), on=on, how="outer", indicator="side")
    matched["side"] = matched["side"].map({"both": "both", "left_only": "A", "right_only": "B"})
    in_grid_order = [c for c in ("job", "job A", "job B", "row") if c in matched]
    return matched.sort_values(in_grid_order, kind="stable", ignore_index=True)


def metrics(frames: list[pd.DataFrame], params: set[str]) -> tuple[list[str], list[str]]:
    """The numeric columns that are neither parameters nor the harness's: (timings, others).

    A timing is what harness.measuring.columns.is_timing says is one, of these metric columns
    alone (a planned parameter is never a timing, whatever its name); how it was taken (its
    spread X_iqr_ms, samples, repeats, the load beside it, its threads, its GPU's clocks:
    is_housekeeping, with or without a prefix) is no metric of its own.
    """
    columns = list(dict.fromkeys(c for frame in frames for c in frame.columns))
    numeric = [
        c
        for c in columns
        if c not in params | NOT_METRICS
        and not is_housekeeping(c)
        and any(c in frame and is_number_column(frame[c]) for frame in frames)
    ]
    timings = [c for c in numeric if is_timing(c)]
    return timings, [c for c in numeric if c not in timings]


def curve_figures(c: "Comparison") -> list[dict]:
    """Each training metric over step, both sides' runs overlaid (octlm_analysis.plots.curves):
    a line a point, A solid and B dashed in one color a point, the rows of a phase other than
    the run's own (its most rows: train) marked, B's open. A side of several sweeps: its
    first's runs."""
    figures = []
    for metric in c.finals:
        points = {}
        traces = [t for side, name in ((c.a, "A"), (c.b, "B"))
                  for t in _side_curves(side, name, metric, c.keys, points)]  # fmt: skip
        if not traces:
            continue
        values = pd.concat([numbers(side.rows, metric) for side in (c.a, c.b)]).dropna()
        extremes = [values.min(), values.max()] if len(values) else []  # all the axis needs
        marked = any(trace["mode"] == "markers" for trace in traces)
        name = f"{metric} per step: A solid, B dashed" + (" (diamonds: other phases)"
                                                             if marked else "")  # fmt: skip
        figures.append(plots.figure(traces, name, "step", plots.title(metric), (), extremes))
    return figures


def _side_curves(side: Side, name: str, metric: str, keys: list[str], points: dict) -> list:
    """A side's traces of a metric over step (plots.curves'), each colored by its point
    (`points`: label -> color, shared by both sides)."""
    rows = (side.parts or [side])[0].rows
    if metric not in rows or runs.STEP not in rows:
        return []
    rows = rows[[c for c in ("job", runs.STEP, runs.PHASE, metric) if c in rows]]
    rows = rows[rows[metric].notna() & rows[runs.STEP].notna()]
    phases = rows[runs.PHASE].fillna("") if runs.PHASE in rows else pd.Series("", rows.index)
    own = phases == (phases.value_counts().index[0] if len(phases) else "")
    grid = parameters(side.manifest).reset_index()
    labels = {point["job"]: plots.label(point, keys) for _, point in grid.iterrows()}
    held_out = rows.loc[~own, ["job", runs.STEP, metric]] if (~own).any() else None
    figure = plots.curves(rows[own].sort_values(["job", runs.STEP], kind="stable"),
                          {job: f"{name} {label}" for job, label in labels.items()}, metric,
                          held_out)  # fmt: skip
    if figure is None:
        return []
    for trace in figure["data"]:
        point = trace["legendgroup"].removeprefix(f"{name} ")
        color = points.setdefault(point, COLORS[len(points) % len(COLORS)])
        trace["legendgroup"] = point
        if trace["mode"] == "lines":
            trace["line"] = {"color": color, "dash": "solid" if name == "A" else "dash"}
        else:
            trace["marker"] |= {"color": color, "symbol": "diamond" if name == "A"
                                else "diamond-open"}  # fmt: skip
    return figure["data"]


def own_column(timing: str, name: str, columns) -> str:
    """A timing's own column of its housekeeping `name`, among `columns`: named with the
    timing's prefix as harness.measuring.timing.time_call's columns are prefixed (sdpa_time_ms:
    sdpa_cpu_load_beside), else the unprefixed `name`."""
    prefix = timing.removesuffix("time_ms") if timing.endswith("time_ms") else ""
    return f"{prefix}{name}" if f"{prefix}{name}" in columns else name


def is_load(column: str) -> bool:
    """Whether a column is a timing's LOAD, prefixed (sdpa_cpu_load_beside) or not."""
    return column == LOAD or column.endswith(f"_{LOAD}")


def in_common(c: Comparison) -> int:
    """How many points both sweeps have."""
    return int(c.matched.loc[c.matched["side"] == "both", "row"].eq(0).sum())


def nothing_in_common(c: Comparison) -> str:
    """The line that says two sweeps share no point: what they match on, and how many each has."""
    alone = c.matched[c.matched["row"] == 0]["side"].value_counts()
    return (
        f"sweeps {c.a.id} and {c.b.id} have no point in common (matched on "
        f"{', '.join(c.keys)}): {alone.get('A', 0)} points only in A, {alone.get('B', 0)} only "
        "in B; nothing to compare"
    )


def _distinct(frame: pd.DataFrame, name: str) -> int:
    return frame[name].astype(str).nunique() if name in frame else 0


def _only_value(frame: pd.DataFrame, name: str):
    return frame[name].iloc[0] if name in frame and len(frame) else None


def _same(a, b) -> bool:
    return (pd.isna(a) and pd.isna(b)) or a == b


def numbers(frame: pd.DataFrame, column: str, side: str | None = None) -> pd.Series:
    """A column (a side's: "column A") as floats, NaN where it is missing or not a number."""
    name = f"{column} {side}" if side else column
    return pd.to_numeric(cells(frame, name), errors="coerce").astype(float)


def number(value) -> float:
    """A value as a float, NaN where it is missing or not a number."""
    found = pd.to_numeric(value, errors="coerce")
    return float(found) if found is not None and not pd.isna(found) else math.nan


def cells(frame: pd.DataFrame, name: str) -> pd.Series:
    """A column of the frame, or Nones where it has none."""
    return frame[name] if name in frame else pd.Series([None] * len(frame), index=frame.index)


def point_index(frame: pd.DataFrame, keys: list[str]) -> pd.Index:
    """The keys as the tables' index; the row number too where a point has several rows."""
    names = [*keys, "row"] if (frame["row"] > 0).any() else keys
    return pd.MultiIndex.from_frame(frame[names]) if len(names) > 1 else pd.Index(frame[names[0]])


def ratio_of(b: float, a: float) -> float:
    """B/A, NaN where either is missing or A is 0."""
    return b / a if pd.notna(a) and pd.notna(b) and a != 0 else math.nan
