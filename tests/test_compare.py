"""python -m harness report compare: two synthetic sweeps with known differences, point by point."""

import re

import numpy as np
import pandas as pd
import pytest

from harness import store
from octlm_analysis.compare import compare
from octlm_analysis.comparison import document
from octlm_analysis.gate import FAILED, NOT_DECIDED, PASSED, judge, timing_tables
from octlm_analysis.sides import load
from octlm_analysis.verdicts import estimate, holm, verdict

EXPERIMENT = "exp_timed"
A, B = "20261129-100000-aaaa", "20261129-110000-bbbb"
CONFIG = {
    "name": EXPERIMENT,
    "claims": [{"metric": "max_abs_diff", "max": 1e-6, "text": "matches to 1e-6"}],
}
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


def changes(comparison, factor: float = 1.10) -> dict[str, list[str]]:
    """Each timing's changes, point by point."""
    return {metric: table["change"].tolist()
            for metric, table in timing_tables(comparison, factor).items()}  # fmt: skip


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


def test_the_interval_is_welchs_on_the_logs_as_scipy_gives_it():
    """Against scipy's own Welch test of the log values (ttest_ind, equal_var=False): each end
    of the interval a one-sided 95% bound, so the two-sided 90% interval."""
    from scipy import stats

    a, b = [10.0, 10.4, 9.7, 10.1], [12.2, 12.9, 11.8]
    found = estimate(a, b, factor=1.10, tail=0.05)
    welch = stats.ttest_ind(np.log(b), np.log(a), equal_var=False)
    low, high = welch.confidence_interval(0.90)
    assert (found.low, found.high) == (pytest.approx(np.exp(low)), pytest.approx(np.exp(high)))
    shifted = stats.ttest_ind(np.log(b) - np.log(1.10), np.log(a), equal_var=False,
                              alternative="greater")  # fmt: skip
    assert found.p_slower == pytest.approx(shifted.pvalue)
    assert found.ratio == pytest.approx(np.exp(np.log(b).mean() - np.log(a).mean()))


def test_holm_steps_down_and_stops_at_the_first_it_keeps():
    assert holm([0.01, 0.04, 0.03], 0.05) == [True, False, False]  # 0.03 > 0.05 / 2
    assert holm([0.01, 0.02, 0.04], 0.05) == [True, True, True]  # 0.01, 0.02 <= 0.025, 0.04
    assert holm([0.2, 0.04], 0.05) == [False, False] and holm([], 0.05) == []


@pytest.mark.parametrize(
    "b, expected",
    [
        ([1.30, 1.32, 1.29], "slower"),
        ([0.70, 0.71, 0.69], "faster"),
        ([1.00, 1.01, 0.99], "same"),
        ([0.88, 0.93, 0.99], "same or faster"),
        ([1.05, 1.10, 1.16], "ambiguous"),  # beyond 1.10 or within it: not told apart
    ],
)
def test_each_verdict_from_the_interval_and_the_factor(b, expected):
    found = estimate([1.0, 1.01, 0.99], b, factor=1.10, tail=0.05)
    assert verdict(found, slower=holm([found.p_slower], 0.05)[0], factor=1.10) == expected


# A process's samples: TIMES times its factor (a process of its own: its repeats tight, the
# processes apart by their factors).
TIMES = [10.0, 10.3, 9.8, 10.1, 10.4, 9.9, 10.2, 10.0]
STARTS = iter(range(10**6))  # each row's start: a measurement of its own


def timed_row(slower: float, load: float | None, prefix: str = "", **more) -> dict:
    """A row as harness.measuring.timing.time_call gives it on the CPU: samples `slower` times
    TIMES, and its cpu_load_beside (None: an older row without it), each column prefixed."""
    samples = [t * slower for t in TIMES]
    row = {f"{prefix}time_ms": float(np.median(samples)), f"{prefix}time_samples_ms": samples,
           f"{prefix}repeats": len(samples), **more}  # fmt: skip
    return row if load is None else row | {f"{prefix}cpu_load_beside": load}


def write_timed(results, sweep: str, row: dict) -> None:
    """A sweep of one point whose row is `row`, started at a moment of its own (unless the row
    says when: a copy of another's)."""
    params = {"backend": "flash", "length": 128}
    started = pd.Timestamp("2026-11-29", tz="UTC") + pd.Timedelta(seconds=next(STARTS))
    line = {"job": 0, "status": "ok", "started_at": started, **params, **row}
    store.write_rows(store.SweepPaths(results, EXPERIMENT, sweep).job(0).file, [line])
    points = [{"job": 0, "overrides": [], "params": params}]
    manifest = {"experiment": EXPERIMENT, "sweep": sweep, "command": "python -m harness"}
    store.write_manifest(results, {**manifest, "experiment_config": CONFIG, "points": points})


