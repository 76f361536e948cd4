"""exp017_recall in the report: each point's final values (held-out loss and accuracy, its
training throughput), the agreement of the attention paths' losses from the same seed, that of
a point trained across processes (ddp) with one process trained alone, and the curves of loss
and accuracy per step (a plot per sweep, a line per point).

The tables are the experiment's own, which its claims read too (octlm_experiments.derived.recall).
A point's parameters are found in its rows, as the harness writes them: each row carries its
point's parameters beside its measurements."""

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure  # drawn to a file: no pyplot, no backend to choose

from harness.results.tables import markdown
from octlm_analysis import plots
from octlm_experiments.derived.recall import AGREEMENT_STEPS, REFERENCE, parameters

SMOOTHING = 25  # steps in the running mean the curves draw
LEGEND = 12  # at most this many lines named in a PNG's legend


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
    octlm_analysis.plots.curves), the held-out loss and accuracy marked."""
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
