"""What changed between the two sides of a comparison (octlm_analysis.compare), as tables: each
metric other than a timing point by point, training runs' final values, the worst values, the
statuses that differ, the points only one side has, the claims, and the load beside the
timings. Each a small function of the comparison's matched lines; octlm_analysis.comparison
writes them as Markdown. The timings' tables are the gate's (octlm_analysis.gate)."""

import numpy as np
import pandas as pd

from octlm_analysis.compare import (
    BUSY,
    Comparison,
    cells,
    is_load,
    numbers,
    point_index,
    ratio_of,
)
from octlm_analysis.sides import Side, side_claims


def metric_table(matched: pd.DataFrame, metric: str, keys: list[str]) -> pd.DataFrame:
    """A metric other than a timing at each point both sweeps have: A, B and B/A."""
    both = matched[matched["side"] == "both"]
    table = pd.DataFrame({"A": numbers(both, metric, "A"), "B": numbers(both, metric, "B")})
    with np.errstate(divide="ignore", invalid="ignore"):
        table["B/A"] = table["B"] / table["A"]
    table.index = point_index(both, keys)
    return table[table[["A", "B"]].notna().any(axis=1)]


def final_table(c: Comparison, metric: str) -> pd.DataFrame:
    """A training metric's final values at each point both sweeps have: A, B and B/A a phase
    ("train A", "train B", "train B/A", "eval A", ...)."""
    tables = [metric_table(c.matched, column, c.keys).add_prefix("" if phase is None else
                                                                 f"{phase} ")
              for phase, column in c.finals[metric].items()]  # fmt: skip
    return pd.concat(tables, axis=1)


def finals_summary(c: Comparison) -> pd.DataFrame:
    """Each training metric's final values in each phase over the points both sweeps have: how
    many points have both, each side's median, and B/A's median, lowest and highest."""
    lines = []
    for metric, phases in c.finals.items():
        for phase, column in phases.items():
            table = metric_table(c.matched, column, c.keys)
            ratio = table["B/A"][np.isfinite(table["B/A"])]
            both = int(table[["A", "B"]].notna().all(axis=1).sum())
            lines.append({"metric": metric, "phase": phase or "", "points": both,
                          "A median": table["A"].median(), "B median": table["B"].median(),
                          "B/A median": ratio.median(), "B/A lowest": ratio.min(),
                          "B/A highest": ratio.max()})  # fmt: skip
    return pd.DataFrame(lines).set_index(["metric", "phase"])


def worst_table(matched: pd.DataFrame, others: list[str]) -> pd.DataFrame:
    """Each non-timing metric's worst (largest) value over the points both sweeps have."""
    both = matched[matched["side"] == "both"]
    lines = []
    for metric in others:
        a, b = (pd.to_numeric(cells(both, f"{metric} {s}"), errors="coerce").max() for s in "AB")
        lines.append({"metric": metric, "worst A": a, "worst B": b, "B/A": ratio_of(b, a)})
    return pd.DataFrame(lines, columns=["metric", "worst A", "worst B", "B/A"]).set_index("metric")


def status_changes(matched: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """The points both sweeps have whose statuses differ (ok in A, failed in B, ...)."""
    both = matched[(matched["side"] == "both") & (matched["status A"] != matched["status B"])]
    return pd.DataFrame(
        {
            "A": both["status A"].to_numpy(),
            "B": both["status B"].to_numpy(),
            "error in B": cells(both, "error B").where(both["status B"] != "ok").to_numpy(),
        },
        index=point_index(both, keys),
    )


def unmatched(matched: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """The points only one sweep has, and their status there."""
    alone = matched[matched["side"] != "both"]
    status = alone["status A"].where(alone["side"] == "A", alone["status B"])
    return pd.DataFrame(
        {"only in": alone["side"].to_numpy(), "status": status.to_numpy()},
        index=point_index(alone, keys),
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


def load_line(matched: pd.DataFrame) -> str | None:
    """Each sweep's LOAD columns (each timing's, prefixed or not) over the points both have
    (median, largest), or None without any."""
    both = matched[matched["side"] == "both"]
    names = sorted({n for n in (c.rsplit(" ", 1)[0] for c in both.columns) if is_load(n)})
    loads = {side: pd.concat([numbers(both, n, side) for n in names], ignore_index=True).dropna()
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
        f"{busy} of them over {BUSY:g} (a process beside such a load is set aside)."
    )
