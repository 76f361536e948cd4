"""python -m harness report compare: two synthetic sweeps with known differences, point by point."""

import re

import numpy as np
import pytest

from harness import store
from octlm_analysis.compare import change, compare, metric_table
from octlm_analysis.comparison import document
from octlm_analysis.sides import load

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
        store.write_rows(store.job_file(results, experiment, sweep, job), [full])
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


def test_each_timing_is_faster_slower_or_the_same_by_the_noise_rule(results):
    comparison = compare(load(results, A), load(results, B))
    assert comparison.keys == ["backend", "length"] and comparison.timings == ["time_ms"]
    table = metric_table(comparison.matched, "time_ms", comparison.keys)
    changes = table["change"].to_dict()
    assert changes[("math", 128)] == "faster" and changes[("flash", 128)] == "slower"
    assert changes[("math", 256)] == "same"
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
    assert "Mann-Whitney" in text and "interquartile range" in text


@pytest.mark.parametrize("factor, slower", [(1.2, True), (1.5, False)])
def test_fail_on_regression_gates_on_the_factor_and_the_noise(results, analysis, factor, slower):
    """One sweep a side: the timings slower by the rule are listed, not judged (code cannot be
    told from process there); the point that fails in B is an answer lost, which fails."""
    result = analysis("compare", A, B, "--fail-on-regression", str(factor))
    assert result.returncode == 1, result.stderr  # the point that fails in B counts, always
    written = results.parent / "report" / f"compare-{A}-vs-{B}.md"
    assert written.read_text() in result.stdout
    timings = result.stdout.split(f"## Slower than {factor:g}x A by the rule, not judged")[1]
    timings, lost = timings.split("## Regressions")
    # 1.22x at length 256 is within the noise: never a regression, whatever the factor.
    assert ("backend=flash length=128" in timings) == slower
    assert "backend=math length=256" not in timings
    assert "backend=flash length=1024" in lost and "failed" in lost
    assert f"cannot tell code from process at {factor:g}x" in result.stdout


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
    assert "The gate judged none of its 1 timings (1 busy machine)" in gate.stdout


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
    manifest = store.read_manifest(results, EXPERIMENT, B)
    for point in manifest["points"]:
        point["params"]["min_time_s"] = 0.05
    store.write_manifest(results, manifest)
    comparison = compare(load(results, A), load(results, B))
    assert comparison.keys == ["backend", "length"]
    assert comparison.settings.loc["min_time_s"].tolist() == [0.5, 0.05]


def test_two_sweeps_with_no_point_in_common_say_so_and_exit_1(results, analysis):
    """Nothing matched is no comparison: not "the same at every point", and no exit 0."""
    manifest = store.read_manifest(results, EXPERIMENT, B)
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


SPREAD = np.linspace(10, 20, 81)  # interquartile range 12.5 to 17.5


@pytest.mark.parametrize(
    "a, b, expected",
    [
        ([1.0, 1.1, 0.9], [2.0, 2.1, 1.9], "same"),  # three against three: exact p 0.1 at best
        ([1.0, 1.1, 0.9, 1.05], [2.0, 2.1, 1.9, 2.05], "slower"),  # four: exact p 2/70
        ([1.0, 1.1, 0.9, 1.05, 0.95], [2.0, 2.1, 1.9, 2.05, 1.95], "slower"),
        ([2.0, 2.1, 1.9, 2.05, 1.95], [1.0, 1.1, 0.9, 1.05, 0.95], "faster"),
        (SPREAD, SPREAD + 2, "same"),  # p < 1e-4, but each median inside the other's range
        (SPREAD, SPREAD + 6, "slower"),
        (None, [2.0, 2.1], "no samples"),
    ],
)
def test_change_needs_enough_repeats_and_a_change_beyond_the_spread(a, b, expected):
    assert change(a, b) == expected


# The same code's point timed twice: B's code either as fast as A's or 1.4x slower, B's
# machine busy (others used `load` of its CPUs) or not. TIMES are A's samples.
TIMES = [10.0, 10.3, 9.8, 10.1, 10.4, 9.9, 10.2, 10.0]


