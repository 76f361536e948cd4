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
their claims' verdicts.
"""

import copy
import functools
import importlib.util
import json
import os
import re
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from plotly.io.json import to_json_plotly

from harness import files, store
from harness.names import available_experiments, experiment_file
from harness.results import runs
from harness.results.claims import (
    claims_of,
    claims_table,
    derived_tables,
    outcome,
    parameters,
)
from harness.results.tables import (
    MISSING,
    WIDTH,
    absent_columns,
    markdown,
    planned,
    sweep_table,
)
from octlm_analysis import curves, page, plots, point_lines, search


def latest_sweep(root: Path, experiment: str) -> tuple[str | None, list[str]]:
    """The newest sweep with rows (else the newest), and the newer ones with none landed yet,
    of those python -m harness again did not make (its reruns, whose manifests name their
    original as again_of: all of them where there is no other). A sweep folder that a kill left
    with nothing but an hour-old temporary file (a manifest cut short) is no sweep: it goes."""
    sweeps = [s for s in store.sweeps(root, experiment) if not store.prune(root, experiment, s)]
    originals = []
    for sweep in reversed(sweeps):  # the newest first: the chosen one is near the end
        if not (store.read_manifest(root, experiment, sweep) or {}).get("again_of"):
            originals.insert(0, sweep)
            if store.result_files(root, experiment, sweep):
                break
    sweeps = originals or sweeps
    landed = [sweep for sweep in sweeps if store.result_files(root, experiment, sweep)]
    chosen = landed[-1] if landed else (sweeps[-1] if sweeps else None)
    return chosen, sweeps[sweeps.index(chosen) + 1 :] if chosen else []


def judging(experiment: str, config_dirs, current_claims: bool) -> list:
    """What an experiment's sweeps' verdicts are judged by, besides the code and their files:
    the config dirs, its YAML's and its tables' function's files, and current_claims."""
    own = experiment_file(experiment, config_dirs) if experiment in available_experiments(
        config_dirs) else None  # fmt: skip
    derive = str((own_config(experiment, config_dirs) or {}).get("derive") or "").rpartition(".")
    code = point_lines.file_version(_origin(derive[0]))  # a tables' function of one's own, edited
    return [[str(f) for f in config_dirs], point_lines.file_version(own), code, current_claims]


def judged(
    root: Path, experiment: str, sweep: str, report_dir: Path, config_dirs, current_claims: bool,
    by: list, claims: pd.DataFrame | None = None,
) -> dict:  # fmt: skip
    """A sweep's claims in a few words ("1 FAIL, 2 PASS"; "" without claims) and the sweep it
    runs again ("again_of", None for an original), judged as its section would judge them (its
    `claims`, where the section has); kept in the report folder's cache, as its points are,
    while what it was judged `by` (judging) holds."""

    def computed() -> dict:
        manifest = store.read_manifest(root, experiment, sweep)
        said = claims
        if said is None and manifest:
            config = trusted_config(manifest, experiment, config_dirs, current_claims)
            try:
                rows = store.as_planned(store.read(root, experiment, sweep), manifest, root)
                # Its points from the same read, kept as the page's sweep list reads them.
                point_lines.keep(root, experiment, sweep, report_dir,
                                 point_lines.of_rows(rows, manifest, sweep))  # fmt: skip
                said = claims_table(rows, config, manifest["points"])
            except Exception:  # its own section says what went wrong
                said = pd.DataFrame({"result": ["ERROR"]})
        return {"again_of": (manifest or {}).get("again_of"), "claims": verdicts(said)}

    path = report_dir / point_lines.CACHE / experiment / f"{sweep}.judged.json"
    folder = store.sweep_dir(root, experiment, sweep)
    return point_lines.cached(path, folder, computed, by, fresh=claims is not None)


def verdicts(claims: pd.DataFrame | None) -> str:
    """Claims' results counted, the worst first: "1 FAIL, 2 PASS" ("" for none)."""
    if claims is None or claims.empty:
        return ""
    counts = claims["result"].value_counts()
    order = [r for r in ("ERROR", "FAIL", "INCOMPLETE", "N/A", "PASS") if r in counts]
    return ", ".join(f"{counts[r]} {r}" for r in [*order, *counts.index.difference(order)])


