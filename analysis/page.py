"""The report as one page: outputs/report/index.html, which needs no server and no network.

plotly.js is its one sibling file (plotly.min.js, from the plotly package, written when it
differs); everything else is in the page: the tables (sortable by a click on a column's head,
filtered by the box above them), the claims, the interactive plots (octlm_analysis.plots: hover,
a click on a legend entry hides or shows its series, zoom), each experiment's sweeps (one
picked from the list shows its points), and the history of its metrics across sweeps. The
page's data is one JSON block that its script reads.

The page is made from Jinja2 templates (templates/: page.html, its tables in tables.html, its
style page.css and its script page.js inlined), every value escaped as it goes in: a column,
a parameter's value or an experiment's name is text on the page, never markup. What is HTML
already (a report module's Markdown made HTML by `parts_html`, a header by `_inline`) is
escaped where it is made and marked as such (Markup).

A page written by `python -m harness report --watch` is live: every POLL_MS it loads STAMP (a script
of one line, which works over file:// as well as http://, where fetch would not), and when the
stamp differs from its own it reloads, keeping the reader's scroll position, picked sweeps and
filters (sessionStorage). Once everything is drawn the page sets data-drawn="yes" on its body.
"""

import functools
import hashlib
import html
import os
import re
from pathlib import Path

import jinja2
import markdown as markdown_text
import numpy as np
import pandas as pd
from markupsafe import Markup
from plotly.io import to_html
from plotly.io.json import to_json_plotly
from plotly.offline import get_plotlyjs

from harness import files, store
from octlm_analysis.point_lines import PLANNED

PAGE = "index.html"
PLOTLY = "plotly.min.js"
STAMP = "stamp.js"
POLL_MS = 2000
RESULTS = ("PASS", "FAIL", "INCOMPLETE", "N/A", "ERROR")
SWEEP_COLUMNS = ["sweep", PLANNED]  # the same on each of a sweep's points: said once, above them
TEMPLATES = Path(__file__).parent / "templates"


def write_page(
    report_dir: Path,
    heading: str,
    experiments: list[dict],
    stamp: str | None,
    assets: Path | None = None,
) -> Path:
    """index.html of `experiments` (see `section` for what each holds) in report_dir;
    `stamp`: the page is live (--watch) and this is its version, else None; `assets`: the
    folder of plotly.min.js (report_dir: the page's own)."""
    script = write_plotly(assets or report_dir)
    figures: list[dict] = []
    sections = [section(e, figures) for e in experiments]
    catalogs = {e["name"]: e["catalog"] for e in experiments}  # parsed when a sweep is picked
    page = _render(
        "page.html",
        heading=_inline(heading),
        experiments=sections,
        plotly=Path(os.path.relpath(script, report_dir)).as_posix(),
        data={"figures": figures, "stamp": stamp, "poll_ms": POLL_MS},
        catalogs=catalogs,
    )
    path = report_dir / PAGE
    files.write_text(path, page)
    if stamp is not None:
        files.write_text(report_dir / STAMP, f"window.reportStamp = {stamp!r};\n")
    return path


def write_figures(path: Path, title: str, figures: list[dict]) -> Path:
    """A page of `figures` alone (a comparison's curves), plotly.min.js beside it."""
    write_plotly(path.parent)
    plots = [Markup(to_html(f, full_html=False, include_plotlyjs=False)) for f in figures]
    files.write_text(path, _render("figures.html", title=title, plots=plots, plotly=PLOTLY))
    return path


def write_plotly(folder: Path) -> Path:
    """plotly.min.js in `folder`, written where it is not plotly's own, byte for byte."""
    script = folder / PLOTLY
    plotly = get_plotlyjs()
    encoded = plotly.encode()  # 4.8 MB: encoded once
    if _held(script, len(encoded) + 1) != encoded:
        files.write_text(script, plotly)
    return script


def _render(template: str, **values) -> str:
    return _templates().get_template(template).render(**values)


