"""python -m harness report: tables and claims from the store, REPORT.md, and --check's exit
code."""

import re
from datetime import UTC, datetime

import pandas as pd
import pytest
from commands import SUPPORT
from sweeps import write_jobs, write_plan

from harness import store
from harness.results import claims
from harness.results.claims import claims_table
from harness.results.tables import check_table_names, markdown, sweep_table
from octlm_analysis import plots

CONFIG = {
    "name": "exp014_tiled",
    "table": {"index": "length", "columns": "block", "values": "max_abs_diff"},
    "claims": [{"metric": "max_abs_diff", "max": 1e-6, "text": "tiled matches SDPA"}],
}


def rows(values, statuses=None):
    statuses = statuses or ["ok"] * len(values)
    grid = [(length, block) for length in (128, 512) for block in (64, 128)]
    points = zip(grid, values, statuses, strict=False)
    return pd.DataFrame(
        [
            {"job": job, "status": status, "length": length, "block": block, "max_abs_diff": value}
            for job, ((length, block), value, status) in enumerate(points)
        ]
    )


def write_sweep(
    root, values, sweep="20261129-120000-aaaa", statuses=None, total=None, experiment="exp014_tiled"
):
    frame = rows(values, statuses)
    written = [
        {k: v for k, v in row.items() if row["status"] == "ok" or k != "max_abs_diff"}
        for row in frame.to_dict("records")
    ]
    write_jobs(root, experiment, sweep, written)
    grid = rows([None] * (total or len(values)))
    params = [{"length": int(length), "block": int(block)}
              for length, block in zip(grid["length"], grid["block"], strict=True)]  # fmt: skip
    write_plan(root, experiment, sweep, params, CONFIG)


def test_the_table_is_the_declared_pivot_with_gaps_for_failed_points():
    table = sweep_table(rows([1e-7, 2e-7, 3e-7, None], ["ok", "ok", "ok", "failed"]), CONFIG)
    assert table.index.tolist() == [128, 512] and table.columns.tolist() == [64, 128]
    assert table.loc[128, 128] == 2e-7 and pd.isna(table.loc[512, 128])
    assert "| —" in markdown(table) and "nan" not in markdown(table)


def test_a_table_of_one_index_and_its_values_takes_the_largest_over_the_rest():
    table = sweep_table(
        rows([1e-7, 2e-7, 3e-7, None], ["ok", "ok", "ok", "failed"]),
        {"table": {"index": "length", "values": "max_abs_diff"}},
        ["length", "block"],
    )
    assert table.index.tolist() == [128, 512] and table.columns.tolist() == ["max_abs_diff"]
    assert table["max_abs_diff"].tolist() == [2e-7, 3e-7]  # 512's failed point: the other's
    assert table.attrs["caption"] == "max_abs_diff by length, the largest over block"


def test_a_table_over_several_parameters_keeps_each_combination_in_grid_order():
    grid = [
        {"method": m, "dtype": d, "cap": c, "length": n}
        for m in ("tiled", "sdpa") for d in ("bfloat16", "float32") for c in (30, 50)
        for n in (128, 256)
    ]  # fmt: skip
    frame = pd.DataFrame(grid).assign(job=range(len(grid)), status="ok")
    frame["err"] = frame["job"] * 1e-7
    frame.loc[5, "status"] = "failed"  # tiled, float32, cap 30, length 256
    spec = {"index": ["method", "length"], "columns": ["dtype", "cap"], "values": "err"}
    table = sweep_table(frame, {"table": spec}, ["method", "dtype", "cap", "length"])
    assert table.index.tolist() == [("tiled", 128), ("tiled", 256), ("sdpa", 128), ("sdpa", 256)]
    assert table.columns.tolist() == [("bfloat16", 30), ("bfloat16", 50), ("float32", 30),
                                      ("float32", 50)]  # fmt: skip
    assert pd.isna(table.loc[("tiled", 256), ("float32", 30)])  # a gap, never another dtype's
    assert table.loc[("sdpa", 128), ("float32", 50)] == pytest.approx(14e-7)
    assert table.attrs["caption"] == "err, method, length (rows) by dtype, cap (columns)"
    header = markdown(table).splitlines()[0]
    assert [cell.strip() for cell in header.strip("|").split("|")] == [
        "method", "length", "dtype=bfloat16 cap=30", "dtype=bfloat16 cap=50",
        "dtype=float32 cap=30", "dtype=float32 cap=50"]  # fmt: skip


