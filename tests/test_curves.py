"""A training experiment's curves on the page (octlm_analysis.curves), the history's metrics and
the sweep list's state, from stores written as the harness leaves them."""

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from browser import Browser, chromium
from sweeps import write_jobs, write_plan

from octlm_analysis import report

WHEN = datetime(2026, 12, 1, 12, tzinfo=UTC)
CONFIG = {"name": "trainer", "plots": ["loss", "grad_norm"]}


def training_store(root: Path, points: int, steps: int = 30) -> None:
    params = [{"lr": 0.01 * (1 + p), "width": 8, "step_sleep_s": 0.0} for p in range(points)]
    write_plan(root, "trainer", "20261201-120000-aaaa", params, CONFIG)
    rows = []
    for job, point in enumerate(params):
        for step in range(steps):
            loss = (1 + job) * 0.9**step
            rows.append({"job": job, "status": "ok", **point, "started_at": WHEN,
                         "phase": "train", "step": step, "loss": loss, "grad_norm": 2 * loss,
                         "tokens_per_s": 1e4})  # fmt: skip
        rows.append({"job": job, "status": "ok", **point, "phase": "eval", "step": steps,
                     "loss": (1 + job) * 0.9**steps})  # fmt: skip
    write_jobs(root, "trainer", "20261201-120000-aaaa", rows)


def figures(page: Path) -> list[dict]:
    found = re.search(r'id="report-data">(.*?)</script>', page.read_text(), re.S)
    return json.loads(found[1])["figures"]


@pytest.mark.parametrize("points", [4, 40])
def test_a_training_sweep_gets_a_figure_per_plotted_metric_with_a_line_per_run(tmp_path, points):
    training_store(tmp_path / "results", points)
    report.write_report(tmp_path / "results", tmp_path / "report")
    curves = [f for f in figures(tmp_path / "report" / "index.html")
              if f["layout"]["xaxis"]["title"]["text"] == "step"]  # fmt: skip
    assert [f["layout"]["title"]["text"].split()[0] for f in curves] == ["loss", "grad_norm"]
    loss = curves[0]
    lines = [t for t in loss["data"] if t["mode"] == "lines"]
    marks = [t for t in loss["data"] if t["mode"] == "markers"]
    assert len(lines) == len(marks) == points, "a line and an eval mark per run"
    assert loss["layout"]["yaxis"]["type"] == "log", "the loss spans decades"
    named = [t["name"] for t in lines if t["showlegend"]]
    assert len(named) == (points if points <= 10 else 6), "the ends by final value, named"
    assert all(n.startswith("lr=") and "step_sleep_s" not in n for n in named), named


def test_the_history_draws_no_parameter_even_one_named_as_a_timing(tmp_path):
    training_store(tmp_path / "results", 2)
    write_plan(tmp_path / "results", "trainer", "20261202-120000-bbbb",
               [{"lr": 0.01, "width": 8, "step_sleep_s": 0.0}], CONFIG)  # fmt: skip
    write_jobs(tmp_path / "results", "trainer", "20261202-120000-bbbb",
               [{"job": 0, "status": "ok", "lr": 0.01, "width": 8, "step_sleep_s": 0.0,
                 "started_at": WHEN,
                 "phase": "eval", "step": 1, "loss": 0.5, "time_ms": 3.0}])  # fmt: skip
    report.write_report(tmp_path / "results", tmp_path / "report")
    titles = [f["layout"]["title"]["text"] for f in figures(tmp_path / "report" / "index.html")]
    histories = [t for t in titles if "across sweeps" in t]
    assert histories and not any("step_sleep_s" in t for t in histories), titles


@pytest.mark.slow
@pytest.mark.skipif(chromium() is None, reason="no chromium (Debian: apt-get install chromium)")
def test_the_curves_are_drawn_in_chromium(tmp_path):
    training_store(tmp_path / "results", 40)
    report.write_report(tmp_path / "results", tmp_path / "report")
    with Browser() as browser:
        browser.open((tmp_path / "report" / "index.html").as_uri())
        traces = browser.evaluate(
            "[...document.querySelectorAll('div.plot')].filter(d => d.layout.xaxis.title.text"
            " === 'step').map(d => d.querySelectorAll('.scatterlayer .trace').length)"
        )
        assert traces == [80, 40], "40 lines, and 40 eval marks where eval rows hold the metric"
        assert browser.evaluate("document.querySelectorAll('input.runs').length") == 2
        assert not browser.errors()
