"""python -m harness history: the detector on arrays (octlm_analysis.steps), the command on
stores written through the store's own functions, and on sweeps of an experiment of one's own
whose kernel does 1.5x the work after an edit (its timings what the work would take, give or
take 1%: tests/benchmarks/history_real_sweeps.py times the same on this machine's CPU)."""

import math
import re
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest
from own import OwnExperiment
from sweeps import write_jobs

from harness import store
from octlm_analysis import history, steps

EXPERIMENT = "own"
START = datetime(2026, 12, 1, tzinfo=UTC)


def noisy(count: int, seed: int, spread: float = 0.03) -> np.ndarray:
    return np.exp(np.random.default_rng(seed).normal(0, spread, count))


@pytest.mark.parametrize("seed", range(5))
def test_identical_series_show_no_step_and_a_half_again_shows_one_where_it_is(seed):
    same = [noisy(12, seed), noisy(12, seed + 100)]
    assert steps.find_steps(same) == []
    stepped = noisy(12, seed) * np.r_[np.ones(6), np.full(6, 1.5)]
    [step] = steps.find_steps([noisy(12, seed + 100), stepped])
    assert (step.series, step.at, step.start, step.end, step.log) == (1, 6, 0, 12)[:4] + (True,)
    assert step.low < 1.5 < step.high and 1.4 < step.change < 1.6


def test_holm_over_the_series_keeps_a_step_that_one_series_alone_would_show():
    """A step whose p lies between alpha / 50 and alpha: found alone, not among 49 series
    more (each without a step), as the gate's Holm rule treats its timings."""
    values = np.r_[noisy(6, 1, 0.05), noisy(6, 2, 0.05) * 1.28]
    at, p = steps.candidate(np.log(values), steps.SIDE, math.log(steps.TOLERANCE))
    assert steps.ALPHA / 50 < p <= steps.ALPHA, p  # the case this test is about
    assert [s.at for s in steps.find_steps([values])] == [at]
    assert steps.find_steps([values, *[np.ones(12)] * 49]) == []


def test_a_long_series_steps_at_its_best_split_though_many_splits_pass():
    """1,000 sweeps, a step at 500: many splits have p values below what a double holds; the
    best is still the one at the step."""
    values = noisy(1000, 4) * np.r_[np.ones(500), np.full(500, 1.25)]
    assert [(s.at, s.start, s.end) for s in steps.find_steps([values])] == [(500, 0, 1000)]


def test_a_series_may_hold_several_steps_each_measured_between_its_neighbours():
    values = noisy(30, 3) * np.r_[np.ones(10), np.full(10, 2.0), np.full(10, 1.0)]
    found = steps.find_steps([values])
    assert [(s.at, s.start, s.end) for s in found] == [(10, 0, 20), (20, 10, 30)]
    assert [round(s.change, 1) for s in found] == [2.0, 0.5]


@pytest.mark.parametrize("at", [1, 2, 10, 11])
def test_no_step_is_placed_with_fewer_than_three_sweeps_a_side(at):
    values = np.r_[np.ones(at), np.full(12 - at, 3.0)]
    assert all(3 <= s.at <= 9 for s in steps.find_steps([values]))


@pytest.mark.parametrize("factor, found", [(1.05, False), (1.5, True)])
def test_a_step_is_a_change_beyond_the_factor_either_way(factor, found):
    """As the gate: a machine that drifts by 5% with no code changed shows no step; a step
    down (faster) is one as a step up is."""
    same = noisy(12, 9, 0.01)
    assert bool(steps.find_steps([same * np.r_[np.ones(6), np.full(6, factor)]])) == found
    assert bool(steps.find_steps([same * np.r_[np.ones(6), np.full(6, 1 / factor)]])) == found


def test_a_series_with_zeros_is_judged_as_a_difference():
    values = np.r_[np.zeros(6), np.full(6, 0.5)]
    [step] = steps.find_steps([values])
    assert (step.at, step.log, step.change) == (6, False, 0.5)
    assert steps.said(step) == "+0.5 [+0.5, +0.5]"


