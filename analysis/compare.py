"""python -m harness report compare SWEEP_A SWEEP_B: two sweeps of one experiment, point by point.

Points match by their parameters (the manifest's points[i]["params"]): by those that vary
within either sweep. A parameter fixed in both sweeps, to different values (dtype=float32 in
A, float64 in B), is what the comparison is about: the header shows it and points do not
match on it. Each metric is shown for A and B with the ratio B/A; points that only one sweep
has, statuses that differ and claims whose result differs are listed.

The noise rule for a timing (a metric X_ms whose repeats are in X_samples_ms): B is faster or
slower than A only when (1) each sweep's median lies outside the other's interquartile range
and (2) a two-sided Mann-Whitney U test on the two sets of repeats (scipy.stats.mannwhitneyu:
exact p for small samples without ties) gives p < 0.05; otherwise "same". (1) asks for a
change bigger than the spread of the repeats, (2) guards against deciding on a few repeats
(three against three can never be told apart: their smallest p is 0.1).

Repeats of one process do not show how much a timing moves between processes (where its memory
lies, which core it runs on, the clock's state): the same code, timed in two processes, differs
by more than either's repeats say. So a side may be several sweeps of one grid, each run by its
own command and so in processes of its own (`compare A1,A2,A3 B1,B2,B3`). A timing is then each
sweep's median, a value per process, and its A and B the medians of those; B is faster or
slower only when the two sides' values do not overlap (every process of B slower than every
process of A, or faster). Two sides of the same code fail that, with three processes a side,
one time in ten either way by chance alone, and a gate asks for its factor as well
(--fail-on-regression 1.10): a timing regresses only when it is slower by the rule and by more
than the factor.

Two sweeps run at different moments, and other work on the machine slows a CPU timing by as
much as a change in the code could (two busy processes on two cores: 2x to 4x). A CPU
timing's row says how busy the machine was while it ran (cpu_load_beside, harness.measuring.timing:
the share of its CPUs other processes used); a timing during which others used more than
BUSY of them, in either sweep, is not judged ("busy machine"), neither faster, slower nor
the same, and no gate counts it. The header gives both sweeps' loads.
"""

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from harness import store
from octlm_analysis.plots import housekeeping
from octlm_analysis.sides import PROCESS, CompareError, Side, side_claims

ALPHA = 0.05
RULE = (
    "A timing is faster or slower only when each sweep's median lies outside the other's "
    f"interquartile range and a Mann-Whitney U test on the repeats gives p < {ALPHA}; "
    "otherwise it is the same (no samples, or no value on a side: not judged). Where each side "
    "is several sweeps "
    "(A1,A2,... each in processes of its own), it is faster or slower only when the sweeps' "
    "medians on one side all lie beyond those on the other. A CPU timing during which other "
    "processes used over a quarter of its CPUs, in either sweep, is not judged (busy machine)."
)
ONE_PROCESS = (
    "Each side is one sweep, and so its timings' repeats come from one process, which do not "
    "show how much a timing moves between processes: give each side as several sweeps of one "
    "grid (SWEEP_A1,SWEEP_A2,SWEEP_A3) for a gate that judges by that spread."
)
PER_PROCESS = " per process"  # "X per process A": a timing's median in each of A's sweeps
LOAD = "cpu_load_beside"  # the share of a CPU timing's CPUs others used (harness.measuring.timing)
BUSY = 0.25  # a timing with more than this LOAD on either side is not judged
NOT_METRICS = {"experiment", "sweep", "repeats", LOAD, PROCESS, *store.HARNESS_COLUMNS}


@dataclass
class Comparison:
    a: Side
    b: Side
    keys: list[str]  # the parameters points match on
    settings: pd.DataFrame  # parameters fixed in both sweeps, to different values
    matched: pd.DataFrame  # one line per measurement of either sweep: keys, "side", "X A", "X B"
    timings: list[str]
    others: list[str]


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
    timings, others = metrics([a.rows, b.rows], names)
    sides = [_pooled(measurements(s, keys, names), timings) for s in (a, b)]
    matched = match(*sides, keys)
    return Comparison(a, b, keys, settings, matched, timings, others)


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
    by = ["job", PROCESS] if PROCESS in rows else "job"
    rows = rows.assign(row=rows.groupby(by).cumcount())
    lines = grid.merge(rows, on="job", how="left")
    lines["status"] = lines["status"].fillna("not run")
    lines["row"] = lines["row"].fillna(0).astype(int)
    return lines


