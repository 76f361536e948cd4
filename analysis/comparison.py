"""A comparison of two sweeps (analysis.compare) as its Markdown page: the header (both sides'
provenance, what points match on, the noise rule, the loads), a summary line, a section per
timing and per other metric that changed, the claims and statuses that differ, the points only
one side has, and, under --fail-on-regression, the regressions and the answers lost."""

import numpy as np
import pandas as pd

from analysis.compare import (
    ONE_PROCESS,
    RULE,
    Comparison,
    claim_changes,
    load_line,
    lost_answers,
    metric_table,
    regressions,
    status_changes,
    unmatched,
    worst_table,
)
from analysis.report import sweep_header
from harness import codestore
from harness.names import setting
from harness.tables import markdown


def document(c: Comparison, factor: float | None) -> tuple[str, int]:
    """The comparison as Markdown, and how many timings regressed beyond `factor`."""
    timing_tables = {metric: metric_table(c.matched, metric, c.keys) for metric in c.timings}
    other_tables = {metric: metric_table(c.matched, metric, c.keys) for metric in c.others}
    claims = claim_changes(c.a, c.b)
    regressed = regressions(timing_tables, factor) if factor is not None else None
    lost = lost_answers(c) if factor is not None else None
    parts = [
        *_header(c),
        _summary(c, timing_tables, claims),
        *_timing_sections(timing_tables),
        *_other_sections(c, other_tables),
        *_listed(c, claims),
        *_regression_section(regressed, factor),
        *_lost_section(lost),
    ]
    return "\n\n".join(parts) + "\n", 0 if regressed is None else len(regressed) + len(lost)


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


def _lost_section(lost: pd.DataFrame | None) -> list[str]:
    if lost is None or lost.empty:
        return []
    return [
        f"## Regressions: {len(lost)} points answered in A have no answer in B",
        _by_point(lost),
    ]


def _regression_section(regressed: pd.DataFrame | None, factor: float | None) -> list[str]:
    if regressed is None:
        return []
    title = f"## Regressions: {len(regressed)} timings slower than {factor:g}x A, outside the noise"
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
