"""The report as one page: outputs/report/index.html, which needs no server and no network.

plotly.js is its one sibling file (plotly.min.js, from the plotly package, written when it
differs); everything else is in the page: the tables (sortable by a click on a column's head,
filtered by the box above them), the claims, the interactive plots (octlm_analysis.plots: hover,
a click on a legend entry hides or shows its series, zoom), each experiment's sweeps (one
picked from the list shows its points), and the history of its metrics across sweeps. The
page's data is one JSON block that its script reads.

A page written by `python -m harness report --watch` is live: every POLL_MS it loads STAMP (a script
of one line, which works over file:// as well as http://, where fetch would not), and when the
stamp differs from its own it reloads, keeping the reader's scroll position, picked sweeps and
filters (sessionStorage). Once everything is drawn the page sets data-drawn="yes" on its body.
"""

import hashlib
import html
import os
import re
from pathlib import Path

import markdown as markdown_text
import numpy as np
import pandas as pd
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


def write_page(
    report_dir: Path,
    heading: str,
    experiments: list[dict],
    stamp: str | None,
    assets: Path | None = None,
) -> Path:
    """index.html of `experiments` (see `experiment_html` for what each holds) in report_dir;
    `stamp`: the page is live (--watch) and this is its version, else None; `assets`: the
    folder of plotly.min.js (report_dir: the page's own)."""
    script = (assets or report_dir) / PLOTLY
    plotly = get_plotlyjs()
    encoded = plotly.encode()  # 4.8 MB: encoded once
    if _held(script, len(encoded) + 1) != encoded:  # kept only if it is plotly's, byte for byte
        files.write_text(script, plotly)
    figures: list[dict] = []
    body = [experiment_html(e, figures) for e in experiments]
    contents = "".join(f'<li><a href="#{_id(e["name"])}">{html.escape(e["name"])}</a></li>'
                       for e in experiments)  # fmt: skip
    data = {"figures": figures, "stamp": stamp, "poll_ms": POLL_MS}
    catalogs = {e["name"]: e["catalog"] for e in experiments}  # parsed when a sweep is picked
    page = TEMPLATE.format(
        heading=_inline(heading),
        contents=contents,
        body="".join(body) or "<p>No sweeps in the store yet.</p>",
        plotly=Path(os.path.relpath(script, report_dir)).as_posix(),
        data=_json(data),
        catalogs=_json(catalogs),
        script=SCRIPT,
        style=STYLE,
    )
    path = report_dir / PAGE
    files.write_text(path, page)
    if stamp is not None:
        files.write_text(report_dir / STAMP, f"window.reportStamp = {stamp!r};\n")
    return path


def _held(path: Path, most: int) -> bytes | None:
    """A file's first `most` bytes; None for none, or a link (replaced, never followed)."""
    try:
        opened = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(opened, "rb") as file:
        return file.read(most)


def _json(data) -> str:
    """JSON for a <script> block: plotly's encoder writes < and / as \\u escapes, so no
    text in it can end the block early."""
    return to_json_plotly(data)


