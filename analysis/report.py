"""The store as report tables: one small function per table, Markdown written apart from them.

An experiment's config declares its report: `table` (index, columns, values: a pivot of its
rows) and `claims` (metric, max and/or min, optional `where` query, text). Claims are checked
against the rows of the sweep being reported.
"""

import math
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from harness import store

MISSING = "—"


def latest_sweep(root: Path, experiment: str) -> str | None:
    sweeps = store.sweeps(root, experiment)
    return sweeps[-1] if sweeps else None


def sweep_table(rows: pd.DataFrame, config: dict) -> pd.DataFrame | None:
    """The experiment's declared pivot (e.g. length x block of max_abs_diff) of ok rows."""
    spec = config.get("table")
    if not spec or rows.empty or spec["values"] not in rows:
        return None
    ok = rows[rows["status"] == "ok"]
    table = ok.pivot_table(
        index=spec["index"], columns=spec["columns"], values=spec["values"], aggfunc="max"
    )
    in_grid_order = rows.sort_values("job")
    index = in_grid_order[spec["index"]].drop_duplicates()
    columns = in_grid_order[spec["columns"]].drop_duplicates()
    table = table.reindex(index=index, columns=columns)  # grid order; failed points show as gaps
    table.columns.name = f"{spec['values']}, {spec['index']} (rows) by {spec['columns']} (columns)"
    return table


def claims_table(rows: pd.DataFrame, config: dict) -> pd.DataFrame:
    """One line per declared claim: PASS, FAIL or NO DATA, the worst value, the points covered."""
    lines = [_claim(rows, claim) for claim in config.get("claims") or []]
    return pd.DataFrame(lines, columns=["claim", "result", "worst", "points"])


def _claim(rows: pd.DataFrame, claim: dict) -> dict:
    metric, low, high = claim["metric"], claim.get("min"), claim.get("max")
    selected = rows.query(claim["where"]) if claim.get("where") and not rows.empty else rows
    values = selected[metric].dropna() if metric in selected else pd.Series(dtype=float)
    bounds = " and ".join(
        f"{metric} {op} {bound:g}" for op, bound in ((">=", low), ("<=", high)) if bound is not None
    )
    text = f"{claim.get('text', bounds)} ({bounds})" if claim.get("text") else bounds
    points = f"{len(values)} of {len(selected)}"
    if values.empty:
        return {"claim": text, "result": "NO DATA", "worst": MISSING, "points": points}
    inside = values.between(-math.inf if low is None else low, math.inf if high is None else high)
    return {
        "claim": text,
        "result": "PASS" if inside.all() and len(values) == len(selected) else "FAIL",
        "worst": _worst(values, low, high),
        "points": points,
    }


def _worst(values: pd.Series, low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f"{values.min():.3g} to {values.max():.3g}"
    return f"{(values.max() if high is not None else values.min()):.3g}"


def sweep_header(rows: pd.DataFrame, manifest: dict | None, sweep: str) -> str:
    """Where a sweep's numbers came from: id, points landed, commit, torch, device, command."""
    total = len(manifest["points"]) if manifest else rows["job"].nunique()
    landed = rows["job"].nunique() if not rows.empty else 0
    ok = rows.groupby("job")["status"].agg(lambda s: (s == "ok").all()).sum() if landed else 0
    parts = [f"sweep `{sweep}`", f"{ok} of {total} points ok"]
    if landed < total:
        parts.append(f"{total - landed} missing")
    if landed:
        parts += _provenance(rows.iloc[0], rows)
    if manifest:
        parts.append(f"`{manifest['command']}`")
    return " · ".join(parts)


def _provenance(first: pd.Series, rows: pd.DataFrame) -> list[str]:
    """The commit, torch version and devices a sweep ran with, as far as its rows say."""
    parts = []
    if pd.notna(first.get("git_commit")):
        dirty = " (dirty)" if first.get("git_dirty") else ""
        parts.append(f"commit `{first['git_commit'][:10]}`{dirty}")
    if pd.notna(first.get("torch_version")):
        parts.append(f"torch {first['torch_version']}")
    if "device_name" in rows:
        parts.append(", ".join(sorted(rows["device_name"].dropna().unique())))
    return parts


def markdown(table: pd.DataFrame, floatfmt: str = ".3g") -> str:
    """A table as Markdown, numbers to three digits, gaps as a dash."""
    return (
        table.astype(object)
        .where(table.notna(), None)
        .to_markdown(floatfmt=floatfmt, missingval=MISSING)
    )


def section(root: Path, experiment: str, sweep: str) -> tuple[str, pd.DataFrame]:
    """An experiment's REPORT.md section for one sweep, and its claims."""
    rows = store.read(root, experiment, sweep)
    manifest = store.read_manifest(root, experiment, sweep)
    config = manifest["experiment_config"] if manifest else {}
    claims = claims_table(rows, config)
    parts = [f"## {experiment}", sweep_header(rows, manifest, sweep)]
    table = sweep_table(rows, config)
    if table is not None:
        parts.append(f"{table.columns.name}:\n\n{markdown(table)}")
    failed = rows[rows["status"] != "ok"] if not rows.empty else rows
    if not failed.empty:
        parts.append(markdown(failed[["job", "status", "error"]].set_index("job")))
    if not claims.empty:
        parts.append(markdown(claims.set_index("claim")))
    return "\n\n".join(parts) + "\n", claims


def write_report(root: Path, report_dir: Path) -> tuple[Path, pd.DataFrame]:
    """REPORT.md with every experiment's latest sweep; returns its path and all claims."""
    report_dir.mkdir(parents=True, exist_ok=True)
    generated = f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
    parts = [f"# octlm-harness report\n\nGenerated {generated} from `{root}`.\n"]
    claims = []
    for experiment in store.experiments(root):
        sweep = latest_sweep(root, experiment)
        if sweep is None:
            continue
        text, checked = section(root, experiment, sweep)
        parts.append(text)
        claims.append(checked.assign(experiment=experiment, sweep=sweep))
    path = report_dir / "REPORT.md"
    store.write_text(path, "\n".join(parts))
    all_claims = (
        pd.concat(claims, ignore_index=True) if claims else claims_table(pd.DataFrame(), {})
    )
    return path, all_claims
