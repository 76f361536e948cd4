"""The report folder's cache and key (octlm_analysis.point_lines): each sweep's points and
section kept while its files, the code and the config are as they were, a cache edited there
or forged under a key that is no key computed again, links in the report folder refused, and a
report that only reads the store."""

import hashlib
import hmac
import json
import os
import time

import pandas as pd
import pytest
from browser import page_data
from plotly.offline import get_plotlyjs
from sweeps import write_jobs, write_plan

from harness import store
from octlm_analysis import page, point_lines

CONFIG = {"name": "exp014_tiled", "claims": [{"metric": "max_abs_diff", "max": 1e-6}]}


def test_points_without_an_answer_are_listed_and_the_summaries_cache_follows_the_store(
    tmp_path, analysis
):
    results = tmp_path / "outputs" / "results"
    sweep = "20261129-120000-aaaa"
    params = [{"length": length} for length in (128, 256, 512)]
    write_plan(results, "exp014_tiled", sweep, params, CONFIG)
    write_jobs(results, "exp014_tiled", sweep, [
        {"job": 0, "status": "ok", "length": 128, "max_abs_diff": 1e-7},
        {"job": 1, "status": "failed", "length": 256, "error": "RuntimeError: boom"},
    ])  # fmt: skip
    assert analysis().returncode == 0
    report = tmp_path / "outputs" / "report"
    entry = page_data(report / "index.html", "report-catalogs")["exp014_tiled"][sweep]
    statuses = [row[entry["columns"].index("status")] for row in entry["rows"]]
    assert statuses == ["ok", "failed", "not run"]
    text = (report / "index.html").read_text()
    problems = text.split("Points without an answer")[1].split("</table>")[0]
    assert "RuntimeError: boom" in problems and "not run" in problems and ">128<" not in problems
    assert "Points without an answer" in (report / "REPORT.md").read_text()
    cached = report / point_lines.CACHE / "exp014_tiled" / f"{sweep}.json"
    first = cache_json(cached)
    assert [p["status"] for p in first["value"]["points"]] == ["ok", "failed", "not run"]
    write_jobs(results, "exp014_tiled", sweep, [
        {"job": 2, "status": "ok", "length": 512, "max_abs_diff": 2e-7}])  # fmt: skip
    time.sleep(0.01)  # a later modification time on filesystems of coarse clocks
    assert analysis().returncode == 0
    again = cache_json(cached)
    assert [p["status"] for p in again["value"]["points"]] == ["ok", "failed", "ok"], "new row"
    assert "3 points: 2 ok, 1 failed" in (report / "REPORT.md").read_text(), "the section too"
    cached.write_text("{not json")
    assert analysis().returncode == 0
    assert cache_json(cached)["value"] == again["value"], "unreadable: read again"
    assert "RuntimeError: boom" in (report / "REPORT.md").read_text()


def cache_json(path):
    """A report cache's JSON, after the MAC line it opens with."""
    mac, body = path.read_text().split("\n", 1)
    assert len(mac) == 64
    return json.loads(body)


def failing_sweep(tmp_path, sweep: str) -> None:
    """A sweep of one point whose claim ("exact") FAILs."""
    results = tmp_path / "outputs" / "results"
    config = {**CONFIG, "claims": [{"metric": "max_abs_diff", "max": 1e-9, "text": "exact"}]}
    write_plan(results, "exp014_tiled", sweep, [{"length": 128}], config)
    write_jobs(results, "exp014_tiled", sweep, [
        {"job": 0, "status": "ok", "length": 128, "max_abs_diff": 1e-3}])  # fmt: skip


def test_a_cache_edited_in_the_report_folder_is_computed_again_not_believed(tmp_path, analysis):
    sweep = "20261129-120000-cccc"
    failing_sweep(tmp_path, sweep)
    assert analysis("--check").returncode == 1  # the claim FAILs
    report = tmp_path / "outputs" / "report"
    caches = report / point_lines.CACHE / "exp014_tiled"
    section, points = caches / f"{sweep}.section.json", caches / f"{sweep}.json"
    for path, edit in [
        (section, lambda text: text.replace('"FAIL"', '"PASS"')),
        (section, lambda text: text.replace("exact", "<img src=x onerror=alert(1)>exact")),
        (points, lambda text: text.replace('max_abs_diff":0.001', 'max_abs_diff":7.77')),
        (section, lambda text: "0" * 64 + "\n" + text.split("\n", 1)[1].replace("FAIL", "PASS")),
    ]:
        before = path.read_text()
        path.write_text(edit(before))
        assert path.read_text() != before, "the edit changed the cache"
        assert analysis("--check").returncode == 1, "an edited claim is not believed"
        assert path.read_text() == before, "computed again, and kept with its MAC"
        page = (report / "index.html").read_text()
        assert "alert(1)" not in page and "7.77" not in page and "FAIL" in page


BAD_KEYS = ["empty", "whitespace", "short", "open to others", "a link", "a FIFO", "not ours"]


