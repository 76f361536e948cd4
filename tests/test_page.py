"""The report page (octlm_analysis.page): index.html from real sweeps, opened in headless Chromium
(tests/support/browser.py) from the disk and through --watch; its plots (octlm_analysis.plots)
checked by Plotly's own validator; its cache of each sweep's point lines
(octlm_analysis.point_lines)."""

import base64
import os
import re
import select
import shutil
import signal
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
from browser import Browser, chromium, page_data
from commands import SUPPORT, call_command, start_command
from sweeps import write_jobs, write_plan

from harness import store
from octlm_analysis import plots, png_figures

if chromium() is None and os.environ.get("HARNESS_REQUIRE_CHROMIUM") != "1":
    needs_browser = pytest.mark.skip(reason="no chromium (Debian: apt-get install chromium)")
else:
    needs_browser = pytest.mark.slow

TILED = ["+experiment=exp014_tiled", "length=16,64", "block=8,16"]
RECALL = ["+experiment=exp017_recall", "steps=30", "checkpoint_every=10", "reference_steps=5",
          "attention=sdpa,tiled", "window=0", "batch=16"]  # fmt: skip
LONG = "a-folder-" * 12  # a long error and a long tag: text that must not widen the tables
FAULTY = ["--config-dir", str(SUPPORT / "conf"), "+experiment=faulty", "fail=1",
          f"folder={LONG}", f"tag={LONG}"]  # fmt: skip


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory) -> Path:
    """Two exp014_tiled sweeps (so a history and a sweep to pick) and an exp017_recall one of
    two short training points, run for real, then the report."""
    cwd = tmp_path_factory.mktemp("page")
    for args in (TILED, TILED, RECALL):
        ran = call_command("harness", *args, cwd=cwd)
        assert ran.returncode == 0, ran.stdout + ran.stderr
    ran = call_command("harness", *FAULTY, cwd=cwd, env={"PYTHONPATH": str(SUPPORT)})
    assert ran.returncode == 1 and "1 failed" in ran.stdout, ran.stdout + ran.stderr
    made = call_command("analysis", cwd=cwd)
    assert made.returncode == 0, made.stdout + made.stderr
    return cwd


def length(values) -> int:
    """An array's length, plain or plotly.js's typed array (base64 of its bytes)."""
    if isinstance(values, dict):
        return len(base64.b64decode(values["bdata"])) // np.dtype(values["dtype"]).itemsize
    return len(values)


@pytest.mark.slow
def test_the_page_is_self_contained_and_its_figures_are_valid_plotly(store_dir):
    report = store_dir / "outputs" / "report"
    text = (report / "index.html").read_text()
    sources = re.findall(r'<script src="([^"]+)"', text)
    assert sources == ["plotly.min.js"] and (report / "plotly.min.js").stat().st_size > 1e6
    assert not re.search(r'(src|href)="(https?:)?//', text), "nothing from the network"
    figures = page_data(report / "index.html")["figures"]
    titles = [f["layout"]["title"]["text"] for f in figures]
    for figure in figures:
        go.Figure(figure)  # raises on a property plotly.js does not have
        assert figure["layout"]["xaxis"]["title"]["text"]
        assert figure["layout"]["yaxis"]["title"]["text"]
        assert figure["data"] and all(length(t["y"]) for t in figure["data"]), "no empty series"
    assert any("training loss per step" in t for t in titles)
    assert any("tokens_per_s" in t for t in titles)
    assert any("across sweeps" in t for t in titles), "a history: exp014_tiled has two sweeps"
    claim = next(f for f in figures if f["layout"]["title"]["text"].startswith("tiled is as"))
    assert claim["layout"]["yaxis"]["type"] == "log", "errors and bounds span decades"
    assert any(t["name"].startswith("max 2 * sdpa_err64") for t in claim["data"]), "bound drawn"
    names = {
        t["name"] for f in figures for t in f["data"] if "per step" in f["layout"]["title"]["text"]
    }
    assert {"attention=sdpa", "attention=tiled"} <= names, "a line per point, by its settings"
    # The experiment's own table first, as REPORT.md has it: before its plots and claims.
    tiled = text[text.index('id="exp-exp014_tiled"') :]
    table = tiled.index("max_abs_diff, length (rows) by block (columns)")
    assert table < tiled.index('class="plot"') < tiled.index("<h3>Claims</h3>")