def timed_row(slower: float, load: float | None) -> dict:
    """A row as harness.measuring.timing.time_call gives it on the CPU: samples `slower` times
    TIMES, and cpu_load_beside (None: an older row without it)."""
    samples = [t * slower for t in TIMES]
    row = {"time_ms": float(np.median(samples)), "time_samples_ms": samples}
    return row if load is None else row | {"cpu_load_beside": load}


def write_timed(results, sweep: str, row: dict) -> None:
    """A sweep of one point whose row is `row`."""
    params = {"backend": "flash", "length": 128}
    line = {"job": 0, "status": "ok", **params, **row}
    store.write_rows(store.job_file(results, EXPERIMENT, sweep, 0), [line])
    points = [{"job": 0, "overrides": [], "params": params}]
    manifest = {"experiment": EXPERIMENT, "sweep": sweep, "command": "python -m harness"}
    store.write_manifest(results, {**manifest, "experiment_config": CONFIG, "points": points})


@pytest.mark.parametrize(
    "slower, load_a, load_b, expected",
    [
        (1.4, 0.01, 0.70, "busy machine"),  # load beside B: 1.4x, not the code's
        (1.4, 0.60, 0.02, "busy machine"),  # beside A
        (1.4, 0.02, 0.03, "slower"),  # an idle machine both times: the code
        (1.4, None, None, "slower"),  # rows that do not say: judged as they are
        (1.4, None, 0.70, "busy machine"),
        (1.0, 0.24, 0.0, "same"),
    ],
)
def test_a_timing_beside_other_load_is_not_judged(tmp_path, slower, load_a, load_b, expected):
    results = tmp_path / "results"
    write_timed(results, A, timed_row(1.0, load_a))
    write_timed(results, B, timed_row(slower, load_b))
    comparison = compare(load(results, A), load(results, B))
    assert comparison.timings == ["time_ms"], "the load is the machine's, not a metric"
    assert "cpu_load_beside" not in comparison.others
    table = metric_table(comparison.matched, "time_ms", comparison.keys)
    assert table["change"].tolist() == [expected]
    assert table["B/A"].tolist() == [pytest.approx(slower)]
    text, verdict = document(comparison, factor=1.10)
    assert verdict == 3, "one sweep a side: not judged"
    said = "Other processes' share of the CPUs" in text.split("## ")[0]
    assert said == (load_a is not None or load_b is not None)
    assert f"1 {expected}" in text


def sides(results, factors_a, factors_b, failed_in_b=None, load_b=0.01,
          broken_b=0.0) -> tuple[str, str]:  # fmt: skip
    """Sweeps of one point whose samples are TIMES times each factor: a sweep a process (its
    repeats tight, the processes apart), A's and B's ids joined by commas. B's sweeps ran
    beside load_b; with broken_b other than 0.0, their timing is that value (None: no value)
    and their samples none, on rows that say ok."""
    ids = {}
    for side, factors in (("a", factors_a), ("b", factors_b)):
        ids[side] = [f"20261129-12{side}{n:03d}-{side * 4}" for n in range(len(factors))]
        for number, (sweep, factor) in enumerate(zip(ids[side], factors, strict=True)):
            row = timed_row(factor, load_b if side == "b" else 0.01)
            if side == "b" and broken_b != 0.0:
                row = {**row, "time_ms": broken_b, "time_samples_ms": None}
            if side == "b" and number == failed_in_b:
                row = {"status": "failed", "error": "RuntimeError: out of memory"}
            write_timed(results, sweep, row)
    return ",".join(ids["a"]), ",".join(ids["b"])


