"""exp019_precision: each precision's point trains for real and ends with a complete final row,
a precision the device cannot run is an unsupported row, a checkpoint continues the same run,
each claim fails on rows that break it, and the report's tables."""

import inspect
import math
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from test_recall import Dying, tracker  # the killed-and-resumed trainer's tracker, as exp017's

from harness import store
from harness.results import claims
from octlm_analysis import precision as report
from octlm_experiments import attention, paths, precision
from octlm_experiments.derived import precision as deriving

TINY = {"width": 16, "length": 16, "steps": 6, "batch": 2, "warmup_steps": 2, "device": "cpu"}
# The tiny runs the module shares: 12 steps, checkpoints at 5 and 10 (none taken without a
# tracker), as the resumed runs below take them, so that they are those runs never interrupted.
RUN = {**TINY, "steps": 12, "checkpoint_every": 5}
CONFIG = Path(__file__).resolve().parent.parent / "conf" / "experiment" / "exp019_precision.yaml"
DEFAULTS = {name: parameter.default for name, parameter in
            inspect.signature(precision.run).parameters.items() if name != "tracker"}  # fmt: skip
BACKENDS = {"flash", "efficient", "cudnn", "math"}
GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
# The tests that take tiny_runs, on one of pytest-xdist's workers (--dist loadgroup): the runs
# (each measures its step in a child of its own) are made once, not once on each worker.
TINY_RUNS = pytest.mark.xdist_group("precision-tiny-runs")


@pytest.fixture(scope="module")
def tiny_runs():
    """Each precision's tiny run (RUN), once for the module."""
    return {name: precision.run(**RUN, precision=name) for name in precision.PRECISIONS}


@TINY_RUNS
@pytest.mark.process  # tiny_runs: each run measures its step in a child of its own
@pytest.mark.parametrize("name", list(precision.PRECISIONS))
def test_each_precision_trains_and_ends_with_a_complete_final_row(name, tiny_runs):
    *train, final = tiny_runs[name]
    assert [r["step"] for r in train] == list(range(1, 13)) and final["phase"] == "final"
    for row in train:
        assert row["phase"] == "train" and row["loss"] > 0 and row["tokens_per_s"] > 0
        assert 0 <= row["zero_grad_fraction"] <= 1 and 0 <= row["accuracy"] <= 1
    assert final.get("status", "ok") == "ok" and final["device_used"] == "cpu"
    assert final["tokens_per_s"] > 0 and final["tokens_per_s_iqr"] >= 0
    assert final["timed_steps"] == 10  # the steps after warmup_steps
    assert final["rss_delta_mib"] >= 0 and "cuda_peak_mib" not in final, "memory named as measured"
    assert final["sdpa_forward"] in BACKENDS and final["sdpa_backward"] in BACKENDS
    fused = final["sdpa_forward"] in precision.FUSED and final["sdpa_backward"] in precision.FUSED
    assert final["sdpa_fused_ops"] == (2 * DEFAULTS["layers"] if fused else 0)
    assert 0 < final["matmul_share"] <= 1 and final["matmul_ms"] > 0
    assert 0 <= final["eval_accuracy"] <= 1 and final["chance"] == 1 / 16
    if name == "float16":
        assert final["loss_scaling"] == "GradScaler" and final["final_scale"] > 0
        assert final["skipped_steps"] >= 0 and all(r["loss_scale"] > 0 for r in train)
    else:  # no scaler: none, not zero
        assert final["loss_scaling"] == "none"
        assert final["final_scale"] is None and final["skipped_steps"] is None
        assert all(r["loss_scale"] is None and r["step_skipped"] is None for r in train)


@TINY_RUNS
@pytest.mark.process
def test_the_precisions_start_from_the_same_weights_and_batches(tiny_runs):
    """The seed fixes the initial weights and the data: the first step's losses differ by
    rounding only."""
    first = {name: rows[0]["loss"] for name, rows in tiny_runs.items()}
    assert all(loss == pytest.approx(first["float32"], abs=1e-2) for loss in first.values())
    assert first["bfloat16"] != first["float32"], "autocast ran"


def test_a_precision_autocast_refuses_is_an_unsupported_row(monkeypatch):
    """CPU autocast takes bfloat16 and float16 only; for another dtype it warns and disables
    itself, which would train float32 under the precision's name."""
    monkeypatch.setitem(precision.PRECISIONS, "float16", (torch.float64, True))
    [row] = precision.run(**TINY, precision="float16")
    assert row["status"] == "unsupported" and "not supported" in row["error"]
    assert row["phase"] == "final" and row["device_used"] == "cpu"


