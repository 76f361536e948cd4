"""The page shows every name and value as text (octlm_analysis.page and its templates): an
experiment, a parameter, a metric, a parameter's value and a claim that read as markup or as the
end of a script (<script>, </script>, &, quotes) are escaped where they go in; the page's script
runs to its end and a reader sees them as they were written, in Chromium as in the file."""

import html
import json
import re
from datetime import UTC, datetime

import pytest
from browser import Browser, chromium
from sweeps import write_jobs, write_plan

from octlm_analysis import report

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
