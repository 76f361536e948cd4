"""exp017_recall: its data, its training rows, a checkpoint that continues the same run, the text
task, and its claims, each seen to fail on a run that breaks it."""

import inspect
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from harness import store, tracking
from harness.results import claims
from octlm_analysis import recall as report
from octlm_experiments import recall, tasks
from octlm_experiments.attention import naive_attention
from octlm_experiments.derived import recall as deriving
from octlm_experiments.model import ModelConfig, OctLM
from octlm_experiments.paths import PATHS

SHORT = {"steps": 12, "batch": 8, "device": "cpu", "checkpoint_every": 5}
CONFIG = Path(__file__).resolve().parent.parent / "conf" / "experiment" / "exp017_recall.yaml"
DEFAULTS = {name: parameter.default for name, parameter in
            inspect.signature(recall.run).parameters.items() if name != "tracker"}  # fmt: skip


def test_a_recall_batch_holds_pairs_a_gap_and_queries_with_their_answers():
    data = tasks.Recall(pairs=5, queries=3, gap=4, keys=9, values=7, pair_tokens=True)
    tokens, targets = data.batch(torch.Generator().manual_seed(0), 16)
    assert tokens.shape == targets.shape == (16, data.length) and data.length == 5 + 4 + 6
    for row, target in zip(tokens.tolist(), targets.tolist(), strict=True):
        pairs = {t // 7: t % 7 for t in row[:5]}
        assert len(pairs) == 5 and all(t < 9 * 7 for t in row[:5]), "distinct keys"
        assert row[5:9] == [data.filler] * 4
        asked = [row[9 + 2 * i] - data.query0 for i in range(3)]
        answers = [row[10 + 2 * i] - data.answer0 for i in range(3)]
        assert len(set(asked)) == 3 and answers == [pairs[key] for key in asked]
        scored = [(i, t) for i, t in enumerate(target) if t != tasks.IGNORE]
        assert scored == [(9 + 2 * i, data.answer0 + answers[i]) for i in range(3)]
    assert data.vocab_size == 9 * 7 + 9 + 7 + 1 and data.chance == 1 / 7


def test_the_two_token_form_puts_each_value_after_its_key():
    data = tasks.Recall(pairs=4, queries=2, gap=0, keys=6, values=5, pair_tokens=False)
    tokens, targets = data.batch(torch.Generator().manual_seed(1), 4)
    for row, target in zip(tokens.tolist(), targets.tolist(), strict=True):
        pairs = dict(zip(row[0:8:2], (t - 6 for t in row[1:8:2]), strict=True))
        key, answer = row[8], row[9] - 6
        assert pairs[key] == answer and target[8] == row[9]


@pytest.mark.parametrize("layers, window", [(1, 4), (2, 4), (3, 5)])
def test_a_window_reaches_layers_times_window_less_one_positions_back(layers, window):
    """What the chance claim's `where` rests on: through the layers, the output at position p
    depends on the tokens from p - layers * (window - 1) on, and on none before."""
    config = ModelConfig(vocab_size=32, width=16, n_layers=layers, n_heads=2, n_kv_heads=2,
                         max_length=32, attention="naive", window=window)  # fmt: skip
    octlm = OctLM(config)
    embedded = []

    def keep(module, inputs, output):
        output.retain_grad()
        embedded.append(output)

    octlm.embedding.register_forward_hook(keep)
    octlm(torch.arange(32).unsqueeze(0))[0, 31].sum().backward()
    reached = embedded[0].grad[0].abs().sum(-1) > 0
    first = 31 - layers * (window - 1)
    assert reached[first:].all() and not reached[:first].any()


def test_a_run_has_a_row_per_step_then_its_evaluation():
    rows = recall.run(**SHORT)
    assert [r["step"] for r in rows[:-1]] == list(range(1, 13))
    assert {r["phase"] for r in rows[:-1]} == {"train"} and rows[-1]["phase"] == "eval"
    for row in rows[:-1]:
        assert row["loss"] > 0 and 0 <= row["accuracy"] <= 1 and row["tokens_per_s"] > 0
    assert rows[0]["learning_rate"] < rows[4]["learning_rate"], "warming up"
    assert rows[-1]["chance"] == 1 / 16


def test_a_path_without_a_backward_here_is_an_unsupported_row():
    [row] = recall.run(**SHORT, attention="flex")  # FlexAttention: no CPU backward in 2.13
    assert row["status"] == "unsupported" and "backward" in row["error"]


def test_bfloat16_trains_through_autocast():
    rows = recall.run(**SHORT, dtype="bfloat16")
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)


