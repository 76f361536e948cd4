"""The store as report tables: one small function per table, Markdown written apart from them.

An experiment's config declares its report: `table` (index, columns, values: a pivot of its
rows), or `report`, a module of its own (e.g. octlm_analysis.backends) with `sections(rows, tables,
folder)` (the section's Markdown parts, its plots written to folder) and `figures(rows, tables)`
(the page's plots), the tables being those the experiment derives (`derive`,
harness.results.claims); and `claims` (harness.results.claims), checked over the sweep's planned
points. Tables and claims see every planned point: one without rows is a "not run" row with its
parameters, so that it shows as a gap rather than vanishing.

The report shows each experiment's newest sweep by default (a sweep `python -m harness again`
made is a rerun: shown with its original, never taken as the newest), or the sweeps chosen
(`shown`: `python -m harness report --sweep ID`, `--all`), each chosen one's plots in sweeps/ID/;
every section lists all the sweeps of its experiment, with their points planned and landed and
their claims' results.

This module writes the whole report (write_report): the sweeps chosen, every sweep's claim results,
the sweep lists, and each experiment's part of the page with its history across sweeps. One
sweep's section is octlm_analysis.report_section's; the config a sweep is reported with (and the
code it may import) octlm_analysis.report_config's.
"""

import os
import re
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from harness import files, store
from harness.measuring.columns import is_number_column, is_timing
from harness.names import available_experiments, experiment_file
from harness.results.claims import claims_table
from harness.results.tables import markdown
from octlm_analysis import page, plots, point_lines
from octlm_analysis.history import marked, on_page
from octlm_analysis.report_config import (
    claims_changed,
    latest_sweep,
    module_file,
    own_config,
    trusted_config,
)
from octlm_analysis.report_section import (
    SWEEPS,
    cached_section,
    claims_note,
    portable,
    sweep_header,
)

# What the report's commands import from it (octlm_analysis.__main__, .comparison, .sides, .watch).
__all__ = ["SWEEPS", "claims_changed", "claims_note", "latest_sweep", "sweep_header",
           "trusted_config", "write_report"]  # fmt: skip


def judging(experiment: str, config_dirs, current_claims: bool) -> list:
    """What an experiment's sweeps' claim results are judged by, besides the code and their files:
    the config dirs, its YAML's and its tables' function's files, and current_claims."""
    own = experiment_file(experiment, config_dirs) if experiment in available_experiments(
        config_dirs) else None  # fmt: skip
    derive = str((own_config(experiment, config_dirs) or {}).get("derive") or "").rpartition(".")
    code = point_lines.file_version(module_file(derive[0]))  # one's own tables' function, edited
    return [[str(f) for f in config_dirs], point_lines.file_version(own), code, current_claims]


def judged(
    paths: store.SweepPaths, report_dir: Path, config_dirs, current_claims: bool, by: list,
    claims: pd.DataFrame | None = None,
) -> dict:  # fmt: skip
    """A sweep's claims in a few words ("1 FAIL, 2 PASS"; "" without claims) and the sweep it
    runs again ("again_of", None for an original), judged as its section would judge them (its
    `claims`, where the section has); kept in the report folder's cache, as its points are,
    while what it was judged `by` (judging) holds."""
    root, experiment, sweep = paths.root, paths.experiment, paths.sweep

    def computed() -> dict:
        manifest = store.read_manifest(paths)
        said = claims
        if said is None and manifest:
            config = trusted_config(manifest, experiment, config_dirs, current_claims)
            try:
                rows = store.as_planned(store.read(root, experiment, sweep), manifest, root)
                # Its points from the same read, kept as the page's sweep list reads them.
                point_lines.keep(paths, report_dir, point_lines.of_rows(rows, manifest, sweep))
                said = claims_table(rows, config, manifest["points"])
            except Exception:  # its own section says what went wrong
                said = pd.DataFrame({"result": ["ERROR"]})
        return {"again_of": (manifest or {}).get("again_of"), "claims": claim_counts(said)}

    path = report_dir / point_lines.CACHE / experiment / f"{sweep}.judged.json"
    return point_lines.cached(path, paths.folder, computed, by, fresh=claims is not None)


def claim_counts(claims: pd.DataFrame | None) -> str:
    """Claims' results counted, the worst first: "1 FAIL, 2 PASS" ("" for none)."""
    if claims is None or claims.empty:
        return ""
    counts = claims["result"].value_counts()
    order = [r for r in ("ERROR", "FAIL", "INCOMPLETE", "N/A", "PASS") if r in counts]
    return ", ".join(f"{counts[r]} {r}" for r in [*order, *counts.index.difference(order)])


