"""One sweep's section of the report: its header (where its numbers came from), notes, table,
the report module's parts, plots, the points without an answer and the claims as Markdown, and
its part of the page (octlm_analysis.page's `shown`); kept in the report folder's cache while
the sweep's files, the code and the experiment's config are as they were (cached_section). A
sweep that cannot be reported says why in its section and sinks none of the others."""

import json
import re
from pathlib import Path

import pandas as pd
from plotly.io.json import to_json_plotly

from harness import store
from harness.names import available_experiments, experiment_file
from harness.results import runs
from harness.results.claims import claims_of, derived_tables, outcome, parameters
from harness.results.tables import (
    MISSING,
    WIDTH,
    absent_columns,
    markdown,
    planned,
    sweep_table,
)
from octlm_analysis import curves, page, plots, png_figures, point_lines, search
from octlm_analysis.report_config import (
    claims_changed,
    module_file,
    report_module,
    trusted_config,
    untrusted_code,
)


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


def section(
    paths: store.SweepPaths,
    report_dir: Path,
    config_dirs: list[Path] = (),
    current_claims: bool = False,
) -> tuple[str, pd.DataFrame, dict]:
    """An experiment's REPORT.md section for one sweep, its claims, and its part of the page
    (octlm_analysis.page.section's `shown`, its points those of
    octlm_analysis.point_lines); its plots go to `report_dir` (their links are relative to the
    report's own folder, its parent if report_dir is a sweeps/ID/ one)."""
    root, experiment, sweep = paths.root, paths.experiment, paths.sweep
    manifest = store.read_manifest(paths)
    rows = store.as_planned(store.read(root, experiment, sweep), manifest, root)
    config = trusted_config(manifest, experiment, config_dirs, current_claims)
    plan = manifest["points"] if manifest else None
    every = planned(rows, plan)
    tables = derived_tables(every, config)
    params = parameters(plan)
    claims = claims_of(tables, config, params) if manifest else _unknown_plan(paths)
    header = sweep_header(rows, manifest, sweep)
    notes = _notes(paths, manifest, config, claims)
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
        best, figures, failed = _searched(paths, config, tables["best"], params)
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
    plot = png_figures.png(figures[:PNG_PANELS], report_dir / f"{experiment}-claims.png")
    return [] if plot is None else _linked([f"![the sweep's metrics]({plot.name})"], report_dir)


def _searched(sweep: store.SweepPaths, config: dict, best: pd.DataFrame,
              params: list[str]) -> tuple[str, list[dict], list[str]]:  # fmt: skip
    """A search's best trial per cell as Markdown, the studies' own plots, and a note where
    they cannot be drawn (a study that cannot be read: the table stands)."""
    searched = config["search"]
    said = f"Best trial per cell ({searched['direction']} {searched['objective']})"
    table = f"{said}:\n\n{markdown(search.best_table(best, searched, params), index=False)}"
    try:
        return table, search.figures(sweep), []
    except Exception as error:
        return table, [], [f"**Not drawn:** the search's plots failed ({error!r})."]


def _notes(sweep: store.SweepPaths, manifest: dict | None, config: dict,
           claims: pd.DataFrame) -> list[str]:  # fmt: skip
    """What a section says of its sweep beside the header: damaged, code not loaded, skipped."""
    notes = []
    if manifest is None:
        notes.append(f"**Damaged:** {claims['worst'].iloc[0]}: its plan and claims are unknown.")
    notes += untrusted_code(manifest, config)
    for path, reason in store.skipped(sweep).items():
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


def _unknown_plan(sweep: store.SweepPaths) -> pd.DataFrame:
    """The claims of a sweep without a readable manifest: unknown, which --check fails."""
    said = f"{sweep.manifest} is missing or unreadable"
    line = {"claim": "the sweep's plan and claims can be read", "result": "ERROR", "worst": said}
    return pd.DataFrame([line | {"points": MISSING, "missing": ""}])


def cached_section(paths: store.SweepPaths, report_dir, folder, config_dirs, current_claims):
    """_reported(), kept in the report folder's cache (octlm_analysis.point_lines.cached) while the
    sweep's files, the code and the experiment's config are as they were, and the plots its
    text links to are still there; a sweep that could not be reported is not kept."""
    experiment, sweep = paths.experiment, paths.sweep
    manifest = store.read_manifest(paths)
    own = experiment_file(experiment, config_dirs) if experiment in available_experiments(
        config_dirs) else None  # fmt: skip
    config = trusted_config(manifest, experiment, config_dirs)
    derive = (config.get("derive") or "").rpartition(".")[0]  # the module of its function
    code = [module_file(config.get("report")), module_file(derive)]  # a module of one's own, edited
    extra = [str(folder), point_lines.file_version(own), *map(point_lines.file_version, code),
             current_claims]  # fmt: skip

    def computed() -> dict:
        text, claims, view = _reported(paths, folder, config_dirs, current_claims)
        if not view.get("failed"):  # its points, from the rows it read: not read twice
            point_lines.keep(paths, report_dir, view["points"])
        view["points"] = page.reading_order(view["points"])  # as the page shows them
        tables = {k: _table(view[k]) for k in ("claims", "problems", "points")}
        kept = {**view, **tables, "figures": json.loads(to_json_plotly(view["figures"]))}
        return {"text": text, "claims": _table(claims), "view": kept}

    path = report_dir / point_lines.CACHE / experiment / f"{sweep}.section.json"
    value = point_lines.cached(path, paths.folder, computed, extra)
    linked = re.findall(r"\]\(([^)/:]+(?:/[^)/:]+)*\.png)\)", value["text"])
    if not all((report_dir / link).exists() for link in linked):
        path.unlink(missing_ok=True)
        value = point_lines.cached(path, paths.folder, computed, extra)
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


def _reported(paths: store.SweepPaths, folder: Path, config_dirs, current_claims):
    """section(), or, for a sweep that cannot be reported, a line saying why and an ERROR
    claim: one sweep must not sink the rest."""
    try:
        return section(paths, folder, config_dirs, current_claims)
    except Exception as error:
        experiment, sweep = paths.experiment, paths.sweep
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