def sweep_header(rows: pd.DataFrame, manifest: dict | None, sweep: str) -> str:
    """Where a sweep's numbers came from: id, points landed, commit, torch, device, command."""
    statuses = store.job_statuses(rows)
    total = len(manifest["points"]) if manifest else len(statuses)
    parts = [f"sweep `{sweep}`", store.status_counts(statuses, total)]
    if len(statuses):
        parts += _provenance(rows.iloc[0], rows)
    if manifest:
        parts.append(f"`{portable(manifest['command'])}`")
    return " · ".join(parts)


def portable(text: str) -> str:
    """A command line (or a path) without the absolute paths of the machine that ran it: each
    one within this folder relative to it, any other as .../ and its last two parts (a report
    is read elsewhere; where the sweep's out and code store lay is no result)."""
    here = Path.cwd()

    def shown(match: re.Match) -> str:
        path = Path(match[0])
        if path.is_relative_to(here):
            return path.relative_to(here).as_posix() or "."
        return ".../" + "/".join(path.parts[-2:])

    return re.sub(r"(?<![\w.])/[^\s'\"=,]*", shown, text)


def _provenance(first: pd.Series, rows: pd.DataFrame) -> list[str]:
    """The commit, torch version and devices a sweep ran with, as far as its rows say."""
    parts = []
    if pd.notna(first.get("git_commit")):
        dirty = " (dirty)" if first.get("git_dirty") else ""
        parts.append(f"commit `{first['git_commit'][:10]}`{dirty}")
    if pd.notna(first.get("torch_version")):
        parts.append(f"torch {first['torch_version']}")
    devices = sorted(rows["device_name"].dropna().unique()) if "device_name" in rows else []
    if devices:
        parts.append(", ".join(devices))
    return parts


IMPORTED = {"derive": "tables", "report": "report module"}  # config keys that name code


def trusted_config(
    manifest: dict | None, experiment: str, config_dirs: list[Path], current_claims: bool = False
) -> dict:
    """The sweep's experiment config (its claims and table, as the manifest recorded them),
    with the tables' function and report module that the experiment's own config names
    (conf/experiment/, or a --config-dir's): code is never imported because a file in the store
    names it. current_claims: the claims the experiment's own config states today instead (the
    recorded ones where it has no config here)."""
    config = dict(manifest.get("experiment_config") or {}) if manifest else {}
    for key in IMPORTED:
        config.pop(key, None)
    own = own_config(experiment, config_dirs)
    if own is not None:
        config.update({key: str(own[key]) for key in IMPORTED if own.get(key)})
        if current_claims:
            config["claims"] = own.get("claims") or []
    return config


def own_config(experiment: str, config_dirs: list[Path]) -> dict | None:
    """The experiment node of the experiment's YAML as it is today (conf/experiment/ or a
    --config-dir's), read as YAML, nothing imported; None where there is none here."""
    if experiment not in available_experiments(config_dirs):
        return None
    path = experiment_file(experiment, config_dirs)
    return copy.deepcopy(_yaml_experiment(str(path), path.stat().st_mtime_ns))


@functools.lru_cache(maxsize=64)
def _yaml_experiment(path: str, version: int) -> dict:
    """A YAML file's experiment node, read once for each version of the file (its mtime)."""
    return (yaml.safe_load(Path(path).read_text()) or {}).get("experiment") or {}


def claims_changed(manifest: dict | None, experiment: str, config_dirs: list[Path]) -> bool:
    """Whether the claims a sweep recorded in its manifest differ from those its experiment's
    YAML states today (a claim since fixed, added or removed); False where either is unknown."""
    own = own_config(experiment, config_dirs)
    if manifest is None or own is None:
        return False
    recorded = (manifest.get("experiment_config") or {}).get("claims") or []
    today = own.get("claims") or []
    return _numbers(recorded) != _numbers(today)


def _numbers(value):
    """A claim's values with numbers written as text read as numbers: YAML's reader takes 1e-5
    for a string where Hydra's (the manifest's) takes it for a float."""
    if isinstance(value, dict):
        return {key: _numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_numbers(item) for item in value]
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