def killed(root: Path, experiment: str, points: pd.DataFrame) -> pd.DataFrame:
    """The points (point_lines.of_experiment's) with each whose rows say running but whose
    process let its running mark go as killed, as `python -m harness status` says it (a
    sweep a command runs now here is left as it is: its points run there)."""
    running = points[points["status"] == store.RUNNING] if "status" in points else points[:0]
    for sweep, jobs in running.groupby("sweep")["job"]:
        paths = store.SweepPaths(root, experiment, sweep)
        if store.run_by(paths):
            continue
        for index, job in jobs.items():
            if store.still_running(paths.job(int(job)).file) is False:
                points.loc[index, "status"] = "killed"
    return points


def sweep_list(experiment: str, states: pd.DataFrame) -> str:
    """Every sweep of an experiment, oldest first, with its state, points, its claims' results,
    the sweep it runs again (again_of) and whether this report shows it (states: the page's
    sweep list, point_lines.sweep_states)."""
    shown = states[["sweep", "started", "state", "points", "landed", "claims", "again_of", "shown"]]
    return (
        f"Sweeps of {experiment} (`python -m harness report --sweep ID` shows others):\n\n"
        + markdown(shown.set_index("sweep"))
    )


def write_report(
    root: Path,
    report_dir: Path,
    config_dirs: list[Path] = (),
    shown: dict[str, list[str]] | None = None,
    stamp: str | None = None,
    page_dir: Path | None = None,
    current_claims: bool = False,
    histories: dict | None = None,
) -> tuple[Path, pd.DataFrame]:
    """REPORT.md and index.html (octlm_analysis.page) with the sweeps `shown` (experiment -> its
    sweeps), by default every experiment's latest; returns REPORT.md's path and the claims of
    every sweep shown (attrs["shown"]: each (experiment, sweep) shown, with claims or without).
    `stamp`: the page is live (--watch), at this version. `page_dir`: where
    the two go (report_dir: the main ones), their plots and caches staying in report_dir.
    current_claims: judge each sweep by its experiment's claims today, not those it recorded.
    histories: where given, each experiment's judged history that the page marks
    (octlm_analysis.history.on_page: None where it has none), by experiment."""
    report_dir.mkdir(parents=True, exist_ok=True)
    files.no_links_below(report_dir)  # before anything is written there (files.Linked)
    page_dir = page_dir or report_dir
    generated = f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
    heading = f"Generated {generated} from `{portable(str(root))}`."
    parts = [f"# octlm-harness report\n\n{heading} The same with interactive plots: {page.PAGE}.\n"]
    claims, experiments, judged_sweeps = [], [], []
    for experiment in store.experiments(root) if shown is None else list(shown):
        newer, seen, by = [], {}, judging(experiment, config_dirs, current_claims)

        def judge(sweep: str, checked=None, experiment=experiment, seen=seen, by=by) -> dict:
            if sweep not in seen or checked is not None:
                paths = store.SweepPaths(root, experiment, sweep)
                seen[sweep] = judged(paths, report_dir, config_dirs, current_claims, by, checked)
            return seen[sweep]

        if shown is None:
            sweep, newer = latest_sweep(root, experiment)
            chosen = [sweep] if sweep is not None else []
        else:
            chosen = shown[experiment]
        every_sweep = store.sweeps(root, experiment)
        for sweep in set(every_sweep) - set(chosen):  # before the points: a claim count's read
            judge(sweep)  # keeps them too; a shown sweep's are its section's (below)
        views = []
        for sweep in chosen:
            folder = report_dir if shown is None else report_dir / SWEEPS / sweep
            paths = store.SweepPaths(root, experiment, sweep)
            text, checked, view = cached_section(
                paths, report_dir, folder, config_dirs, current_claims
            )
            judge(sweep, checked)
            if newer:
                text += f"\nNewer, with nothing landed yet: {', '.join(f'`{s}`' for s in newer)}.\n"
            reruns = [s for s in every_sweep if s != sweep and judge(s)["again_of"] == sweep]
            if reruns:
                said = ", ".join(f"`{s}` ({judge(s)['claims'] or 'no claims'})" for s in reruns)
                text += f"\nRun again (python -m harness again): {said}.\n"
            parts.append(text)
            claims.append(checked.assign(experiment=experiment, sweep=sweep))
            judged_sweeps.append((experiment, sweep))
            views.append(view)
        points = point_lines.of_experiment(root, experiment, report_dir)  # the shown ones: kept
        points = killed(root, experiment, points)
        states = point_lines.sweep_states(points)
        states["claims"] = [judge(s)["claims"] for s in states["sweep"]]
        states["again_of"] = [judge(s)["again_of"] or "" for s in states["sweep"]]
        states["shown"] = np.where(states["sweep"].isin(chosen), "yes", "")
        if chosen and not states.empty:
            parts.append(sweep_list(experiment, states) + "\n")
        steps = on_page(root, experiment, points) if len(states) > 1 else None
        if histories is not None:
            histories[experiment] = steps
        experiments.append(_page_part(experiment, points, states, views, steps))
    path = page_dir / "REPORT.md"
    up = Path(os.path.relpath(report_dir, page_dir)).as_posix()
    if up != ".":  # the plots' links, relative to report_dir, from the page's folder
        parts = [_from(up, part) for part in parts]
        experiments = [_html_from(up, e) for e in experiments]
    files.write_text(path, "\n".join(parts))
    page.write_page(page_dir, heading, experiments, stamp, assets=report_dir)
    all_claims = (
        pd.concat(claims, ignore_index=True) if claims else claims_table(pd.DataFrame(), {})
    )
    all_claims.attrs["shown"] = judged_sweeps
    return path, all_claims