def test_a_kernel_the_device_lacks_for_the_dtype_is_an_unsupported_row(monkeypatch):
    def no_half(query, key, value, **options):
        if query.dtype == torch.float16:
            raise RuntimeError("\"scaled_dot_product_attention\" not implemented for 'Half'")
        return attention.naive_attention(query, key, value, **options)

    monkeypatch.setitem(paths.PATHS, "sdpa", no_half)
    [row] = precision.run(**TINY, precision="float16_unscaled")
    assert row["status"] == "unsupported" and "not implemented for 'Half'" in row["error"]


def test_an_error_that_is_no_missing_kernel_still_raises(monkeypatch):
    def broken(query, key, value, **options):
        raise RuntimeError("shapes do not match")

    monkeypatch.setitem(paths.PATHS, "sdpa", broken)
    with pytest.raises(RuntimeError, match="shapes do not match"):
        precision.run(**TINY, precision="bfloat16")


@TINY_RUNS
@pytest.mark.process
@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_a_run_resumed_from_its_checkpoint_continues_the_same_run(tmp_path, name, tiny_runs):
    """Killed at step 8 (checkpoints at 5 and 10), resumed: the same losses, step for step, as a
    run never interrupted (tiny_runs': weights, optimizer, scaler and data generator restored),
    and a final row over all 12 steps."""
    run = {**RUN, "precision": name}
    *straight, final = tiny_runs[name]
    dying = tracker(tmp_path, Dying, at=8)
    with pytest.raises(KeyboardInterrupt):
        precision.run(**run, tracker=dying)
    dying.close()
    again = tracker(tmp_path)
    [resumed] = precision.run(**run, tracker=again)
    again.end([])
    rows = store.job_rows(tmp_path / "job-000000.parquet")
    assert [r["step"] for r in rows] == list(range(1, 13))
    assert [r["loss"] for r in rows] == [r["loss"] for r in straight]
    assert [r.get("loss_scale") for r in rows] == [r["loss_scale"] for r in straight]
    for column in ("timed_steps", "zero_grad_fraction", "skipped_steps", "final_scale"):
        assert resumed[column] == final[column], column


@pytest.mark.parametrize(
    "given, said",
    [
        ({"length": 15}, "length=15 must hold the 8 pairs and 4 queries"),
        ({"warmup_steps": 6}, "warmup_steps=6 must leave steps to time"),
        ({"width": 18}, "must be an even multiple of heads"),
        ({"steps": 0}, "steps must be positive"),
    ],
)
def test_bad_values_are_refused_with_one_line(given, said):
    with pytest.raises(ValueError, match=said):
        precision.run(**{**TINY, **given})


# The claims, on hand-built rows: a sweep's points as the store holds them.

HEALTHY = {  # a final row that meets every claim, on the CPU
    "float32": {"tokens_per_s": 10_000.0, "zero_grad_fraction": 0.0, "matmul_share": 0.3},
    "bfloat16": {"tokens_per_s": 3_000.0, "zero_grad_fraction": 0.0, "matmul_share": 0.6},
    "float16": {"tokens_per_s": 2_500.0, "zero_grad_fraction": 0.0, "matmul_share": 0.6},
    "float16_unscaled": {"tokens_per_s": 2_600.0, "zero_grad_fraction": 1e-3,
                         "matmul_share": 0.6},
}  # fmt: skip
LOSS_OFFSET = {"float32": 0.0, "bfloat16": 1e-3, "float16": 1.5e-4, "float16_unscaled": 1.5e-4}
CUDA = {"device_used": "cuda:0", "capability": 9.0}


def sweep(changed: dict | None = None, offsets: dict | None = None, **common) -> pd.DataFrame:
    """A point per precision: 100 training rows (float32's loss plus the precision's offset),
    then its final row (HEALTHY, with `changed[precision]` and `common` over it)."""
    rows = []
    for job, name in enumerate(precision.PRECISIONS):
        params = {**DEFAULTS, "precision": name}
        offset = (offsets or LOSS_OFFSET)[name]
        rows += [{"job": job, "status": "ok", **params, "phase": "train", "step": step,
                  "loss": 5.0 - step / 50 + offset * math.sin(step)}
                 for step in range(1, 101)]  # fmt: skip
        final = {
            "device_used": "cpu",
            "sdpa_forward": "flash",
            "sdpa_backward": "flash",
            "sdpa_fused_ops": 4,
            **HEALTHY[name],
            **common,
            **(changed or {}).get(name, {}),
        }
        if final["device_used"] == "cpu":
            final["rss_delta_mib"] = 5.0
        rows.append({"job": job, "status": "ok", **params, "phase": "final", **final})
    return pd.DataFrame(rows)


