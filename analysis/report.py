"""The store as report tables: one small function per table, Markdown written apart from them.

An experiment's config declares its report: `table` (index, columns, values: a pivot of its
rows), or `report`, a module of its own (e.g. analysis.backends) with `tables(rows)` (derived
tables by name) and `sections(rows, tables, folder)` (the section's Markdown parts, its plots
written to folder); and `claims` (analysis.claims), checked over the sweep's planned points.
Tables and claims see every planned point: one without rows is a "not run" row with its
parameters, so that it shows as a gap rather than vanishing.

The report shows each experiment's newest sweep by default, or the sweeps chosen (`shown`:
`python -m analysis --sweep ID`, `--all`), each chosen one's plots in sweeps/ID/; every section
lists all the sweeps of its experiment, with their points planned and landed.
"""

import re
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


def sweep_list(root: Path, experiment: str, shown: list[str]) -> str:
    """Every sweep of an experiment, oldest first: its points planned and landed (from the
    listing and the manifest: nothing is read), and whether this report shows it."""
    lines = []
    for sweep in store.sweeps(root, experiment):
        manifest = store.read_manifest(root, experiment, sweep)
        planned_points = len(manifest["points"]) if manifest else None
        landed = len(store.jobs_with_rows(root, experiment, sweep))
        lines.append({"sweep": sweep, "points": planned_points, "landed": landed,
                      "shown": "yes" if sweep in shown else ""})  # fmt: skip
    table = pd.DataFrame(lines).set_index("sweep")
    return f"Sweeps of {experiment} (`python -m analysis --sweep ID` shows others):\n\n" + markdown(
        table
    )


def section(
    root: Path, experiment: str, sweep: str, report_dir: Path, config_dirs: list[Path] = ()
) -> tuple[str, pd.DataFrame]:
    """An experiment's REPORT.md section for one sweep, and its claims; its plots go to
    `report_dir` (their links are relative to the report's own folder, its parent if
    report_dir is a sweeps/ID/ one)."""
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
        report_dir.mkdir(parents=True, exist_ok=True)
        parts += _linked(module.sections(every, tables, report_dir), report_dir)
    failed = rows[~rows["status"].isin(store.DONE)] if not rows.empty else rows
    failed = failed.drop_duplicates("job")  # a training point's rows: one line for the point
    if not failed.empty:
        parts.append(markdown(failed[["job", "status", "error"]].set_index("job")))
    if not claims.empty:
        parts.append(markdown(claims.set_index("claim")))
    return "\n\n".join(parts) + "\n", claims


def _linked(parts: list[str], folder: Path) -> list[str]:
    """A module's parts, their images (named alone, in `folder`) linked from the report's own
    folder when `folder` is a sweeps/ID/ one below it."""
    if folder.parent.name != SWEEPS:
        return parts
    prefix = f"{SWEEPS}/{folder.name}/"
    return [re.sub(r"\]\(([^)/:]+\.png)\)", lambda m: f"]({prefix}{m[1]})", p) for p in parts]


SWEEPS = "sweeps"  # the report folder's subfolder of the chosen sweeps' plots


def _unknown_plan(root: Path, experiment: str, sweep: str) -> pd.DataFrame:
    """The claims of a sweep without a readable manifest: unknown, which --check fails."""
    path = store.sweep_dir(root, experiment, sweep) / store.MANIFEST
    said = f"{path} is missing or unreadable"
    line = {"claim": "the sweep's plan and claims can be read", "result": "ERROR", "worst": said}
    return pd.DataFrame([line | {"points": MISSING, "missing": ""}])


def write_report(
    root: Path,
    report_dir: Path,
    config_dirs: list[Path] = (),
    shown: dict[str, list[str]] | None = None,
) -> tuple[Path, pd.DataFrame]:
    """REPORT.md with the sweeps `shown` (experiment -> its sweeps), by default every
    experiment's latest; returns its path and the claims of every sweep shown."""
    report_dir.mkdir(parents=True, exist_ok=True)
    generated = f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
    parts = [f"# octlm-harness report\n\nGenerated {generated} from `{root}`.\n"]
    claims = []
    for experiment in store.experiments(root) if shown is None else list(shown):
        newer = []
        if shown is None:
            sweep, newer = latest_sweep(root, experiment)
            chosen = [sweep] if sweep is not None else []
        else:
            chosen = shown[experiment]
        for sweep in chosen:
            folder = report_dir if shown is None else report_dir / SWEEPS / sweep
            text, checked = _reported(root, experiment, sweep, folder, config_dirs)
            if newer:
                text += f"\nNewer, with nothing landed yet: {', '.join(f'`{s}`' for s in newer)}.\n"
            parts.append(text)
            claims.append(checked.assign(experiment=experiment, sweep=sweep))
        if chosen:
            parts.append(sweep_list(root, experiment, chosen) + "\n")
    path = report_dir / "REPORT.md"
    files.write_text(path, "\n".join(parts))
    all_claims = (
        pd.concat(claims, ignore_index=True) if claims else claims_table(pd.DataFrame(), {})
    )
    return path, all_claims


def _reported(root: Path, experiment: str, sweep: str, folder: Path, config_dirs):
    """section(), or, for a sweep that cannot be reported, a line saying why and an ERROR
    claim: one sweep must not sink the rest."""
    try:
        return section(root, experiment, sweep, folder, config_dirs)
    except Exception as error:
        text = f"## {experiment}\n\nsweep `{sweep}` could not be reported: {error!r}\n"
        checked = pd.DataFrame(
            [{"claim": "the sweep can be reported", "result": "ERROR", "worst": repr(error),
              "points": MISSING, "missing": ""}]
        )  # fmt: skip
        return text, checked