def sides(results, factors_a, factors_b, failed_in_b=None, load_b=0.01, broken_b=0.0,
          rows=None) -> tuple[str, str]:  # fmt: skip
    """Sweeps of one point, a sweep a process, each side's ids joined by commas: each row
    timed_row(factor, load) (rows(side, number, factor): a row of the test's own). B's sweeps
    ran beside load_b (a list: each its own); with broken_b other than 0.0, their timing is that
    value (None: no value) and their samples none, on rows that say ok."""
    ids = {}
    for side, factors in (("a", factors_a), ("b", factors_b)):
        ids[side] = [f"20261129-12{side}{n:03d}-{side * 4}" for n in range(len(factors))]
        for number, (sweep, factor) in enumerate(zip(ids[side], factors, strict=True)):
            load_here = load_b[number] if isinstance(load_b, list) else load_b
            row = timed_row(factor, load_here if side == "b" else 0.01)
            if rows:
                row = rows(side, number, factor)
            if side == "b" and broken_b != 0.0:
                row = {**row, "time_ms": broken_b, "time_samples_ms": None}
            if side == "b" and number == failed_in_b:
                row = {"status": "failed", "error": "RuntimeError: out of memory"}
            write_timed(results, sweep, row)
    return ",".join(ids["a"]), ",".join(ids["b"])


SAME = [1.0, 1.01, 0.99]  # the same code in three processes, a little apart


@pytest.mark.parametrize(
    "slower, loads_b, expected, processes",
    [
        (1.4, [0.70, 0.70, 0.70], "busy machine", "3+0"),  # 1.4x, but beside others' work
        (1.4, [0.02, 0.70, 0.03], "slower", "3+2"),  # the busy one set aside, two judged
        (1.4, [0.02, 0.02, 0.03], "slower", "3+3"),
        (1.4, [None, None, None], "slower", "3+3"),  # rows that do not say: judged as they are
        (1.0, [0.24, 0.0, 0.1], "same", "3+3"),
    ],
)
def test_a_process_beside_other_load_is_set_aside(tmp_path, slower, loads_b, expected,
                                                  processes):  # fmt: skip
    results = tmp_path / "results"
    a, b = sides(results, SAME, [f * slower for f in SAME], load_b=loads_b)
    comparison = compare(load(results, a), load(results, b))
    assert comparison.timings == ["time_ms"], "the load is the machine's, not a metric"
    assert "cpu_load_beside" not in comparison.others
    table = timing_tables(comparison, 1.10)["time_ms"]
    assert table["change"].tolist() == [expected] and table["processes"].tolist() == [processes]
    busy = sum(load is not None and load > 0.25 for load in loads_b)
    assert table["set aside"].tolist() == [f"B {busy} busy" if busy else ""]
    if expected != "busy machine":
        assert table["B/A"].tolist() == [pytest.approx(slower, rel=0.02)]
    text, verdict = document(comparison, factor=1.10)
    assert verdict == {"busy machine": 3, "slower": 1, "same": 0}[expected]
    assert "Other processes' share of the CPUs" in text.split("## ")[0]


def test_a_side_of_several_sweeps_is_judged_by_the_spread_between_its_processes(tmp_path):
    """The same code in six processes: one sweep against one judges nothing; three against
    three, the same; the A and B shown are the geometric means of the processes' values."""
    results = tmp_path / "results"
    a, b = sides(results, SAME, [1.005, 0.995, 1.01])
    alone = compare(load(results, a.split(",")[0]), load(results, b.split(",")[0]))
    assert changes(alone) == {"time_ms": ["one process"]}
    assert document(alone, factor=1.10)[1] == 3, "one sweep a side: not judged"
    assert "come from one process" in document(alone, factor=1.10)[0]
    pooled = compare(load(results, a), load(results, b))
    table = timing_tables(pooled, 1.10)["time_ms"]
    assert table["change"].tolist() == ["same"] and table["processes"].tolist() == ["3+3"]
    median = float(np.median(TIMES))
    assert table["A"].iloc[0] == pytest.approx(median * np.prod(SAME) ** (1 / 3))
    assert table["low"].iloc[0] < table["B/A"].iloc[0] < table["high"].iloc[0]
    text, verdict = document(pooled, factor=1.10)
    assert verdict == 0 and "come from one process" not in text
    assert all(f"A{n}: sweep `{sweep}`" in text for n, sweep in enumerate(a.split(","), 1))
    assert (
        "Processes that count, a side, for each timing: A 3 of its 3 sweeps, B 3 of its 3" in text
    )