def test_an_index_of_several_levels_is_a_column_each_not_tuples():
    pivot = pd.DataFrame({"device": ["cpu", "cpu"], "dtype": ["bfloat16", "float32"],
                          "length": [1024, 1024], "flash": ["1.2 (3%)", "0.9 (2%)"]})  # fmt: skip
    text = markdown(pivot.set_index(["device", "dtype", "length"]))
    header = text.splitlines()[0]
    assert [cell.strip() for cell in header.strip("|").split("|")] == [
        "device", "dtype", "length", "flash"]  # fmt: skip
    assert "('cpu'" not in text and "| cpu " in text


@pytest.mark.parametrize(
    "values, statuses, result, worst",
    [
        ([1e-7, 2e-7, 3e-7, 4e-7], None, "PASS", "4e-07"),
        ([1e-7, 2e-6, 3e-7, 4e-7], None, "FAIL", "2e-06"),
        ([1e-7, 2e-7, 3e-7, None], ["ok", "ok", "ok", "failed"], "INCOMPLETE", "3e-07"),
        ([1e-7, 2e-6, 3e-7, None], ["ok", "ok", "ok", "failed"], "FAIL", "2e-06"),
        ([None] * 4, ["failed"] * 4, "INCOMPLETE", "—"),
        ([1e-7, 2e-7, 3e-7, 4e-7], ["ok", "ok", "ok", "unsupported"], "INCOMPLETE", "3e-07"),
    ],
)
def test_claims_pass_fail_or_are_incomplete(values, statuses, result, worst):
    (claim,) = claims_table(rows(values, statuses), CONFIG).to_dict("records")
    assert claim["result"] == result and claim["worst"] == worst
    assert claim["claim"] == "tiled matches SDPA (max_abs_diff <= 1e-06)"
    if statuses and statuses[-1] != "ok":
        assert claim["missing"].endswith(f"length=512 block=128 ({statuses[-1]})")


def test_a_claim_covers_the_planned_points_not_only_those_that_ran():
    points = [{"job": j, "params": {"length": 128 * (j + 1), "block": 64}} for j in range(4)]
    (claim,) = claims_table(rows([1e-7]), CONFIG, points).to_dict("records")
    assert (claim["result"], claim["points"]) == ("INCOMPLETE", "1 of 4")
    assert claim["missing"] == "length=256 (not run), length=384 (not run), length=512 (not run)"
    elsewhere = {**CONFIG, "claims": [{**CONFIG["claims"][0], "where": "length == 512"}]}
    (claim,) = claims_table(rows([1e-7]), elsewhere, points).to_dict("records")
    assert (claim["result"], claim["points"]) == ("INCOMPLETE", "0 of 1"), "selected by its plan"


def test_a_bound_may_be_an_expression_over_the_row():
    rule = {"metric": "tiled_err64", "min": 1e-10, "max": "2 * sdpa_err64 + 1e-6"}
    frame = rows([0.0] * 4).assign(sdpa_err64=[1e-7, 1e-7, 1e-7, None])
    frame["tiled_err64"] = [3e-7, 1.1e-6, 1e-7, 1e-7]
    (claim,) = claims_table(frame, {"claims": [rule]}).to_dict("records")
    assert claim["result"] == "INCOMPLETE", "the last row's bound is missing"
    frame.loc[0, "tiled_err64"] = 1.3e-6  # over 2 * 1e-7 + 1e-6
    (claim,) = claims_table(frame, {"claims": [rule]}).to_dict("records")
    assert (claim["result"], claim["worst"]) == ("FAIL", "1.3e-06 to 1.3e-06")
    assert claim["claim"] == "tiled_err64 >= 1e-10 and tiled_err64 <= 2 * sdpa_err64 + 1e-6"


def test_range_and_filtered_claims():
    config = {
        "claims": [{"metric": "max_abs_diff", "min": 1.5, "max": 4.5, "where": "length == 512"}]
    }
    (claim,) = claims_table(rows([9.0, 9.0, 2.0, 4.0]), config).to_dict("records")
    assert (claim["result"], claim["worst"], claim["points"]) == ("PASS", "2 to 4", "2 of 2")


def test_report_shows_the_latest_sweep_and_check_fails_on_a_failing_claim(tmp_path, analysis):
    results = tmp_path / "outputs" / "results"
    write_sweep(results, [1e-7, 2e-7, 3e-7, 4e-7], sweep="20261129-120000-aaaa")
    assert analysis("--check").returncode == 0
    write_sweep(results, [1e-7, 5e-6, 3e-7], sweep="20261129-130000-bbbb", total=4)
    plain, checked = analysis(), analysis("--check")
    assert plain.returncode == 0 and checked.returncode == 1
    assert "FAIL" in checked.stdout
    report = (tmp_path / "outputs" / "report" / "REPORT.md").read_text()
    assert "sweep `20261129-130000-bbbb`" in report and "sweep `20261129-120000-aaaa`" not in report
    assert "4 points: 3 ok, 1 not run" in report
    assert "**FAIL**" in report and "5e-06" in report
    assert "sweeps shown and checked: exp014_tiled 20261129-130000-bbbb" in checked.stdout