@pytest.mark.parametrize(
    "claims, level, direction",
    [
        ([], 1.0, 0),
        ([{"metric": "err", "max": 1e-5}], 1e-7, 1),
        ([{"metric": "err", "min": 0.5}], 1.0, -1),
        ([{"metric": "err", "min": 1e-10, "max": [1e-5, "2 * other"]}], 1e-7, 1),  # max nearer
        ([{"metric": "err", "min": 1.0, "max": 100.0}], 2.0, -1),  # min nearer
        ([{"metric": "err", "min": 1.0, "max": "2 * other"}], 2.0, 1),  # max not a number
    ],
)
def test_a_claimed_metric_worsens_toward_its_bound(claims, level, direction):
    assert history._direction("err", {"claims": claims}, level) == direction
    assert history._direction("kernel_ms", {"claims": claims}, level) == 1


def write_history(results, values: list[dict], machines=None, loads=None, config=None) -> list:
    """Sweeps of EXPERIMENT, one a dict of `values` ({point x: {metric: value}}), planned an
    hour apart, each with its own code digest; machines[n] the n-th sweep's device, loads[n]
    its timings' CPU load beside. Their ids, in order."""
    ids = []
    for n, sweep_values in enumerate(values):
        sweep, planned = f"20261201-{n:02d}0000-aaaa", START + timedelta(hours=n)
        machine = (machines or {}).get(n, "cpu: the test machine")
        points = [{"job": j, "overrides": [], "params": {"x": x}}
                  for j, x in enumerate(sweep_values)]  # fmt: skip
        store.write_manifest(results, {"experiment": EXPERIMENT, "sweep": sweep,
                                       "created_at": planned.isoformat(), "points": points,
                                       "experiment_config": config or {},
                                       "command": "python -m harness"})  # fmt: skip
        rows = [{"job": j, "x": x, "status": "ok", **metrics, "started_at": planned,
                 "device_name": machine if isinstance(machine, str) else machine[j],
                 "code_digest": f"code{n:02d}", "git_commit": f"commit{n:02d}",
                 **({"cpu_load_beside": loads[n]} if loads else {})}
                for j, (x, metrics) in enumerate(sweep_values.items())]  # fmt: skip
        write_jobs(results, EXPERIMENT, sweep, rows)
        ids.append(sweep)
    return ids


def sweep_values(count: int, seed: int, step_at=None, factor=1.5) -> list[dict]:
    """A value of time_ms and err at points x=1 and 2 a sweep; from sweep `step_at` on,
    time_ms at x=2 `factor` times."""
    rng = np.random.default_rng(seed)
    made = []
    for n in range(count):
        grow = factor if step_at is not None and n >= step_at else 1.0
        made.append({1: {"time_ms": float(np.exp(rng.normal(0, 0.03))), "err": 1e-7},
                     2: {"time_ms": float(2 * grow * np.exp(rng.normal(0, 0.03))),
                         "err": 2e-7}})  # fmt: skip
    return made


@pytest.mark.e2e
def test_twelve_sweeps_of_identical_code_show_no_step(harness):
    write_history(harness.results, sweep_values(12, 0))
    done = harness("history", EXPERIMENT, "--check")
    assert done.returncode == 0, done.stderr
    assert "own: 0 step(s) in 4 series (time_ms, err) over 12 sweeps" in done.stdout


@pytest.mark.e2e
def test_a_step_is_named_by_its_two_sweeps_and_check_fails(harness):
    ids = write_history(harness.results, sweep_values(12, 1, step_at=6))
    done = harness("history", EXPERIMENT, "--check")
    assert done.returncode == 1, done.stdout + done.stderr
    [said] = [line for line in done.stdout.splitlines() if line.startswith("step")]
    assert said.startswith("step 1: time_ms at x=2: x1.49 [1.46, 1.53] (worse; 6 sweeps before")
    assert f"between sweep {ids[5]} (planned 2026-12-01 05:00 UTC, code code05, commit " \
           "commit05)" in done.stdout  # fmt: skip
    assert f"and sweep {ids[6]} (planned 2026-12-01 06:00 UTC, code code06" in done.stdout
    assert f"python -m harness code {ids[5]} {ids[6]}" in done.stdout
    assert "  git log --oneline commit05..commit06: the commits between" in done.stdout
    assert harness("history", EXPERIMENT).returncode == 0  # without --check: the steps, exit 0
    assert harness("history", EXPERIMENT, "err", "--check").returncode == 0  # err: no step


