"""A comparison of two sweeps (octlm_analysis.compare) as its Markdown page: the header (both sides'
provenance, what points match on, the noise rule, the loads), a summary line, a section per
timing and per other metric that changed, the claims and statuses that differ, the points only
one side has, and, under --fail-on-regression, the regressions, the answers lost and what the
gate could not judge. The verdicts are the gate's (octlm_analysis.gate.judge): this module
writes them and decides none."""

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd

from harness import files
from harness.command.code import differing
from harness.names import setting
from harness.pinning import codestore
from harness.results.tables import markdown
from octlm_analysis.compare import RULE, Comparison, curve_figures
from octlm_analysis.compare_tables import (
    claim_changes,
    final_table,
    finals_summary,
    load_line,
    metric_table,
    status_changes,
    unmatched,
    worst_table,
)
from octlm_analysis.gate import CLOCKS, Gate, judge
from octlm_analysis.report import sweep_header
from octlm_analysis.verdicts import ALPHA, TOLERANCE, processes_to_decide

RUNS_RULE = (
    "Training runs are compared by their final values: each metric's last value in each phase "
    "of a point's run (train, eval), B/A point by point, and over the points both sweeps have "
    "the median, lowest and highest B/A."
)
ONE_PROCESS = (
    "Each side is one sweep, and so its timings' repeats come from one process, which do not "
    "show how much a timing moves between processes: give each side as several sweeps of one "
    "grid (SWEEP_A1,SWEEP_A2,SWEEP_A3) for a gate that judges by that spread."
)
MOST_SAID = 100  # processes a side beyond which "what would decide it" says "more than"
WHY_UNDECIDED = {
    "one process": "a side has fewer than two processes for them (each side one sweep, whose "
                   "repeats come from one process and cannot tell code from process)",
    "busy machine": "other processes used over a quarter of the CPUs beside them in so many of "
                    "a side's processes that fewer than two are left: run them again on a "
                    "machine that is otherwise idle",
    "copies": "a side's values are copies of other measurements (rows reused from another "
              "sweep, counted once), leaving it fewer than two of its own",
    "clocks differ": f"the GPU's SM clock differed by more than {CLOCKS - 1:.0%} between the "
                     "sides: run them again where the clocks agree (a GPU that no power or "
                     "heat cap holds down)",
}  # fmt: skip


def document(c: Comparison, factor: float | None = None, looks: int = 1) -> tuple[str, int]:
    """The comparison as Markdown, and the gate's exit code under --fail-on-regression `factor`
    (octlm_analysis.gate.judge: PASSED without one). `looks`: judge's."""
    gate = judge(c, factor, looks)
    return render(c, gate), gate.code


def render(c: Comparison, gate: Gate) -> str:
    """The comparison as Markdown, its timings as `gate` judged them; under a gate (its
    factor), the regressions, the answers lost and the timings it did not decide, and what
    would decide them."""
    factor = gate.factor or TOLERANCE
    other_tables = {metric: metric_table(c.matched, metric, c.keys) for metric in c.others}
    claims = claim_changes(c.a, c.b)
    parts = [
        *_header(c, gate.timings),
        _summary(c, gate.timings, claims),
        *_timing_sections(gate.timings, factor),
        *(_final_sections(c) if c.finals else _other_sections(c, other_tables)),
        *_listed(c, claims),
    ]
    if gate.factor is not None:
        parts += [
            *_regression_section(gate.regressed, factor),
            *_lost_section(gate.lost),
            *_lost_timing_section(gate.lost_values),
            *_undecided(c, gate),
        ]
    return "\n\n".join(parts) + "\n"


def write(report: Path, c: Comparison, text: str) -> tuple[Path, str]:
    """The comparison's Markdown written under the report folder (file_name), its training
    runs' curves a page beside it where it has any (nothing written through a symlink); its
    path, and the text as written, which names that page."""
    files.no_links_below(report)
    path = report / file_name(c.a.id, c.b.id)
    figures = curve_figures(c) if c.finals else []
    if figures:
        from octlm_analysis.page import write_figures

        page = write_figures(path.with_suffix(".html"), path.stem, figures)
        text += f"\nCurves of both sides' runs, A solid and B dashed: {page.name}\n"
    files.write_text(path, text)
    return path, text


def file_name(a: str, b: str) -> str:
    """The comparison's file: compare-A-vs-B.md, each side's sweeps joined by +; where that
    would be too long a name for a file system (255 bytes), each side's first sweep and how
    many more, and a digest of the whole that tells two such apart."""
    name = "compare-{}-vs-{}.md".format(*(side.replace(",", "+") for side in (a, b)))
    if len(name) <= 200:
        return name
    short = [f"{side.split(',')[0]}+{side.count(',')}more" for side in (a, b)]
    digest = hashlib.sha256(f"{a} {b}".encode()).hexdigest()[:12]
    return f"compare-{short[0]}-vs-{short[1]}-{digest}.md"