def report_module(config: dict):
    """The experiment's own report module (config `report`), or None."""
    return importlib.import_module(config["report"]) if config.get("report") else None


def _untrusted_code(manifest: dict | None, config: dict) -> list[str]:
    """A note for each piece of code the manifest names that the experiment's config does not."""
    recorded = (manifest or {}).get("experiment_config") or {}
    return [
        f"**Not loaded:** the {what} `{recorded[key]}` that the sweep's manifest names: the "
        "experiment's own config does not (give its --config-dir to load its own)."
        for key, what in IMPORTED.items()
        if recorded.get(key) and recorded[key] != config.get(key)
    ]


def killed(root: Path, experiment: str, points: pd.DataFrame) -> pd.DataFrame:
    """The points (point_lines.of_experiment's) with each whose rows say running but whose
    process let its running mark go as killed, as `python -m harness status` says it (a
    sweep a command runs now here is left as it is: its points run there)."""
    running = points[points["status"] == store.RUNNING] if "status" in points else points[:0]
    for sweep, jobs in running.groupby("sweep")["job"]:
        if store.run_by(root, experiment, sweep):
            continue
        for index, job in jobs.items():
            path = store.job_file(root, experiment, sweep, int(job))
            if store.still_running(path) is False:
                points.loc[index, "status"] = "killed"
    return points


def sweep_list(experiment: str, states: pd.DataFrame) -> str:
    """Every sweep of an experiment, oldest first, with its state, points, its claims' verdicts,
    the sweep it runs again (again_of) and whether this report shows it (states: the page's
    sweep list, point_lines.sweep_states)."""
    shown = states[["sweep", "started", "state", "points", "landed", "claims", "again_of", "shown"]]
    return (
        f"Sweeps of {experiment} (`python -m harness report --sweep ID` shows others):\n\n"
        + markdown(shown.set_index("sweep"))
    )


def section(
    root: Path,
    experiment: str,
    sweep: str,
    report_dir: Path,
    config_dirs: list[Path] = (),
    current_claims: bool = False,
) -> tuple[str, pd.DataFrame, dict]:
    """An experiment's REPORT.md section for one sweep, its claims, and its part of the page
    (octlm_analysis.page.experiment_html's `shown`, its points those of
    octlm_analysis.point_lines); its plots go to `report_dir` (their links are relative to the
    report's own folder, its parent if report_dir is a sweeps/ID/ one)."""
    manifest = store.read_manifest(root, experiment, sweep)
    rows = store.as_planned(store.read(root, experiment, sweep), manifest, root)
    config = trusted_config(manifest, experiment, config_dirs, current_claims)
    plan = manifest["points"] if manifest else None
    every = planned(rows, plan)
    tables = derived_tables(every, config)
    params = parameters(plan)
    claims = (
        claims_of(tables, config, params) if manifest else _unknown_plan(root, experiment, sweep)
    )
    header = sweep_header(rows, manifest, sweep)
    notes = _notes(root, experiment, sweep, manifest, config, claims)
    if claims_changed(manifest, experiment, config_dirs):
        notes.append(claims_note(current_claims))
    parts = [f"## {experiment}", header, *notes]
    table, module = sweep_table(every, config, params), report_module(config)
    module_parts = []
    if table is not None:
        module_parts.append(f"{table.attrs['caption']}:\n\n{markdown(table, width=WIDTH)}")
    absent = absent_columns(rows, config.get("table"))
    if absent:
        parts.append(f"**No table:** {absent}.")
    if module is not None and not rows.empty:
        report_dir.mkdir(parents=True, exist_ok=True)
        module_parts += _linked(module.sections(every, tables, report_dir), report_dir)
    try:
        shown = _figures(module if not rows.empty else None, every, tables, config, params)
    except Exception as error:  # a plot must not sink the section: its tables stand
        shown = []
        parts.append(f"**Not drawn:** the plots failed ({error!r}).")
    if module is None and not rows.empty:  # the claims' plots, where no module draws its own
        module_parts += _claims_png(shown, report_dir, experiment)
    if config.get("search") and not rows.empty:  # each cell's best trial, the studies' plots
        best, figures, failed = _searched(root, experiment, sweep, config, tables["best"], params)
        module_parts, shown, parts = [*module_parts, best], [*shown, *figures], [*parts, *failed]
    parts += module_parts
    points = point_lines.of_rows(rows, manifest, sweep)
    problems = _problems(points, params)
    if not problems.empty:
        parts += ["Points without an answer:", markdown(problems, index=False)]
    if not claims.empty:
        parts.append(claims_list(claims, config))
    view = {
        "sweep": sweep,
        "header": " ".join([header, *notes]),
        "claims": _with_wheres(claims, config),
        "problems": problems,
        "points": points,
        "figures": shown,
        "html": page.parts_html(module_parts),
        "metrics": [c["metric"] for c in config.get("claims") or []],
    }
    return "\n\n".join(parts) + "\n", claims, view