@pytest.mark.e2e
def test_a_sweeps_commit_is_its_own_rows_not_one_they_copied(harness):
    """The sweep after the step copied its x=1 point from the first sweep (reuse), whose row
    names that sweep's commit: the step names the sweep's own, from its row of x=2."""
    ids = write_history(harness.results, sweep_values(12, 1, step_at=6))
    copied = {"job": 0, "x": 1, "status": "ok", "time_ms": 1.0, "err": 1e-7, "started_at": START,
              "device_name": "cpu: the test machine", "code_digest": "code06",
              "git_commit": "commit00", "reused_from": f"{ids[0]}/job-0"}  # fmt: skip
    write_jobs(harness.results, EXPERIMENT, ids[6], [copied])
    done = harness("history", EXPERIMENT, "time_ms")
    assert f"and sweep {ids[6]} (planned 2026-12-01 06:00 UTC, code code06, commit commit06)" in (
        done.stdout
    )


@pytest.mark.e2e
def test_a_copied_value_is_no_measurement_of_the_sweep_that_copied_it(harness):
    """Six sweeps, then one whose x=1 timing came out 30% slow, then five that copied that
    point from it (reuse): one measurement after the six, not six equal ones, so no step."""
    values = sweep_values(12, 5)
    ids = write_history(harness.results, values)
    slow = {"job": 0, "x": 1, "status": "ok", "time_ms": 1.3, "err": 1e-7, "started_at": START,
            "device_name": "cpu: the test machine", "code_digest": "code06"}  # fmt: skip
    write_jobs(harness.results, EXPERIMENT, ids[6], [slow])
    for sweep in ids[7:]:
        write_jobs(harness.results, EXPERIMENT, sweep, [{**slow, "reused_from": f"{ids[6]}/job-0"}])
    done = harness("history", EXPERIMENT, "time_ms", "--check")
    assert done.returncode == 0, done.stdout
    assert "0 step(s) in 2 series (time_ms) over 12 sweeps" in done.stdout


@pytest.mark.e2e
def test_copied_timings_are_one_measurement_and_copied_answers_each_sweeps(harness):
    """Every sweep but the first copied its one point (reuse): its timing was measured once,
    which leaves no series of it, said in one line, exit 2; its err is each sweep's answer
    (the reuse key holds its code, config and machine), a series of twelve."""
    ids = write_history(harness.results, [{1: {"time_ms": 1.0, "err": 1e-7}}] * 12)
    for sweep in ids[1:]:
        write_jobs(harness.results, EXPERIMENT, sweep, [{
            "job": 0, "x": 1, "status": "ok", "time_ms": 1.0, "err": 1e-7, "started_at": START,
            "device_name": "cpu: the test machine", "reused_from": f"{ids[0]}/job-0"}])  # fmt: skip
    done = harness("history", EXPERIMENT, "time_ms")
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert done.stderr.strip() == (
        "error: no series of own to judge: time_ms at its one point: of 12 sweeps, 11 copied "
        "from another sweep (reuse), set aside"
    )
    done = harness("history", EXPERIMENT, "err", "--check")
    assert done.returncode == 0 and "0 step(s) in 1 series (err) over 12 sweeps" in done.stdout


def test_a_copy_of_a_busy_timing_is_set_aside_once_as_a_copy():
    """Sweeps 1 and 3 copied sweep 0's busy timing, sweep 2 measured its own while busy: two
    copies and one busy timing (not three), and an answer's copies stay."""
    own = pd.DataFrame({"started_at": [START, START, START + timedelta(hours=2), START],
                        "time_ms": [1.0, 1.0, 1.1, 1.0], "time_ms_cpu_load_beside": 0.9,
                        "err": 1e-7})  # fmt: skip
    aside = history._set_aside(own, "time_ms", "time_ms_cpu_load_beside")
    assert [list(mask) for mask in aside.values()] == [
        [False, True, False, True],
        [True, False, True, False],
    ]
    assert history._set_aside(own, "err", None) == {}


@pytest.mark.e2e
def test_the_sweeps_again_made_are_no_part_of_the_history(harness):
    """Six sweeps, then three more that `again` made of the first's code (their manifests say
    again_of) on a machine twice as slow by then: no step, and 6 sweeps judged."""
    values = sweep_values(9, 8)
    for n in range(6, 9):
        for x in values[n]:
            values[n][x]["time_ms"] *= 2
    ids = write_history(harness.results, values)
    for sweep in ids[6:]:
        paths = store.SweepPaths(harness.results, EXPERIMENT, sweep)
        store.write_manifest(harness.results, {**store.read_manifest(paths), "again_of": ids[0]})
    done = harness("history", EXPERIMENT, "time_ms", "--check")
    assert done.returncode == 0 and "0 step(s) in 2 series (time_ms) over 6 sweeps" in done.stdout