def _from(up: str, text: str) -> str:
    """Links into the report folder's sweeps/ (Markdown's, HTML's) from a folder `up` below it."""
    return re.sub(rf'(\]\(|src="){SWEEPS}/', lambda m: f"{m[1]}{up}/{SWEEPS}/", text)


def _html_from(up: str, part: dict) -> dict:
    """An experiment's page part (_page_part) with its sweeps' HTML linked from `up`."""
    views = [{**view, "html": _from(up, view["html"])} for view in part.get("shown", [])]
    return {**part, "shown": views}


def _page_part(experiment: str, points: pd.DataFrame, states: pd.DataFrame, views: list,
               judged=None) -> dict:  # fmt: skip
    """An experiment on the page (octlm_analysis.page.section): its sweeps, the ones shown,
    the history of its metrics across sweeps, with the steps `judged` found marked
    (octlm_analysis.history), and the sweeps' points for the picker: of its
    newest PAGE_SWEEPS sweeps and those shown (REPORT.md lists every one), so that the page
    stays the same size however many sweeps the store keeps."""
    params = points.attrs.get("params", [])
    listed = states[states.index >= len(states) - PAGE_SWEEPS] if len(states) else states
    listed = pd.concat([states[(states["shown"] == "yes") & ~states.index.isin(listed.index)],
                        listed])  # fmt: skip
    points = points[points["sweep"].isin(listed["sweep"])]
    headers = {state.sweep: _header_line(state) for state in listed.itertuples()}
    catalog = page.catalogs(points.drop(columns=point_lines.PROVENANCE[1:]), headers)
    history = []
    if len(listed) > 1:
        try:
            metrics = [m for m in _history_metrics(views, points, params) if m in points]
            drawn = [(m, plots.history(points, m, params)) for m in metrics]
            history = [f if judged is None else marked(f, m, judged, points)
                       for m, f in drawn if f]  # fmt: skip
        except Exception as error:  # the rest of the page stands
            print(f"warning: {experiment}'s history could not be drawn: {error!r}", file=sys.stderr)
    return {"name": experiment, "sweeps": listed, "every": len(states), "shown": views,
            "history": history, "catalog": catalog}  # fmt: skip


PAGE_SWEEPS = 500  # the newest sweeps of an experiment whose points and history the page has


def _header_line(state) -> str:
    """A sweep's line in the picker: its id, statuses, and the provenance it has."""
    known = [(label, value) for label, value in (("commit", state.commit), ("torch", state.torch),
             ("", state.device)) if isinstance(value, str) and value]  # fmt: skip
    said = [f"{label} `{value}`" if label == "commit" else f"{label} {value}".strip()
            for label, value in known]  # fmt: skip
    return " · ".join([f"sweep `{state.sweep}`", str(state.statuses), *said])


def _history_metrics(views: list[dict], points: pd.DataFrame, params: list[str]) -> list[str]:
    """The metrics a history is drawn of: the shown claims' (those the points have: a claim on
    a derived table may have none), then every timing of numbers (harness.measuring.columns:
    X_ms or X_s, no housekeeping); never one of the sweeps' planned parameters (`params`: a
    step_sleep_s is no timing) nor the harness's columns (duration_s)."""
    named = [m for view in views for m in view["metrics"] if m in points]
    measured = [c for c in points if c not in params and c not in store.HARNESS_COLUMNS]
    timings = [c for c in measured if is_timing(c) and is_number_column(points[c])]
    return [m for m in dict.fromkeys([*named, *timings]) if m not in params]