def _claims_png(figures: list[dict], report_dir: Path, experiment: str) -> list[str]:
    """The PNG of the claims' plots (its first PNG_PANELS), linked; none without a figure."""
    plot = plots.png(figures[:PNG_PANELS], report_dir / f"{experiment}-claims.png")
    return [] if plot is None else _linked([f"![the sweep's metrics]({plot.name})"], report_dir)


def _searched(root: Path, experiment: str, sweep: str, config: dict, best: pd.DataFrame,
              params: list[str]) -> tuple[str, list[dict], list[str]]:  # fmt: skip
    """A search's best trial per cell as Markdown, the studies' own plots, and a note where
    they cannot be drawn (a study that cannot be read: the table stands)."""
    searched = config["search"]
    said = f"Best trial per cell ({searched['direction']} {searched['objective']})"
    table = f"{said}:\n\n{markdown(search.best_table(best, searched, params), index=False)}"
    try:
        return table, search.figures(root, experiment, sweep), []
    except Exception as error:
        return table, [], [f"**Not drawn:** the search's plots failed ({error!r})."]


def _notes(root: Path, experiment: str, sweep: str, manifest: dict | None, config: dict,
           claims: pd.DataFrame) -> list[str]:  # fmt: skip
    """What a section says of its sweep beside the header: damaged, code not loaded, skipped."""
    notes = []
    if manifest is None:
        notes.append(f"**Damaged:** {claims['worst'].iloc[0]}: its plan and claims are unknown.")
    notes += _untrusted_code(manifest, config)
    for path, reason in store.skipped(root, experiment, sweep).items():
        notes.append(f"**Skipped** `{path.name}` ({reason}): its point counts as not run.")
    return notes


def claims_note(current_claims: bool) -> str:
    """What a section (and --check) says of a sweep whose recorded claims differ from its
    experiment's YAML today."""
    if current_claims:
        return ("**Claims changed:** the experiment's YAML states other claims than this sweep "
                "recorded; judged by today's (--current-claims).")  # fmt: skip
    return ("**Claims changed:** the experiment's YAML states other claims than this sweep "
            "recorded; judged by the recorded ones (--current-claims: by today's).")  # fmt: skip


def claims_list(claims: pd.DataFrame, config: dict) -> str:
    """The claims as Markdown, a line each: result, statement, where, and its outcome (the
    worst value and how many have one; a FAIL's failing points, values and bounds)."""
    lines = []
    for claim in _with_wheres(claims, config).itertuples():
        where = f" where `{claim.where}`" if claim.where else ""
        lines.append(f"- **{claim.result}** {claim.claim}{where}: {outcome(claim)}")
    return "Claims:\n\n" + "\n".join(lines)


def _with_wheres(claims: pd.DataFrame, config: dict) -> pd.DataFrame:
    """The claims with each one's `where` (its config's, in order), empty where it has none."""
    listed = config.get("claims") or []
    wheres = [c.get("where") or "" for c in listed] if len(listed) == len(claims) else ""
    return claims.assign(where=wheres)


def _problems(points: pd.DataFrame, params: list[str]) -> pd.DataFrame:
    """The points without an answer (failed, killed, oom, timeout, running, not run): their
    job, the parameters that vary, status and error."""
    if "status" not in points:
        return pd.DataFrame()
    left = points[~points["status"].isin(store.DONE)]
    shown = ["job", *plots.varying(points, params), "status", "error"]
    return left.reindex(columns=shown)