@pytest.mark.parametrize(
    "factors_b, failed_in_b, factor, code, expected",
    [
        ([1.3, 1.36, 1.28], None, 1.10, FAILED, "slower"),
        ([1.3, 1.36, 1.28], None, None, PASSED, "slower"),  # no gate: judged, never failed
        ([1.3, 0.99, 1.36], None, 1.10, NOT_DECIDED, "ambiguous"),
        ([1.0, 1.05, 0.98], None, 1.10, PASSED, "same"),
        ([1.0, 1.0, 1.0], 1, 1.10, FAILED, "same"),  # a lost answer
    ],
)
def test_the_gate_is_a_value_read_before_any_markdown(tmp_path, factors_b, failed_in_b, factor,
                                                      code, expected):  # fmt: skip
    """judge's Gate holds each timing's verdicts and the exit code; the document's code is it."""
    results = tmp_path / "results"
    a, b = sides(results, [1.0, 1.06, 0.97], factors_b, failed_in_b)
    comparison = compare(load(results, a), load(results, b))
    gate = judge(comparison, factor)
    assert gate.code == code and gate.decided == (code != NOT_DECIDED)
    assert gate.timings["time_ms"]["change"].tolist() == [expected]
    assert len(gate.undecided) == (code == NOT_DECIDED)
    assert len(gate.lost) == (failed_in_b is not None)
    assert document(comparison, factor)[1] == code
    with pytest.raises(AttributeError):
        gate.code = PASSED


@pytest.mark.parametrize(
    "factors_b, failed_in_b, expected, exit_code",
    [
        ([1.3, 1.36, 1.28], None, "slower", 1),  # a real 1.3x: every process of B slower
        ([0.7, 0.75, 0.72], None, "faster", 0),
        ([1.3, 0.99, 1.36], None, "ambiguous", 3),  # one of B's processes as fast as A's
        ([1.0, 1.0, 1.0], 1, "same", 1),  # B's second sweep failed the point: a lost answer
    ],
)
def test_a_side_of_several_sweeps_finds_a_real_change_and_a_lost_answer(
    tmp_path, analysis, factors_b, failed_in_b, expected, exit_code
):
    results = tmp_path / "outputs" / "results"
    a, b = sides(results, [1.0, 1.06, 0.97], factors_b, failed_in_b)
    comparison = compare(load(results, a), load(results, b))
    if failed_in_b is None:
        assert changes(comparison) == {"time_ms": [expected]}
    assert document(comparison, factor=1.10)[1] == exit_code
    gate = analysis("compare", a, b, "--fail-on-regression", "1.10")
    assert gate.returncode == exit_code, gate.stdout + gate.stderr
    named = f"compare-{a.replace(',', '+')}-vs-{b.replace(',', '+')}.md"
    assert (results.parent / "report" / named).read_text() in gate.stdout
    if expected == "ambiguous":
        assert "## Not decided: 1 timings" in gate.stdout
        assert "processes a side would decide them" in gate.stdout
        assert f"python -m harness again {a.split(',')[0]} {b.split(',')[0]}" in gate.stdout


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


def test_a_side_of_several_sweeps_has_each_claims_worst_result_and_names_its_sweep(tmp_path):
    results = tmp_path / "results"
    ids = {"a": [], "b": []}
    for side, errors in (("a", [1e-7, 1e-7]), ("b", [1e-7, 1e-3])):
        for number, error in enumerate(errors):
            sweep = f"20261129-13{side}{number:03d}-{side * 4}"
            write_timed(results, sweep, timed_row(1.0, 0.0) | {"max_abs_diff": error})
            ids[side].append(sweep)
    comparison = compare(*(load(results, ",".join(ids[side])) for side in "ab"))
    text, _ = document(comparison, factor=None)
    claim = next(line for line in text.splitlines() if line.startswith("| matches to 1e-6"))
    cells = [cell.strip() for cell in claim.strip("|").split("|")]
    assert cells[1:3] == ["PASS", "FAIL"] and cells[-1] == "yes", claim
    assert f"(in {ids['b'][1]})" in cells[4] and "(in " not in cells[3]


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


