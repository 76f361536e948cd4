"""How a sweep's measurements scale with length, as tables: memory named for what it is, ratios
per doubling, speedups over a baseline, and the ratios a point timed in its own process.

The tables that experiments derive for their claims (octlm_experiments.derived) and the report's
sections (analysis) are built of these; pandas only.
"""

import pandas as pd

MEMORY = ["cuda_peak_mib", "rss_delta_mib"]  # a row has one of these, named for what it is


def with_memory(rows: pd.DataFrame) -> pd.DataFrame:
    """Every row (planned points without a measurement too, see harness.results.tables.planned),
    with memory_mib, memory_kind (the column it came from) and memory_over_inputs; the measurements
    of a row that is not ok are missing (NaN), so that what is derived from them is too."""
    data = rows.copy()
    measured = [c for c in ("time_ms", "inputs_mib", *MEMORY) if c in data]
    data[measured] = data[measured].where(data["status"] == "ok")
    kinds = [column for column in MEMORY if column in data]
    memory = data[kinds].bfill(axis=1).iloc[:, 0] if kinds else pd.Series(float("nan"), data.index)
    data["memory_kind"] = (
        data[kinds].notna().idxmax(axis=1).where(memory.notna()) if kinds else None
    )
    data["memory_mib"] = memory
    if "inputs_mib" in data:
        data["memory_over_inputs"] = data["memory_mib"] / data["inputs_mib"]
    return data


def keys(rows: pd.DataFrame, shape: list[str], others: list[str]) -> list[str]:
    """What tells a sweep's measurements apart besides length: the shape columns it has, and
    any other parameter that varies in it (so that no two points share a key)."""
    varying = [c for c in others if c in rows and rows[c].nunique(dropna=False) > 1]
    return [c for c in shape if c in rows] + varying


def per_doubling(data: pd.DataFrame, keys: list[str], ratios: dict[str, str]) -> pd.DataFrame:
    """Per group of `keys`: each column at length L over its value at L/2, for every L whose L/2
    was planned too; missing (NaN) where either point has no value, so that a claim on the
    ratio sees the gap.

    ratios maps a column to the name of its ratio, e.g. {"memory_mib": "memory_growth"}.
    """
    if data.empty:
        return pd.DataFrame(columns=[*keys, "length", *ratios.values()])
    indexed = data.set_index(keys + ["length"])
    if not indexed.index.is_unique:
        raise ValueError(f"two measurements share {', '.join(keys)} and length")
    half = indexed.rename(index=lambda length: length * 2, level="length")
    both = indexed.index.intersection(half.index)
    growth = pd.DataFrame(
        {name: indexed.loc[both, c] / half.loc[both, c] for c, name in ratios.items() if c in data},
        index=both,
    )
    return growth.reset_index()


def speedup_over(data: pd.DataFrame, keys: list[str], by: str, baseline: str) -> pd.DataFrame:
    """Per `keys` and length, for each value of `by` other than `baseline`: the baseline's
    median time over its own (speedup_over_BASELINE), missing where either has no time; no
    line where the baseline was not planned."""
    keys, name = keys + ["length"], f"speedup_over_{baseline}"
    if "time_ms" not in data:  # no point has a time yet
        data = data.assign(time_ms=float("nan"))
    base = data.loc[data[by] == baseline, keys + ["time_ms"]]
    others = data.loc[data[by] != baseline, keys + [by, "time_ms"]]
    paired = others.merge(base, on=keys, suffixes=("", "_base"))
    paired[name] = paired["time_ms_base"] / paired["time_ms"]
    return paired[[*keys, by, name]]


def paired_first(
    across: pd.DataFrame, data: pd.DataFrame, keys: list[str], column: str
) -> pd.DataFrame:
    """`across` (a line per keys and length, `column` a ratio of two points' medians) with
    `column` taken instead from the ok row of `data` at that line's point where the row
    measured it in its own process, in turns (a missing value: not measured there), and
    COLUMN_paired saying which it is. The lines are `across`'s: what a claim selects does not
    change, only how its values were measured."""
    keys, paired, own = [*keys, "length"], f"{column}_paired", f"{column} own"
    if column not in data:
        return across.assign(**{paired: False})
    values = data[keys].assign(**{own: data[column].where(data["status"] == "ok")})
    lines = across.merge(values, on=keys, how="left")
    lines[paired] = lines[own].notna()
    lines[column] = lines.pop(own).fillna(lines.get(column, float("nan")))
    return lines