def test_sweep_and_all_choose_the_sweeps_shown_and_checked(tmp_path, analysis):
    results = tmp_path / "outputs" / "results"
    write_sweep(results, [1e-7, 2e-7, 3e-7, 4e-7], sweep="20261129-120000-aaaa")
    write_sweep(results, [1e-7, 5e-6, 3e-7], sweep="20261129-130000-bbbb", total=4)
    report_file = tmp_path / "outputs" / "report" / "REPORT.md"
    assert analysis().returncode == 0
    main_page = {p: p.read_bytes() for p in (report_file, report_file.with_name("index.html"))}
    older = analysis("--check", "--sweep", "20261129-120000-aaaa")
    assert older.returncode == 0, older.stdout + older.stderr  # the older one passes
    assert "sweeps shown and checked: exp014_tiled 20261129-120000-aaaa" in older.stdout
    # Its own page, in a folder of its own: the main page keeps what it showed.
    assert {p: p.read_bytes() for p in main_page} == main_page
    own = report_file.parent / "sweeps" / "20261129-120000-aaaa"
    assert f"report: {own.relative_to(tmp_path)}/REPORT.md" in older.stdout
    report = (own / "REPORT.md").read_text()
    page = (own / "index.html").read_text()
    linked = re.findall(r'(?:src="|\]\()([^")]+\.(?:js|png))', report + page)
    assert {link.rsplit(".", 1)[1] for link in linked} == {"js", "png"}, linked
    for link in linked:  # the plots and the script, from the page's folder
        assert (own / link).is_file(), link
    assert "sweep `20261129-120000-aaaa`" in report and "sweep `20261129-130000-bbbb`" not in report
    listed = [line for line in report.splitlines() if "2026112" in line and line.startswith("|")]
    assert len(listed) == 2, "every sweep of the experiment is listed"
    assert [line.split("|")[-2].strip() for line in listed] == ["yes", ""]
    every = analysis("--check", "--all")
    assert every.returncode == 1, every.stdout  # the newer one fails its claim
    report = report_file.read_text()
    assert "sweep `20261129-120000-aaaa`" in report and "sweep `20261129-130000-bbbb`" in report
    assert every.stdout.count("PASS") == 1 and every.stdout.count("FAIL") == 1


@pytest.mark.parametrize(
    ("sweep", "said"),
    [("20261129-990000-none", "no such sweep"), ("../x", "not a plain name")],
)
def test_a_sweep_not_in_the_store_is_one_line_and_exit_code_2(tmp_path, analysis, sweep, said):
    write_sweep(tmp_path / "outputs" / "results", [1e-7] * 4)
    result = analysis("--sweep", sweep)
    assert result.returncode == 2 and said in result.stderr and result.stderr.count("\n") == 1


def test_the_plots_of_a_chosen_sweep_are_linked_from_its_subfolder(tmp_path):
    from octlm_analysis.report_section import SWEEPS, _linked

    parts = ["text ![loss](exp017_recall-curves.png) and ![x](https://e.org/a.png)"]
    assert _linked(parts, tmp_path) == parts  # the report's own folder: as it is
    linked = _linked(parts, tmp_path / SWEEPS / "s1")
    assert linked == ["text ![loss](sweeps/s1/exp017_recall-curves.png) and "
                      "![x](https://e.org/a.png)"]  # fmt: skip


def test_no_store_is_one_line_and_exit_code_2(tmp_path, analysis):
    result = analysis()
    assert result.returncode == 2 and result.stderr.startswith("error: no results")


def test_the_report_skips_a_newer_sweep_with_nothing_landed_and_says_so(tmp_path, analysis):
    results = tmp_path / "outputs" / "results"
    write_sweep(results, [1e-7, 2e-7, 3e-7, 4e-7], sweep="20261129-120000-aaaa")
    store.write_manifest(results, {"experiment": "exp014_tiled", "sweep": "20261129-130000-bbbb",
                                   "points": [], "experiment_config": CONFIG})  # fmt: skip
    assert analysis("--check").returncode == 0
    report = (tmp_path / "outputs" / "report" / "REPORT.md").read_text()
    assert "sweep `20261129-120000-aaaa`" in report
    assert "Newer, with nothing landed yet: `20261129-130000-bbbb`" in report


