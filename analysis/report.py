"""The store as report tables: one small function per table, Markdown written apart from them.

An experiment's config declares its report: `table` (index, columns, values: a pivot of its
rows), or `report`, a module of its own (e.g. analysis.backends) with `tables(rows)` (derived
tables by name) and `sections(rows, tables, folder)` (the section's Markdown parts, its plots
written to folder); and `claims` (analysis.claims), checked over the sweep's planned points.
Tables and claims see every planned point: one without rows is a "not run" row with its
parameters, so that it shows as a gap rather than vanishing.
"""

from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from harness import files, store
from harness.claims import claims_of, claims_table, derived_tables, report_module
from harness.config import available_experiments, experiment_file
from harness.status import compact_if_finished
from harness.tables import MISSING, markdown, planned, sweep_table


def latest_sweep(root: Path, experiment: str) -> tuple[str | None, list[str]]:
    """The newest sweep with rows (else the newest), and the newer ones with none landed yet.
    A sweep folder that a kill left with nothing but an hour-old temporary file (a manifest
    cut short) is no sweep: it goes."""
    sweeps = [s for s in store.sweeps(root, experiment) if not store.prune(root, experiment, s)]
    landed = [sweep for sweep in sweeps if store.result_files(root, experiment, sweep)]
    chosen = landed[-1] if landed else (sweeps[-1] if sweeps else None)
    return chosen, sweeps[sweeps.index(chosen) + 1 :] if chosen else []


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


def trusted_config(manifest: dict | None, experiment: str, config_dirs: list[Path]) -> dict:
    """The sweep's experiment config (its claims and table, as the manifest recorded them),
    with the report module that the experiment's own config names (conf/experiment/, or a
    --config-dir's): a module is never imported because a file in the store names it."""
    config = dict(manifest.get("experiment_config") or {}) if manifest else {}
    config.pop("report", None)
    if experiment in available_experiments(config_dirs):
        own = OmegaConf.load(experiment_file(experiment, config_dirs)).get("experiment") or {}
        if own.get("report"):
            config["report"] = str(own["report"])
    return config


def _untrusted_report(manifest: dict | None, config: dict) -> str | None:
    """A note when the manifest names a report module that the experiment's config does not."""
    named = ((manifest or {}).get("experiment_config") or {}).get("report")
    if named and named != config.get("report"):
        return (
            f"**Not loaded:** the report module `{named}` that the sweep's manifest names: the "
            "experiment's own config does not (give its --config-dir to load its own)."
        )
    return None


def section(
    root: Path, experiment: str, sweep: str, report_dir: Path, config_dirs: list[Path] = ()
) -> tuple[str, pd.DataFrame]:
    """An experiment's REPORT.md section for one sweep, and its claims."""
    manifest = store.read_manifest(root, experiment, sweep)
    compact_if_finished(root, experiment, sweep, manifest)  # one file to read, now and later
    rows = store.as_planned(store.read(root, experiment, sweep), manifest, root)
    config = trusted_config(manifest, experiment, config_dirs)
    points = manifest["points"] if manifest else None
    every = planned(rows, points)
    tables = derived_tables(every, config)
    claims = claims_of(tables, config) if manifest else _unknown_plan(root, experiment, sweep)
    parts = [f"## {experiment}", sweep_header(rows, manifest, sweep)]
    if manifest is None:
        parts.append(f"**Damaged:** {claims['worst'].iloc[0]}: its plan and claims are unknown.")
    parts += [note for note in [_untrusted_report(manifest, config)] if note]
    for path, reason in store.skipped(root, experiment, sweep).items():
        parts.append(f"**Skipped** `{path.name}` ({reason}): its point counts as not run.")
    params = list(points[0]["params"]) if points else []
    table, module = sweep_table(every, config, params), report_module(config)
    if table is not None:
        parts.append(f"{table.columns.name}:\n\n{markdown(table)}")
    if module is not None and not rows.empty:
        parts += module.sections(every, tables, report_dir)
    failed = rows[~rows["status"].isin(store.DONE)] if not rows.empty else rows
    failed = failed.drop_duplicates("job")  # a training point's rows: one line for the point
    if not failed.empty:
        parts.append(markdown(failed[["job", "status", "error"]].set_index("job")))
    if not claims.empty:
        parts.append(markdown(claims.set_index("claim")))
    return "\n\n".join(parts) + "\n", claims


def _unknown_plan(root: Path, experiment: str, sweep: str) -> pd.DataFrame:
    """The claims of a sweep without a readable manifest: unknown, which --check fails."""
    path = store.sweep_dir(root, experiment, sweep) / store.MANIFEST
    said = f"{path} is missing or unreadable"
    line = {"claim": "the sweep's plan and claims can be read", "result": "ERROR", "worst": said}
    return pd.DataFrame([line | {"points": MISSING, "missing": ""}])


def write_report(
    root: Path, report_dir: Path, config_dirs: list[Path] = ()
) -> tuple[Path, pd.DataFrame]:
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
            text, checked = section(root, experiment, sweep, report_dir, config_dirs)
        except Exception as error:  # one sweep that cannot be reported must not sink the rest
            text = f"## {experiment}\n\nsweep `{sweep}` could not be reported: {error!r}\n"
            checked = pd.DataFrame(
                [{"claim": "the sweep can be reported", "result": "ERROR", "worst": repr(error),
                  "points": MISSING, "missing": ""}]
            )  # fmt: skip
        if newer:
            text += f"\nNewer, with nothing landed yet: {', '.join(f'`{s}`' for s in newer)}.\n"
        parts.append(text)
        claims.append(checked.assign(experiment=experiment, sweep=sweep))
    path = report_dir / "REPORT.md"
    files.write_text(path, "\n".join(parts))
    all_claims = (
        pd.concat(claims, ignore_index=True) if claims else claims_table(pd.DataFrame(), {})
    )
    return path, all_claims