@pytest.mark.e2e
def test_a_faster_code_is_a_step_that_check_passes(harness):
    write_history(harness.results, sweep_values(12, 2, step_at=6, factor=0.6))
    done = harness("history", EXPERIMENT, "--check")
    assert done.returncode == 0 and "x0.6" in done.stdout and "(better;" in done.stdout


@pytest.mark.e2e
def test_a_claimed_metric_that_grew_toward_its_max_is_worse(harness):
    values = sweep_values(12, 3)
    for n in range(6, 12):
        values[n][1]["err"] = 3e-7
    claims = [{"metric": "err", "min": 1e-10, "max": 1e-5}]
    write_history(harness.results, values, config={"claims": claims})
    done = harness("history", EXPERIMENT, "--check")
    assert done.returncode == 1
    assert "step 1: err at x=1: x3 [3, 3] (worse;" in done.stdout


@pytest.mark.e2e
def test_each_machine_is_a_history_of_its_own(harness):
    """Six sweeps on one machine and six twice as slow on another, interleaved: no step (one
    history would show steps at every change of machine)."""
    values = sweep_values(12, 4)
    for n in range(1, 12, 2):
        for x in values[n]:
            values[n][x]["time_ms"] *= 2
    machines = {n: "cpu: the other machine" for n in range(1, 12, 2)}
    write_history(harness.results, values, machines=machines)
    done = harness("history", EXPERIMENT, "time_ms", "--check")
    assert done.returncode == 0
    assert "0 step(s) in 4 series" in done.stdout and "the other machine" in done.stdout


@pytest.mark.e2e
def test_a_timing_taken_on_a_busy_machine_is_set_aside(harness):
    """A sweep twice as slow while other processes used the CPUs, among identical ones: no
    step; without the load it would be one value of the history like any other."""
    values = sweep_values(14, 5, step_at=11, factor=2.0)
    loads = [0.0] * 11 + [0.9] * 3
    write_history(harness.results, values, loads=loads)
    done = harness("history", EXPERIMENT, "time_ms", "--check")
    assert done.returncode == 0 and "0 step(s)" in done.stdout