def test_a_side_of_several_sweeps_is_judged_by_the_spread_between_its_processes(tmp_path):
    """The same code in six processes, each apart from the others by more than its repeats
    spread: one sweep against one calls it 1.12x slower; three against three, the same."""
    results = tmp_path / "results"
    a, b = sides(results, [1.0, 1.06, 0.97], [1.09, 1.01, 1.04])
    alone = compare(load(results, a.split(",")[2]), load(results, b.split(",")[0]))
    table = metric_table(alone.matched, "time_ms", alone.keys)
    assert table["change"].tolist() == ["slower"] and table["B/A"].iloc[0] > 1.10
    assert document(alone, factor=1.10)[1] == 3, "one sweep a side: not judged"
    assert "come from one process" in document(alone, factor=1.10)[0]
    pooled = compare(load(results, a), load(results, b))
    table = metric_table(pooled.matched, "time_ms", pooled.keys)
    assert table["change"].tolist() == ["same"]
    assert table["A"].iloc[0] == pytest.approx(10.05) and table["B"].iloc[0] == pytest.approx(
        10.05 * 1.04
    ), "the medians of the processes' medians"
    text, verdict = document(pooled, factor=1.10)
    assert verdict == 0 and "come from one process" not in text
    assert all(f"A{n}: sweep `{sweep}`" in text for n, sweep in enumerate(a.split(","), 1))


@pytest.mark.parametrize(
    "factors_b, failed_in_b, expected, regressed",
    [
        ([1.3, 1.36, 1.28], None, "slower", 1),  # a real 1.3x: every process of B slower
        ([0.7, 0.75, 0.72], None, "faster", 0),
        ([1.3, 0.99, 1.36], None, "same", 0),  # one of B's processes as fast as A's
        ([1.0, 1.0, 1.0], 1, "same", 1),  # B's second sweep failed the point: a lost answer
    ],
)
def test_a_side_of_several_sweeps_finds_a_real_change_and_a_lost_answer(
    tmp_path, analysis, factors_b, failed_in_b, expected, regressed
):
    results = tmp_path / "outputs" / "results"
    a, b = sides(results, [1.0, 1.06, 0.97], factors_b, failed_in_b)
    comparison = compare(load(results, a), load(results, b))
    table = metric_table(comparison.matched, "time_ms", comparison.keys)
    if failed_in_b is None:
        assert table["change"].tolist() == [expected]
    assert document(comparison, factor=1.10)[1] == regressed
    gate = analysis("compare", a, b, "--fail-on-regression", "1.10")
    assert gate.returncode == regressed, gate.stdout + gate.stderr
    named = f"compare-{a.replace(',', '+')}-vs-{b.replace(',', '+')}.md"
    assert (results.parent / "report" / named).read_text() in gate.stdout


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


def test_each_prefixed_timing_is_judged_with_its_own_load_and_its_housekeeping_is_no_metric(
    tmp_path,
):
    """Two timings in a row, prefixed as docs/own-experiments.md says (sdpa_, naive_): naive's
    was taken beside a busy machine and is not judged, sdpa's on an idle one is; neither's
    repeats, load or threads is a metric of the comparison."""
    results = tmp_path / "results"
    for sweep, slower, naive_load in ((A, 1.0, 0.02), (B, 1.4, 0.66)):
        row = {}
        for prefix, load_beside in (("sdpa_", 0.02), ("naive_", naive_load)):
            samples = [t * slower for t in TIMES]
            row |= {f"{prefix}time_ms": float(np.median(samples)),
                    f"{prefix}time_samples_ms": samples, f"{prefix}repeats": len(samples),
                    f"{prefix}cpu_load_beside": load_beside,
                    f"{prefix}threads_used": 2}  # fmt: skip
        write_timed(results, sweep, row)
    comparison = compare(load(results, A), load(results, B))
    assert comparison.timings == ["sdpa_time_ms", "naive_time_ms"] and comparison.others == []
    changes = {t: metric_table(comparison.matched, t, comparison.keys)["change"].tolist()
               for t in comparison.timings}  # fmt: skip
    assert changes == {"sdpa_time_ms": ["slower"], "naive_time_ms": ["busy machine"]}
    text, _ = document(comparison, factor=1.10)
    assert "naive_cpu_load_beside, sdpa_cpu_load_beside" in text.split("## ")[0]
