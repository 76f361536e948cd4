"""The store as report tables: one small function per table, Markdown written apart from them.

An experiment's config declares its report: `table` (index, columns, values: a pivot of its
rows), or `report`, a module of its own (e.g. analysis.backends) with `tables(rows)` (derived
tables by name) and `sections(rows, tables, folder)` (the section's Markdown parts, its plots
written to folder); and `claims`: {metric, max and/or min, where (a pandas query), table (a derived
table's name; default the rows), text}, checked against the sweep being reported. A claim
whose `where` selects nothing in the sweep does not apply to it (N/A).
"""

import importlib
import math
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from harness import store

MISSING = "—"


def latest_sweep(root: Path, experiment: str) -> tuple[str | None, list[str]]:
    """The newest sweep with rows (else the newest), and the newer ones with none landed yet."""
    sweeps = store.sweeps(root, experiment)
    landed = [sweep for sweep in sweeps if store.result_files(root, experiment, sweep)]
    chosen = landed[-1] if landed else (sweeps[-1] if sweeps else None)
    return chosen, sweeps[sweeps.index(chosen) + 1 :] if chosen else []


def sweep_table(rows: pd.DataFrame, config: dict, params: list[str] = ()) -> pd.DataFrame | None:
    """The experiment's declared pivot (e.g. length x block of max_abs_diff) of ok rows; where
    other parameters (of `params`) vary too, each cell is the largest over them, as it says."""
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
    hidden = [p for p in params if p in rows and p not in spec.values() and rows[p].nunique() > 1]
    if hidden:
        table.columns.name += f", the largest over {', '.join(hidden)}"
    return table


def report_module(config: dict):
    """The experiment's own report module (config `report`), or None."""
    return importlib.import_module(config["report"]) if config.get("report") else None


def derived_tables(rows: pd.DataFrame, config: dict) -> dict[str, pd.DataFrame]:
    """The rows, and the tables the experiment's report module derives from them, by name."""
    module = report_module(config)
    return {"rows": rows, **(module.tables(rows) if module and not rows.empty else {})}


def claims_table(rows: pd.DataFrame, config: dict) -> pd.DataFrame:
    """One line per claim: PASS, FAIL, NO DATA or N/A, the worst value, the points covered."""
    tables = derived_tables(rows, config)
    lines = [_claim(tables, claim) for claim in config.get("claims") or []]
    return pd.DataFrame(lines, columns=["claim", "result", "worst", "points"])


def _claim(tables: dict[str, pd.DataFrame], claim: dict) -> dict:
    """N/A when the claim's `where` selects none of the sweep's points (whatever their status);
    NO DATA when it selects some but they have no value (failed, out of memory, not run)."""
    metric, low, high = claim["metric"], claim.get("min"), claim.get("max")
    bounds = " and ".join(
        f"{metric} {op} {bound:g}" for op, bound in ((">=", low), ("<=", high)) if bound is not None
    )
    text = f"{claim.get('text', bounds)} ({bounds})" if claim.get("text") else bounds
    table = tables.get(claim.get("table", "rows"), pd.DataFrame())
    try:
        if _selects_nothing(tables["rows"], claim.get("where")):
            return {"claim": text, "result": "N/A", "worst": MISSING, "points": "0 of 0"}
        selected = table.query(claim["where"]) if claim.get("where") and not table.empty else table
    except Exception as error:  # a where that names no column of the table
        return {"claim": text, "result": "ERROR", "worst": str(error), "points": MISSING}
    values = selected[metric].dropna() if metric in selected else pd.Series(dtype=float)
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


def _selects_nothing(rows: pd.DataFrame, where: str | None) -> bool:
    """Whether `where` selects none of the sweep's rows (a where on a derived table's own
    columns cannot tell: then False). No rows at all is no data, not N/A."""
    if rows.empty or not where:
        return False
    try:
        return rows.query(where).empty
    except Exception:
        return False


def _worst(values: pd.Series, low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f"{values.min():.3g} to {values.max():.3g}"
    return f"{(values.max() if high is not None else values.min()):.3g}"


def sweep_header(rows: pd.DataFrame, manifest: dict | None, sweep: str) -> str:
    """Where a sweep's numbers came from: id, points landed, commit, torch, device, command."""
    statuses = store.job_statuses(rows)
    total = len(manifest["points"]) if manifest else len(statuses)
    parts = [f"sweep `{sweep}`", store.status_counts(statuses, total)]
    if len(statuses):
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


def markdown(table: pd.DataFrame, floatfmt: str = ".3g", index: bool = True) -> str:
    """A table as Markdown, numbers to three digits, gaps as a dash."""
    cells = table.astype(object).where(table.notna(), None)
    return cells.to_markdown(floatfmt=floatfmt, missingval=MISSING, index=index)


def section(root: Path, experiment: str, sweep: str, report_dir: Path) -> tuple[str, pd.DataFrame]:
    """An experiment's REPORT.md section for one sweep, and its claims."""
    rows = store.read(root, experiment, sweep)
    manifest = store.read_manifest(root, experiment, sweep)
    config = manifest["experiment_config"] if manifest else {}
    claims = claims_table(rows, config)
    parts = [f"## {experiment}", sweep_header(rows, manifest, sweep)]
    params = list(manifest["points"][0]["params"]) if manifest and manifest["points"] else []
    table, module = sweep_table(rows, config, params), report_module(config)
    if table is not None:
        parts.append(f"{table.columns.name}:\n\n{markdown(table)}")
    if module is not None and not rows.empty:
        parts += module.sections(rows, derived_tables(rows, config), report_dir)
    failed = rows[~rows["status"].isin(store.DONE)] if not rows.empty else rows
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
        sweep, newer = latest_sweep(root, experiment)
        if sweep is None:
            continue
        try:
            text, checked = section(root, experiment, sweep, report_dir)
        except Exception as error:  # one sweep that cannot be reported must not sink the rest
            text = f"## {experiment}\n\nsweep `{sweep}` could not be reported: {error!r}\n"
            checked = pd.DataFrame(
                [{"claim": "the sweep can be reported", "result": "ERROR", "worst": repr(error),
                  "points": MISSING}]
            )  # fmt: skip
        if newer:
            text += f"\nNewer, with nothing landed yet: {', '.join(f'`{s}`' for s in newer)}.\n"
        parts.append(text)
        claims.append(checked.assign(experiment=experiment, sweep=sweep))
    path = report_dir / "REPORT.md"
    store.write_text(path, "\n".join(parts))
    all_claims = (
        pd.concat(claims, ignore_index=True) if claims else claims_table(pd.DataFrame(), {})
    )
    return path, all_claims