def prefixed(slowers: dict[str, float], loads: dict[str, float]):
    """rows() for sides(): two timings in a row, prefixed as docs/own-experiments.md says
    (sdpa_, naive_), each `slowers[prefix]` times slower on B and beside `loads[prefix]` there,
    with the housekeeping time_call gives each."""

    def rows(side: str, number: int, factor: float) -> dict:
        row = {}
        for prefix in ("sdpa_", "naive_"):
            slower = slowers[prefix] if side == "b" else 1.0
            row |= timed_row(factor * slower, loads[prefix] if side == "b" else 0.02, prefix,
                             **{f"{prefix}threads_used": 2})  # fmt: skip
        return row

    return rows


def test_each_prefixed_timing_is_judged_with_its_own_load_and_its_housekeeping_is_no_metric(
    tmp_path, analysis
):
    """The user's case: identical code, two prefixed timings, B's naive beside a busy machine.
    Naive is not judged and sdpa is the same: exit 3, never 1; neither's repeats, load or
    threads is a metric of the comparison."""
    results = tmp_path / "outputs" / "results"
    a, b = sides(
        results,
        SAME,
        [1.005, 0.995, 1.01],
        rows=prefixed({"sdpa_": 1.0, "naive_": 1.0}, {"sdpa_": 0.02, "naive_": 0.66}),
    )
    comparison = compare(load(results, a), load(results, b))
    assert comparison.timings == ["sdpa_time_ms", "naive_time_ms"] and comparison.others == []
    assert changes(comparison) == {"sdpa_time_ms": ["same"], "naive_time_ms": ["busy machine"]}
    gate = analysis("compare", a, b, "--fail-on-regression", "1.10")
    assert gate.returncode == 3, gate.stdout + gate.stderr
    assert "naive_cpu_load_beside, sdpa_cpu_load_beside" in gate.stdout.split("## ")[0]


def test_a_slowdown_of_one_of_two_prefixed_timings_fails_the_gate_naming_it(tmp_path, analysis):
    results = tmp_path / "outputs" / "results"
    a, b = sides(
        results,
        [1.0, 1.02, 0.97],
        [0.99, 1.03, 1.0],
        rows=prefixed({"sdpa_": 1.0, "naive_": 1.75}, {"sdpa_": 0.02, "naive_": 0.02}),
    )
    gate = analysis("compare", a, b, "--fail-on-regression", "1.10")
    assert gate.returncode == 1, gate.stdout + gate.stderr
    regressed = gate.stdout.split("## Regressions: 1 timings slower than 1.1x A")[1]
    assert "naive_time_ms" in regressed.split("##")[0]
    assert "sdpa_time_ms" not in regressed.split("##")[0]


def test_a_family_of_timings_is_judged_together(tmp_path):
    """A 1.2x change that one timing's test finds beyond 1.10, but with p near 0.01: alone it
    is slower; among forty timings alike, Holm's rule asks p <= 0.05 / 40 of the likeliest,
    and none is called slower (at 1.2x they are each ambiguous)."""
    noisy = [1.0, 1.04, 0.96]

    def gate(timings: int) -> dict:
        results = tmp_path / f"of{timings}"

        def rows(side, number, factor):
            slower = 1.2 if side == "b" else 1.0
            return {f"t{n}_time_ms": 10.0 * factor * slower for n in range(timings)}

        a, b = sides(results, noisy, noisy, rows=rows)
        return changes(compare(load(results, a), load(results, b)))

    alone = gate(1)
    assert alone == {"t0_time_ms": ["slower"]}
    together = gate(40)
    assert {c for changed in together.values() for c in changed} == {"ambiguous"}


def test_copies_of_another_measurement_count_once_and_the_gate_says_so(tmp_path, analysis):
    """B's second and third sweeps reused their point from its first (the same start and
    value: one measurement): a 2x slower B has one process of its own, and is not judged."""
    results = tmp_path / "outputs" / "results"
    made = {}

    def rows(side, number, factor):
        started = pd.Timestamp("2026-11-28", tz="UTC") + pd.Timedelta(seconds=len(made))
        made[(side, number)] = timed_row(factor, 0.01, started_at=started)
        if side == "b" and number:  # a copy, as reuse makes it: the original's row and start
            made[(side, number)] = made[("b", 0)]
        return dict(made[(side, number)])

    a, b = sides(results, SAME, [2.0, 2.0, 2.0], rows=rows)
    comparison = compare(load(results, a), load(results, b))
    table = timing_tables(comparison, 1.10)["time_ms"]
    assert table["change"].tolist() == ["copies"] and table["processes"].tolist() == ["3+1"]
    assert table["set aside"].tolist() == ["B 2 copies"]
    gate = analysis("compare", a, b, "--fail-on-regression", "1.10")
    assert gate.returncode == 3, gate.stdout + gate.stderr
    assert "B 1 of its 3 sweeps" in gate.stdout and "- 1 copies: " in gate.stdout


