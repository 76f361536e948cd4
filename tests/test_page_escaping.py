"""The page shows every name and value as text (octlm_analysis.page and its templates): an
experiment, a parameter, a metric, a parameter's value and a claim that read as markup or as the
end of a script (<script>, </script>, &, quotes) are escaped where they go in; the page's script
runs to its end and a reader sees them as they were written, in Chromium as in the file.

So in its plots (octlm_analysis.plots.plain): plotly.js reads HTML (<b>, <br>, &amp;) in every
text it draws and %{...} as a placeholder, so a parameter's name and value, a metric, a claim
and a device go into a plot's texts escaped and never into a hover template's own text."""

import html
import json
import re
from datetime import UTC, datetime

import pytest
from browser import Browser, chromium
from sweeps import write_jobs, write_plan

from octlm_analysis import plots, report

WHEN = datetime(2026, 12, 1, 12, tzinfo=UTC)
SWEEP = "20261201-120000-aaaa"
BREAK = "</script><script>document.body.dataset.broken = 'yes'</script>"
EXPERIMENT = "<img src=x onerror=document.body.dataset.broken=1> & \"q\" 'q'"  # a folder: no /
PARAM = "<b>" + BREAK
VALUE = BREAK + " & \"q\" 'q' &amp;"
METRIC = "<i>err</i>"
CLAIM = '<script>alert(1)</script> holds & "stays" below 1'


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """The page of one sweep whose every name and value is hostile."""
    root = tmp_path_factory.mktemp("escaping")
    config = {"name": EXPERIMENT, "claims": [{"metric": METRIC, "max": 1.0, "text": CLAIM}]}
    params = [{PARAM: length, "tag": VALUE} for length in (64, 128)]
    write_plan(root / "results", EXPERIMENT, SWEEP, params, config)
    rows = [{"job": job, "status": "ok", **point, "started_at": WHEN, METRIC: 0.25 * (job + 1)}
            for job, point in enumerate(params)]  # fmt: skip
    write_jobs(root / "results", EXPERIMENT, SWEEP, rows)
    report.write_report(root / "results", root / "report")
    return root / "report" / "index.html"


def blocks(text: str) -> dict[str, dict]:
    found = re.findall(r'<script type="application/json" id="([^"]+)">(.*?)</script>', text, re.S)
    return {name: json.loads(data) for name, data in found}


def shown(tag: str, text: str) -> list[str]:
    """The text of each `tag` element that holds no markup, as a reader sees it."""
    found = re.findall(rf"<{tag}(?: [^>]*)?>([^<]*)</{tag}>", text)
    return [html.unescape(inner) for inner in found]


def test_every_name_and_value_is_escaped_in_the_file(page):
    text = page.read_text()
    assert text.count("<script") == 4, "plotly.min.js, two JSON blocks and the page's script"
    for hostile in (BREAK, "<img src=x", "<b>", "<i>", "<script>alert"):
        assert hostile not in text
    assert shown("h2", text) == [EXPERIMENT]
    assert {PARAM, METRIC} <= set(shown("th", text)) and VALUE in shown("td", text)
    assert any(cell.startswith(CLAIM) for cell in shown("td", text))
    titles = re.findall(r'<td class="long" title="([^"]*)">', text)  # a long value's whole
    assert VALUE in map(html.unescape, titles)
    data = blocks(text)  # JSON with < > & as \u escapes: the values come back whole
    assert set(data) == {"report-data", "report-catalogs"}
    catalog = data["report-catalogs"][EXPERIMENT][SWEEP]
    assert PARAM in catalog["columns"] and METRIC in catalog["columns"]
    assert VALUE in {cell for row in catalog["rows"] for cell in row}


@pytest.mark.slow
@pytest.mark.skipif(chromium() is None, reason="no chromium (Debian: apt-get install chromium)")
def test_the_page_runs_its_script_and_shows_the_text_literally_in_chromium(page):
    with Browser() as browser:
        browser.open(page.as_uri())
        assert browser.evaluate("document.body.dataset.broken ?? null") is None
        assert browser.evaluate("document.scripts.length") == 4
        assert browser.evaluate("document.querySelectorAll('img').length") == 0
        assert browser.evaluate("document.querySelector('section h2').textContent") == EXPERIMENT
        assert browser.evaluate("document.querySelector('nav a').textContent") == EXPERIMENT
        heads = browser.evaluate(
            "[...document.querySelectorAll('.sweep table.data th')].map(h => h.textContent)"
        )
        assert {PARAM, METRIC, "claim"} <= set(heads), heads
        cells = browser.evaluate(
            "[...document.querySelectorAll('.sweep table.data td')].map(c => c.textContent)"
        )
        assert VALUE in cells and any(cell.startswith(CLAIM) for cell in cells)
        # The picker finds the experiment's box by its name, quotes and all, and shows the
        # sweep's points from the catalog as text.
        picked = browser.evaluate(
            "(() => { const p = document.querySelector('select.sweep-picker');"
            f" p.value = {json.dumps(SWEEP)}; p.dispatchEvent(new Event('change'));"
            " const box = document.querySelector('.picked');"
            " return [[...box.querySelectorAll('th')].map(h => h.textContent),"
            " [...box.querySelectorAll('td')].map(c => c.textContent)]; })()"
        )
        assert PARAM in picked[0] and METRIC in picked[0] and VALUE in picked[1], picked
        assert browser.evaluate("document.body.dataset.broken ?? null") is None
        assert browser.errors() == []