def test_claims_without_values_are_incomplete_and_without_points_not_applicable():
    assert claims_table(pd.DataFrame(), CONFIG)["result"].tolist() == ["N/A"]
    failed = rows([None] * 4, ["oom"] * 4)
    assert claims_table(failed, CONFIG)["result"].tolist() == ["INCOMPLETE"]
    elsewhere = {**CONFIG, "claims": [{**CONFIG["claims"][0], "where": "length == 4096"}]}
    assert claims_table(rows([1e-7] * 4), elsewhere)["result"].tolist() == ["N/A"]


@pytest.mark.parametrize(
    "claim, said",
    [
        ({"metric": "max_abs_dif", "max": 1e-6}, "no column 'max_abs_dif' in the rows; did you "
                                                 "mean max_abs_diff?"),
        ({"metric": "max_abs_diff", "max": 1e-6, "where": "lenght > 1"},
         "unknown column 'lenght' in 'lenght > 1'; did you mean length?"),
        ({"metric": "gflop", "max": 1.0}, "no column 'gflop' in the rows"),
    ],
)  # fmt: skip
def test_a_claim_on_a_column_no_row_has_is_an_error_naming_the_nearest(claim, said):
    """A typo is no INCOMPLETE claim (a value none measured): it names what the rows have."""
    (line,) = claims_table(rows([1e-7] * 4), {"claims": [claim]}).to_dict("records")
    assert line["result"] == "ERROR" and said in line["worst"], line
    assert ("did you mean" in line["worst"]) == ("did you mean" in said)
    failed = rows([None] * 4, ["failed"] * 4).drop(columns="max_abs_diff")
    (line,) = claims_table(failed, {"claims": [claim]}).to_dict("records")
    assert line["result"] == ("ERROR" if "where" in claim else "INCOMPLETE"), "nothing answered"


def test_a_line_short_of_what_its_claim_needs_is_missing_and_says_what_it_has():
    """needs: a value over fewer steps than the claim rests on is no value, and the line says
    what the short points have against what the claim needs."""
    claim = {"metric": "max_abs_diff", "max": 1e-6, "needs": "steps >= 100", "text": "agrees"}
    table = rows([1e-7, 2e-7, 3e-7, 9e-6]).assign(steps=[100, 100, 30, 12])
    (line,) = claims_table(table, {"claims": [claim]}).to_dict("records")
    assert line["claim"] == "agrees (max_abs_diff <= 1e-06; needs steps >= 100)"
    assert line["result"] == "INCOMPLETE" and line["points"] == "2 of 4", "9e-6: too short to fail"
    assert line["missing"] == ("length=512 block=64 steps=30 (ok), length=512 block=128 steps=12 "
                               "(ok) (steps=30, steps=12, where it needs "
                               "steps >= 100)")  # fmt: skip
    table["steps"] = 100
    assert claims_table(table, {"claims": [claim]})["result"].tolist() == ["FAIL"]
    table.loc[3, "max_abs_diff"] = 4e-7
    assert claims_table(table, {"claims": [claim]})["result"].tolist() == ["PASS"]
    unknown = {**claim, "needs": "step >= 100"}
    (line,) = claims_table(table, {"claims": [unknown]}).to_dict("records")
    assert line["result"] == "ERROR" and "did you mean steps?" in line["worst"]
    with pytest.raises(ValueError, match=r"claim 1 \(max_abs_diff\): its needs: not an expr"):
        claims.validate({"claims": [{**claim, "needs": "steps >="}]})


def test_check_fails_on_a_sweep_whose_claim_is_incomplete(tmp_path, analysis):
    results = tmp_path / "outputs" / "results"
    write_sweep(results, [1e-7], total=4)
    checked = analysis("--check")
    assert checked.returncode == 1 and "INCOMPLETE" in checked.stdout
    assert "1 of 4 points have a value; none for length=128 block=128 (not run)" in checked.stdout


def test_a_sweep_that_cannot_be_reported_is_an_error_line_not_a_lost_report(tmp_path, analysis):
    results = tmp_path / "outputs" / "results"
    # exp015_backends' own report module, given rows without the columns it derives from.
    write_sweep(results, [1e-7, 2e-7, 3e-7, 4e-7], experiment="exp015_backends")
    write_sweep(results, [1e-7], sweep="20261129-120000-cccc", experiment="other")
    result = analysis("--check")
    assert result.returncode == 1 and "ERROR" in result.stdout
    report = (tmp_path / "outputs" / "report" / "REPORT.md").read_text()
    assert "could not be reported" in report and "## other" in report


def test_a_legend_or_a_point_prints_a_float_to_four_digits():
    point = {"lr": 0.006466422717414595, "warmup": 50, "attention": "sdpa", "big": 12345678.0}
    said = plots.label(point, ["lr", "warmup", "attention", "big"])
    assert said == "lr=0.006466 warmup=50 attention=sdpa big=1.235e+07"


