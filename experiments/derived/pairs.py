"""What the training experiments' tables share: each point paired with the reference point of
the same other parameters (its seed among them), and how far apart their training losses lie
over the first steps both have."""

from collections.abc import Iterator

import pandas as pd


def early_losses(rows: pd.DataFrame, steps: int) -> pd.DataFrame:
    """The training loss of the first `steps` steps, a column per job (none without steps)."""
    if "phase" not in rows or "step" not in rows:
        return pd.DataFrame()
    early = rows[(rows["phase"] == "train") & (rows["step"] <= steps)]
    return early.pivot_table(index="step", columns="job", values="loss")


def with_reference(
    final: pd.DataFrame, column: str, reference: str, shared: list[str], skipped: tuple = ()
) -> Iterator[tuple[pd.Series, pd.Series]]:
    """(point, its reference point) for each point whose `column` is neither `reference` nor
    one of `skipped` and that has a point of `reference` with the same `shared` parameters (a
    missing value equal to itself)."""
    keys = final[shared].map(repr)
    bases = final[final[column] == reference]
    others = final[final[column].notna() & ~final[column].isin((reference, *skipped))]
    for _, point in others.iterrows():
        same = bases[(keys.loc[bases.index] == keys.loc[point.name]).all(axis=1)]
        if not same.empty:
            yield point, same.iloc[0]


def loss_gap(losses: pd.DataFrame, base: pd.Series, point: pd.Series) -> tuple[int, float]:
    """How many of early_losses' steps both points have, and the largest difference of their
    losses over them (NaN where they share none)."""
    both = [base["job"], point["job"]]
    steps = losses[both].dropna() if all(job in losses for job in both) else pd.DataFrame()
    gap = (steps[both[0]] - steps[both[1]]).abs().max() if len(steps) else float("nan")
    return len(steps), gap