def _undecided(c: Comparison, gate: Gate) -> list[str]:
    """The section on the timings the gate did not decide and what would decide them, or none
    where it decided all."""
    lines, factor = gate.undecided, gate.factor
    if lines.empty:
        return []
    again = (f"python -m harness again {c.a.id.split(',')[0]} {c.b.id.split(',')[0]} "
             f"factor={factor:g}")  # fmt: skip
    said = []
    for why, count in lines["change"].value_counts().items():
        if why in WHY_UNDECIDED:
            said.append(f"- {count} {why}: {WHY_UNDECIDED[why]}.")
    ambiguous = lines[lines["change"] == "ambiguous"]
    if len(ambiguous):
        tail = ALPHA / gate.looks
        needed = [processes_to_decide(e, factor, tail) for e in ambiguous["_estimate"]]
        known = [n for n in needed if n is not None]
        most = max(known) if known else None
        reach = ("no number of processes decides one whose ratio is the factor itself"
                 if most is None else f"more than {MOST_SAID} processes a side"
                 if most > MOST_SAID else f"about {most} processes a side")  # fmt: skip
        said.append(f"- {len(ambiguous)} ambiguous: the interval reaches beyond {factor:g}x "
                    f"and not surely past it; at the ratios and spreads seen, {reach} would "
                    "decide them.")  # fmt: skip
        shown = ambiguous.assign(**{"to decide": [n or "never" for n in needed]})
        said.append(_by_point(shown[["metric", "A", "B", "B/A", "low", "high", "processes",
                                     "to decide"]]))  # fmt: skip
    said.append(
        f"{again} gathers processes a side, A and B in turns, until each timing is "
        "decided or its cap is reached, then prints the comparison to run."
    )
    return [f"## Not decided: {len(lines)} timings", *said]


def _lost_timing_section(lost: pd.DataFrame) -> list[str]:
    if lost.empty:
        return []
    return [f"## Regressions: {len(lost)} timings A has are no number on an ok row of B (a "
            f"broken timer's)", _by_point(lost)]  # fmt: skip


def _header(c: Comparison, tables: dict[str, pd.DataFrame]) -> list[str]:
    parts = [f"# {c.a.experiment}: sweep {c.a.id} (A) vs {c.b.id} (B)"]
    for name, side in (("A", c.a), ("B", c.b)):
        parts += [f"{name}{'' if side.parts is None else n + 1}: "
                  f"{sweep_header(one.rows, one.manifest, one.id)}"
                  for n, one in enumerate(side.parts or [side])]  # fmt: skip
    parts.append(_code_line(c))
    parts.append(f"Points match on: {', '.join(c.keys)}. {RUNS_RULE if c.finals else RULE}")
    if c.timings and (c.a.parts is None or c.b.parts is None):
        parts.append(ONE_PROCESS)
    counted = _processes_line(c, tables)
    if counted:
        parts.append(counted)
    load = load_line(c.matched)
    if load:
        parts.append(load)
    if not c.settings.empty:
        parts += ["Fixed in each sweep, to different values:", markdown(c.settings)]
    return parts


def _code_line(c: Comparison) -> str:
    """Whether A's and B's points ran the same code (their manifests' code_digest), and in how
    many files it differs (from the code store's snapshots, where it has them)."""
    codes = [sorted({str(one.manifest.get("code_digest")) for one in side.parts or [side]})
             for side in (c.a, c.b)]  # fmt: skip
    said = [", ".join(digests) for digests in codes]
    if codes[0] == codes[1] and len(codes[0]) == 1:
        return f"Code: A and B ran the same code ({said[0]})."
    if len(codes[0]) > 1 or len(codes[1]) > 1 or "None" in said:
        return f"Code: A ran {said[0]}, B ran {said[1]}."
    count = differing(codestore.store_of(None), codes[0][0], codes[1][0])
    files = "their snapshots are not in this code store" if count is None else f"{count} files"
    return (
        f"Code: A ran {said[0]} and B ran {said[1]}: they differ ({files}; python -m harness "
        f"code {c.a.id.split(',')[0]} {c.b.id.split(',')[0]} shows how)."
    )


def _processes_line(c: Comparison, tables: dict[str, pd.DataFrame]) -> str | None:
    """How many processes each side really had for its timings (those that count: not set
    aside for a busy machine, not another's copy), and what was set aside, or None without
    timings."""
    lines = pd.concat(tables.values()) if tables else pd.DataFrame()
    if lines.empty:
        return None
    counts = pd.DataFrame(lines["_counts"].tolist())
    said = []
    for n, (name, side) in enumerate((("A", c.a), ("B", c.b))):
        fewest, most = counts[n].min(), counts[n].max()
        had = f"{fewest}" if fewest == most else f"{fewest} to {most}"
        said.append(f"{name} {had} of its {len(side.parts or [side])} sweeps")
    aside = [t for t in lines["set aside"] if t]
    tail = f"; set aside at {len(aside)} timings (see each timing's table)" if aside else ""
    return f"Processes that count, a side, for each timing: {', '.join(said)}{tail}."