def test_an_experiment_of_ones_own_is_plotted_against_its_widest_swept_parameter():
    """No `length`, no report module, no claims: its metrics against the parameter with the
    most values, a line per value of the other."""
    from octlm_analysis.report_section import _figures

    grid = [(width, seed) for width in (8, 16, 32) for seed in (0, 1)]
    rows = pd.DataFrame({"job": range(6), "status": "ok", "width": [w for w, _ in grid],
                         "seed": [s for _, s in grid], "loss": [1.0 / w + s for w, s in grid],
                         "threads": 2})  # fmt: skip
    assert plots.axis(rows, {}, ["seed", "width"]) == "width"
    assert plots.axis(rows, {"table": {"index": "seed"}}, ["seed", "width"]) == "seed"
    assert plots.axis(rows.iloc[:1], {}, ["seed", "width"]) is None, "one point: no line"
    (figure,) = _figures(None, rows, {"rows": rows}, {}, ["width", "seed"])
    traces = [t for t in figure["data"] if t.get("mode") == "lines+markers"]
    assert [t["name"] for t in traces] == ["seed=0", "seed=1"]
    assert [t["x"] for t in traces] == [[8, 16, 32]] * 2
    assert traces[1]["y"] == pytest.approx([1 + 1 / 8, 1 + 1 / 16, 1 + 1 / 32])


def test_the_watch_server_serves_the_reports_own_files_to_this_host_only(tmp_path):
    """A symlink in outputs/report could name any file (/etc/passwd); a page elsewhere whose
    name resolves here (DNS rebinding) sends its own Host: neither is answered."""
    import http.client

    from octlm_analysis.watch import _serve

    folder = tmp_path / "report"
    (folder / "sweeps").mkdir(parents=True)
    (folder / "index.html").write_text("<p>the page</p>")
    secret = tmp_path / "secret.txt"
    secret.write_text("not the report's")
    (folder / "leak").symlink_to(secret)
    (folder / "linked").symlink_to(tmp_path, target_is_directory=True)
    server = _serve(folder, 0)
    port = server.server_address[1]
    try:

        def get(path: str, host: str = f"127.0.0.1:{port}") -> tuple[int, bytes]:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            connection.request("GET", path, headers={"Host": host})
            answer = connection.getresponse()
            body = answer.read()
            connection.close()
            return answer.status, body

        assert get("/index.html") == (200, b"<p>the page</p>")
        assert get("/index.html", host=f"localhost:{port}")[0] == 200
        assert get("/leak")[0] == 404 and get("/linked/secret.txt")[0] == 404
        assert get("/sweeps/")[0] == 404, "no folder listed"
        assert get("/../secret.txt")[0] == 404
        assert get("/index.html", host=f"rebound.example:{port}")[0] == 403
        (folder / "sweeps" / "index.html").symlink_to(secret)
        assert get("/")[0] == 200 and get("/sweeps/")[0] == 404, "an index.html that is a link"
    finally:
        server.shutdown()
        server.server_close()


SIZED = """# @package _global_
experiment:
  name: sized
  run: probes.sized
  claims:
    - {{metric: area, min: 0, max: {bound}, text: the area is bounded}}
width: 3
point: 0
hydra: {{sweeper: {{params: {{point: '1,2'}}}}}}
"""


def test_check_says_when_a_sweep_recorded_other_claims_and_can_judge_by_todays(
    harness, analysis, tmp_path
):
    """A claim fixed in the YAML after a sweep ran: --check judges the sweep by the claims it
    recorded and says they have changed since; --current-claims judges it by today's."""
    mine = tmp_path / "mine"
    (mine / "experiment").mkdir(parents=True)
    yaml = mine / "experiment" / "sized.yaml"
    yaml.write_text(SIZED.format(bound=100))
    given, path = ("--config-dir", str(mine)), {"PYTHONPATH": str(SUPPORT)}
    ran = harness(*given, "+experiment=sized", env=path)
    assert ran.returncode == 0 and "PASS" in ran.stdout, ran.stdout + ran.stderr
    same = analysis("--check", *given)
    assert same.returncode == 0 and "Claims changed" not in same.stdout, same.stdout
    yaml.write_text(SIZED.format(bound=5))  # areas 3 and 6: today's claim fails
    recorded = analysis("--check", *given)
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    assert "the experiment's YAML states other claims than this sweep recorded; judged by " \
           "the recorded ones (--current-claims: by today's)" in recorded.stdout  # fmt: skip
    report = (tmp_path / "outputs" / "report" / "REPORT.md").read_text()
    assert "**Claims changed:**" in report
    today = analysis("--check", "--current-claims", *given)
    assert today.returncode == 1, today.stdout + today.stderr
    assert "FAIL" in today.stdout and "judged by today's (--current-claims)" in today.stdout
    assert analysis("--check").returncode == 0, "without its YAML, only what it recorded"