def stamp_of(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def experiment_html(experiment: dict, figures: list[dict]) -> str:
    """An experiment's section. `experiment`: name; sweeps (the sweep list, a DataFrame with a
    column "sweep"); shown (a dict per sweep shown: sweep, header, html, claims, problems,
    points, figures); history (figures); catalog (sweep -> header, columns, rows); the
    figures' dicts are appended to `figures`, the page's list."""
    name = experiment["name"]
    parts = [f'<section id="{_id(name)}"><h2>{html.escape(name)}</h2>']
    for shown in experiment["shown"]:
        parts.append(f'<div class="sweep" data-sweep="{html.escape(shown["sweep"])}">')
        parts.append(f'<p class="provenance">{_inline(shown["header"])}</p>')
        parts.append(shown["html"])  # the experiment's own tables first, as REPORT.md has them
        parts.append(_plots(shown["figures"], figures))
        if not shown["claims"].empty:
            parts += ["<h3>Claims</h3>", claims_html(shown["claims"])]
        if not shown["problems"].empty:
            parts += ["<h3>Points without an answer</h3>", table_html(shown["problems"])]
        parts += [
            "<h3>Points</h3>",
            table_html(shown["points"].drop(columns=SWEEP_COLUMNS, errors="ignore")),
        ]
        parts.append("</div>")
    parts.append(_picker(name, experiment["sweeps"], experiment["every"]))
    if experiment["history"]:
        parts += ["<h3>History across sweeps</h3>", _plots(experiment["history"], figures)]
    parts.append("</section>")
    return "".join(parts)


def _plots(shown: list[dict], figures: list[dict]) -> str:
    cells = []
    for figure in shown:
        figures.append(figure)
        cells.append(f'<div class="plot" data-figure="{len(figures) - 1}"></div>')
    return f'<div class="plots">{"".join(cells)}</div>' if cells else ""


def _picker(name: str, sweeps: pd.DataFrame, every: int) -> str:
    options = "".join(
        f'<option value="{html.escape(s)}">{html.escape(s)}: {html.escape(str(state))}</option>'
        for s, state in zip(sweeps["sweep"], sweeps["state"], strict=True)
    )
    return (
        f"<h3>Sweeps ({_count(len(sweeps), every)})</h3>{table_html(sweeps)}"
        f'<p><label>Show a sweep\'s points: <select class="sweep-picker" data-experiment='
        f'"{html.escape(name)}"><option value="">pick a sweep</option>{options}</select></label>'
        f" (<code>python -m harness report --sweep ID</code> for its claims and plots)</p>"
        f'<div class="picked" data-experiment="{html.escape(name)}"></div>'
    )


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
            "header": _inline(headers.get(sweep, f"sweep `{sweep}`")),
            "columns": names[columns].tolist(),
            "rows": cells[np.ix_(rows, np.flatnonzero(columns))].tolist(),
        }
    return entries


def table_html(table: pd.DataFrame) -> str:
    """A DataFrame as a sortable, filterable table: numbers to four digits, gaps as a dash, a
    text longer than LONG_TEXT characters cut to the cell's width with its whole on hover."""
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in table.columns)
    rows = "".join(
        "<tr>" + "".join(_td(_cell(v)) for v in row) + "</tr>"
        for row in table.astype(object).itertuples(index=False)
    )
    return f'<table class="data"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'


def _td(text: str) -> str:
    """A cell; a long one (an error, a path) cut by the style, its whole text its title and
    still its content, which sorting and filtering read."""
    escaped = html.escape(text)
    if len(text) <= LONG_TEXT:
        return f"<td>{escaped}</td>"
    return f'<td class="long" title="{escaped}">{escaped}</td>'


LONG_TEXT = 40  # characters: a longer text in a table is cut to the cell (same in SCRIPT)


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


