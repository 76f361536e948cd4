"""exp019_precision's derived tables: each point's final values, and each half-precision point
against float32's point of the same shape and seed.

A ratio here divides two points' figures, each a median over that point's own steps: the
precisions train one after another, so each met whatever load the machine had then. The claims
over them are bounded far from 1 (bfloat16 on this CPU runs at a fraction of float32's speed),
so a shift of load does not decide them.

Memory is compared as measured, never one kind for the other: rss_delta_ratio (resident memory
over the baseline, CPU) and cuda_peak_ratio (the CUDA allocator's peak, CUDA).
"""

import pandas as pd

from harness import store
from octlm_experiments.derived.pairs import early_losses, loss_gap, with_reference

REFERENCE = "float32"
AGREEMENT_STEPS = 100  # a precision's loss is compared with float32's over the first steps, this
# many at most (a claim over them says how many it needs: `needs: compared_steps >= 100`)
# The final row's columns that the tables carry (a point without one has them missing).
FINAL = ["device_used", "capability", "tokens_per_s", "tokens_per_s_iqr", "step_ms",
         "rss_delta_mib", "cuda_peak_mib", "zero_grad_fraction", "loss_scaling", "final_scale",
         "skipped_steps", "eval_loss", "eval_accuracy", "sdpa_forward", "sdpa_backward",
         "sdpa_fused_ops", "matmul_share"]  # fmt: skip
# The columns of a step's row, which a point's parameters are told from (store.parameter_columns).
STEP = ["phase", "step", "loss", "accuracy", "tokens_per_s", "learning_rate",
        "zero_grad_fraction", "loss_scale", "step_skipped"]  # fmt: skip
FUSED = ("flash", "efficient", "cudnn")  # SDPA's backends with kernels of their own
SM80 = 8.0  # flash attention needs sm80; below it the memory-efficient kernel runs half precision


def parameters(rows: pd.DataFrame) -> list[str]:
    """The points' parameter columns, from the rows (store.parameter_columns)."""
    return store.parameter_columns(rows, [*STEP, *FINAL])


def tables(rows: pd.DataFrame) -> dict[str, pd.DataFrame]:
    params = parameters(rows)
    final = final_values(rows, params)
    return {"final": final, "versus_float32": versus_float32(rows, final, params)}


def final_values(rows: pd.DataFrame, params: list[str]) -> pd.DataFrame:
    """One line per point: its parameters, status, its final row's values (FINAL), and
    sdpa_expected_ops (expected_ops)."""
    points = rows.drop_duplicates("job").set_index("job")[params]
    points.insert(0, "status", store.job_statuses(rows))
    phase = rows["phase"] if "phase" in rows else pd.Series(None, index=rows.index)
    final = rows[phase == "final"].drop_duplicates("job", keep="last").set_index("job")
    for column in FINAL:
        points[column] = final[column] if column in final else float("nan")
    points["sdpa_expected_ops"] = expected_ops(points)
    return points.reset_index()


def expected_ops(final: pd.DataFrame) -> pd.Series:
    """sdpa_fused_ops where both directions ran the fused kernel a GPU of that capability should
    run (the memory-efficient one below sm80, where flash does not exist; flash, efficient or
    cuDNN's from sm80 on), else 0: 2 * layers when SDPA ran as expected."""
    below = final["capability"] < SM80

    def expected(column: str) -> pd.Series:
        ran = final[column]
        return ran.isin(FUSED) & (~below | (ran == "efficient"))

    ops = pd.to_numeric(final["sdpa_fused_ops"], errors="coerce")
    return ops.where(expected("sdpa_forward") & expected("sdpa_backward"), 0.0)


def versus_float32(rows: pd.DataFrame, final: pd.DataFrame, params: list[str]) -> pd.DataFrame:
    """One line per point of another precision that has a float32 point of the same other
    parameters (seed included): status ok when both ended ok; its tokens per second over
    float32's (speedup), its memory over float32's (rss_delta_ratio or cuda_peak_ratio), float32's
    matmul share, both zero-gradient shares, and the largest difference of their training losses
    over the first AGREEMENT_STEPS steps both have (compared_steps: how many)."""
    if "precision" not in final:
        return pd.DataFrame()
    shared = [p for p in params if p != "precision"]
    losses = early_losses(rows, AGREEMENT_STEPS)
    pairs = with_reference(final, "precision", REFERENCE, shared)
    return pd.DataFrame([compared(point, base, shared, losses) for point, base in pairs])


def compared(point: pd.Series, base: pd.Series, shared: list[str], losses) -> dict:
    """versus_float32's line for one point against its float32 point."""
    steps, gap = loss_gap(losses, base, point)
    ok = point["status"] == base["status"] == "ok"
    return {
        **point[shared].to_dict(), "precision": point["precision"],
        "device_used": point["device_used"], "capability": point["capability"],
        "status": "ok" if ok else "incomplete",
        "speedup": _ratio(point, base, "tokens_per_s"),
        "rss_delta_ratio": _ratio(point, base, "rss_delta_mib"),
        "cuda_peak_ratio": _ratio(point, base, "cuda_peak_mib"),
        "float32_matmul_share": base["matmul_share"],
        "zero_grad_fraction": point["zero_grad_fraction"],
        "float32_zero_grad_fraction": base["zero_grad_fraction"],
        "compared_steps": steps, "max_loss_diff": gap,
    }  # fmt: skip


def _ratio(point: pd.Series, base: pd.Series, column: str) -> float:
    value, reference = (pd.to_numeric(s[column], errors="coerce") for s in (point, base))
    return value / reference if reference else float("nan")