def test_a_sweep_listed_started_when_it_was_planned_not_when_its_reused_rows_first_ran(
    tmp_path, analysis
):
    """A reused row keeps its first run's started_at, so a sweep that reused answers from
    yesterday did not start yesterday: the sweep list gives its manifest's created_at (and a
    sweep whose manifest names none, its earliest row's)."""
    results = tmp_path / "outputs" / "results"
    first_ran = datetime(2026, 11, 28, 9, tzinfo=UTC)
    for sweep, created in (("20261128-090000-aaaa", None), ("20261129-130000-bbbb", "13:00:00")):
        jobs = [{"job": job, "status": "ok", "length": 128, "block": block, "max_abs_diff": 1e-7,
                 "started_at": first_ran} for job, block in enumerate((64, 128))]  # fmt: skip
        write_jobs(results, "exp014_tiled", sweep, jobs)
        points = [{"job": row["job"], "overrides": [], "params": {"length": 128,
                   "block": row["block"]}} for row in jobs]  # fmt: skip
        manifest = {"experiment": "exp014_tiled", "sweep": sweep, "points": points,
                    "experiment_config": CONFIG, "command": "python -m harness"}  # fmt: skip
        if created:
            manifest["created_at"] = f"2026-11-29T{created}.250000+00:00"
        store.write_manifest(results, manifest)
    assert analysis().returncode == 0
    report = (tmp_path / "outputs" / "report" / "REPORT.md").read_text()
    listed = {line.split("|")[1].strip(): line.split("|")[2].strip()
              for line in report.splitlines() if line.startswith("| 2026112")}  # fmt: skip
    assert listed["20261129-130000-bbbb"].startswith("2026-11-29 13:00:00"), listed
    assert listed["20261128-090000-aaaa"].startswith("2026-11-28 09:00:00"), listed
    page = (tmp_path / "outputs" / "report" / "index.html").read_text()
    assert "sweep_planned_at" not in page, "a sweep's planning time is said once, not a column"


PRECISION_GRID = [{"dtype": dtype, "length": length} for dtype in ("float32", "bfloat16")
                  for length in (256, 4096)]  # fmt: skip


def precision_rows(errors: list[float], references: list[float]) -> pd.DataFrame:
    return pd.DataFrame([{"job": job, "status": "ok", **point, "err": err, "ref": ref}
                         for job, (point, err, ref) in enumerate(zip(
                             PRECISION_GRID, errors, references, strict=True))])  # fmt: skip


def planned_points() -> list[dict]:
    return [{"job": job, "params": point} for job, point in enumerate(PRECISION_GRID)]


def test_a_failing_claim_names_each_failing_point_its_value_and_the_bound_it_breaks():
    """Each point's own bound (twice its reference, plus 1e-6): the bfloat16 points break
    theirs, the float32 ones pass; the line names the failing points by the parameters that
    vary, with value and bound, and how many pass."""
    claim = {"metric": "err", "max": "2 * ref + 1e-6", "text": "as accurate as the reference"}
    table = precision_rows([1e-7, 2e-7, 3.2e-3, 5e-3], [1e-7, 1e-7, 5e-4, 2e-3])
    (line,) = claims_table(table, {"claims": [claim]}, planned_points()).itertuples()
    assert line.result == "FAIL" and line.passes == "2 of 4"
    assert line.failing == ("at dtype=bfloat16 length=256: 0.0032 > 0.001, "
                            "at dtype=bfloat16 length=4096: 0.005 > 0.004")  # fmt: skip
    said = claims.outcome(line)
    assert said.startswith("at dtype=bfloat16 length=256: 0.0032 > 0.001, at dtype=bfloat16")
    assert said.endswith("; 2 of 4 pass")
    # Selected by a where that fixes dtype: only what varies among the selected names them.
    where = {**claim, "where": "dtype == 'bfloat16'"}
    (line,) = claims_table(table, {"claims": [where]}, planned_points()).itertuples()
    assert line.failing.startswith("at length=256: 0.0032 > 0.001, at length=4096")
    # A value next to its bound is shown with the digits that tell them apart.
    assert claims._versus(1.00002, ">", 1.0) == "1.00002 > 1"


