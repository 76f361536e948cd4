"""exp017_recall in the report: each point's final values (held-out loss and accuracy, its
training throughput), the agreement of the attention paths' losses from the same seed, that of
a point trained across processes (ddp) with one process trained alone, and the curves of loss
and accuracy per step (a plot per sweep, a line per point).

A point's parameters are found in its rows, as the harness writes them (the report reads no
experiment code): each row carries its point's parameters beside its measurements."""

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure  # drawn to a file: no pyplot, no backend to choose

from analysis import plots
from harness import store
from harness.tables import markdown

MEASURED = ["phase", "step", "loss", "accuracy", "tokens_per_s", "learning_rate", "chance",
            "single_loss_diff"]  # fmt: skip
REFERENCE = "sdpa"  # the path every other one is compared with, from the same seed
NOT_COMPARED = (REFERENCE, "auto")  # auto: sdpa itself at these lengths
AGREEMENT_STEPS = 100  # two paths' losses are compared over their first steps, this many at most
# (a claim over them says how many it needs: `needs: compared_steps >= 100`)
SMOOTHING = 25  # steps in the running mean the curves draw
LEGEND = 12  # at most this many lines named in a PNG's legend


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
    early = rows[(rows["phase"] == "train") & (rows["step"] <= AGREEMENT_STEPS)]
    losses = early.pivot_table(index="step", columns="job", values="loss")
    lines = []
    reference = final[final["attention"] == REFERENCE]
    keys = final[shared].map(repr)  # a missing value equal to itself
    others = final[final["attention"].notna() & ~final["attention"].isin(NOT_COMPARED)]
    for _, other in others.iterrows():
        same = reference[(keys.loc[reference.index] == keys.loc[other.name]).all(axis=1)]
        if same.empty:
            continue
        base = same.iloc[0]
        both = [base["job"], other["job"]]
        steps = losses[both].dropna() if all(j in losses for j in both) else pd.DataFrame()
        ok = base["status"] == other["status"] == "ok" and len(steps) > 0
        difference = (steps[both[0]] - steps[both[1]]).abs().max() if ok else float("nan")
        lines.append({**other[shared].to_dict(), "attention": other["attention"],
                      "against": REFERENCE, "status": "ok" if ok else "incomplete",
                      "compared_steps": len(steps), "max_loss_diff": difference})  # fmt: skip
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


def sections(rows: pd.DataFrame, derived: dict, folder: Path) -> list[str]:
    final = derived["final"]
    varying = varied(final, parameters(rows))
    shown = final[["job", *varying, "status", "loss", "accuracy", "chance", "last_step",
                   "tokens_per_s"]]  # fmt: skip
    parts = ["Final values: held-out loss and accuracy, chance, steps trained, median training "
             "tokens per second:", markdown(shown, ".3g", index=False)]  # fmt: skip
    if "attention" in final and final["tokens_per_s"].notna().any():
        speed = final.groupby("attention")["tokens_per_s"].median()
        parts += ["Training tokens per second by attention path (median over its points):",
                  markdown(speed.to_frame(), ".4g")]  # fmt: skip
    agree = derived["agreement"]
    if not agree.empty:
        columns = [c for c in varying if c in agree and c != "attention"]
        caption = (f"Agreement with {REFERENCE} from the same seed: the largest difference of "
                   f"the training loss over the first {AGREEMENT_STEPS} steps")  # fmt: skip
        table = agree[[*columns, "attention", "compared_steps", "max_loss_diff"]]
        parts += [f"{caption}:", markdown(table, ".3g", index=False)]
    ddp = derived["ddp"]
    if not ddp.empty:
        columns = [c for c in varying if c in ddp]
        caption = ("Across processes (ddp) against one process alone on the whole batch, from "
                   "the same weights: the largest difference of the training loss over the "
                   f"first {AGREEMENT_STEPS} steps")  # fmt: skip
        table = ddp[[*columns, "world_size", "compared_steps", "max_loss_diff"]]
        parts += [f"{caption}:", markdown(table, ".3g", index=False)]
    plot = curves(rows, final, varying, folder / "exp017_recall-curves.png")
    if plot is not None:
        parts.append(f"![loss and accuracy per step]({plot.name})")
    return parts