def test_a_damaged_row_file_is_named_and_nothing_is_judged(tmp_path, analysis):
    results = tmp_path / "outputs" / "results"
    a, b = sides(results, SAME, [1.005, 0.995, 1.01])
    path = store.SweepPaths(results, EXPERIMENT, b.split(",")[1]).job(0).file
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a flipped byte
    path.write_bytes(bytes(data))
    gate = analysis("compare", a, b, "--fail-on-regression", "1.10")
    assert gate.returncode == 1 and gate.stdout == "", gate.stdout
    assert gate.stderr.startswith(f"error: sweep {b.split(',')[1]}'s {path.name} (")
    assert "is damaged" in gate.stderr and "nothing is judged" in gate.stderr


@pytest.mark.parametrize("clocks_b, expected", [(1975, "same"), (1410, "clocks differ")])
def test_cuda_timings_are_judged_only_where_the_clocks_agree(tmp_path, clocks_b, expected):
    results = tmp_path / "results"

    def rows(side, number, factor):
        clock = 1980 if side == "a" else clocks_b
        return timed_row(factor, None, gpu_sm_clock_mhz=clock)

    a, b = sides(results, SAME, [1.005, 0.995, 1.01], rows=rows)
    assert changes(compare(load(results, a), load(results, b))) == {"time_ms": [expected]}


SCRIPTS = {"a": [10.0, 10.8, 10.1, 10.15], "b": [10.6, 9.9, 10.1, 10.05]}  # a process each


@pytest.mark.process
def test_again_adds_processes_a_side_until_the_gate_decides(harness, tmp_path):
    """Identical code whose processes are scripted: at two a side the interval reaches past
    1.10 (ambiguous), at three it ends within it (decided, not slower). `again` with times=2
    most=4 looks once, gathers a third of each, looks again and exits 0."""
    import json

    from tests.support.probes import PROBE_PATH, SUPPORT

    for side, values in SCRIPTS.items():
        (tmp_path / f"{side}.json").write_text(json.dumps({"values": values, "next": 0}))
    given = ["--config-dir", str(SUPPORT / "conf"), "+experiment=scripted", f"folder={tmp_path}"]
    env = {"PYTHONPATH": PROBE_PATH}
    made = []
    for side in "ab":
        ran = harness(*given, f"side={side}", "reuse=false", env=env)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        made.append(re.search(r"^sweep (\S+): \d+ points", ran.stdout, re.M)[1])
    gate = harness("again", *made, "times=2", "most=4", env=env)
    assert gate.returncode == 0, gate.stdout + gate.stderr
    assert "look 1 of 3: not decided at 2 processes a side; one more of each" in gate.stdout
    assert "gate passed at 3 processes a side, look 2 of 3" in gate.stdout
    assert "--looks 3" in gate.stdout and "## Not decided" not in gate.stdout
    for side in "ab":
        assert json.loads((tmp_path / f"{side}.json").read_text())["next"] == 3


def test_a_comparison_of_many_sweeps_a_side_is_written_under_a_name_a_disk_takes(
    tmp_path, analysis
):
    """Eight sweeps a side would name a file of over 300 characters: it is named by each
    side's first sweep, how many more, and a digest of the whole."""
    results = tmp_path / "outputs" / "results"
    a, b = sides(results, [1.0, 1.01, 0.99, 1.0] * 2, [1.005, 0.995, 1.01, 1.0] * 2)
    gate = analysis("compare", a, b, "--fail-on-regression", "1.10")
    assert gate.returncode == 0, gate.stdout + gate.stderr
    written = list((results.parent / "report").glob("compare-*.md"))
    assert [p.name[: -len("-0123456789ab.md")] for p in written] == [
        f"compare-{a.split(',')[0]}+7more-vs-{b.split(',')[0]}+7more"
    ]
    assert written[0].read_text() in gate.stdout and len(written[0].name) < 100