def _timing_sections(tables: dict[str, pd.DataFrame], factor: float) -> list[str]:
    parts = []
    for metric, table in tables.items():
        tally = ", ".join(f"{n} {change}" for change, n in table["change"].value_counts().items())
        parts += [f"## {metric} ({tally or 'no points'})", _by_point(table)]
    if parts:
        parts.insert(
            0,
            f"Timings: low and high are the interval of B/A (each end a one-sided "
            f"{1 - ALPHA:.0%} bound); within {factor:g}x either way is the same.",
        )
    return parts


def _other_sections(c: Comparison, tables: dict[str, pd.DataFrame]) -> list[str]:
    """The worst values, then each metric that changed at some point (the rest: one line)."""
    if not tables:
        return []
    parts = ["## Worst (largest) values, over the points both sweeps have"]
    parts.append(markdown(worst_table(c.matched, c.others)))
    same = [
        m for m, t in tables.items() if len(t) and np.array_equal(t["A"], t["B"], equal_nan=True)
    ]
    if same:
        parts.append(f"The same at every point: {', '.join(same)}.")
    for metric, table in tables.items():
        if metric not in same:
            parts += [f"## {metric}", _by_point(table)]
    return parts


def _final_sections(c: Comparison) -> list[str]:
    """Training runs' final values: B/A over the points, then each metric whose final values
    changed at some point, point by point and phase by phase (the rest: one line)."""
    summary = finals_summary(c)
    parts = ["## Final values, over the points both sweeps have", markdown(summary)]
    tables = {metric: final_table(c, metric) for metric in c.finals}
    same = [metric for metric, table in tables.items()
            if len(table) and all(np.array_equal(table[f"{p}A"], table[f"{p}B"], equal_nan=True)
                                  for p in _phase_prefixes(c, metric))]  # fmt: skip
    if same:
        parts.append(f"The same at every point: {', '.join(same)}.")
    for metric, table in tables.items():
        if metric not in same:
            parts += [f"## {metric}: final values", _by_point(table)]
    return parts


def _phase_prefixes(c: Comparison, metric: str) -> list[str]:
    """The prefixes of a metric's columns in its final_table, a phase each ("train ", ...)."""
    return ["" if phase is None else f"{phase} " for phase in c.finals[metric]]


def _lost_section(lost: pd.DataFrame) -> list[str]:
    if lost.empty:
        return []
    return [
        f"## Regressions: {len(lost)} points answered in A have no answer in B",
        _by_point(lost),
    ]


def _regression_section(regressed: pd.DataFrame, factor: float) -> list[str]:
    title = f"## Regressions: {len(regressed)} timings slower than {factor:g}x A, by the rule"
    if not len(regressed):
        return [title]
    return [title, _by_point(regressed[["metric", "A", "B", "B/A", "low", "high", "processes"]])]


def _summary(c: Comparison, timing_tables: dict[str, pd.DataFrame], claims: pd.DataFrame) -> str:
    sides = c.matched.drop_duplicates([*c.keys, "row"])["side"].value_counts()
    changes = [table["change"] for table in timing_tables.values()]
    verdicts = pd.concat(changes).value_counts() if changes else pd.Series()
    parts = [
        f"{sides.get('both', 0)} points in both, {sides.get('A', 0)} only in A, "
        f"{sides.get('B', 0)} only in B",
        f"{len(status_changes(c.matched, c.keys))} statuses differ",
        f"{int((claims['flipped'] == 'yes').sum())} of {len(claims)} claims flipped",
    ]
    if len(verdicts):
        parts.append("timings: " + ", ".join(f"{int(n)} {v}" for v, n in verdicts.items()))
    return "Summary: " + "; ".join(parts) + "."


def _listed(c: Comparison, claims: pd.DataFrame) -> list[str]:
    parts = []
    if not claims.empty:
        parts += ["## Claims", markdown(claims)]
    statuses = status_changes(c.matched, c.keys)
    if not statuses.empty:
        parts += ["## Statuses that differ", _by_point(statuses)]
    alone = unmatched(c.matched, c.keys)
    if not alone.empty:
        parts += ["## Points only one sweep has", _by_point(alone)]
    return parts


def _by_point(table: pd.DataFrame) -> str:
    """A table of points as Markdown, a point named as on the command line: length=64 block=16."""
    table = table[[c for c in table.columns if not c.startswith("_")]]
    keys = table.index.names
    values = table.index if isinstance(table.index, pd.MultiIndex) else [(v,) for v in table.index]
    names = [" ".join(setting(k, v) for k, v in zip(keys, key, strict=True)) for key in values]
    return markdown(table.set_axis(pd.Index(names, name="point")))
