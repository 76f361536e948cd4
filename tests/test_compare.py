"""python -m harness report compare: two synthetic sweeps with known differences, point by point."""

import re

import pytest
from timed_sides import CONFIG, EXPERIMENT, sides

from harness import store
from octlm_analysis.compare import compare
from octlm_analysis.comparison import document
from octlm_analysis.gate import timing_tables
from octlm_analysis.sides import load

A, B = "20261129-100000-aaaa", "20261129-110000-bbbb"
# (backend, length) -> time_samples_ms in A and B; the comments say what the rule must find.
SAMPLES = {
    ("math", 128): ([10.0, 10.1, 9.9, 10.2, 9.8], [5.0, 5.1, 4.9, 5.2, 4.8]),  # faster, 0.5x
    ("math", 256): ([10, 14, 18, 22, 26], [12, 17, 22, 27, 32]),  # 1.22x, within the noise: same
    ("flash", 128): ([2.0, 2.02, 1.98, 2.01, 1.99], [2.6, 2.62, 2.58, 2.61, 2.59]),  # slower, 1.3x
}
ONLY_A, ONLY_B, FAILS_IN_B = ("flash", 256), ("flash", 512), ("flash", 1024)


def point_rows(sweep: str) -> list[tuple[dict, dict]]:
    """(params, row) for each point of the sweep: the shared grid and the known differences."""
    points = [*SAMPLES, ONLY_A if sweep == A else ONLY_B, FAILS_IN_B]
    lines = []
    for backend, length in points:
        params = {"backend": backend, "length": length, "min_time_s": 0.5}
        samples = SAMPLES.get((backend, length), ([1.0, 1.1, 0.9], [1.0, 1.1, 0.9]))
        times = samples[0] if sweep == A else samples[1]
        row = {
            "time_ms": sorted(times)[len(times) // 2],
            "time_samples_ms": [float(t) for t in times],
            "max_abs_diff": 2e-6 if (sweep == B and length == 256) else 1e-7,
        }
        if sweep == B and (backend, length) == FAILS_IN_B:
            row = {"status": "failed", "error": "RuntimeError: out of memory"}
        lines.append((params, row))
    return lines


def write_sweep(results, sweep: str, experiment: str = EXPERIMENT) -> None:
    points = []
    for job, (params, row) in enumerate(point_rows(sweep)):
        full = {"job": job, "status": "ok", **params, **row}
        store.write_rows(store.SweepPaths(results, experiment, sweep).job(job).file, [full])
        points.append({"job": job, "overrides": [], "params": params})
    manifest = {
        "experiment": experiment,
        "sweep": sweep,
        "command": f"python -m harness +experiment={experiment}",
        "experiment_config": CONFIG,
        "points": points,
    }
    store.write_manifest(results, manifest)


@pytest.fixture
def results(tmp_path):
    results = tmp_path / "outputs" / "results"
    write_sweep(results, A)
    write_sweep(results, B)
    return results


def test_one_sweep_a_side_shows_each_timings_ratio_and_judges_none(results):
    """A sweep's repeats come from one process: a side of one sweep has one process a timing,
    too few for an interval, whatever its repeats say (A's 0.5x at math 128 included)."""
    comparison = compare(load(results, A), load(results, B))
    assert comparison.keys == ["backend", "length"] and comparison.timings == ["time_ms"]
    table = timing_tables(comparison, 1.10)["time_ms"]
    judged = table.drop(index=[FAILS_IN_B])
    assert set(judged["change"]) == {"one process"} and set(judged["processes"]) == {"1+1"}
    assert table.loc[FAILS_IN_B, "change"] == "no value", "B's point failed"
    assert table.loc[("math", 128), "B/A"] == pytest.approx(0.5, rel=0.02)
    assert table.loc[("math", 256), "B/A"] == pytest.approx(22 / 18)
    assert ONLY_A not in table.index and ONLY_B not in table.index


def test_the_document_lists_lone_points_statuses_and_the_flipped_claim(results):
    text, verdict = document(compare(load(results, A), load(results, B)), factor=None)
    assert verdict == 0
    assert "4 points in both, 1 only in A, 1 only in B" in text
    assert "| backend=flash length=256 | A " in text and "| backend=flash length=512 | B " in text
    assert "| backend=flash length=1024 | ok  | failed | RuntimeError: out of memory" in text
    claim = next(line for line in text.splitlines() if line.startswith("| matches to 1e-6"))
    assert "PASS" in claim and "FAIL" in claim and claim.rstrip(" |").endswith("yes")
    assert "Holm's rule" in text and "Welch's t interval" in text


@pytest.mark.parametrize("factor", [1.2, 1.5])
def test_one_sweep_a_side_fails_the_gate_only_for_a_lost_answer(results, analysis, factor):
    """One sweep a side: no timing is judged (exit 3 had nothing been lost, saying why); the
    point that fails in B is an answer lost, which fails the gate whatever its factor."""
    result = analysis("compare", A, B, "--fail-on-regression", str(factor))
    assert result.returncode == 1, result.stderr
    written = results.parent / "report" / f"compare-{A}-vs-{B}.md"
    assert written.read_text() in result.stdout
    assert f"## Regressions: 0 timings slower than {factor:g}x A" in result.stdout
    lost = result.stdout.split("## Regressions: 1 points answered in A have no answer in B")[1]
    assert "backend=flash length=1024" in lost and "failed" in lost
    assert "3 one process: a side has fewer than two processes" in result.stdout


@pytest.mark.parametrize("a, b", [(A, A), (f"{A},{B}", B)], ids=["itself", "within a side"])
def test_a_sweep_on_both_sides_is_one_line_and_exit_2(results, analysis, a, b):
    """A sweep against itself would pass any gate (every timing the same): refused."""
    refused = analysis("compare", a, b, "--fail-on-regression", "1.01")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "is on both sides" in refused.stderr and refused.stdout == ""


def test_a_gate_that_could_judge_no_timing_exits_3_and_says_why(tmp_path, analysis):
    """Three sweeps a side, B 1.3x slower, every timing of B beside a busy machine: no timing is
    judged, and the gate does not pass: exit 3, saying so."""
    results = tmp_path / "outputs" / "results"
    a, b = sides(results, [1.0, 1.06, 0.97], [1.3, 1.36, 1.28], load_b=0.7)
    gate = analysis("compare", a, b, "--fail-on-regression", "1.10")
    assert gate.returncode == 3, gate.stdout + gate.stderr
    assert "## Not decided: 1 timings" in gate.stdout and "- 1 busy machine: " in gate.stdout


@pytest.mark.parametrize("broken", [float("nan"), float("inf"), None])
def test_a_timing_b_lost_on_an_ok_row_fails_the_gate(tmp_path, analysis, broken):
    """B's timer broken (NaN, infinite, no value) on rows that say ok: an answer lost, named."""
    results = tmp_path / "outputs" / "results"
    a, b = sides(results, [1.0, 1.06, 0.97], [1.0, 1.0, 1.0], broken_b=broken)
    gate = analysis("compare", a, b, "--fail-on-regression", "1.10")
    assert gate.returncode == 1, gate.stdout + gate.stderr
    assert "## Regressions: 1 timings A has are no number on an ok row of B" in gate.stdout


@pytest.mark.parametrize(
    "other, message",
    [("other", "is exp_timed and sweep 20261129-120000-cccc is other"), (None, "no sweep")],
)
def test_different_experiments_or_an_unknown_sweep_is_one_line_and_exit_2(
    results, analysis, other, message
):
    sweep = "20261129-120000-cccc"
    if other:
        write_sweep(results, sweep, experiment=other)
    result = analysis("compare", A, sweep)
    assert result.returncode == 2 and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""


def test_a_setting_that_differs_is_shown_and_not_matched_on(tmp_path):
    results = tmp_path / "results"
    write_sweep(results, A)
    write_sweep(results, B)
    manifest = store.read_manifest(store.SweepPaths(results, EXPERIMENT, B))
    for point in manifest["points"]:
        point["params"]["min_time_s"] = 0.05
    store.write_manifest(results, manifest)
    comparison = compare(load(results, A), load(results, B))
    assert comparison.keys == ["backend", "length"]
    assert comparison.settings.loc["min_time_s"].tolist() == [0.5, 0.05]


def test_two_sweeps_with_no_point_in_common_say_so_and_exit_1(results, analysis):
    """Nothing matched is no comparison: not "the same at every point", and no exit 0."""
    manifest = store.read_manifest(store.SweepPaths(results, EXPERIMENT, B))
    for point in manifest["points"]:
        point["params"]["length"] += 10_000
    store.write_manifest(results, manifest)
    result = analysis("compare", A, B)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.strip() == (
        f"error: sweeps {A} and {B} have no point in common (matched on backend, length): "
        "5 points only in A, 5 only in B; nothing to compare"
    )
    assert "The same at every point" not in result.stdout
    assert "0 points in both, 5 only in A, 5 only in B" in result.stdout
    assert re.search(r"\| backend=math length=10128 +\| B +\|", result.stdout), "listed as B's"


def test_a_side_whose_sweeps_are_not_one_grid_or_name_one_twice_is_one_line_and_exit_2(
    results, analysis
):
    other = "20261129-120000-cccc"
    write_sweep(results, other)
    for side, said in [(f"{A},{B}", "are not of one grid"), (f"{A},{A}", "names a sweep twice")]:
        refused = analysis("compare", side, other)
        assert refused.returncode == 2 and said in refused.stderr, refused.stderr
        assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr


def test_a_symlink_in_the_report_folder_writes_no_comparison_through_it(results, analysis):
    report = results.parent / "report"
    report.mkdir()
    (report / f"compare-{A}-vs-{B}.md").symlink_to(results.parent / "elsewhere.md")
    refused = analysis("compare", A, B)
    assert refused.returncode == 2 and "is a symlink" in refused.stderr, refused.stderr
    assert not (results.parent / "elsewhere.md").exists()


def test_a_sweep_whose_claims_cannot_be_checked_is_an_error_line_not_a_traceback(
    results, monkeypatch
):
    import octlm_analysis.sides as sides_module

    def broken(rows, config, points):
        raise ValueError("two measurements share length\nand more")

    monkeypatch.setattr(sides_module, "claims_table", broken)
    text, _ = document(compare(load(results, A), load(results, B)), factor=None)
    claim = next(line for line in text.splitlines() if "the sweep's claims can be checked" in line)
    assert claim.count("ERROR") == 2 and "ValueError: two measurements share length" in claim
