"""python -m harness report compare with sides of several sweeps, each a process: the spread
between processes, a process beside other load set aside, prefixed timings, copies counted
once, CUDA clocks, a damaged file, and again adding processes until the gate decides."""

import re

import numpy as np
import pandas as pd
import pytest
from timed_sides import EXPERIMENT, SAME, TIMES, changes, sides, timed_row, write_timed

from harness import store
from octlm_analysis.compare import compare
from octlm_analysis.comparison import document
from octlm_analysis.gate import FAILED, NOT_DECIDED, PASSED, judge, timing_tables
from octlm_analysis.sides import load


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