@pytest.mark.parametrize("bad", BAD_KEYS)
def test_a_report_key_that_is_no_key_is_replaced_and_a_cache_forged_under_it_not_believed(
    tmp_path, analysis, monkeypatch, bad
):
    """The key of the caches' MACs made empty, short, readable by others, a link to a readable
    file, a FIFO, or another user's: the report never uses it (nor waits on it), puts a key of
    its own in its place, and a cache forged under the old key does not turn a FAIL to PASS."""
    key = tmp_path / "cache" / "report.key"
    key.parent.mkdir()
    monkeypatch.setattr(point_lines, "KEY", key)
    point_lines._secret.cache_clear()  # noqa: SLF001 - a new process's key
    known = {"empty": "", "whitespace": " \n", "short": "ab" * 16}.get(bad, "cd" * 32)
    if bad == "a link":
        (tmp_path / "readable").write_text(known)
        key.symlink_to(tmp_path / "readable")
    elif bad == "a FIFO":
        os.mkfifo(key, 0o600)
    else:
        key.write_text(known)
        key.chmod(0o644 if bad == "open to others" else 0o600)
        if bad == "not ours":
            os.chown(key, 65534, 65534)
    sweep = "20261129-120000-eeee"
    failing_sweep(tmp_path, sweep)
    try:
        assert analysis("--check").returncode == 1  # the claim FAILs
        status = key.lstat()
        assert key.is_file() and not key.is_symlink() and status.st_uid == os.getuid()
        assert status.st_mode & 0o077 == 0 and len(bytes.fromhex(key.read_text())) == 32
        section = tmp_path / "outputs" / "report" / point_lines.CACHE / "exp014_tiled"
        section = section / f"{sweep}.section.json"
        body = section.read_text().split("\n", 1)[1].replace('"FAIL"', '"PASS"')
        old = bytes.fromhex(known.strip())
        forged = hmac.new(old, body.encode(), hashlib.sha256).hexdigest()
        section.write_text(f"{forged}\n{body}")
        assert analysis("--check").returncode == 1, "a cache forged under the old key"
    finally:
        point_lines._secret.cache_clear()  # noqa: SLF001


def test_a_plotly_script_replaced_by_one_of_the_same_size_is_written_again(tmp_path, analysis):
    results = tmp_path / "outputs" / "results"
    write_plan(results, "exp014_tiled", "20261129-120000-dddd", [{"length": 128}], CONFIG)
    assert analysis().returncode == 0
    script = tmp_path / "outputs" / "report" / page.PLOTLY
    plotly = get_plotlyjs().encode()
    assert script.read_bytes() == plotly
    forged = b"alert(document.cookie);//"
    script.write_bytes(forged + b" " * (len(plotly) - len(forged)))  # the same size
    assert analysis().returncode == 0
    assert script.read_bytes() == plotly


@pytest.mark.parametrize("linked", [".cache", "plots", "index.html", "plotly.min.js"])
def test_a_symlink_in_the_report_folder_is_refused_in_one_line_and_nothing_goes_through_it(
    tmp_path, analysis, linked
):
    results = tmp_path / "outputs" / "results"
    write_plan(results, "exp014_tiled", "20261129-120000-eeee", [{"length": 128}], CONFIG)
    report = tmp_path / "outputs" / "report"
    report.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "kept").mkdir(parents=True)
    place = report / linked
    place.symlink_to(elsewhere)  # refused whatever it leads to
    for command in [(), ("--check",)]:
        refused = analysis(*command)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert refused.stderr == (
            f"error: {place.relative_to(tmp_path)} is a symlink: the harness writes nothing "
            "through a link in its outputs (remove it, then run the command again)\n"
        )
    assert [p.name for p in elsewhere.rglob("*")] == ["kept"], "nothing written through it"
    assert not (report / "REPORT.md").exists()


def test_a_report_only_reads_the_store(tmp_path, analysis):
    """A finished sweep of job files stays as it is: the report compacts nothing (that is the
    sweep's end's, compact's and resume's), so a store it may only read is reported alike."""
    results = tmp_path / "outputs" / "results"
    sweep = "20261129-120000-ffff"
    write_plan(results, "exp014_tiled", sweep, [{"length": 128}, {"length": 256}], CONFIG)
    write_jobs(results, "exp014_tiled", sweep, [
        {"job": 0, "status": "ok", "length": 128, "max_abs_diff": 1e-7},
        {"job": 1, "status": "ok", "length": 256, "max_abs_diff": 2e-7}])  # fmt: skip

    def listing():
        return sorted((str(p.relative_to(results)), p.stat().st_size, p.stat().st_mtime_ns)
                      for p in results.rglob("*"))  # fmt: skip

    before = listing()
    assert len([name for name, *_ in before if name.endswith(".parquet")]) == 2
    for command in [(), ("--check",), ("--all",)]:
        assert analysis(*command).returncode == 0
        assert listing() == before


def test_a_summary_is_a_line_per_planned_point_with_its_last_row(tmp_path):
    results = tmp_path / "results"
    sweep = "20261129-120000-bbbb"
    write_plan(results, "exp017_recall", sweep, [{"lr": 0.1}, {"lr": 0.2}], {"name": "x"})
    train = [{"job": 0, "status": "ok", "lr": 0.1, "phase": "train", "step": s, "loss": 1.0 / s}
             for s in (1, 2, 3)]  # fmt: skip
    evaluation = {"job": 0, "status": "ok", "lr": 0.1, "phase": "eval", "step": 3, "loss": 0.25}
    write_jobs(results, "exp017_recall", sweep, [*train, evaluation])
    points = point_lines.compute(store.SweepPaths(results, "exp017_recall", sweep))
    assert points["status"].tolist() == ["ok", "not run"]
    assert points.loc[0, "loss"] == 0.25 and pd.isna(points.loc[1, "loss"])
    assert points.attrs["params"] == ["lr"]