@functools.cache
def _templates() -> jinja2.Environment:
    """The page's templates (TEMPLATES), every value escaped unless marked as HTML already."""
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters["json"] = _json
    environment.globals["inline"] = _inlined
    environment.globals["long_text"] = LONG_TEXT
    return environment


def _inlined(name: str) -> Markup:
    """A file of TEMPLATES as it is (the page's style and script), for the page to hold."""
    return Markup((TEMPLATES / name).read_text())


def _held(path: Path, most: int) -> bytes | None:
    """A file's first `most` bytes; None for none, or a link (replaced, never followed)."""
    try:
        opened = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(opened, "rb") as file:
        return file.read(most)


def _json(data) -> Markup:
    """JSON for a <script> block: plotly's encoder writes < > and / as \\u escapes, and & is
    written so too, so no text in it can end the block early or read as markup."""
    return Markup(to_json_plotly(data).replace("&", "\\u0026"))


def stamp_of(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def section(experiment: dict, figures: list[dict]) -> dict:
    """An experiment's section, for the page's template. `experiment`: name; sweeps (the sweep
    list, a DataFrame with columns "sweep" and "state"); every (how many sweeps it has); shown
    (a dict per sweep shown: sweep, header, html, claims, problems, points, figures); history
    (figures); catalog (sweep -> header, columns, rows); the figures' dicts are appended to
    `figures`, the page's list, and the section holds their places in it."""
    sweeps = experiment["sweeps"]
    return {
        "name": experiment["name"],
        "id": _id(experiment["name"]),
        "shown": [_sweep(shown, figures) for shown in experiment["shown"]],
        "count": _count(len(sweeps), experiment["every"]),
        "sweeps": table(sweeps),
        "options": list(zip(sweeps["sweep"], sweeps["state"].astype(str), strict=True)),
        "history": _placed(experiment["history"], figures),
    }


def _sweep(shown: dict, figures: list[dict]) -> dict:
    """A sweep shown: its header, the experiment's own tables first (as REPORT.md has them),
    its plots, its claims, its points without an answer, and its points."""
    claims, problems = shown["claims"], shown["problems"]
    return {
        "sweep": shown["sweep"],
        "header": _inline(shown["header"]),
        "html": Markup(shown["html"]),  # parts_html's: escaped where it was made
        "figures": _placed(shown["figures"], figures),
        "claims": None if claims.empty else claims_table(claims),
        "problems": None if problems.empty else table(problems),
        "points": table(shown["points"].drop(columns=SWEEP_COLUMNS, errors="ignore")),
    }


def _placed(shown: list[dict], figures: list[dict]) -> list[int]:
    """`shown` appended to the page's `figures`; their places in it."""
    figures.extend(shown)
    return list(range(len(figures) - len(shown), len(figures)))


def _count(listed: int, every: int) -> str:
    if listed == every:
        return str(every)
    return f"{listed} of {every}: the newest and those shown; REPORT.md lists every one"


def catalogs(points: pd.DataFrame, headers: dict[str, str]) -> dict[str, dict]:
    """Each sweep for the picker: its header, and its points as columns and rows of text (the
    columns it has values in). `points`: every sweep's (octlm_analysis.point_lines), a column
    "sweep"."""
    if points.empty:
        return {}
    shown = reading_order(points.drop(columns=SWEEP_COLUMNS, errors="ignore"))
    listed = [[_cell(v) for v in row] for row in shown.astype(object).itertuples(index=False)]
    cells = np.array(listed, dtype=object).reshape(len(shown), len(shown.columns))
    present = shown.notna().groupby(points["sweep"].to_numpy()).any()
    names = np.array([str(c) for c in shown.columns], dtype=object)
    entries = {}
    for sweep, rows in points.groupby("sweep", sort=False).indices.items():
        columns = present.loc[sweep].to_numpy()
        entries[sweep] = {
            "header": str(_inline(headers.get(sweep, f"sweep `{sweep}`"))),
            "columns": names[columns].tolist(),
            "rows": cells[np.ix_(rows, np.flatnonzero(columns))].tolist(),
        }
    return entries


def table(data: pd.DataFrame) -> dict:
    """A DataFrame as the templates' sortable, filterable table (tables.html): its columns'
    names and its cells as text, numbers to four digits, gaps as a dash."""
    rows = [[_cell(v) for v in row] for row in data.astype(object).itertuples(index=False)]
    return {"columns": [str(c) for c in data.columns], "rows": rows}


LONG_TEXT = 40  # characters: a longer text in a table is cut to the cell (same in page.js)


def reading_order(points: pd.DataFrame) -> pd.DataFrame:
    """A table of points, its columns in the order a reader looks for them: the job, the
    parameters that vary, the status, where it was reused from (where any point was), the
    measurements, the error; then the parameters every
    point shares, and the harness's columns (provenance, ...). `attrs["params"]`: the
    parameters' names."""
    params = [p for p in points.attrs.get("params", []) if p in points]
    varying = [p for p in params if points[p].astype(str).nunique() > 1]
    measured = [c for c in points if c not in (*params, *store.HARNESS_COLUMNS)]
    reused = ["reused_from"] if points.get("reused_from", pd.Series()).notna().any() else []
    first = ["job", *varying, "status", *reused, *measured, "error"]
    order = [c for c in first if c in points]
    return points[[*order, *(c for c in points if c not in order)]]


def claims_table(claims: pd.DataFrame) -> dict:
    """The claims for the template (tables.html): their columns, and a row per claim of its
    cells' text and the kind of its result (a badge's colour)."""
    shown = ("claim", "result", "where", "worst", "points", "passes", "failing", "missing")
    columns = [c for c in shown if c in claims]
    rows = []
    for claim in claims[columns].astype(object).itertuples(index=False):
        result = dict(zip(columns, claim, strict=True)).get("result")
        kind = result if result in RESULTS else "ERROR"
        cells = [(c, _cell(v)) for c, v in zip(columns, claim, strict=True)]
        rows.append({"cells": cells, "kind": kind.replace("/", "")})
    return {"columns": columns, "rows": rows}


def parts_html(parts: list[str]) -> str:
    """A report module's Markdown parts (captions and tables) as HTML, less its PNG links
    (the page draws its own plots), its tables sortable and filterable."""
    text = "\n\n".join(p for p in parts if not p.lstrip().startswith("!["))
    converted = markdown_text.markdown(
        html.escape(text, quote=False), extensions=["tables", _OwnLinks()]
    )
    return converted.replace("<table>", '<table class="data">')


class _OwnLinks(markdown_text.extensions.Extension):
    """Links to the page's own anchors only, and no images: a value in a table (an error, a
    tag) that reads as [x](javascript:...) or ![i](http://host/beacon.png) stays its text, so
    the page runs nothing and fetches nothing it was not built with."""

    def extendMarkdown(self, md) -> None:  # noqa: N802 (Markdown's name)
        md.treeprocessors.register(_AsText(md), "own_links", 0)


class _AsText(markdown_text.treeprocessors.Treeprocessor):
    def run(self, root) -> None:
        for element in root.iter():
            if element.tag == "a" and not element.get("href", "").startswith("#"):
                element.tag, element.attrib = "span", {}
            elif element.tag == "img":
                element.tag, element.text, element.attrib = "span", element.get("alt", ""), {}


def _inline(text: str) -> Markup:
    """A line of the report's Markdown as HTML: everything escaped, then its `code` spans and
    **strong** words marked (a sweep's error or a device name is text, never markup)."""
    escaped = html.escape(text, quote=False)
    escaped = re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)
    return Markup(re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", escaped))


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "–"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else f"{value:.4g}"
    if isinstance(value, pd.Timestamp):
        return f"{value:%Y-%m-%d %H:%M}"
    return str(value)


def _id(name: str) -> str:
    return "exp-" + "".join(c if c.isalnum() or c in "-_" else "-" for c in name)