NAME = "<b>n</b><br>%{y}&amp;"  # a parameter's name, its values, a metric, a claim, a device
VALUES = ("<b>1</b><br>%{y}&amp;", "<i>2</i><br>%{x}&amp;")
LOSS = "<b>loss</b><br>%{y}&amp;"
HOLDS = "<b>low</b> %{y} &amp; <br>below 9"
DEVICE = "<b>gpu</b> %{y} &amp;"
SWEEPS = ("20261201-120000-aaaa", "20261202-120000-bbbb")
PLACEHOLDERS = {"x", "y:.4g", "y:.3g", "text", "meta", "meta[0]", "meta[1]", "fullData.name",
                "yaxis.title.text", "customdata"}  # fmt: skip


@pytest.fixture(scope="module")
def plotted(tmp_path_factory):
    """A page whose plots are named by hostile names: a swept experiment of two sweeps (its
    claim's figure and its history) and a training one (its curves)."""
    root = tmp_path_factory.mktemp("plotted") / "results"
    config = {"name": "swept", "claims": [{"metric": LOSS, "max": 9.0, "text": HOLDS}]}
    params = [{"length": length, NAME: value} for length in (64, 128) for value in VALUES]
    for number, sweep in enumerate(SWEEPS):
        write_plan(root, "swept", sweep, params, config)
        when = WHEN.replace(day=1 + number)
        rows = [{"job": job, "status": "ok", **point, "started_at": when, "device_name": DEVICE,
                 LOSS: 0.5 + job} for job, point in enumerate(params)]  # fmt: skip
        write_jobs(root, "swept", sweep, rows)
    trained = [{NAME: value} for value in VALUES]
    write_plan(root, "trained", SWEEPS[0], trained, {"name": "trained", "plots": [LOSS]})
    write_jobs(root, "trained", SWEEPS[0], [
        {"job": job, "status": "ok", **point, "started_at": WHEN, "phase": phase, "step": step,
         LOSS: (1 + job) / (1 + step)}
        for job, point in enumerate(trained)
        for phase, step in [*(("train", s) for s in range(5)), ("eval", 5)]])  # fmt: skip
    report.write_report(root, root.parent / "report")
    return root.parent / "report" / "index.html"


def settings() -> list[str]:
    return [f"{NAME}={value}" for value in VALUES]


def test_a_plot_holds_hostile_names_escaped_and_none_in_a_hover_template(plotted):
    figures = blocks(plotted.read_text())["report-data"]["figures"]
    titles = [html.unescape(f["layout"]["title"]["text"].replace("<br>", " ")) for f in figures]
    assert {HOLDS, f"{LOSS} across sweeps"} <= set(titles), titles
    assert any(t.startswith(f"{LOSS} per step") for t in titles), titles
    for figure in figures:
        layout, traces = figure["layout"], figure["data"]
        drawn = [layout["title"]["text"], *(layout[a]["title"]["text"] for a in ("xaxis", "yaxis"))]
        for trace in traces:
            template = trace.get("hovertemplate", "")
            assert "&" not in template and "</" not in template.replace("</extra>", ""), template
            assert set(re.findall(r"%\{([^}]*)\}", template)) <= PLACEHOLDERS, template
            said = [trace["meta"]] if "%{meta" in template else []
            drawn += [trace["name"], *(trace.get("text") or []), *said]
        for text in [t for said in drawn for t in ([said] if isinstance(said, str) else said)]:
            assert "%{" not in text and not re.search(r"<(?!br>)", text), text
    named = {html.unescape(t["name"]) for f in figures for t in f["data"]}
    assert set(settings()) <= named, named
    sweeps = next(t for f in figures for t in f["data"] if t["name"] == "sweep")
    assert all(html.unescape(text).endswith(f" · {DEVICE}") for text in sweeps["text"]), sweeps


@pytest.mark.slow
@pytest.mark.skipif(chromium() is None, reason="no chromium (Debian: apt-get install chromium)")
def test_a_plot_shows_hostile_names_literally_in_chromium(plotted):
    with Browser() as browser:
        browser.open(plotted.as_uri())
        drawn = browser.evaluate(
            "[...document.querySelectorAll('.js-plotly-plot')].map(div => ({"
            " title: div.querySelector('.gtitle')?.textContent,"
            " y: div.querySelector('.ytitle')?.textContent,"
            " legend: [...div.querySelectorAll('.legendtext')].map(t => t.textContent)}))"
        )
        by_title = {plot["title"]: plot for plot in drawn}
        claim = by_title[HOLDS]
        assert claim["y"] == LOSS and set(settings()) <= set(claim["legend"]), claim
        history = by_title[f"{LOSS} across sweeps"]
        lines = [f"length={length} {said}" for length in (64, 128) for said in settings()]
        cut = [s if len(s) <= plots.LEGEND_CHARS else s[: plots.LEGEND_CHARS - 1] + "…"
               for s in lines]  # fmt: skip
        assert history["y"] == LOSS and sorted(cut) == sorted(history["legend"]), history
        curves = next(p for title, p in by_title.items() if title.startswith(f"{LOSS} per step"))
        assert curves["y"] == LOSS, curves
        assert sorted(n.rsplit(" (", 1)[0] for n in curves["legend"]) == settings(), curves
        for title in (HOLDS, curves["title"]):  # a point's hover names its line and metric
            hover = browser.evaluate(
                "(() => { const div = [...document.querySelectorAll('.js-plotly-plot')]"
                f".find(d => d.querySelector('.gtitle')?.textContent === {json.dumps(title)});"
                " Plotly.Fx.hover(div, [{curveNumber: 0, pointNumber: 0}]);"
                " return div.querySelector('.hovertext')?.textContent; })()"
            )
            assert LOSS in hover and any(s in hover for s in settings()), hover
        assert browser.errors() == []