def _pooled(lines: pd.DataFrame, timings: list[str]) -> pd.DataFrame:
    """A side of several sweeps (measurements' lines with PROCESS) as one line per point and
    row: each timing the median of its sweeps' values, which "X per process" lists; the status
    ok only where every sweep's is (else the first that is not, its error with it); the load
    the largest; the rest the first sweep's. A side of one sweep, as it is."""
    if PROCESS not in lines or lines[PROCESS].isna().all():
        return lines.drop(columns=[PROCESS], errors="ignore")
    lines = lines.sort_values(PROCESS, kind="stable")
    groups = lines.groupby(["job", "row"], sort=True)
    pooled = groups.first()
    answered = lines["status"].eq("ok")
    failed = lines[~answered].groupby(["job", "row"]).first()
    pooled.loc[failed.index, ["status", "error"]] = failed.reindex(columns=["status", "error"])
    for timing in [t for t in timings if t in lines]:
        values = pd.to_numeric(lines[timing], errors="coerce")
        pooled[timing] = values.groupby([lines["job"], lines["row"]]).median()
        pooled[timing + PER_PROCESS] = values.groupby([lines["job"], lines["row"]]).agg(
            lambda v: [float(x) for x in v.dropna()]
        )
    for load in [c for c in lines if _is_load(c)]:  # each timing's: the largest
        pooled[load] = pd.to_numeric(lines[load], errors="coerce").groupby(
            [lines["job"], lines["row"]]).max()  # fmt: skip
    return pooled.drop(columns=[PROCESS]).reset_index()


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

    A timing's name ends in _ms or _s; how it was taken (its spread X_iqr_ms, samples, repeats,
    the load beside it, its threads, its GPU's clocks: octlm_analysis.plots.housekeeping, with
    or without a prefix) is no metric of its own.
    """
    columns = list(dict.fromkeys(c for frame in frames for c in frame.columns))
    numeric = [
        c
        for c in columns
        if c not in params | NOT_METRICS
        and not housekeeping(c)
        and any(_is_number(frame, c) for frame in frames)
    ]
    timings = [c for c in numeric if c.endswith(("_ms", "_s"))]
    return timings, [c for c in numeric if c not in timings]


def metric_table(matched: pd.DataFrame, metric: str, keys: list[str]) -> pd.DataFrame:
    """A metric at each point both sweeps have: A, B, B/A, and for a timing its change (busy
    machine where either side's LOAD exceeds BUSY)."""
    both = matched[matched["side"] == "both"]
    a, b = (_numbers(both, metric, side) for side in "AB")
    table = pd.DataFrame({"A": a, "B": b})
    with np.errstate(divide="ignore", invalid="ignore"):
        table["B/A"] = table["B"] / table["A"]
    samples = metric.removesuffix("_ms") + "_samples_ms"
    if metric.endswith(("_ms", "_s")):
        pairs = zip(_column(both, f"{samples} A"), _column(both, f"{samples} B"), strict=True)
        processes = zip(*(_column(both, f"{metric}{PER_PROCESS} {s}") for s in "AB"), strict=True)
        own = load_of(metric, {c.rsplit(" ", 1)[0] for c in both.columns})
        busy = np.fmax(*(_numbers(both, own, side) for side in "AB")) > BUSY
        valued = np.isfinite(table["A"]) & np.isfinite(table["B"])
        table["change"] = [
            "no value" if not has_values else "busy machine" if busy_here
            else change(a, b, *per_process)
            for (a, b), per_process, busy_here, has_values
            in zip(pairs, processes, busy, valued, strict=True)
        ]  # fmt: skip
    table.index = _index(both, keys)
    return table[table[["A", "B"]].notna().any(axis=1)]


def load_of(timing: str, columns) -> str:
    """The column of the load beside a timing, among `columns`: its own, named with its prefix
    as harness.measuring.timing.time_call's columns are prefixed (sdpa_time_ms:
    sdpa_cpu_load_beside), else the unprefixed LOAD."""
    prefix = timing.removesuffix("time_ms") if timing.endswith("time_ms") else ""
    own = f"{prefix}{LOAD}"
    return own if own in columns else LOAD


def _is_load(column: str) -> bool:
    return column == LOAD or column.endswith(f"_{LOAD}")


def load_line(matched: pd.DataFrame) -> str | None:
    """Each sweep's LOAD columns (each timing's, prefixed or not) over the points both have
    (median, largest), or None without any."""
    both = matched[matched["side"] == "both"]
    names = sorted({n for n in (c.rsplit(" ", 1)[0] for c in both.columns) if _is_load(n)})
    loads = {side: pd.concat([_numbers(both, n, side) for n in names], ignore_index=True).dropna()
             if names else pd.Series(dtype=float) for side in "AB"}  # fmt: skip
    if all(load.empty for load in loads.values()):
        return None
    said = [
        f"{side} median {load.median():.2f}, at most {load.max():.2f}" if len(load) else "none"
        for side, load in loads.items()
    ]
    busy = sum(int((load > BUSY).sum()) for load in loads.values())
    return (
        f"Other processes' share of the CPUs while CPU timings ran ({', '.join(names)}): "
        f"{'; '.join(said)}; "
        f"{busy} of them over {BUSY:g}, whose timings are not judged."
    )


def _numbers(both: pd.DataFrame, column: str, side: str) -> pd.Series:
    """A side's column as floats, NaN where it is missing or not a number."""
    return pd.to_numeric(_column(both, f"{column} {side}"), errors="coerce").astype(float)


def worst_table(matched: pd.DataFrame, others: list[str]) -> pd.DataFrame:
    """Each non-timing metric's worst (largest) value over the points both sweeps have."""
    both = matched[matched["side"] == "both"]
    lines = []
    for metric in others:
        a, b = (pd.to_numeric(_column(both, f"{metric} {s}"), errors="coerce").max() for s in "AB")
        lines.append({"metric": metric, "worst A": a, "worst B": b, "B/A": _ratio(b, a)})
    return pd.DataFrame(lines, columns=["metric", "worst A", "worst B", "B/A"]).set_index("metric")


def status_changes(matched: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """The points both sweeps have whose statuses differ (ok in A, failed in B, ...)."""
    both = matched[(matched["side"] == "both") & (matched["status A"] != matched["status B"])]
    return pd.DataFrame(
        {
            "A": both["status A"].to_numpy(),
            "B": both["status B"].to_numpy(),
            "error in B": _column(both, "error B").where(both["status B"] != "ok").to_numpy(),
        },
        index=_index(both, keys),
    )


def unmatched(matched: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """The points only one sweep has, and their status there."""
    alone = matched[matched["side"] != "both"]
    status = alone["status A"].where(alone["side"] == "A", alone["status B"])
    return pd.DataFrame(
        {"only in": alone["side"].to_numpy(), "status": status.to_numpy()},
        index=_index(alone, keys),
    )


def claim_changes(a: Side, b: Side) -> pd.DataFrame:
    """Each claim's result in A and B (each sweep by its own manifest's claims; a side of
    several, its sweeps' worst: octlm_analysis.sides); flipped."""
    results = [side_claims(side) for side in (a, b)]
    table = results[0][["result", "worst"]].merge(
        results[1][["result", "worst"]],
        how="outer",
        left_index=True,
        right_index=True,
        suffixes=(" A", " B"),
    )
    table["flipped"] = np.where(table["result A"] != table["result B"], "yes", "")
    return table[["result A", "result B", "worst A", "worst B", "flipped"]]


def regressions(timing_tables: dict[str, pd.DataFrame], factor: float) -> pd.DataFrame:
    """The timings slower than A by more than `factor` and outside the noise."""
    slower = [
        table[(table["change"] == "slower") & (table["B/A"] > factor)].assign(metric=metric)
        for metric, table in timing_tables.items()
    ]
    slower = [table for table in slower if not table.empty]
    return pd.concat(slower) if slower else pd.DataFrame(columns=["metric", "A", "B", "B/A"])


def lost_timings(c: Comparison) -> pd.DataFrame:
    """The timings A has at a point and B has not, on an ok row of B (NaN, infinite, missing or
    not a number: a broken timer's): for --fail-on-regression an answer lost, as a point's."""
    both = c.matched[c.matched["side"] == "both"]
    ok = _column(both, "status B").eq("ok").to_numpy()
    lost = []
    for metric in c.timings:
        a, b = (_numbers(both, metric, side) for side in "AB")
        gone = ok & np.isfinite(a.to_numpy()) & ~np.isfinite(b.to_numpy())
        lost.append(pd.DataFrame({"metric": metric, "A": a[gone].to_numpy(),
                                  "B": _column(both, f"{metric} B")[gone].to_numpy()},
                                 index=_index(both[gone], c.keys)))  # fmt: skip
    return pd.concat(lost) if lost else pd.DataFrame(columns=["metric", "A", "B"])


def change(a, b, processes_a=None, processes_b=None) -> str:
    """faster, slower or same for B against A by the noise rule: by the repeats `a` and `b` of
    one process each, or, where each side has several, by their values per process (each
    sweep's median): slower only if every one of B's lies above every one of A's, faster
    likewise. "no samples" without either."""
    if _samples(processes_a) and _samples(processes_b):
        if min(processes_b) > max(processes_a):
            return "slower"
        return "faster" if max(processes_b) < min(processes_a) else "same"
    if not (_samples(a) and _samples(b)):
        return "no samples"
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    low_a, median_a, high_a = np.percentile(a, [25, 50, 75])
    low_b, median_b, high_b = np.percentile(b, [25, 50, 75])
    if median_b < low_a and median_a > high_b:
        verdict = "faster"
    elif median_b > high_a and median_a < low_b:
        verdict = "slower"
    else:
        return "same"
    from scipy.stats import mannwhitneyu  # here: importing scipy.stats takes a second

    return verdict if mannwhitneyu(a, b, alternative="two-sided").pvalue < ALPHA else "same"


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


def lost_answers(c: Comparison) -> pd.DataFrame:
    """The points with an answer in A (ok, unsupported) and none in B: a failure, a kill, not
    run. For --fail-on-regression they count as regressions: a gate must not pass them."""
    changed = status_changes(c.matched, c.keys)
    return changed[changed["A"].isin(store.DONE) & ~changed["B"].isin(store.DONE)]


def _distinct(frame: pd.DataFrame, name: str) -> int:
    return frame[name].astype(str).nunique() if name in frame else 0


def _only_value(frame: pd.DataFrame, name: str):
    return frame[name].iloc[0] if name in frame and len(frame) else None


def _same(a, b) -> bool:
    return (pd.isna(a) and pd.isna(b)) or a == b


def _is_number(frame: pd.DataFrame, column: str) -> bool:
    if column not in frame:
        return False
    dtype = frame[column].dtype
    return pd.api.types.is_numeric_dtype(dtype) and not pd.api.types.is_bool_dtype(dtype)


def _column(frame: pd.DataFrame, name: str) -> pd.Series:
    return frame[name] if name in frame else pd.Series([None] * len(frame), index=frame.index)


def _samples(value) -> bool:
    return isinstance(value, list | np.ndarray) and len(value) >= 2


def _index(frame: pd.DataFrame, keys: list[str]) -> pd.Index:
    """The keys as the tables' index; the row number too where a point has several rows."""
    names = [*keys, "row"] if (frame["row"] > 0).any() else keys
    return pd.MultiIndex.from_frame(frame[names]) if len(names) > 1 else pd.Index(frame[names[0]])


def _ratio(b: float, a: float) -> float:
    return b / a if pd.notna(a) and pd.notna(b) and a != 0 else math.nan