@needs_browser
def test_the_page_in_chromium_draws_hovers_toggles_sorts_filters_and_picks(store_dir, tmp_path):
    page = store_dir / "outputs" / "report" / "index.html"
    expected = len(page_data(page)["figures"])
    with Browser() as browser:
        browser.open(page.as_uri())
        drawn = browser.evaluate(
            "[...document.querySelectorAll('div.plot')].filter(d => d.querySelector("
            "'svg.main-svg .scatterlayer .trace')).length"
        )
        assert drawn == expected > 0
        # Hover over a point of the first plot with markers: its label appears.
        x, y = browser.evaluate(
            "(() => { const p = document.querySelector('div.plot .scatterlayer path.point');"
            " p.scrollIntoView({block: 'center'}); const r = p.getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        browser.mouse("move", x, y)
        label = browser.wait_until("document.querySelector('.hoverlayer .hovertext')?.textContent")
        assert "length=" in label
        # A click on a legend entry hides its series.
        x, y = browser.evaluate(
            "(() => { const t = document.querySelector('div.plot .legend .traces');"
            " t.scrollIntoView({block: 'center'}); const r = t.getBoundingClientRect();"
            " return [r.x + 20, r.y + r.height / 2]; })()"
        )
        browser.mouse("click", x, y)
        hidden = browser.wait_until(
            "document.querySelector('div.plot').data.filter(t => t.visible === 'legendonly').length"
        )
        assert hidden == 1
        # Sorting by a column's head, descending on a second click; filtering by a word.
        column = (
            "[...document.querySelectorAll('section table.data')].find(t => ["
            "'length', 'status'].every(n => t.rows[0].textContent.includes(n)))"
        )  # points
        at = browser.evaluate(f"[...{column}.rows[0].cells].findIndex(c => c.textContent === "
                              "'length')")  # fmt: skip
        lengths = (f"[...{column}.tBodies[0].rows].filter(r => !r.hidden).map(r => +r.cells[{at}]"
                   ".textContent)")  # fmt: skip
        head = f"{column}.rows[0].cells[{at}]"
        browser.evaluate(f"{head}.click(); {head}.click()")
        shown = browser.evaluate(lengths)
        assert shown == sorted(shown, reverse=True) and len(set(shown)) == 2
        browser.evaluate(
            f"(() => {{ const box = {column}.previousElementSibling; box.value = 'block=8 FLOAT32';"
            " box.dispatchEvent(new Event('input')); })()"
        )
        assert sorted(browser.evaluate(lengths)) == [16, 64], "a column's value, and any text"
        browser.evaluate(
            f"(() => {{ const box = {column}.previousElementSibling; box.value = 'block=8 nowhere';"
            " box.dispatchEvent(new Event('input')); })()"
        )
        assert browser.evaluate(lengths) == [], "a word in no row hides every row"
        browser.evaluate(
            f"(() => {{ const box = {column}.previousElementSibling;"
            " box.value = 'length=64 block=8'; box.dispatchEvent(new Event('input')); })()"
        )
        assert browser.evaluate(lengths) == [64]
        # Picking the older exp014_tiled sweep shows its points.
        sweeps = store.sweeps(store_dir / "outputs" / "results", "exp014_tiled")
        picked = browser.evaluate(
            "(() => { const p = document.querySelector('select.sweep-picker[data-experiment="
            f"\"exp014_tiled\"]'); p.value = '{sweeps[0]}'; p.dispatchEvent(new Event('change'));"
            " const box = document.querySelector('.picked[data-experiment=\"exp014_tiled\"]');"
            " return [box.querySelector('.provenance').textContent,"
            " box.querySelectorAll('tbody tr').length]; })()"
        )
        assert sweeps[0] in picked[0] and picked[1] == 4
        # A points table reads job, the parameters that vary, status, the measurements: on a
        # 1,280 px screen, however long the error or a tag is (cut to its cell, whole on hover).
        heads = browser.evaluate(
            "Object.fromEntries([...document.querySelectorAll('section')].map(s => {"
            " const h = [...s.querySelectorAll('h3')].find(h => h.textContent === 'Points');"
            " let t = h.nextElementSibling; while (t.tagName !== 'TABLE') t = t.nextElementSibling;"
            " return [s.id, Object.fromEntries([...t.rows[0].cells].map(c => [c.textContent,"
            " c.getBoundingClientRect().right]))]; }))"
        )
        assert list(heads["exp-faulty"])[:5] == ["job", "point", "status", "val", "error"]
        assert heads["exp-faulty"]["val"] <= 1280 and heads["exp-faulty"]["error"] <= 1280
        assert heads["exp-exp014_tiled"]["max_abs_diff"] <= 1280
        cut = browser.evaluate(
            "[...document.querySelectorAll('#exp-faulty td.long')].map(c => [c.title,"
            " c.textContent, c.scrollWidth > c.clientWidth])"
        )
        assert cut and all(title == text and wider for title, text, wider in cut)
        assert any(text.startswith("RuntimeError: point 1 fails") for _, text, _ in cut)
        # Each plot's title lies clear of its tool bar.
        overlaps = browser.evaluate(
            "[...document.querySelectorAll('div.plot')].filter(d => { const t = d.querySelector("
            "'.gtitle').getBoundingClientRect(), m = d.querySelector('.modebar')"
            ".getBoundingClientRect(); return t.right > m.left && m.right > t.left &&"
            " t.bottom > m.top && m.bottom > t.top; }).length"
        )
        assert overlaps == 0
        assert browser.errors() == []
        browser.screenshot(tmp_path / "page.png")


def line_within(stream, timeout_s: float = 120.0) -> str:
    """The next line a child process prints, or a failure after `timeout_s`."""
    ready, _, _ = select.select([stream], [], [], timeout_s)
    assert ready, f"nothing printed within {timeout_s} s"
    return stream.readline()


@needs_browser
def test_watch_serves_a_page_that_reloads_itself_when_rows_land(store_dir, tmp_path):
    store_dir = Path(shutil.copytree(store_dir, tmp_path / "copy"))  # the others' store stays
    watcher = start_command(
        "analysis", "--watch", "--port", "0", "--interval", "0.3", cwd=store_dir
    )
    try:
        first = line_within(watcher.stdout)
        url = re.search(r"(http://127\.0\.0\.1:\d+/index\.html)", first)
        assert url, first
        assert "report written" in line_within(watcher.stdout)
        with Browser() as browser:
            browser.open(url[1])
            browser.evaluate("window.scrollTo(0, 600)")
            before = browser.evaluate("JSON.parse(document.getElementById('report-data')"
                                      ".textContent).stamp")  # fmt: skip
            ran = call_command("harness", "+experiment=exp014_tiled", "length=32", "block=8",
                               "hydra.sweeper.params={}", cwd=store_dir)  # fmt: skip
            assert ran.returncode == 0, ran.stderr
            newest = store.sweeps(store_dir / "outputs" / "results", "exp014_tiled")[-1]
            shown = (f"document.body?.dataset.drawn === 'yes' && document.querySelector("
                     f"'.sweep[data-sweep=\"{newest}\"]') !== null")  # fmt: skip
            browser.wait_until(shown, timeout_s=60)
            stamp = browser.evaluate("JSON.parse(document.getElementById('report-data')"
                                     ".textContent).stamp")  # fmt: skip
            assert stamp != before
            assert browser.evaluate("window.scrollY") == 600, "the reader's place is kept"
            assert browser.errors() == []
    finally:
        watcher.send_signal(signal.SIGINT)
        said, _ = watcher.communicate(timeout=60)
    assert watcher.returncode == 0 and "stopped" in said


def test_downsample_keeps_every_extreme_in_step_order():
    steps = np.arange(1, 100_001)
    values = np.sin(steps / 500.0)
    values[31_337], values[77_777] = 9.0, -9.0  # one step each: must survive
    kept_steps, kept = plots.downsample(steps, values)
    assert len(kept) <= plots.CURVE_POINTS and len(kept) > plots.CURVE_POINTS // 2
    assert list(kept_steps) == sorted(kept_steps)
    assert 31_338 in kept_steps and 77_778 in kept_steps
    assert kept.max() == 9.0 and kept.min() == -9.0
    np.testing.assert_array_equal(values[kept_steps - 1], kept)  # each value at its own step
    short_steps, short = plots.downsample(steps[:500], values[:500])
    assert len(short) == 500
    with_gaps = values.copy()
    with_gaps[::2] = np.nan
    assert not np.isnan(plots.downsample(steps, with_gaps)[1]).any()


def test_axes_are_log_only_where_values_span_decades():
    assert plots.axis_type([1e-7, 1e-5]) == "log"
    assert plots.axis_type([1.0, 5.0]) == "linear"
    assert plots.axis_type([0.0, 1e3]) == "linear", "a zero has no place on a log axis"
    assert plots.axis_type([]) == "-"
    assert plots.axis_type(["sdpa", "tiled"]) == "-", "texts: plotly.js's categories"


def test_the_still_pictures_show_a_users_text_as_written(tmp_path, monkeypatch):
    """REPORT.md's PNGs draw the page's figures, whose texts are plotly's (entities): matplotlib
    is given each as the user wrote it, a $ as itself (an odd one is no mathtext error)."""
    rows = pd.DataFrame({"kind": ["<b>a</b>", "b & c"], "cost_$": [1.0, 2.0], "run": ["x$^", "y"]})
    fig = plots.lines(rows, "kind", "cost_$", ["run"], "cost in $ of <i>each</i> %{y}")
    labels = []
    original = png_figures._text
    monkeypatch.setattr(png_figures, "_text", lambda text: labels.append(original(text)) or
                        labels[-1])  # fmt: skip
    assert png_figures.png([fig], tmp_path / "p.png").stat().st_size > 0
    assert r"cost in \$ of <i>each</i> %{y}" in labels and r"run=x\$^" in labels
    assert "<b>a</b>" in labels and "b & c" in labels


def test_a_log_axis_over_powers_of_two_is_ticked_at_the_grid_and_long_titles_wrap(tmp_path):
    rows = pd.DataFrame({"length": [128, 256, 512, 1024, 2048], "err": [1e-7, 2e-7, 3e-7, 1e-6,
                         2e-6]})  # fmt: skip
    title = "the error of a path against float64, the largest over every head width"
    fig = plots.lines(rows, "length", "err", [], title)
    axis = fig["layout"]["xaxis"]
    assert axis["type"] == "log" and axis["tickvals"] == [128, 256, 512, 1024, 2048]
    assert axis["ticktext"] == ["128", "256", "512", "1,024", "2,048"]
    shown = fig["layout"]["title"]["text"].split("<br>")
    assert len(shown) == 2 and all(len(line) <= plots.TITLE_CHARS for line in shown)
    assert " ".join(shown) == title
    go.Figure(fig)
    for xs in ([100, 300, 1000, 5000], [16, 64], [2**k for k in range(20)]):
        axis = plots.figure([], "t", "x", "y", xs, [1, 2])["layout"]["xaxis"]
        assert "tickvals" not in axis, f"not a short log grid of powers of two: {xs}"
    assert png_figures.png([fig], tmp_path / "p.png").stat().st_size > 0


@pytest.mark.parametrize("named", [None, ["time_ms", "err"]])
def test_the_page_plots_the_measurements_first_and_no_housekeeping(named):
    """Without `plots`, the table's values come first and the timings' housekeeping (repeats,
    spreads, load, clocks) is drawn nowhere; with it, the metrics it names, in its order."""
    rows = pd.DataFrame({"length": [128, 256], "status": "ok", "repeats": [5, 7],
                         "time_ms": [1.0, 2.0], "time_iqr_ms": [0.1, 0.2],
                         "cpu_load_beside": [0.0, 0.1], "threads_used": [1, 1],
                         "gflops": [3.0, 4.0], "err": [1e-7, 2e-7]})  # fmt: skip
    config = {"table": {"index": "length", "values": "err"}}
    if named:
        config["plots"] = named
    drawn = plots.metric_figures(rows, "length", ["length"], set(), config)
    titles = [fig["layout"]["title"]["text"] for fig in drawn]
    assert titles == (named or ["err", "time_ms", "gflops"])


def test_error_bars_are_the_repeats_quartiles_and_a_bound_is_drawn_at_each_points_own_value():
    data = pd.DataFrame({
        "length": [64, 64, 128], "backend": ["math", "flash", "math"],
        "time_ms": [2.0, 1.0, 8.0], "time_iqr_ms": [2.0, 0.5, 1.0],
        "time_samples_ms": [[1.0, 2.0, 2.0, 5.0, 9.0], [1.0, 1.0, 1.0], None],
        "bound": [3.0, 1.5, 9.0],
    })  # fmt: skip
    figure = plots.lines(data, "length", "time_ms", ["backend"], "time", spread="time_iqr_ms")
    math_ = next(t for t in figure["data"] if t["name"] == "backend=math")
    bars = math_["error_y"]
    assert bars["array"][0] == 5.0 - 2.0 and bars["arrayminus"][0] == 2.0 - 2.0, "quartiles"
    assert bars["array"][1] == bars["arrayminus"][1] == 0.5, "no repeats: half the IQR each way"
    # A bound of each row's own (flash's 1.5 and math's 3.0 at 64) is a dashed line per line,
    # never one line through the tightest, which would draw math's point above its bound.
    bounded = plots.with_bounds(figure, data, "length", {"max": ["bound"]}, ["backend"])
    drawn = {t["name"]: (t["x"], t["y"]) for t in bounded["data"] if t.get("line", {}).get("dash")}
    assert drawn == {"max bound (backend=math)": ([64, 128], [3.0, 9.0]),
                     "max bound (backend=flash)": ([64], [1.5])}  # fmt: skip
    go.Figure(bounded)
    # The same bound for every line at each length: one line.
    same = plots.with_bounds(plots.lines(data, "length", "time_ms", ["backend"], "time"),
                             data.assign(bound=[3.0, 3.0, 9.0]), "length", {"max": ["bound"]},
                             ["backend"])  # fmt: skip
    drawn = [(t["name"], t["x"], t["y"]) for t in same["data"] if t.get("line", {}).get("dash")]
    assert drawn == [("max bound", [64, 128], [3.0, 9.0])]


def test_the_page_stands_for_odd_sweeps_and_shows_their_text_as_text(tmp_path, analysis):
    results = tmp_path / "outputs" / "results"
    recall = {"name": "exp017_recall", "report": "octlm_analysis.recall",
              "claims": [{"table": "final", "metric": "accuracy", "min": 0.95}]}  # fmt: skip
    # A training sweep whose every point failed before its first step, a list parameter in
    # two sweeps, and an error that is markup.
    # A parameter whose value reads as a Markdown link and image (no live link, no fetch).
    tag = "[x](javascript:alert(1)) ![i](http://beacon.example/b.png)"
    for sweep in ("20261129-120000-aaaa", "20261129-130000-bbbb"):
        write_plan(results, "exp017_recall", sweep,
                   [{"attention": "sdpa", "dims": [64, 128], "tag": tag},
                    {"attention": "tiled", "dims": [32], "tag": "plain"}], recall)  # fmt: skip
        write_jobs(results, "exp017_recall", sweep, [
            {"job": 0, "status": "failed", "attention": "sdpa", "dims": [64, 128], "tag": tag,
             "error": "<img src=x onerror=alert(1)> __init__ failed"},
            {"job": 1, "status": "oom", "attention": "tiled", "dims": [32], "tag": "plain",
             "error": "OOM"},
        ])  # fmt: skip
    # A sweep whose manifest is damaged and that has no rows.
    damaged = store.SweepPaths(results, "exp014_tiled", "20261129-140000-cccc").folder
    damaged.mkdir(parents=True)
    (damaged / store.MANIFEST).write_text("{not json")
    made = analysis()
    assert made.returncode == 0, made.stderr
    text = (tmp_path / "outputs" / "report" / "index.html").read_text()
    assert "<img src=x" not in text and "&lt;img src=x onerror=alert(1)&gt; __init__" in text
    assert "beacon.example" in text, "the value is on the page, as text"
    assert 'href="javascript' not in text and 'src="http://beacon' not in text
    report = (tmp_path / "outputs" / "report" / "REPORT.md").read_text()
    assert "\\[x\\](javascript:alert(1)) !\\[i\\](http://beacon.example/b.png)" in report
    assert 'id="exp-exp014_tiled"' in text, "the damaged sweep's experiment is on the page"
    assert "the sweep&#x27;s plan and claims can be read" in text or "plan and claims" in text
    recall_part = text.split('id="exp-exp017_recall"')[1]
    assert "Points without an answer" in recall_part and "oom" in recall_part
    assert "could not be reported" not in text


@pytest.mark.parametrize("given", [["--port", "70000"], ["--interval", "0"], ["--interval", "nan"]])
def test_watch_refuses_a_bad_port_or_interval_in_one_line(tmp_path, analysis, given):
    (tmp_path / "outputs" / "results").mkdir(parents=True)
    refused = analysis("--watch", *given)
    assert refused.returncode == 2 and refused.stderr.startswith("error: --")
    assert len(refused.stderr.splitlines()) == 1 and not (tmp_path / "outputs" / "report").exists()
