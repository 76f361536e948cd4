"""The timing gate as a value: judge(comparison, factor, looks) -> Gate, each timing's verdict
point by point and the gate's exit code, decided here and rendered after
(octlm_analysis.comparison writes the Markdown; python -m harness again reads the code).

Each timing is judged over its processes (octlm_analysis.compare gathers them a point) by
octlm_analysis.verdicts: B/A with Welch's interval, slower only by Holm's rule over every
timing judged together. The gate (--fail-on-regression FACTOR) fails where a timing is slower
or an answer of A is lost in B (a point's, or a timing's on an ok row: a broken timer's), is
not decided where a timing is not (ambiguous, or not judged at all: one process a side, a busy
machine, copies, clocks that differ), and passes otherwise.
"""

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from harness import store
from octlm_analysis.compare import (
    BUSY_SET,
    CLOCKS_SEEN,
    COPIES,
    IDS,
    VALUES,
    Comparison,
    cells,
    number,
    numbers,
    point_index,
    ratio_of,
)
from octlm_analysis.compare_tables import status_changes
from octlm_analysis.verdicts import ALPHA, TOLERANCE, estimate, holm, verdict

PASSED, FAILED, NOT_DECIDED = 0, 1, 3  # the gate's exit codes (2: bad input)
SAID = {PASSED: "passed", FAILED: "failed", NOT_DECIDED: "not decided"}
CLOCKS = 1.10  # a CUDA timing is judged where the sides' SM clocks are within this factor
UNDECIDED = ("ambiguous", "one process", "busy machine", "copies", "clocks differ")


@dataclass(frozen=True)
class Gate:
    """A comparison judged: each timing's verdicts, what fails the gate, and its exit code."""

    factor: float | None  # --fail-on-regression's; None: no gate (timings judged at TOLERANCE)
    looks: int  # how many times the processes were judged as they were gathered
    timings: dict[str, pd.DataFrame]  # timing -> its table (timing_tables): "change" a point
    regressed: pd.DataFrame  # the timing lines judged slower (regressions)
    lost: pd.DataFrame  # the points answered in A and not in B (lost_answers)
    lost_values: pd.DataFrame  # the timings A has and B's ok rows lack (lost_timings)
    undecided: pd.DataFrame  # the timing lines not decided, with their metric
    code: int  # PASSED, FAILED or NOT_DECIDED; PASSED where there is no gate

    @property
    def decided(self) -> bool:
        """Whether the gate decided: passed or failed."""
        return self.code in (PASSED, FAILED)


def judge(comparison: Comparison, factor: float | None = None, looks: int = 1) -> Gate:
    """The comparison judged under --fail-on-regression `factor` (None: no gate; its timings
    judged at TOLERANCE, and PASSED): FAILED where a timing is slower (beyond the factor, by the
    family rule) or an answer of A is lost in B (a point's, or a timing's on an ok row); else
    NOT_DECIDED where a timing is not decided; else PASSED. `looks`: timing_tables'."""
    tables = timing_tables(comparison, factor or TOLERANCE, looks)
    regressed, lost = regressions(tables), lost_answers(comparison)
    lost_values = lost_timings(comparison)
    lines = [table.assign(metric=metric) for metric, table in tables.items()]
    lines = pd.concat(lines) if lines else pd.DataFrame(columns=["change", "metric"])
    undecided = lines[lines["change"].isin(UNDECIDED)]
    if factor is None:
        code = PASSED
    elif len(regressed) or len(lost) or len(lost_values):
        code = FAILED
    else:
        code = NOT_DECIDED if len(undecided) else PASSED
    return Gate(factor, looks, tables, regressed, lost, lost_values, undecided, code)


def timing_tables(c: Comparison, factor: float, looks: int = 1) -> dict[str, pd.DataFrame]:
    """Each timing at each point both sweeps have, judged (octlm_analysis.verdicts): A and B
    (the geometric means of the processes that count), B/A, its interval (low, high: one-sided
    bounds at 1 - ALPHA / looks each), the processes that count a side, those set aside, and
    its change: a verdict, or why it has none. The family Holm's rule runs over is every
    timing line of every table with an interval. `looks`: how many times the processes were
    judged while they were gathered (python -m harness again stops once decided), each at
    ALPHA / looks, so that stopping when decided keeps the rate of false alarms."""
    tail = ALPHA / looks
    tables = {metric: _timing_table(c.matched, metric, c.keys, factor, tail)
              for metric in c.timings}  # fmt: skip
    found = [(metric, at) for metric, table in tables.items()
             for at, e in enumerate(table["_estimate"]) if e is not None]  # fmt: skip
    slower = holm([tables[m]["_estimate"].iloc[at].p_slower for m, at in found], tail)
    for (metric, at), is_slower in zip(found, slower, strict=True):
        table = tables[metric]
        table.iloc[at, table.columns.get_loc("change")] = verdict(
            table["_estimate"].iloc[at], is_slower, factor
        )
    return tables