def _figures(module, every: pd.DataFrame, tables: dict, config: dict, params) -> list[dict]:
    """The sweep's plots on the page: the report module's own (its `figures`), then one per
    claim on the rows (octlm_analysis.plots.claim_figures; a training run's by its final rows,
    runs.finals), against the experiment's axis (plots.axis). Then, for a training experiment,
    each metric's curves over step (octlm_analysis.curves, less those the module draws); for
    any other, without a module that draws its own, each other metric against the axis."""
    drawing = module is not None and hasattr(module, "figures")
    own = module.figures(every, tables) if drawing else []
    stepped = runs.stepped(every)
    trained = curves.figures(every, params, config, own) if stepped else []
    claims = config.get("claims") or []
    x = plots.axis(every, config, params)
    if x is None:
        return [*own, *trained]
    figures = plots.claim_figures(tables, claims, x, params) if not stepped else []
    for claim in claims if stepped else []:  # its metric at each run's last row holding it
        finals = {**tables, "rows": runs.finals(every, claim["metric"])}
        figures += plots.claim_figures(finals, [claim], x, params)
    shown = [*own, *figures, *trained]
    if not drawing and not stepped:
        claimed = {claim["metric"] for claim in claims}
        shown += plots.metric_figures(tables["rows"], x, params, claimed, config)
    return shown


def _linked(parts: list[str], folder: Path) -> list[str]:
    """A module's parts, their images (named alone, in `folder`) linked from the report's own
    folder when `folder` is a sweeps/ID/ one below it."""
    if folder.parent.name != SWEEPS:
        return parts
    prefix = f"{SWEEPS}/{folder.name}/"
    return [re.sub(r"\]\(([^)/:]+\.png)\)", lambda m: f"]({prefix}{m[1]})", p) for p in parts]