class Dying(tracking.Tracker):
    """A tracker whose process 'dies' (raises) once the run logs step `at`."""

    def __init__(self, *args, at: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.at = at

    def log(self, row):
        super().log(row)
        if row["step"] == self.at:
            raise KeyboardInterrupt


def tracker(tmp_path, cls=tracking.Tracker, **kwargs):
    def prepare(row):
        return {"job": 0, "status": "ok", **row}

    return cls(tmp_path / "job-000000.parquet", tmp_path / "checkpoints", prepare,
               config_hash="h", **kwargs)  # fmt: skip


class DyingWithAnOlderCheckpoint(Dying):
    """Dying, its checkpoints as a run before the shared training loop took them: without the
    scaler's state."""

    def save(self, state):
        super().save({key: value for key, value in state.items() if key != "scaler"})


@pytest.mark.parametrize("dying", [Dying, DyingWithAnOlderCheckpoint], ids=["now", "older"])
def test_a_run_resumed_from_its_checkpoint_continues_the_same_run(tmp_path, dying):
    """Killed at step 8 (checkpoints at 5 and 10), resumed: the same losses, step for step, as
    a run that was never interrupted (weights, optimizer and data generator restored); from a
    checkpoint of today's, or of a run before the shared training loop (no scaler's state)."""
    straight = [r["loss"] for r in recall.run(**SHORT)[:-1]]
    killed = tracker(tmp_path, dying, at=8)
    with pytest.raises(KeyboardInterrupt):
        recall.run(**SHORT, tracker=killed)
    killed.close()
    (kept,) = (tmp_path / "checkpoints").rglob("checkpoint.pt")
    state = torch.load(kept, weights_only=True)["state"]
    assert ("scaler" in state) == (dying is Dying)  # what the resume finds
    again = tracker(tmp_path)
    recall.run(**SHORT, tracker=again)
    again.end([])
    rows = store.job_rows(tmp_path / "job-000000.parquet")
    assert [r["step"] for r in rows] == list(range(1, 13))
    assert [r["loss"] for r in rows] == straight


def test_the_text_task_learns_characters_from_a_file(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("the quick brown fox jumps over the lazy dog; naïve café. " * 40, "utf-8")
    rows = recall.run(**{**SHORT, "steps": 60}, task="text", text_file=str(text), length=32)
    first, last = rows[0], rows[-1]
    assert last["phase"] == "eval" and last["chance"] == pytest.approx(
        1 / len(set(text.read_text()))
    )
    assert last["loss"] < first["loss"] and last["accuracy"] > 3 * last["chance"]


@pytest.mark.parametrize(
    "given, said",
    [
        ({"task": "text"}, "task=text needs text_file"),
        ({"task": "text", "text_file": "/nonexistent"}, "is not a file"),
        ({"pairs": 20}, "pairs=20 needs at least as many distinct keys"),
        ({"queries": 9}, "queries=9 must not exceed pairs=8"),
        ({"steps": 0}, "steps must be positive"),
    ],
)
def test_bad_values_are_refused_with_one_line(given, said):
    with pytest.raises(ValueError, match=said):
        recall.run(**{**SHORT, **given})


def test_a_text_too_short_for_its_length_is_refused(tmp_path):
    text = tmp_path / "short.txt"
    text.write_text("tiny", "utf-8")
    with pytest.raises(ValueError, match="has 4 characters: at least 330 are needed"):
        recall.run(**SHORT, task="text", text_file=str(text), length=32)
    text.write_bytes(b"\xff\xfe not utf-8" * 100)
    with pytest.raises(ValueError, match="is not UTF-8"):
        recall.run(**SHORT, task="text", text_file=str(text), length=32)


def claim_results(rows: pd.DataFrame) -> dict[str, str]:
    config = yaml.safe_load(CONFIG.read_text())["experiment"]
    table = claims.claims_table(rows, config)
    return dict(zip(table["claim"].str.split(" \\(").str[0], table["result"], strict=True))


def sweep_rows(runs: dict[tuple, list[dict]]) -> pd.DataFrame:
    """Rows as the store holds them: a job per run, its parameters on every row."""
    rows = []
    for job, ((attention, window), run_rows) in enumerate(runs.items()):
        params = {**DEFAULTS, "attention": attention, "window": window}
        rows += [{"job": job, "status": "ok", **params, **row} for row in run_rows]
    return pd.DataFrame(rows)


def test_the_agreement_claim_passes_for_tiled_and_fails_for_a_broken_path(monkeypatch):
    steps = {**SHORT, "steps": deriving.AGREEMENT_STEPS, "batch": 16}
    runs = {("sdpa", 0): recall.run(**steps), ("tiled", 0): recall.run(**steps, attention="tiled")}
    result = claim_results(sweep_rows(runs))
    assert result["tiled and naive attention train as sdpa does from the same seed"] == "PASS"
    rows = sweep_rows(runs)
    early = rows[(rows["phase"] != "train") | (rows["step"] <= 30)]  # as if 30 steps were run
    config = yaml.safe_load(CONFIG.read_text())["experiment"]
    line = claims.claims_table(early, config).iloc[2]
    assert line["claim"].startswith("tiled and naive attention train as sdpa does")
    assert line["result"] == "INCOMPLETE" and line["points"] == "0 of 1", line
    assert line["missing"].endswith("(compared_steps=30, where it needs compared_steps >= 100)")

    def broken(query, key, value, block, causal=True, window=0):  # forgets the last key block
        keep = key.shape[-2] - block // 2
        return naive_attention(query, key[..., :keep, :], value[..., :keep, :])

    monkeypatch.setitem(PATHS, "tiled", broken)
    runs[("tiled", 0)] = recall.run(**steps, attention="tiled")
    result = claim_results(sweep_rows(runs))
    assert result["tiled and naive attention train as sdpa does from the same seed"] == "FAIL"


def test_the_recall_claims_fail_for_a_path_that_cannot_see_the_pairs(monkeypatch):
    """Attention that only sees each position itself: no recall with full attention (FAIL),
    and chance with the short window (PASS), from real, short training."""

    def itself(query, key, value, causal=True, window=0, dropout=0.0):
        return value.repeat_interleave(query.shape[-3] // value.shape[-3], dim=-3)

    monkeypatch.setitem(PATHS, "sdpa", itself)
    run = {**SHORT, "steps": 50, "batch": 32, "checkpoint_every": 1000}
    runs = {("sdpa", 0): recall.run(**run), ("sdpa", 4): recall.run(**run, window=4)}
    result = claim_results(sweep_rows(runs))
    assert result["with full attention octlm learns to recall, on every seed and path"] == "FAIL"
    assert result["a window too short to reach the pairs stays at chance"] == "PASS"


def test_the_report_tables_and_curves(tmp_path):
    rows = sweep_rows({("sdpa", 0): recall.run(**SHORT), ("naive", 0): recall.run(**SHORT,
                       attention="naive")})  # fmt: skip
    tables = deriving.tables(rows)
    final = tables["final"]
    assert final["last_step"].tolist() == [12, 12] and final["accuracy"].between(0, 1).all()
    assert (final["status"] == "ok").all() and final["tokens_per_s"].gt(0).all()
    sections = report.sections(rows, tables, tmp_path)
    assert any("Final values" in part for part in sections)
    assert (tmp_path / "exp017_recall-curves.png").stat().st_size > 0
    # A point whose run is still going (its rows "running") has no final values yet.
    rows.loc[rows["job"] == 1, "status"] = store.RUNNING
    rows = rows[~((rows["job"] == 1) & (rows["phase"] == "eval"))]
    final = deriving.tables(rows)["final"].set_index("job")
    assert final.loc[1, "status"] == "running" and pd.isna(final.loc[1, "accuracy"])


def test_the_report_finds_a_points_parameters_in_its_rows():
    """From the rows alone, as the harness writes them: not the harness's columns nor the
    measurements, and a parameter the report never heard of too."""
    rows = pd.DataFrame([
        {"job": job, "status": "ok", "attention": attention, "new_knob": [job], "phase": phase,
         "step": step, "loss": 1.0 / step, "accuracy": 0.5, "tokens_per_s": 100.0 * step,
         "duration_s": step / 10, "config_hash": f"h{job}", "grad_norm": step * 2.0}
        for job, attention in enumerate(["sdpa", "tiled"])
        for phase, step in [("train", 1), ("train", 2), ("eval", 2)]
    ])  # fmt: skip
    assert deriving.parameters(rows) == ["attention", "new_knob"]
    assert deriving.tables(rows)["final"]["new_knob"].tolist() == [[0], [1]]