def test_a_claim_with_no_value_anywhere_is_incomplete_whatever_its_bound_names():
    """Every point failed: no row has the metric nor the column its bound reads. Nothing is
    judged: INCOMPLETE, naming the points, as a claim with a number bound says."""
    failed = pd.DataFrame([{"job": job, "status": "failed", **point, "error": "boom"}
                           for job, point in enumerate(PRECISION_GRID)])  # fmt: skip
    for bound in (1e-5, "2 * ref + 1e-6", ["2 * ref", 1e-5]):
        claim = {"metric": "err", "max": bound}
        (line,) = claims_table(failed, {"claims": [claim]}, planned_points()).itertuples()
        assert line.result == "INCOMPLETE", (bound, line)
        assert line.missing.startswith("dtype=float32 length=256 (failed)")
    # With values, a bound naming a column the rows lack is an error, its nearest named.
    table = precision_rows([1e-7] * 4, [1e-7] * 4)
    (line,) = claims_table(table, {"claims": [{"metric": "err", "max": "2 * reff"}]}).itertuples()
    assert line.result == "ERROR" and "did you mean ref?" in line.worst


def test_a_bound_that_compares_is_an_error_even_from_a_manifest_edited_past_validation():
    claim = {"metric": "err", "min": "err > 3"}
    (line,) = claims_table(precision_rows([1.0] * 4, [1.0] * 4), {"claims": [claim]}).itertuples()
    assert line.result == "ERROR" and "has the comparison `err > 3`" in line.worst


def test_the_report_names_a_failing_point_and_check_exits_1(tmp_path, analysis):
    results = tmp_path / "outputs" / "results"
    claim = {"metric": "err", "max": "2 * ref + 1e-6", "where": "length > 1",
             "text": "as accurate as the reference"}  # fmt: skip
    write_plan(results, "mine", "20261129-120000-aaaa", PRECISION_GRID, {"claims": [claim]})
    write_jobs(results, "mine", "20261129-120000-aaaa",
               precision_rows([1e-7, 2e-7, 3.2e-3, 1e-3], [1e-7, 1e-7, 5e-4, 2e-3]).to_dict(
                   "records"))  # fmt: skip
    checked = analysis("--check")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    line = "FAIL       mine 20261129-120000-aaaa: as accurate as the reference"
    assert line in checked.stdout
    assert "(at dtype=bfloat16 length=256: 0.0032 > 0.001; 3 of 4 pass)" in checked.stdout
    report = (tmp_path / "outputs" / "report" / "REPORT.md").read_text()
    assert "where `length > 1`: at dtype=bfloat16 length=256: 0.0032 > 0.001; 3 of 4 pass" in (
        report)  # fmt: skip
    page = (tmp_path / "outputs" / "report" / "index.html").read_text()
    assert "at dtype=bfloat16 length=256: 0.0032 &gt; 0.001" in page


def test_a_rerun_by_again_is_shown_with_its_original_and_never_judged_as_the_newest(
    tmp_path, analysis
):
    """An older sweep that fails, the newest original that passes, and a rerun of it by
    `again` (newer still, failing): the report and --check judge the newest original, show
    the rerun beside it, and the sweep list gives every sweep's verdicts."""
    results = tmp_path / "outputs" / "results"
    sweeps = {"20261129-110000-aaaa": 1e-5, "20261129-120000-bbbb": 1e-7,
              "20261129-130000-cccc": 1e-5}  # fmt: skip
    for sweep, value in sweeps.items():
        write_sweep(results, [value] * 4, sweep=sweep)
    rerun = store.read_manifest(store.SweepPaths(results, "exp014_tiled", "20261129-130000-cccc"))
    store.write_manifest(results, {**rerun, "again_of": "20261129-120000-bbbb"})
    checked = analysis("--check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "sweeps shown and checked: exp014_tiled 20261129-120000-bbbb" in checked.stdout
    report = (tmp_path / "outputs" / "report" / "REPORT.md").read_text()
    assert "sweep `20261129-120000-bbbb`" in report
    assert "Run again (python -m harness again): `20261129-130000-cccc` (1 FAIL)." in report
    listed = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
              for line in report.splitlines() if line.startswith("| 2026")}  # fmt: skip
    assert [listed[s][4:7] for s in sweeps] == [
        ["1 FAIL", "", ""],
        ["1 PASS", "", "yes"],
        ["1 FAIL", "20261129-120000-bbbb", ""],
    ]
    # --sweep shows the rerun when asked for.
    assert analysis("--check", "--sweep", "20261129-130000-cccc").returncode == 1


def test_last_names_the_newest_sweep_in_compare_and_sweep_too(tmp_path, analysis):
    results = tmp_path / "outputs" / "results"
    for sweep in ("20261129-110000-aaaa", "20261129-120000-bbbb"):
        write_sweep(results, [1e-7] * 4, sweep=sweep)
    compared = analysis("compare", "20261129-110000-aaaa", "last")
    assert compared.returncode == 0, compared.stdout + compared.stderr
    assert "compare-20261129-110000-aaaa-vs-20261129-120000-bbbb.md" in compared.stdout
    shown = analysis("--sweep", "last")
    assert "sweeps shown: exp014_tiled 20261129-120000-bbbb" in shown.stdout, shown.stderr


