"""exp017_recall's derived tables: each point's final values, the agreement of the attention
paths' losses from the same seed, and that of a point trained across processes (ddp) with one
process trained alone.

A point's parameters are found in its rows, as the harness writes them: each row carries its
point's parameters beside its measurements."""

import pandas as pd

from harness import store
from octlm_experiments.derived.pairs import early_losses, loss_gap, with_reference

MEASURED = ["phase", "step", "loss", "accuracy", "tokens_per_s", "learning_rate", "chance",
            "single_loss_diff"]  # fmt: skip
REFERENCE = "sdpa"  # the path every other one is compared with, from the same seed
NOT_COMPARED = (REFERENCE, "auto")  # auto: sdpa itself at these lengths
AGREEMENT_STEPS = 100  # two paths' losses are compared over their first steps, this many at most
# (a claim over them says how many it needs: `needs: compared_steps >= 100`)


def parameters(rows: pd.DataFrame) -> list[str]:
    """The points' parameter columns, from the rows (store.parameter_columns)."""
    return store.parameter_columns(rows, MEASURED)


def tables(rows: pd.DataFrame) -> dict[str, pd.DataFrame]:
    final = final_values(rows)
    return {"final": final, "agreement": agreement(rows, final), "ddp": across(rows, final)}


def final_values(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per point: its parameters, status, held-out loss and accuracy (the eval row),
    chance, the last step trained and the median tokens per second of its steps."""
    points = rows.drop_duplicates("job").set_index("job")[parameters(rows)]
    points.insert(0, "status", store.job_statuses(rows))
    phase = rows["phase"] if "phase" in rows else pd.Series(None, index=rows.index)
    evals = rows[phase == "eval"].drop_duplicates("job", keep="last").set_index("job")
    kept = [c for c in ("job", "step", "tokens_per_s") if c in rows]
    train = rows.loc[phase == "train", kept].groupby("job")
    for column, values in (
        ("loss", evals.get("loss")),
        ("accuracy", evals.get("accuracy")),
        ("chance", evals.get("chance")),
        ("last_step", train["step"].max() if len(train) and "step" in kept else None),
        ("tokens_per_s", train["tokens_per_s"].median() if "tokens_per_s" in kept else None),
    ):
        points[column] = values if values is not None else float("nan")
    return points.reset_index()


def agreement(rows: pd.DataFrame, final: pd.DataFrame) -> pd.DataFrame:
    """For each point of another attention path, the largest difference between its training
    loss and the REFERENCE point's of the same other parameters (seed included) over the first
    AGREEMENT_STEPS steps (compared_steps: how many both have); status ok when both ended ok."""
    if "phase" not in rows or "attention" not in final:
        return pd.DataFrame()
    shared = [p for p in parameters(rows) if p in final and p != "attention"]
    losses, lines = early_losses(rows, AGREEMENT_STEPS), []
    for other, base in with_reference(final, "attention", REFERENCE, shared, NOT_COMPARED):
        steps, gap = loss_gap(losses, base, other)
        ok = base["status"] == other["status"] == "ok" and steps > 0
        lines.append({**other[shared].to_dict(), "attention": other["attention"],
                      "against": REFERENCE, "status": "ok" if ok else "incomplete",
                      "compared_steps": steps,
                      "max_loss_diff": gap if ok else float("nan")})  # fmt: skip
    return pd.DataFrame(lines)


def across(rows: pd.DataFrame, final: pd.DataFrame) -> pd.DataFrame:
    """For each point trained across processes (ddp), the largest difference between its loss
    and that of the copy rank 0 trained alone on the whole batch (single_loss_diff) over the
    first AGREEMENT_STEPS steps (compared_steps: how many it has), and its processes; status ok
    when it ended ok (a point that did not has a line without a value)."""
    shared = [p for p in parameters(rows) if p in final]
    columns = [*shared, "world_size", "status", "compared_steps", "max_loss_diff"]
    if "ddp" not in final:
        return pd.DataFrame(columns=columns)
    differences = pd.Series(dtype=float)
    if {"single_loss_diff", "phase", "step"} <= set(rows):
        early = rows[(rows["phase"] == "train") & (rows["step"] <= AGREEMENT_STEPS)]
        differences = early.set_index("job")["single_loss_diff"].dropna()
    processes = rows.groupby("job")["world_size"].max() if "world_size" in rows else {}
    lines = []
    for _, point in final[final["ddp"].fillna(False).astype(bool)].iterrows():
        steps = differences[differences.index == point["job"]]
        ok = point["status"] == "ok" and steps.size > 0
        lines.append({**point[shared].to_dict(), "world_size": processes.get(point["job"]),
                      "status": "ok" if ok else "incomplete", "compared_steps": steps.size,
                      "max_loss_diff": steps.max() if ok else float("nan")})  # fmt: skip
    return pd.DataFrame(lines, columns=columns)