@pytest.mark.e2e
@pytest.mark.parametrize(
    "args, said",
    [
        (["nope"], "error: no experiment nope in "),
        ([EXPERIMENT, "nope"], "error: no metric nope in the history: its metrics are time_ms, "
         "err"),
        ([], "error: history: the following arguments are required: EXPERIMENT"),
        ([EXPERIMENT, "bad/name"], "error: "),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(harness, args, said):
    write_history(harness.results, sweep_values(6, 6))
    done = harness("history", *args)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(said) and done.stderr.count("\n") == 1, done.stderr


@pytest.mark.e2e
def test_too_few_sweeps_and_mixed_machines_are_bad_input(harness):
    write_history(harness.results, sweep_values(5, 7))
    done = harness("history", EXPERIMENT)
    assert (done.returncode, done.stderr) == (
        2,
        "error: 5 sweeps of own on one machine: a step needs at least 3 either side (6 sweeps)\n",
    )
    sweep = write_history(harness.results, sweep_values(7, 7),
                          machines={6: ["cpu: one", "cpu: two"]})[6]  # fmt: skip
    done = harness("history", EXPERIMENT)
    assert (done.returncode, done.stderr) == (2, f"error: sweep {sweep} ran on several machines "
                                                 "(cpu: one, cpu: two): its values are no one "
                                                 "machine's\n")  # fmt: skip


# An experiment of one's own whose two timings read what `n` units of work take: n / 1000 ms,
# give or take 1% (a timing's own noise, drawn anew each call). No test rests on the machine's
# clock: a step of the code is one of n, and the 1% can make no step beyond the gate's factor.
# tests/benchmarks/history_real_sweeps.py runs the same histories with the CPU time of a loop.
KERNEL = """import random

WORK = {work}


def cpu_ms(n):
    return n / 1000 * random.uniform(0.99, 1.01)


def run() -> list[dict]:
    return [{{"kernel_ms": cpu_ms(WORK), {other}}}]
"""
OTHER = '"other_ms": cpu_ms(40000)'  # a second timing, which the edit leaves as it was


def run_own(harness, mine: OwnExperiment, tmp_path):
    return harness(*mine.args, "reuse=false", f"code_store={tmp_path / 'codes'}", env=mine.env)


@pytest.mark.e2e
@pytest.mark.slow
def test_sweeps_whose_kernel_does_half_again_the_work_show_one_step(harness, tmp_path):
    """Six sweeps of an experiment of one's own, then six whose kernel does 1.5x the work (its
    code edited: another code digest): one step, in kernel_ms alone, between the 6th and 7th
    sweeps, named by both."""
    mine = OwnExperiment(tmp_path / "mine", EXPERIMENT, "minepkg")
    ids = []
    for n in range(12):
        if n in (0, 6):
            mine.edit(KERNEL.format(work=40000 if n == 0 else 60000, other=OTHER))
        done = run_own(harness, mine, tmp_path)
        assert done.returncode == 0, done.stderr
        ids.append(re.search(r"^sweep (\S+): ", done.stdout, re.M).group(1))
    done = harness("history", EXPERIMENT, "--check")
    assert done.returncode == 1, done.stdout + done.stderr
    steps_said = [line for line in done.stdout.splitlines() if line.startswith("step")]
    assert len(steps_said) == 1, done.stdout
    assert steps_said[0].startswith("step 1: kernel_ms at its one point"), done.stdout
    assert f"between sweep {ids[5]}" in done.stdout and f"and sweep {ids[6]}" in done.stdout, (
        done.stdout
    )
    assert "1 step(s) in 2 series (kernel_ms, other_ms) over 12 sweeps" in done.stdout


@pytest.mark.e2e
@pytest.mark.parametrize("judged, code", [(True, 1), (False, 0)])
def test_the_reports_check_fails_on_a_worse_step_where_it_is_asked(harness, analysis, judged,
                                                                    code, monkeypatch):  # fmt: skip
    """`history: true` in the experiment's YAML (its sweeps' recorded config): the report's
    --check judges its history too, the one the page marked (judged once); without it, the
    history is drawn, not checked."""
    config = {"history": True} if judged else {}
    ids = write_history(harness.results, sweep_values(12, 1, step_at=6), config=config)
    calls = []
    monkeypatch.setattr(history, "judge", lambda *a, judge=history.judge: calls.append(a) or
                        judge(*a))  # fmt: skip
    done = analysis("--check")
    assert len(calls) == 1
    assert done.returncode == code, done.stdout + done.stderr
    said = f"FAIL       own history: time_ms at x=2: x1.49 [1.46, 1.53] between sweeps {ids[5]} "
    assert (f"{said}and {ids[6]}\n" in done.stdout) == judged
    assert ("own history" in done.stdout) == judged


def test_the_page_marks_each_step_of_a_metric_on_its_history(tmp_path):
    from octlm_analysis import plots, point_lines

    results = tmp_path / "results"
    ids = write_history(results, sweep_values(12, 1, step_at=6))
    points = point_lines.of_experiment(results, EXPERIMENT, tmp_path / "report")
    judged = history.on_page(results, EXPERIMENT, points)
    figure = history.marked(plots.history(points, "time_ms", ["x"]), "time_ms", judged, points)
    [line] = figure["layout"]["shapes"]
    [note] = [a for a in figure["layout"]["annotations"] if "→" in a["text"]]
    assert line["x0"] == note["x"] == "2026-12-01 06:00:00"
    assert note["text"] == f"worse x1.49 at x=2: {ids[5]} → {ids[6]}"
    assert note["hovertext"].startswith("time_ms: x1.49 [1.46, 1.53], p ")
    untouched = plots.history(points, "err", ["x"])
    assert history.marked(untouched, "err", judged, points) == plots.history(points, "err", ["x"])
    assert history.on_page(results, EXPERIMENT, points[points["sweep"].isin(ids[:5])]) is None


def test_a_step_note_shows_a_points_value_as_text_not_plotly_markup():
    """A parameter's value with <b> and %{y} in it, in a step's note on the page: plain text,
    as every other text of the page's plots (plots.plain)."""
    import html

    ids = [f"s{n}" for n in range(6)]
    series = history.Series("time_ms", {"tag": "<b>a</b> %{y}"}, "cpu", ids,
                            np.r_[np.ones(3), np.full(3, 1.5)], 1)  # fmt: skip
    step = steps.Step(0, 3, 0, 6, True, 1.5, 1.4, 1.6, 0.001)
    judged = history.History(EXPERIMENT, pd.DataFrame({"sweep": ids}), [series], [step])
    when = [START + timedelta(hours=n) for n in range(6)]
    points = pd.DataFrame({"sweep": ids, "started_at": when})
    [note] = history.marked({"layout": {}}, "time_ms", judged, points)["layout"]["annotations"]
    assert "<b>" not in note["text"] and "%{" not in note["text"]
    assert html.unescape(note["text"]) == "worse x1.5 at tag=<b>a</b> %{y}: s2 → s3"


def test_the_pairs_of_sweeps_a_confirmation_reruns_are_each_once(tmp_path):
    """Two series stepping between the same two sweeps: one pair, its timings named; a step
    down is a pair whose timings fell (the gate then runs the later sweep as A)."""
    results = tmp_path / "results"
    values = sweep_values(12, 1, step_at=6)
    for n in range(6, 12):
        values[n][1]["time_ms"] *= 1.5
        values[n][1]["err"] = 3e-7
    ids = write_history(results, values)
    judged = history.history(results, EXPERIMENT, [], tmp_path / "report")
    [pair] = history.pairs(judged)
    assert (pair["before"], pair["after"], pair["grew"]) == (ids[5], ids[6], True)
    assert [t.split(" (")[0] for t in pair["timings"]] == ["time_ms at x=1", "time_ms at x=2"]
    assert [t.split(" (")[0] for t in pair["others"]] == ["err at x=1"]
    faster = write_history(tmp_path / "other", sweep_values(12, 2, step_at=6, factor=0.6))
    [pair] = history.pairs(history.history(tmp_path / "other", EXPERIMENT, [], tmp_path / "r"))
    assert (pair["before"], pair["after"], pair["grew"], pair["worse"]) == (
        faster[5], faster[6], False, False)  # fmt: skip


def test_a_flag_without_a_value_leaves_the_key_value_after_it_an_option():
    from harness.command.cli import as_flags

    assert as_flags(["own", "--check", "out=o"], {"out": "DIR"}, {"--check"}) == [
        "own", "--check", "--out", "o"]  # fmt: skip
    assert as_flags(["--out", "x=1"], {"out": "DIR"}) == ["--out", "x=1"]  # a value, as given


@pytest.mark.process
@pytest.mark.slow
def test_confirm_reruns_both_codes_and_the_step_stands(harness, tmp_path):
    """Three sweeps, then three whose kernel does twice the work: history --confirm reruns the
    two sweeps either side on their own codes with the gate, which finds the step standing,
    and shows the two codes' difference; --check exits 1 for it. One timing alone, so that the
    gate decides at its first look."""
    mine = OwnExperiment(tmp_path / "mine", EXPERIMENT, "minepkg")
    for n in range(6):
        if n in (0, 3):
            mine.edit(KERNEL.format(work=40000 if n == 0 else 80000, other=""))
        done = run_own(harness, mine, tmp_path)
        assert done.returncode == 0, done.stderr
    done = harness("history", EXPERIMENT, "kernel_ms", "--confirm", "--check",
                   f"code_store={tmp_path / 'codes'}", env=mine.env)  # fmt: skip
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr
    assert "the step stands on the two codes (slower: the gate of " in done.stdout
    assert "1 files differ: minepkg/kernel.py" in done.stdout
    assert "-WORK = 40000\n+WORK = 80000" in done.stdout


def test_a_sweep_slowed_as_a_whole_is_set_aside_and_a_step_of_all_timings_is_kept():
    """Ten timings: sweep 4 slowed 1.5 times in nine of them is set aside; from sweep 6 on
    all ten 1.3 times (a step of the code, or of the machine, that stays) is kept whole."""
    logs = np.log(np.column_stack([noisy(12, seed) for seed in range(10)]))
    logs[4, :9] += np.log(1.5)
    assert list(np.flatnonzero(steps.slowed_sweeps(logs))) == [4]
    logs[6:] += np.log(1.3)
    assert list(np.flatnonzero(steps.slowed_sweeps(logs))) == [4]
    assert not steps.slowed_sweeps(logs[:, :2]).any()  # two timings: too few to tell


@pytest.mark.e2e
def test_the_history_names_the_sweeps_it_set_aside_as_slowed(harness):
    values = [{x: {"time_ms": float(x * np.exp(np.random.default_rng(n * 10 + x).normal(0, 0.01)))}
               for x in range(1, 5)} for n in range(12)]  # fmt: skip
    for x in values[3]:
        values[3][x]["time_ms"] *= 1.6
    ids = write_history(harness.results, values)
    done = harness("history", EXPERIMENT, "--check")
    assert done.returncode == 0, done.stdout
    assert f"their sweep slowed as a whole (the median of its timings over x1.1 their " \
           f"neighbours'): {ids[3]}" in done.stdout  # fmt: skip