def test_the_report_shows_no_absolute_path_of_the_machine_that_ran_it(tmp_path, analysis):
    results = tmp_path / "outputs" / "results"
    write_sweep(results, [1e-7] * 4)
    manifest = store.read_manifest(
        store.SweepPaths(results, "exp014_tiled", "20261129-120000-aaaa")
    )
    command = (f"python -m harness --config-dir {tmp_path}/conf +experiment=exp014_tiled "
               f"reuse=false out={tmp_path}/outputs "
               "code_store=/home/someone/.cache/codes")  # fmt: skip
    store.write_manifest(results, {**manifest, "command": command})
    assert analysis("--out", str(tmp_path / "outputs")).returncode == 0
    for name in ("REPORT.md", "index.html"):
        text = (tmp_path / "outputs" / "report" / name).read_text()
        assert str(tmp_path) not in text and "/home/someone" not in text, name
    report = (tmp_path / "outputs" / "report" / "REPORT.md").read_text()
    assert ("`python -m harness --config-dir conf +experiment=exp014_tiled reuse=false "
            "out=outputs code_store=.../.cache/codes`") in report  # fmt: skip


def test_a_point_of_several_rows_fails_once_and_counts_once():
    """A training point's rows (a step each): the failing point is named once, and how many
    pass counts points, not rows."""
    table = pd.DataFrame([{"job": job, "status": "ok", "lr": lr, "step": step, "loss": loss}
                          for job, lr, losses in ((0, 0.1, [1.0, 2.0, 3.0]), (1, 0.2, [1.0] * 3))
                          for step, loss in enumerate(losses, 1)])  # fmt: skip
    points = [{"job": 0, "params": {"lr": 0.1}}, {"job": 1, "params": {"lr": 0.2}}]
    claim = {"metric": "loss", "max": 1.5}
    (line,) = claims_table(table, {"claims": [claim]}, points).itertuples()
    assert line.failing == "at lr=0.1: 3 > 1.5" and line.passes == "1 of 2"


def test_a_derived_table_names_its_lines_by_what_tells_them_apart_whatever_its_labels():
    """A derived table without the sweep's parameters, made by pd.concat without
    ignore_index (its labels repeat): its lines are named by its own columns, and nothing
    breaks."""
    derived = pd.concat([pd.DataFrame({"method": [m], "length": [2], "ratio": [r]})
                         for m, r in (("a", 0.5), ("b", 0.95))])  # fmt: skip
    claim = {"metric": "ratio", "min": 0.9, "table": "growth"}
    tables = {"rows": rows([1e-7] * 4), "growth": derived}
    (line,) = claims.claims_of(tables, {"claims": [claim]}, ["length", "block"]).itertuples()
    assert line.result == "FAIL" and line.failing == "at method=a: 0.5 < 0.9"
    assert line.passes == "1 of 2"


def test_names_one_letter_from_a_parameter_that_are_columns_of_their_own_are_not_refused():
    """step beside a parameter steps, errors beside the harness's error, speed as a table's
    values beside a parameter seed: the experiment's own columns, not typos."""
    where = "step > 10 and errors == 0"
    config = {"table": {"index": "step", "values": "speed"},
              "claims": [{"metric": "loss", "max": 1.0, "where": where}]}  # fmt: skip
    claims.validate(config, ["steps", "seed", "lr"])
    check_table_names(config["table"], ["steps", "seed", "lr"])


def test_an_experiment_whose_every_sweep_is_a_rerun_is_still_reported(tmp_path, analysis):
    results = tmp_path / "outputs" / "results"
    write_sweep(results, [1e-5] * 4, sweep="20261129-130000-cccc")
    rerun = store.read_manifest(store.SweepPaths(results, "exp014_tiled", "20261129-130000-cccc"))
    store.write_manifest(results, {**rerun, "again_of": "20261129-120000-gone"})
    checked = analysis("--check")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "FAIL       exp014_tiled 20261129-130000-cccc" in checked.stdout


def test_sweep_last_writes_the_page_of_the_sweep_it_names(tmp_path, analysis):
    results = tmp_path / "outputs" / "results"
    write_sweep(results, [1e-7] * 4, sweep="20261129-130000-cccc")
    assert analysis("--sweep", "last").returncode == 0
    assert (
        tmp_path / "outputs" / "report" / "sweeps" / "20261129-130000-cccc" / "REPORT.md"
    ).exists()
    assert not (tmp_path / "outputs" / "report" / "sweeps" / "last").exists()