def claims_html(claims: pd.DataFrame) -> str:
    """The claims, each result as a coloured badge, its where and its missing points."""
    shown = ("claim", "result", "where", "worst", "points", "passes", "failing", "missing")
    columns = [c for c in shown if c in claims]
    head = "".join(f"<th>{c}</th>" for c in columns)
    rows = []
    for claim in claims[columns].astype(object).itertuples(index=False):
        cells = []
        for column, value in zip(columns, claim, strict=True):
            text = html.escape(_cell(value))
            if column == "result":
                kind = value if value in RESULTS else "ERROR"
                text = f'<span class="badge r-{kind.replace("/", "")}">{text}</span>'
            cells.append(f"<td>{text}</td>")
        rows.append(f"<tr>{''.join(cells)}</tr>")
    return (f'<table class="data claims"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table>")  # fmt: skip


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


def _inline(text: str) -> str:
    """A line of the report's Markdown as HTML: everything escaped, then its `code` spans and
    **strong** words marked (a sweep's error or a device name is text, never markup)."""
    escaped = html.escape(text, quote=False)
    escaped = re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", escaped)


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


STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 0 2rem 4rem; color: #222; }
h1 { margin-bottom: .2rem; } h2 { border-top: 2px solid #ddd; padding-top: 1rem; }
nav ul { display: flex; flex-wrap: wrap; gap: .4rem 1.2rem; padding: 0; list-style: none; }
table.data { border-collapse: collapse; margin: .3rem 0 1rem; font-size: 13px; }
table.data th, table.data td { border: 1px solid #ddd; padding: 2px 6px; text-align: left;
  max-width: 38rem; vertical-align: top; }
table.data td.long { max-width: 22rem; overflow: hidden; text-overflow: ellipsis;
  white-space: nowrap; }
table.data th { background: #f3f3f3; cursor: pointer; user-select: none; position: sticky;
  top: 0; }
table.data th.asc::after { content: " \\25B2"; } table.data th.desc::after { content: " \\25BC"; }
input.filter { margin-top: .4rem; width: 18rem; } input.runs { margin: 0 0 .3rem; width: 24rem; }
.badge { padding: 0 6px; border-radius: 3px; color: #fff; font-weight: 600; }
.r-PASS { background: #1e8449; } .r-FAIL { background: #c0392b; } .r-ERROR { background: #7d3c98; }
.r-INCOMPLETE { background: #d68910; } .r-NA { background: #7f8c8d; }
.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(520px, 1fr)); gap: 1rem; }
.plot { height: 420px; border: 1px solid #eee; }
.provenance code, code { background: #f6f6f6; padding: 0 3px; }
.sweep { margin-bottom: 1rem; } .picked:empty { display: none; }
.picked { border-left: 3px solid #2471a3; padding-left: 1rem; }
"""

SCRIPT = r"""
const DATA = JSON.parse(document.getElementById('report-data').textContent);
const KEY = 'octlm-report:' + location.pathname;
let catalogs = null;  // every sweep's points, parsed when first needed
function catalog(experiment) {
  catalogs ??= JSON.parse(document.getElementById('report-catalogs').textContent);
  return catalogs[experiment] || {};
}

function number(text) {
  const value = parseFloat(text.replace(/,/g, ''));
  return isNaN(value) || !/^[\s\d.,eE+-]+$/.test(text) ? null : value;
}

function sortable(table) {
  table.querySelectorAll('th').forEach((head, column) => head.addEventListener('click', () => {
    const body = table.tBodies[0];
    const down = head.classList.contains('asc');
    table.querySelectorAll('th').forEach(h => h.classList.remove('asc', 'desc'));
    head.classList.add(down ? 'desc' : 'asc');
    const rows = [...body.rows].map(row => [row.cells[column]?.textContent ?? '', row]);
    rows.sort(([a], [b]) => {
      const x = number(a), y = number(b);
      const order = x !== null && y !== null ? x - y
        : a.localeCompare(b, undefined, {numeric: true});
      return down ? -order : order;
    });
    rows.forEach(([, row]) => body.appendChild(row));
  }));
}

function filterable(table) {
  // Each word must hold: NAME=VALUE, the cell of column NAME is VALUE; any other word appears
  // somewhere in the row.
  const box = document.createElement('input');
  box.className = 'filter';
  box.placeholder = 'filter: length=1024 sdpa (every word must hold)';
  const names = [...table.rows[0].cells].map(cell => cell.textContent.trim());
  box.addEventListener('input', () => {
    const tests = box.value.trim().split(/\s+/).filter(Boolean).map(word => {
      const [name, ...rest] = word.split('='), column = names.indexOf(name);
      if (rest.length && column >= 0) {
        const value = rest.join('=');
        return row => (row.cells[column]?.textContent ?? '').trim() === value;
      }
      return row => row.textContent.toLowerCase().includes(word.toLowerCase());
    });
    for (const row of table.tBodies[0].rows) row.hidden = !tests.every(test => test(row));
  });
  table.before(box);
}

function enhance(root) {
  root.querySelectorAll('table.data').forEach(table => { sortable(table); filterable(table); });
}

function element(tag, text) {
  const made = document.createElement(tag);
  if (text !== undefined) made.textContent = text;
  return made;
}

function showSweep(picker) {
  const experiment = picker.dataset.experiment;
  const box = document.querySelector(`.picked[data-experiment="${experiment}"]`);
  box.replaceChildren();
  const entry = catalog(experiment)[picker.value];
  if (!entry) return;
  const header = element('p');
  header.className = 'provenance';
  header.innerHTML = entry.header;
  const table = element('table');
  table.className = 'data';
  const head = table.createTHead().insertRow();
  entry.columns.forEach(column => head.appendChild(element('th', column)));
  const body = table.createTBody();
  entry.rows.forEach(values => {
    const row = body.insertRow();
    values.forEach(value => {
      const cell = row.insertCell();
      cell.textContent = value;
      if (value.length > 40) { cell.className = 'long'; cell.title = value; }  // LONG_TEXT
    });
  });
  box.append(header, table);
  enhance(box);
}

function state() {
  const pickers = {}, filters = [];
  document.querySelectorAll('select.sweep-picker')
    .forEach(p => { pickers[p.dataset.experiment] = p.value; });
  document.querySelectorAll('input.filter').forEach(f => filters.push(f.value));
  return {y: window.scrollY, pickers, filters};
}

function restore() {
  const saved = JSON.parse(sessionStorage.getItem(KEY) || 'null');
  if (!saved) return;
  sessionStorage.removeItem(KEY);
  document.querySelectorAll('select.sweep-picker').forEach(p => {
    const value = saved.pickers[p.dataset.experiment];
    if (value && catalog(p.dataset.experiment)[value]) { p.value = value; showSweep(p); }
  });
  document.querySelectorAll('input.filter').forEach((f, i) => {
    if (saved.filters[i]) { f.value = saved.filters[i]; f.dispatchEvent(new Event('input')); }
  });
  window.scrollTo(0, saved.y);
}

function poll() {
  const probe = document.createElement('script');
  probe.src = 'stamp.js?' + Date.now();
  probe.onload = () => {
    probe.remove();
    if (window.reportStamp && window.reportStamp !== DATA.stamp) {
      sessionStorage.setItem(KEY, JSON.stringify(state()));
      location.reload();
    }
  };
  probe.onerror = () => probe.remove();
  document.head.appendChild(probe);
}

enhance(document);
document.querySelectorAll('select.sweep-picker')
  .forEach(p => p.addEventListener('change', () => showSweep(p)));
function runFilter(div) {
  // A figure of runs' curves (octlm_analysis.curves; each trace's meta names its run): a box
  // above it that shows only the runs whose names hold every word (lr=0.01: a setting exactly).
  const box = document.createElement('input');
  box.className = 'filter runs';
  box.placeholder = 'show runs: lr=0.01 width=8 (every word must hold)';
  box.addEventListener('input', () => {
    const words = box.value.trim().toLowerCase().split(/\s+/).filter(Boolean);
    const visible = div.data.map(trace => {
      const name = String(trace.meta ?? '').toLowerCase(), said = name.split(/[\s·]+/);
      return !trace.meta || words.every(w => w.includes('=') ? said.includes(w) : name.includes(w));
    });
    Plotly.restyle(div, {visible});
  });
  const cell = document.createElement('div');
  div.before(cell);
  cell.append(box, div);
}

const config = {responsive: true, displaylogo: false};
const drawn = [...document.querySelectorAll('div.plot')].map(div => {
  const figure = DATA.figures[+div.dataset.figure];
  if (figure.layout.meta?.runs > 1) runFilter(div);
  return Plotly.newPlot(div, figure.data, figure.layout, config);
});
Promise.allSettled(drawn).then(() => {
  restore();
  document.body.dataset.drawn = 'yes';
  if (DATA.stamp) setInterval(poll, DATA.poll_ms);
});
"""

TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>octlm-harness report</title>
<link rel="icon" href="data:,">
<style>{style}</style>
<script src="{plotly}"></script>
</head><body>
<h1>octlm-harness report</h1>
<p>{heading}</p>
<nav><ul>{contents}</ul></nav>
{body}
<script type="application/json" id="report-data">{data}</script>
<script type="application/json" id="report-catalogs">{catalogs}</script>
<script>{script}</script>
</body></html>
"""
