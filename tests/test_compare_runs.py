"""python -m harness report compare of training sweeps: points matched by their parameters, each
run's final value per phase compared, both sides' curves overlaid."""

import pandas as pd
import pytest
from probes import PROBE_PATH, SUPPORT

from harness import store
from octlm_analysis.compare import compare, curve_figures
from octlm_analysis.compare_tables import final_table, finals_summary
from octlm_analysis.comparison import document
from octlm_analysis.gate import FAILED
from octlm_analysis.sides import load

EXPERIMENT = "exp_trained"
A, B = "20261130-100000-aaaa", "20261130-110000-bbbb"
STEPS = 10
CONFIG = {
    "name": EXPERIMENT,
    "claims": [{"metric": "loss", "where": "phase == 'eval'", "max": 0.25, "text": "fits"}],
}
# Each sweep's grid, in its own order of jobs: the points match by width, never by job.
WIDTHS = {A: [8, 16, 32], B: [32, 8, 64]}
SCALE = {A: 1.0, B: 0.5}  # a train loss of SCALE * width / 8 / (step + 1)
EVAL = {A: 0.2, B: 0.3}  # each run's held-out loss, after its last step
FAILS = (B, 8)  # B's width=8 run fails after step 4: a final train value, no eval


def run_rows(sweep: str, width: int) -> list[dict]:
    """A training run's rows: a train loss a step, then one eval row (or a failure)."""
    last = 5 if (sweep, width) == FAILS else STEPS
    rows = [{"phase": "train", "step": step, "loss": SCALE[sweep] * width / 8 / (step + 1)}
            for step in range(last)]  # fmt: skip
    if (sweep, width) == FAILS:
        return [*rows, {"status": "failed", "error": "RuntimeError: diverged"}]
    return [*rows, {"phase": "eval", "step": STEPS, "loss": EVAL[sweep]}]


def write_sweep(results, sweep: str) -> None:
    points = []
    for job, width in enumerate(WIDTHS[sweep]):
        params = {"width": width, "lr": 0.1 if sweep == A else 0.05}
        rows = [{"job": job, "status": "ok", **params, **row} for row in run_rows(sweep, width)]
        store.write_rows(store.SweepPaths(results, EXPERIMENT, sweep).job(job).file, rows)
        points.append({"job": job, "overrides": [], "params": params})
    store.write_manifest(results, {"experiment": EXPERIMENT, "sweep": sweep,
                                   "command": f"python -m harness +experiment={EXPERIMENT}",
                                   "experiment_config": CONFIG, "points": points})  # fmt: skip


@pytest.fixture
def comparison(tmp_path):
    results = tmp_path / "outputs" / "results"
    for sweep in (A, B):
        write_sweep(results, sweep)
    return compare(load(results, A), load(results, B))


def final(sweep: str, width: int) -> float:
    """A run's last train loss: its last step's."""
    last = 4 if (sweep, width) == FAILS else STEPS - 1
    return SCALE[sweep] * width / 8 / (last + 1)


def test_points_match_by_parameters_and_compare_final_values_per_phase(comparison):
    assert comparison.keys == ["width"] and comparison.timings == []
    assert comparison.finals == {"loss": {"train": "loss train", "eval": "loss eval"}}
    table = final_table(comparison, "loss")
    assert list(table.index) == [8, 32], "the points both sweeps have, B's jobs in another order"
    for width in (8, 32):
        assert table.loc[width, "train A"] == pytest.approx(final(A, width))
        assert table.loc[width, "train B"] == pytest.approx(final(B, width))
    assert table.loc[32, "train B/A"] == pytest.approx(0.5)
    assert table.loc[8, "train B/A"] == pytest.approx(1.0), "B's failed run's last train step: 4"
    assert table.loc[32, "eval B/A"] == pytest.approx(1.5) and pd.isna(table.loc[8, "eval B"])
    summary = finals_summary(comparison)
    assert summary.loc[("loss", "train"), "points"] == 2
    assert summary.loc[("loss", "train"), "B/A lowest"] == pytest.approx(0.5)
    assert summary.loc[("loss", "train"), "B/A highest"] == pytest.approx(1.0)
    assert summary.loc[("loss", "eval"), "points"] == 1
    assert summary.loc[("loss", "eval"), "B/A median"] == pytest.approx(1.5)


def test_the_document_counts_points_not_rows_and_the_gate_keeps_a_lost_answer(comparison):
    text, _ = document(comparison, factor=None)
    assert "Summary: 2 points in both, 1 only in A, 1 only in B; 1 statuses differ" in text
    assert "1 of 1 claims flipped" in text
    assert "| width=8 | ok  | failed | RuntimeError: diverged" in text
    assert "| width=16 | A " in text and "| width=64 | B " in text
    assert "## loss: final values" in text and "row=" not in text
    assert len(text.splitlines()) < 60
    gated, verdict = document(comparison, factor=1.1)
    assert verdict == FAILED
    assert "## Regressions: 1 points answered in A have no answer in B" in gated


def test_the_curves_overlay_both_sides_a_solid_b_dashed_a_point_one_color(comparison):
    (figure,) = curve_figures(comparison)
    lines = {t["name"]: t for t in figure["data"] if t["mode"] == "lines"}
    assert sorted(lines) == ["A width=16", "A width=32", "A width=8", "B width=32", "B width=64",
                             "B width=8"]  # fmt: skip
    assert {lines[n]["line"]["dash"] for n in lines if n.startswith("A")} == {"solid"}
    assert {lines[n]["line"]["dash"] for n in lines if n.startswith("B")} == {"dash"}
    assert lines["A width=32"]["line"]["color"] == lines["B width=32"]["line"]["color"]
    assert lines["A width=8"]["line"]["color"] != lines["A width=32"]["line"]["color"]
    marked = [t for t in figure["data"] if t["mode"] == "markers"]
    assert sorted(t["marker"]["symbol"] for t in marked) == ["diamond"] * 3 + ["diamond-open"] * 2
    assert figure["layout"]["yaxis"]["type"] == "log", "losses from 1.0 down to 0.05"


@pytest.mark.process
def test_two_tagged_training_sweeps_compare_as_two_points(harness, analysis):
    """The trainer probe (a row per step, value = step * 10 + seed) run twice, tagged a and b
    with another seed: compare tag:a tag:b matches its two points by steps, 2 points in a short
    file, beside it a page of both sides' curves."""
    gate = harness.cwd / "gate"
    gate.mkdir()
    given = ["--config-dir", str(SUPPORT / "conf"), "+experiment=trainer", f"folder={gate}"]
    for tag, seed in (("a", 0), ("b", 3)):
        result = harness(*given, "steps=20,40", f"seed={seed}", f"tag={tag}",
                         env={"PYTHONPATH": PROBE_PATH})  # fmt: skip
        assert result.returncode == 0, result.stderr
    result = analysis("--config-dir", str(SUPPORT / "conf"), "compare", "tag:a", "tag:b")
    assert result.returncode == 0, result.stderr
    assert "Summary: 2 points in both, 0 only in A, 0 only in B; 0 statuses differ" in result.stdout
    assert (
        "| steps=20 | 200 | 203 |" in result.stdout and "| steps=40 | 400 | 403 |" in result.stdout
    )
    (written,) = (harness.cwd / "outputs" / "report").glob("compare-*.md")
    assert len(written.read_text().splitlines()) < 150
    page = written.with_suffix(".html").read_text()
    assert page.count('class="plotly-graph-div"') == 2, "value and pid over step"
    assert '<script src="plotly.min.js">' in page and (written.parent / "plotly.min.js").exists()