def results(rows: pd.DataFrame) -> dict[str, str]:
    config = yaml.safe_load(CONFIG.read_text())["experiment"]
    table = claims.claims_table(rows, config)
    return dict(zip(table["claim"].str.split(" \\(").str[0], table["result"], strict=True))


SLOWER = "on the CPU, bfloat16 autocast trains slower than float32, not faster"
BF16_LOSS = "on the CPU, bfloat16's loss follows float32's over the first 100 steps from one seed"
FP16_LOSS = "float16 with a GradScaler tracks float32's loss over the first 100 steps"
UNDERFLOW = "without the scaler, float16 gradients underflow to zero where float32's do not"
CUDA_SPEED = ("on CUDA, bfloat16 and float16 train at least 1.5x faster than float32 where it "
              "is matmul-bound")  # fmt: skip
CUDA_SPEED_LAUNCH = ("on CUDA, bfloat16 and float16 train at least 0.2x as fast as float32 "
                     "where it is not matmul-bound")  # fmt: skip
CUDA_MEMORY = ("on CUDA, half precision's step takes less memory than float32's where it is "
               "matmul-bound")  # fmt: skip
CUDA_SDPA = ("on CUDA, SDPA runs half precision in a fused kernel both ways, the memory-efficient "
             "one below sm80")  # fmt: skip


def test_healthy_cpu_rows_pass_the_cpu_claims_and_leave_the_cuda_ones_out():
    said = results(sweep())
    assert [said[c] for c in (SLOWER, BF16_LOSS, FP16_LOSS, UNDERFLOW)] == ["PASS"] * 4
    assert [said[c] for c in (CUDA_SPEED, CUDA_MEMORY, CUDA_SDPA)] == ["N/A"] * 3


@pytest.mark.parametrize(
    "changed, claim",
    [
        ({"bfloat16": {"tokens_per_s": 12_000.0}}, SLOWER),  # faster than float32 here
        ({"bfloat16": {"tokens_per_s": 10_000.0}}, SLOWER),  # the same: no bfloat16 ran
        ({"float16_unscaled": {"zero_grad_fraction": 0.0}}, UNDERFLOW),  # nothing underflowed
        ({"float16_unscaled": {"zero_grad_fraction": 0.5}}, UNDERFLOW),  # far more than that
    ],
)
def test_a_cpu_claim_fails_on_rows_that_break_it(changed, claim):
    assert results(sweep(changed))[claim] == "FAIL"


@pytest.mark.parametrize(
    "offsets, claim",
    [
        ({**LOSS_OFFSET, "bfloat16": 0.0}, BF16_LOSS),  # float32 itself: autocast did not run
        ({**LOSS_OFFSET, "bfloat16": 0.1}, BF16_LOSS),  # another computation
        ({**LOSS_OFFSET, "float16": 0.0}, FP16_LOSS),
        ({**LOSS_OFFSET, "float16": 0.05}, FP16_LOSS),  # what an unscaled underflow could do
    ],
)
def test_a_loss_agreement_claim_fails_on_losses_that_break_it(offsets, claim):
    assert results(sweep(offsets=offsets))[claim] == "FAIL"


def cuda_sweep(changed: dict | None = None, share: float = 0.8) -> dict[str, str]:
    """A matmul-bound sweep on an sm90 GPU (float32's matmul share `share`) that meets every
    CUDA claim, with `changed` over its final rows."""
    healthy = {"float32": {"tokens_per_s": 1e6, "matmul_share": share, "cuda_peak_mib": 1000.0},
               "bfloat16": {"tokens_per_s": 3e6, "cuda_peak_mib": 600.0},
               "float16": {"tokens_per_s": 3e6, "cuda_peak_mib": 600.0},
               "float16_unscaled": {"tokens_per_s": 3e6, "cuda_peak_mib": 600.0}}  # fmt: skip
    merged = {name: {**healthy[name], **(changed or {}).get(name, {})} for name in healthy}
    return results(sweep(merged, **CUDA))


def test_healthy_cuda_rows_pass_the_cuda_claims_and_leave_the_cpu_ones_out():
    said = cuda_sweep()
    assert [said[c] for c in (CUDA_SPEED, CUDA_MEMORY, CUDA_SDPA)] == ["PASS"] * 3
    assert [said[c] for c in (SLOWER, BF16_LOSS, FP16_LOSS)] == ["N/A"] * 3


@pytest.mark.parametrize(
    "changed, claim",
    [
        ({"bfloat16": {"tokens_per_s": 1.2e6}}, CUDA_SPEED),  # matmul-bound, 1.2x only
        ({"float16": {"tokens_per_s": 1e6}}, CUDA_SPEED),
        ({"bfloat16": {"cuda_peak_mib": 1000.0}}, CUDA_MEMORY),  # no saving
        ({"float16": {"sdpa_forward": "math", "sdpa_fused_ops": 2}}, CUDA_SDPA),
        ({"bfloat16": {"sdpa_fused_ops": 2}}, CUDA_SDPA),  # one direction only
    ],
)
def test_a_cuda_claim_fails_on_rows_that_break_it(changed, claim):
    assert cuda_sweep(changed)[claim] == "FAIL"