PNG_PANELS = 4  # the most plots REPORT.md's PNG of an experiment without a module holds
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
    stamp: str | None = None,
    page_dir: Path | None = None,
    current_claims: bool = False,
) -> tuple[Path, pd.DataFrame]:
    """REPORT.md and index.html (octlm_analysis.page) with the sweeps `shown` (experiment -> its
    sweeps), by default every experiment's latest; returns REPORT.md's path and the claims of
    every sweep shown (attrs["shown"]: each (experiment, sweep) shown, with claims or without).
    `stamp`: the page is live (--watch), at this version. `page_dir`: where
    the two go (report_dir: the main ones), their plots and caches staying in report_dir.
    current_claims: judge each sweep by its experiment's claims today, not those it recorded."""
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
                seen[sweep] = judged(root, experiment, sweep, report_dir, config_dirs,
                                     current_claims, by, checked)  # fmt: skip
            return seen[sweep]

        if shown is None:
            sweep, newer = latest_sweep(root, experiment)
            chosen = [sweep] if sweep is not None else []
        else:
            chosen = shown[experiment]
        every_sweep = store.sweeps(root, experiment)
        for sweep in set(every_sweep) - set(chosen):  # before the points: a verdict's read
            judge(sweep)  # keeps them too; a shown sweep's are its section's (below)
        views = []
        for sweep in chosen:
            folder = report_dir if shown is None else report_dir / SWEEPS / sweep
            text, checked, view = _cached_section(
                root, experiment, sweep, report_dir, folder, config_dirs, current_claims
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
        experiments.append(_page_part(experiment, points, states, views))
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


def _page_part(experiment: str, points: pd.DataFrame, states: pd.DataFrame, views: list) -> dict:
    """An experiment on the page (octlm_analysis.page.experiment_html): its sweeps, the ones shown,
    the history of its metrics across sweeps, and the sweeps' points for the picker: of its
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
            history = [f for f in (plots.history(points, m, params) for m in metrics) if f]
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
    a derived table may have none), then every timing (a column X_ms or X_s); never one of the
    sweeps' planned parameters (`params`: a step_sleep_s is no timing)."""
    named = [m for view in views for m in view["metrics"] if m in points]
    timings = [c for c in points if c.endswith(("_ms", "_s")) and not c.endswith("_iqr_ms")
               and c != "duration_s" and pd.api.types.is_numeric_dtype(points[c])]  # fmt: skip
    return [m for m in dict.fromkeys([*named, *timings]) if m not in params]


def _origin(module: str | None) -> Path | None:
    """The file a module is loaded from, without importing it; None where it cannot be found
    (the section says why)."""
    try:
        spec = importlib.util.find_spec(module) if module else None
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec and spec.origin else None


def _cached_section(root, experiment, sweep, report_dir, folder, config_dirs, current_claims):
    """_reported(), kept in the report folder's cache (octlm_analysis.point_lines.cached) while the
    sweep's files, the code and the experiment's config are as they were, and the plots its
    text links to are still there; a sweep that could not be reported is not kept."""
    manifest = store.read_manifest(root, experiment, sweep)
    own = experiment_file(experiment, config_dirs) if experiment in available_experiments(
        config_dirs) else None  # fmt: skip
    config = trusted_config(manifest, experiment, config_dirs)
    derive = (config.get("derive") or "").rpartition(".")[0]  # the module of its function
    code = [_origin(config.get("report")), _origin(derive)]  # a module of one's own, edited
    extra = [str(folder), point_lines.file_version(own), *map(point_lines.file_version, code),
             current_claims]  # fmt: skip

    def computed() -> dict:
        text, claims, view = _reported(root, experiment, sweep, folder, config_dirs, current_claims)
        if not view.get("failed"):  # its points, from the rows it read: not read twice
            point_lines.keep(root, experiment, sweep, report_dir, view["points"])
        view["points"] = page.reading_order(view["points"])  # as the page shows them
        tables = {k: _table(view[k]) for k in ("claims", "problems", "points")}
        kept = {**view, **tables, "figures": json.loads(to_json_plotly(view["figures"]))}
        return {"text": text, "claims": _table(claims), "view": kept}

    path = report_dir / point_lines.CACHE / experiment / f"{sweep}.section.json"
    value = point_lines.cached(path, store.sweep_dir(root, experiment, sweep), computed, extra)
    linked = re.findall(r"\]\(([^)/:]+(?:/[^)/:]+)*\.png)\)", value["text"])
    if not all((report_dir / link).exists() for link in linked):
        path.unlink(missing_ok=True)
        value = point_lines.cached(path, store.sweep_dir(root, experiment, sweep), computed, extra)
    if value["view"].get("failed"):
        path.unlink(missing_ok=True)  # tried again next time: the fault may pass
    view = value["view"] | {k: _frame(value["view"][k]) for k in ("claims", "problems", "points")}
    return value["text"], _frame(value["claims"]), view


def _table(frame: pd.DataFrame) -> dict:
    return {"columns": [str(c) for c in frame.columns], "rows": point_lines.records(frame)}


def _frame(table: dict) -> pd.DataFrame:
    frame = pd.DataFrame(table["rows"], columns=table["columns"])
    if "started_at" in frame:  # ISO text in JSON
        frame["started_at"] = pd.to_datetime(frame["started_at"], utc=True, errors="coerce")
    return frame


def _reported(root: Path, experiment: str, sweep: str, folder: Path, config_dirs, current_claims):
    """section(), or, for a sweep that cannot be reported, a line saying why and an ERROR
    claim: one sweep must not sink the rest."""
    try:
        return section(root, experiment, sweep, folder, config_dirs, current_claims)
    except Exception as error:
        text = f"## {experiment}\n\nsweep `{sweep}` could not be reported: {error!r}\n"
        checked = pd.DataFrame(
            [{"claim": "the sweep can be reported", "result": "ERROR", "worst": repr(error),
              "points": MISSING, "missing": ""}]
        )  # fmt: skip
        view = {"sweep": sweep, "header": f"sweep `{sweep}` could not be reported: {error!r}",
                "claims": checked, "problems": pd.DataFrame(), "figures": [], "html": "",
                "points": pd.DataFrame(), "metrics": [],
                "failed": True}  # fmt: skip
        return text, checked, view