def training_lines(
    rows: pd.DataFrame, final: pd.DataFrame, varied: list[str]
) -> list[tuple[str, pd.DataFrame]]:
    """Each point's training rows in step order, with its label (labels), [] without them."""
    if "phase" not in rows:
        return []
    train = _train(rows, ["loss", "accuracy"])
    names = labels(final, varied)
    return [(names[job], points) for job, points in train.groupby("job")]


def _train(rows: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    """The training rows' job, step and those of `metrics` they have, in job and step order."""
    columns = [c for c in ("job", "step", *metrics) if c in rows]
    return rows.loc[rows["phase"] == "train", columns].sort_values(["job", "step"], kind="stable")


def labels(final: pd.DataFrame, varied: list[str]) -> dict:
    """Each job's label: the parameters that vary in the sweep (`varied`), or where none does
    the settings that name a path (attention, window), as on the command line."""
    names = varied or [p for p in NAMED_BY if p in final]
    return {point["job"]: plots.label(point, names) for _, point in final.iterrows()}


NAMED_BY = ["attention", "window"]  # a point's label when no parameter varies


def figures_of(rows: pd.DataFrame, derived: dict, varied: list[str], held_out) -> list[dict]:
    """Loss, accuracy and tokens per second against step, a line per point (downsampled,
    analysis.plots.curves), the held-out loss and accuracy marked."""
    if "phase" not in rows:
        return []
    train = _train(rows, ["loss", "accuracy", "tokens_per_s"])
    names = labels(derived["final"], varied)
    shown = [plots.curves(train, names, metric, held_out if metric != "tokens_per_s" else None)
             for metric in ("loss", "accuracy", "tokens_per_s")]  # fmt: skip
    return [figure for figure in shown if figure is not None]


def figures(rows: pd.DataFrame, derived: dict) -> list[dict]:
    final = derived["final"]
    held_out = final.rename(columns={"last_step": "step"})[["job", "step", "loss", "accuracy"]]
    return figures_of(rows, derived, varied(final, parameters(rows)), held_out)


def varied(final: pd.DataFrame, params: list[str]) -> list[str]:
    """The parameters whose values differ between the points (lists compared as text)."""
    return [p for p in params if p in final and final[p].astype(str).nunique() > 1]


def curves(rows: pd.DataFrame, final: pd.DataFrame, varied: list[str], path: Path):
    """Training loss and accuracy against step, a line per point (a running mean of SMOOTHING
    steps, downsampled as on the page), the held-out values marked, in one PNG; None without
    training rows."""
    lines = training_lines(rows, final, varied)
    if not lines:
        return None
    figure = Figure(figsize=(11, 4))
    axes = figure.subplots(1, 2)
    held_out = final.set_index("job")
    for (label, points), job in zip(lines, [p["job"].iloc[0] for _, p in lines], strict=True):
        for axis, column in zip(axes, ("loss", "accuracy"), strict=True):
            smooth = points[column].rolling(SMOOTHING, min_periods=1).mean().to_numpy()
            steps, values = plots.downsample(points["step"].to_numpy(), smooth)
            (line,) = axis.plot(steps, values, label=label, linewidth=1)
            if job in held_out.index and pd.notna(held_out.loc[job, column]):
                axis.plot([held_out.loc[job, "last_step"]], [held_out.loc[job, column]], "D",
                          color=line.get_color(), markersize=6)  # fmt: skip
    for axis, column in zip(axes, ("loss", "accuracy"), strict=True):
        axis.set_xlabel("step")
        axis.set_ylabel(f"training {column} (mean of {SMOOTHING} steps)")
        axis.set_title(f"{column} per step (diamond: held out)")
        axis.grid(True, alpha=0.3)
    axes[0].set_yscale("log")
    if len(lines) <= LEGEND:
        axes[1].legend(fontsize="x-small")
    else:
        figure.suptitle(f"{len(lines)} points: index.html names each line", fontsize="small")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    return path