def test_a_launch_bound_step_need_not_be_faster_in_half_precision():
    """Where float32's step is not matmul-bound (its matmul share under 0.6) half precision is
    held only to 0.2x; under that it fails."""
    slower = {"bfloat16": {"tokens_per_s": 9e5}, "float16": {"tokens_per_s": 9e5}}
    launch_bound = cuda_sweep(slower, share=0.2)
    assert (launch_bound[CUDA_SPEED_LAUNCH], launch_bound[CUDA_SPEED]) == ("PASS", "N/A")
    matmul_bound = cuda_sweep(slower, share=0.8)
    assert (matmul_bound[CUDA_SPEED_LAUNCH], matmul_bound[CUDA_SPEED]) == ("N/A", "FAIL")
    crawling = {"bfloat16": {"tokens_per_s": 1e5}}
    assert cuda_sweep(crawling, share=0.2)[CUDA_SPEED_LAUNCH] == "FAIL"


def test_below_sm80_the_memory_efficient_kernel_is_expected():
    """The seed's T4 (sm75): float16 through efficient passes, through flash fails (flash does
    not exist there, so a row saying so is broken); bfloat16 is not claimed there."""
    t4 = {"capability": 7.5}
    efficient = {"sdpa_forward": "efficient", "sdpa_backward": "efficient", **t4}
    through = {name: efficient for name in ("float32", "bfloat16", "float16", "float16_unscaled")}
    assert cuda_sweep(through)[CUDA_SDPA] == "PASS"
    flash = {**through, "float16": {"sdpa_forward": "flash", "sdpa_backward": "flash", **t4}}
    assert cuda_sweep(flash)[CUDA_SDPA] == "FAIL"


@TINY_RUNS
@pytest.mark.process
def test_the_report_tables_and_plot(tiny_runs, tmp_path):
    rows = pd.DataFrame(
        [{"job": job, "status": row.get("status", "ok"), **DEFAULTS, **RUN, "precision": name,
          **row} for job, (name, run) in enumerate(tiny_runs.items()) for row in run]
    )  # fmt: skip
    tables = deriving.tables(rows)
    final, versus = tables["final"], tables["versus_float32"]
    assert final["precision"].tolist() == list(precision.PRECISIONS)
    assert (final["status"] == "ok").all() and final["tokens_per_s"].gt(0).all()
    assert final["sdpa_expected_ops"].tolist() == final["sdpa_fused_ops"].tolist(), "CPU: fused"
    assert versus["precision"].tolist() == ["bfloat16", "float16", "float16_unscaled"]
    assert versus["speedup"].gt(0).all() and versus["cuda_peak_ratio"].isna().all()
    assert versus["compared_steps"].eq(12).all() and versus["max_loss_diff"].gt(0).all()
    parts = report.sections(rows, tables, tmp_path)
    assert any("Against float32" in part for part in parts)
    assert (tmp_path / "exp019_precision-loss.png").stat().st_size > 0


@pytest.mark.gpu
@pytest.mark.process  # it measures in a child process (harness.measuring.memory)
@GPU
@pytest.mark.parametrize("name", list(precision.PRECISIONS))
def test_a_cuda_point_has_the_allocators_peak_and_the_gpus_capability(name):
    *train, final = precision.run(**{**TINY, "device": "cuda", "width": 64, "length": 64},
                                  precision=name)  # fmt: skip
    if final.get("status") == "unsupported":  # bfloat16 before sm80, say
        assert final["error"]
        return
    assert final["device_used"].startswith("cuda") and final["capability"] >= 3.5
    assert final["cuda_peak_mib"] > 0 and "rss_delta_mib" not in final
    assert final["sdpa_forward"] in BACKENDS and final["sdpa_backward"] in BACKENDS
    assert 0 < final["matmul_share"] <= 1 and final["tokens_per_s"] > 0


@pytest.mark.gpu
@pytest.mark.process  # it measures in a child process (harness.measuring.memory)
@GPU
def test_float16_on_cuda_runs_sdpa_fused_both_ways():
    final = precision.run(**{**TINY, "device": "cuda", "width": 64, "length": 64},
                          precision="float16")[-1]  # fmt: skip
    assert final["sdpa_forward"] in precision.FUSED and final["sdpa_backward"] in precision.FUSED
    assert final["sdpa_fused_ops"] == 2 * DEFAULTS["layers"]