def _timing_table(matched: pd.DataFrame, metric: str, keys: list[str], factor: float,
                  tail: float) -> pd.DataFrame:  # fmt: skip
    """A timing's lines (timing_tables), their change why none where there is no estimate."""
    both = matched[matched["side"] == "both"]
    lines = []
    for _, line in both.iterrows():
        a, b = (line.get(f"{metric}{VALUES} {s}") for s in "AB")
        a, b = (v if isinstance(v, list) else [] for v in (a, b))
        ids_a = {i for i in line.get(f"{metric}{IDS} A") or [] if i is not None}
        ids_b = line.get(f"{metric}{IDS} B") or [None] * len(b)
        own = [value for value, i in zip(b, ids_b, strict=True) if i is None or i not in ids_a]
        busy = [int(line.get(f"{metric}{BUSY_SET} {s}") or 0) for s in "AB"]
        copies = [int(line.get(f"{metric}{COPIES} {s}") or 0) for s in "AB"]
        copies[1] += len(b) - len(own)
        b = own
        clocks = [line.get(f"{metric}{CLOCKS_SEEN} {s}") or [] for s in "AB"]
        values = [number(line.get(f"{metric} {s}")) for s in "AB"]
        e, why = None, None
        if not all(np.isfinite(values)):
            why = "no value"
        elif min(len(a), len(b)) < 2:
            why = ("busy machine" if any(busy) else "copies" if any(copies)
                   else "one process")  # fmt: skip
        elif all(clocks) and not _within(np.median(clocks[0]), np.median(clocks[1]), CLOCKS):
            why = "clocks differ"
        else:
            e = estimate(a, b, factor, tail)
        means = [math.exp(np.mean(np.log(v))) for v in (a, b)] if e else values
        lines.append({
            "A": means[0], "B": means[1], "B/A": e.ratio if e else ratio_of(values[1], values[0]),
            "low": e.low if e else math.nan, "high": e.high if e else math.nan,
            "processes": f"{len(a)}+{len(b)}", "_counts": (len(a), len(b)),
            "set aside": _set_aside(busy, copies),
            "change": why or "", "_estimate": e,
        })  # fmt: skip
    columns = ["A", "B", "B/A", "low", "high", "processes", "set aside", "change", "_estimate",
               "_counts"]  # fmt: skip
    table = pd.DataFrame(lines, columns=columns, index=point_index(both, keys))
    return table[table[["A", "B"]].notna().any(axis=1)]


def _set_aside(busy: list[int], copies: list[int]) -> str:
    """What was set aside of a timing's processes, by side ("A 1 busy, B 2 copies"), or ""."""
    said = [f"{side} " + ", ".join([f"{n} busy"] * bool(n) + [f"{k} copies"] * bool(k))
            for side, n, k in zip("AB", busy, copies, strict=True) if n or k]  # fmt: skip
    return "; ".join(said)


def _within(a: float, b: float, factor: float) -> bool:
    return a > 0 and b > 0 and 1 / factor <= b / a <= factor


def regressions(timing_tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The timings judged slower (beyond the factor, by the family rule: timing_tables)."""
    slower = [
        table[table["change"] == "slower"].assign(metric=metric)
        for metric, table in timing_tables.items()
    ]
    slower = [table for table in slower if not table.empty]
    return pd.concat(slower) if slower else pd.DataFrame(columns=["metric", "A", "B", "B/A"])


def lost_timings(c: Comparison) -> pd.DataFrame:
    """The timings A has at a point and B has not, on an ok row of B (NaN, infinite, missing or
    not a number: a broken timer's): for --fail-on-regression an answer lost, as a point's."""
    both = c.matched[c.matched["side"] == "both"]
    ok = cells(both, "status B").eq("ok").to_numpy()
    lost = []
    for metric in c.timings:
        a, b = (numbers(both, metric, side) for side in "AB")
        gone = ok & np.isfinite(a.to_numpy()) & ~np.isfinite(b.to_numpy())
        lost.append(pd.DataFrame({"metric": metric, "A": a[gone].to_numpy(),
                                  "B": cells(both, f"{metric} B")[gone].to_numpy()},
                                 index=point_index(both[gone], c.keys)))  # fmt: skip
    return pd.concat(lost) if lost else pd.DataFrame(columns=["metric", "A", "B"])


def lost_answers(c: Comparison) -> pd.DataFrame:
    """The points with an answer in A (ok, unsupported) and none in B: a failure, a kill, not
    run. For --fail-on-regression they count as regressions: a gate must not pass them."""
    changed = status_changes(c.matched, c.keys)
    return changed[changed["A"].isin(store.DONE) & ~changed["B"].isin(store.DONE)]
