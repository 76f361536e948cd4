"""A comparison of two sweeps (octlm_analysis.compare) as its Markdown page: the header (both sides'
provenance, what points match on, the noise rule, the loads), a summary line, a section per
timing and per other metric that changed, the claims and statuses that differ, the points only
one side has, and, under --fail-on-regression, the regressions, the answers lost and what the
gate could not judge."""

import numpy as np
import pandas as pd

from harness.names import setting
from harness.pinning import codestore
from harness.results.tables import markdown
from octlm_analysis.compare import (
    ONE_PROCESS,
    RULE,
    Comparison,
    claim_changes,
    load_line,
    lost_answers,
    lost_timings,
    metric_table,
    regressions,
    status_changes,
    unmatched,
    worst_table,
)
from octlm_analysis.report import sweep_header

PASSED, FAILED, NOT_JUDGED = 0, 1, 3  # the gate's exit codes (2: bad input)
JUDGED = ("faster", "slower", "same")  # a timing's changes that a gate can go by


def document(c: Comparison, factor: float | None) -> tuple[str, int]:
    """The comparison as Markdown, and the gate's verdict under --fail-on-regression `factor`
    (PASSED without one): FAILED where a timing is slower by the rule and by more than the
    factor, or an answer of A is lost in B (a point's, or a timing's on an ok row); else
    NOT_JUDGED where the gate could judge none of its timings (each one busy machine, no
    samples, no value) or each side is one sweep (whose repeats come from one process: the
    same code, timed in two processes, differs by more than they show, so no factor tells code
    from process there)."""
    timing_tables = {metric: metric_table(c.matched, metric, c.keys) for metric in c.timings}
    other_tables = {metric: metric_table(c.matched, metric, c.keys) for metric in c.others}
    claims = claim_changes(c.a, c.b)
    parts = [
        *_header(c),
        _summary(c, timing_tables, claims),
        *_timing_sections(timing_tables),
        *_other_sections(c, other_tables),
        *_listed(c, claims),
    ]
    if factor is None:
        return "\n\n".join(parts) + "\n", PASSED
    one_process = c.a.parts is None or c.b.parts is None
    regressed, lost = regressions(timing_tables, factor), lost_answers(c)
    lost_values = lost_timings(c)
    unjudged = _unjudged(c, timing_tables, factor, one_process)
    parts += [
        *_regression_section(regressed, factor, counted=not one_process),
        *_lost_section(lost),
        *_lost_timing_section(lost_values),
    ]
    if unjudged:
        parts.append(f"## Not judged\n\n{unjudged}")
    failed = len(lost) + len(lost_values) + (0 if one_process else len(regressed))
    verdict = FAILED if failed else NOT_JUDGED if unjudged else PASSED
    return "\n\n".join(parts) + "\n", verdict


def _unjudged(c: Comparison, tables: dict[str, pd.DataFrame], factor: float,
              one_process: bool) -> str | None:  # fmt: skip
    """Why the gate could not judge the timings, or None where it could."""
    if not c.timings:
        return None
    if one_process:
        return (f"The gate cannot tell code from process at {factor:g}x: each side is one "
                f"sweep, so its timings' repeats come from one process, and the same code "
                f"timed in two processes differs by more than they show (see docs/"
                f"performance.md). Run each side as three sweeps, interleaved (python -m harness "
                f"again {c.a.id.split(',')[0]} {c.b.id.split(',')[0]} times=3 does), and "
                f"compare A1,A2,A3 B1,B2,B3.")  # fmt: skip
    changes = pd.concat([table["change"] for table in tables.values()])
    if changes.isin(JUDGED).any():
        return None
    counts = ", ".join(f"{n} {why}" for why, n in changes.value_counts().items())
    return (f"The gate judged none of its {len(changes)} timings ({counts or 'no points'}): "
            f"run the sweeps again on a machine that is otherwise idle.")  # fmt: skip


def _lost_timing_section(lost: pd.DataFrame) -> list[str]:
    if lost.empty:
        return []
    return [f"## Regressions: {len(lost)} timings A has are no number on an ok row of B (a "
            f"broken timer's)", _by_point(lost)]  # fmt: skip


def _header(c: Comparison) -> list[str]:
    parts = [f"# {c.a.experiment}: sweep {c.a.id} (A) vs {c.b.id} (B)"]
    for name, side in (("A", c.a), ("B", c.b)):
        parts += [f"{name}{'' if side.parts is None else n + 1}: "
                  f"{sweep_header(one.rows, one.manifest, one.id)}"
                  for n, one in enumerate(side.parts or [side])]  # fmt: skip
    parts.append(_code_line(c))
    parts.append(f"Points match on: {', '.join(c.keys)}. {RULE}")
    if c.timings and (c.a.parts is None or c.b.parts is None):
        parts.append(ONE_PROCESS)
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
    count = codestore.differing(codestore.store_of(None), codes[0][0], codes[1][0])
    files = "their snapshots are not in this code store" if count is None else f"{count} files"
    return (
        f"Code: A ran {said[0]} and B ran {said[1]}: they differ ({files}; python -m harness "
        f"code {c.a.id.split(',')[0]} {c.b.id.split(',')[0]} shows how)."
    )


def _timing_sections(tables: dict[str, pd.DataFrame]) -> list[str]:
    parts = []
    for metric, table in tables.items():
        tally = ", ".join(f"{n} {change}" for change, n in table["change"].value_counts().items())
        parts += [f"## {metric} ({tally or 'no points'})", _by_point(table)]
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


def _lost_section(lost: pd.DataFrame) -> list[str]:
    if lost.empty:
        return []
    return [
        f"## Regressions: {len(lost)} points answered in A have no answer in B",
        _by_point(lost),
    ]


def _regression_section(regressed: pd.DataFrame, factor: float, counted: bool) -> list[str]:
    title = f"## Regressions: {len(regressed)} timings slower than {factor:g}x A, outside the noise"
    if not counted:
        title = (f"## Slower than {factor:g}x A by the rule, not judged: {len(regressed)} "
                 "timings")  # fmt: skip
    return [title, _by_point(regressed[["metric", "A", "B", "B/A"]])] if len(regressed) else [title]


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
    keys = table.index.names
    values = table.index if isinstance(table.index, pd.MultiIndex) else [(v,) for v in table.index]
    names = [" ".join(setting(k, v) for k, v in zip(keys, key, strict=True)) for key in values]
    return markdown(table.set_axis(pd.Index(names, name="point")))
