"""exp019_precision in the report: each point's final values (throughput, memory, the gradients'
zero share, the scaler, the SDPA backends), each half-precision point against float32's point of
the same shape and seed, and the loss curves. The tables, and what their ratios are, are the
experiment's own (octlm_experiments.derived.precision).
"""

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure  # drawn to a file: no pyplot, no backend to choose

from harness.results.tables import markdown
from octlm_analysis.recall import figures_of, training_lines, varied
from octlm_experiments.derived.precision import AGREEMENT_STEPS, parameters


def sections(rows: pd.DataFrame, derived: dict, folder: Path) -> list[str]:
    final = derived["final"]
    varying = varied(final, parameters(rows))
    memory = [c for c in ("rss_delta_mib", "cuda_peak_mib") if final[c].notna().any()]
    shown = final[["job", *varying, "status", "tokens_per_s", "tokens_per_s_iqr", *memory,
                   "zero_grad_fraction", "final_scale", "skipped_steps", "eval_accuracy",
                   "sdpa_forward", "sdpa_backward", "matmul_share"]]  # fmt: skip
    parts = ["Final values: median training tokens per second after the warm-up steps and its "
             "IQR, one step's peak memory, the share of parameter gradients (the embedding's "
             "left out) exactly zero averaged over the steps, the scaler's final scale and "
             "skipped steps (none without a scaler), held-out accuracy, the SDPA backend of the "
             "forward and the backward, the step's share of time in matrix multiplies:",
             markdown(shown, ".3g", index=False)]  # fmt: skip
    versus = derived["versus_float32"]
    if not versus.empty:
        ratios = [c for c in ("rss_delta_ratio", "cuda_peak_ratio") if versus[c].notna().any()]
        columns = [c for c in varying if c in versus and c != "precision"]
        table = versus[[*columns, "precision", "speedup", *ratios, "zero_grad_fraction",
                        "float32_zero_grad_fraction", "max_loss_diff"]]  # fmt: skip
        parts += [f"Against float32 from the same seed: tokens per second and memory over "
                  f"float32's, the gradients' zero shares, the largest difference of the "
                  f"training loss over the first {AGREEMENT_STEPS} steps:",
                  markdown(table, ".3g", index=False)]  # fmt: skip
    plot = curves(rows, final, varying, folder / "exp019_precision-loss.png")
    if plot is not None:
        parts.append(f"![training loss per step]({plot.name})")
    return parts


def figures(rows: pd.DataFrame, derived: dict) -> list[dict]:
    """Loss, accuracy and tokens per second against step, a line per point
    (octlm_analysis.recall)."""
    final = derived["final"]
    varying = varied(final, parameters(rows))
    return figures_of(rows, derived, varying, None)


def curves(rows: pd.DataFrame, final: pd.DataFrame, varied: list[str], path: Path):
    """Training loss against step, a line per point, in one PNG; None without training rows."""
    lines = training_lines(rows, final, varied)
    if not lines:
        return None
    figure = Figure(figsize=(8, 4.5))
    axis = figure.subplots()
    for label, points in lines:
        axis.plot(points["step"], points["loss"], label=label, linewidth=0.8)
    axis.set_xlabel("step")
    axis.set_ylabel("training loss")
    axis.set_yscale("log")
    axis.legend(fontsize="xx-small", ncol=2)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    return path
