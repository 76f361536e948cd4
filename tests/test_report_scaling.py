"""The scaling reports (exp015_backends, exp016_backward_memory): derived tables, the configs'
own claims and plots, from rows with known answers."""

import pandas as pd
import pytest
from omegaconf import OmegaConf

from harness.names import CONF
from harness.results.claims import claims_table
from octlm_analysis import backends, backward_memory
from octlm_experiments.derived import backends as backends_tables
from octlm_experiments.derived import backward_memory as backward_memory_tables
from octlm_experiments.derived.scaling import with_memory


def experiment_config(name: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(CONF / "experiment" / f"{name}.yaml").experiment)


# Two CPU sweeps' worth of rows: memory x4 per doubling for math, flat for flash.
MATH_MIB = {1024: 100.0, 2048: 400.0, 4096: 1600.0, 8192: 6400.0}
FLASH_MIB = {1024: 5.0, 2048: 6.0, 4096: 8.0, 8192: 12.0}


def rows(math_mib=MATH_MIB, flash_ms_at_8192=300.0, device="cpu"):
    lines, job = [], 0
    memory_column = "cuda_peak_mib" if device.startswith("cuda") else "rss_delta_mib"
    for backend, memory in (("math", math_mib), ("flash", FLASH_MIB)):
        for length, mib in memory.items():
            time_ms = (length / 1024) ** 2 * (40.0 if backend == "math" else 4.0)
            if backend == "flash" and length == 8192:
                time_ms = flash_ms_at_8192
            lines.append({"job": job, "status": "ok", "backend": backend, "length": length,
                          "dtype": "float32", "device_used": device, "batch": 1, "heads": 8,
                          "head_dim": 32, "causal": True, "time_ms": time_ms, "time_iqr_ms": 1.0,
                          "inputs_mib": 3 * length / 1024, memory_column: mib})  # fmt: skip
            job += 1
    refused = {"status": "unsupported", "error": "No viable backend", "backend": "efficient"}
    lines.append({"job": job, **refused, "length": 1024, "dtype": "float32", "device_used": device,
                  "batch": 1, "heads": 8, "head_dim": 32, "causal": True})  # fmt: skip
    return pd.DataFrame(lines)


CONFIG = experiment_config("exp015_backends")


def test_growth_speedup_and_memory_over_inputs():
    derived = backends_tables.tables(rows())
    growth = derived["growth"].set_index(["backend", "length"])
    assert growth.loc[("math", 8192), "memory_growth"] == 4.0
    assert growth.loc[("flash", 2048), "memory_growth"] == 6.0 / 5.0
    assert growth.loc[("math", 2048), "time_growth"] == 4.0
    assert 1024 not in growth.index.get_level_values("length")
    speedup = derived["speedup"].set_index(["backend", "length"])["speedup_over_math"]
    assert speedup[("flash", 8192)] == pytest.approx(40.0 * 64 / 300.0)
    assert speedup[("efficient", 1024)] != speedup[("efficient", 1024)], "missing: NaN"
    measured = derived["measurements"].set_index(["backend", "length"])
    assert measured.loc[("flash", 8192), "memory_over_inputs"] == 12.0 / 24.0
    assert set(measured["memory_kind"].dropna()) == {"rss_delta_mib"}


CUDA_CLAIMS = ["N/A"] * 4  # the CUDA claims, on a CPU sweep


def test_the_speedup_and_time_growth_are_each_points_own_where_rows_carry_them():
    """Flash at 8,192 timed while the machine was 60x slower: its median over math's (another
    process, another moment) is under 2x; the speedup its own process timed in turns with math
    is what counts. Rows without their own ratios (older sweeps) keep the ratio of medians."""
    loaded = rows(flash_ms_at_8192=256.0 * 60)
    assert claims_table(loaded, CONFIG)["result"].tolist()[2] == "FAIL"
    own = loaded.assign(
        speedup_over_math=(loaded["backend"] == "flash") * 10.0,
        time_growth=4.0,
    )
    own.loc[own["backend"] == "math", "speedup_over_math"] = None
    assert claims_table(own, CONFIG)["result"].tolist() == ["PASS"] * 3 + CUDA_CLAIMS
    derived = backends_tables.tables(own)
    speedup = derived["speedup"].set_index(["backend", "length"])
    assert speedup.loc[("flash", 8192), "speedup_over_math"] == 10.0
    assert speedup.loc[("flash", 8192), "speedup_over_math_paired"]
    assert ("math", 8192) not in speedup.index
    growth = derived["growth"].set_index(["backend", "length"])
    assert growth.loc[("flash", 8192), "time_growth"] == 4.0
    assert 1024 not in growth.index.get_level_values("length"), "the same lines as before"
    assert growth.loc[("math", 8192), "memory_growth"] == 4.0, "memory: across points, as ever"
    assert derived["fused"]["fused_speedup_over_math"].max() == 10.0


def test_the_seeds_claims_pass_on_seed_like_rows_and_fail_when_they_should():
    assert claims_table(rows(), CONFIG)["result"].tolist() == ["PASS"] * 3 + CUDA_CLAIMS
    slower_flash = claims_table(rows(flash_ms_at_8192=10_000.0), CONFIG)
    assert slower_flash["result"].tolist() == ["PASS", "PASS", "FAIL"] + CUDA_CLAIMS
    linear_math = claims_table(rows(math_mib={1024: 100, 2048: 200, 4096: 400, 8192: 800}), CONFIG)
    assert linear_math["result"].tolist()[0] == "FAIL"


def half_precision(capability: float, flash: str, efficient: str) -> pd.DataFrame:
    """math, flash and efficient in bfloat16 at 4,096 on a GPU of this capability: math 40 ms,
    flash and efficient, with these statuses, 4 ms when ok."""
    statuses = (("math", "ok"), ("flash", flash), ("efficient", efficient))
    return pd.DataFrame(
        [{"job": 100 + i, "status": status, "backend": backend, "length": 4096,
          "dtype": "bfloat16", "device_used": "cuda:0", "batch": 1, "heads": 8, "head_dim": 32,
          "causal": True, "capability": capability}
         | ({"time_ms": 40.0 if backend == "math" else 4.0} if status == "ok" else {})
         for i, (backend, status) in enumerate(statuses)]
    )  # fmt: skip


def test_the_cuda_claims_on_a_gpu_sweep_and_gpu_memory_keeps_its_name():
    gpu = rows(device="cuda:0")
    hopper = pd.concat([gpu, half_precision(9.0, "ok", "ok")], ignore_index=True)
    assert claims_table(hopper, CONFIG)["result"].tolist() == ["N/A"] * 3 + ["PASS"] * 4
    refused = pd.concat([gpu, half_precision(9.0, "unsupported", "unsupported")])
    assert claims_table(refused, CONFIG)["result"].tolist()[3] == "INCOMPLETE"
    efficient_only = pd.concat([gpu, half_precision(8.0, "unsupported", "ok")])
    assert claims_table(efficient_only, CONFIG)["result"].tolist()[3] == "PASS"
    turing = pd.concat([gpu, half_precision(7.5, "unsupported", "unsupported")])
    assert claims_table(turing, CONFIG)["result"].tolist()[3] == "N/A", "no bfloat16 before sm80"
    flat_math = rows(device="cuda:0", math_mib={1024: 100, 2048: 200, 4096: 400, 8192: 800})
    assert claims_table(flat_math, CONFIG)["result"].tolist()[6] == "FAIL"
    assert set(with_memory(gpu)["memory_kind"].dropna()) == {"cuda_peak_mib"}


def test_the_section_has_its_tables_plots_and_refusals(tmp_path):
    data = rows()
    parts = backends.sections(data, backends_tables.tables(data), tmp_path)
    text = "\n".join(parts)
    assert "rss_delta_mib" in text and "unsupported" in text and "No viable backend" in text
    assert "Speedup over math" in text and "memory_growth" in text
    for name in ("memory", "time"):
        assert f"](exp015_backends-{name}.png)" in text
        assert (tmp_path / f"exp015_backends-{name}.png").stat().st_size > 10_000


def memory_rows(tiled_mib: dict) -> pd.DataFrame:
    naive = {1024: 100.0, 2048: 390.0, 4096: 1560.0, 8192: 6200.0}
    return pd.DataFrame(
        [
            {"job": job, "status": "ok", "method": method, "length": length, "device": "cpu",
             "dtype": "float32", "rss_delta_mib": mib, "inputs_mib": length / 256}
            for job, (method, length, mib) in enumerate(
                [("naive", length, mib) for length, mib in naive.items()]
                + [("tiled", length, mib) for length, mib in tiled_mib.items()]
            )
        ]
    )  # fmt: skip


def test_backward_memory_claims_tell_linear_from_the_square(tmp_path):
    config = experiment_config("exp016_backward_memory")
    linear = memory_rows({1024: 12.0, 2048: 17.0, 4096: 25.0, 8192: 41.0})
    assert claims_table(linear, config)["result"].tolist() == ["PASS", "PASS"]
    square = memory_rows({1024: 12.0, 2048: 48.0, 4096: 190.0, 8192: 760.0})
    assert claims_table(square, config)["result"].tolist() == ["FAIL", "PASS"]
    parts = backward_memory.sections(linear, backward_memory_tables.tables(linear), tmp_path)
    assert "rss_delta_mib" in parts[0] and "](exp016_backward_memory.png)" in parts[-1]
    assert (tmp_path / "exp016_backward_memory.png").stat().st_size > 10_000


def test_a_backends_sweep_without_one_measurement_still_reports(tmp_path):
    refused = rows().assign(status="unsupported", error="No viable backend")
    refused = refused.drop(columns=["time_ms", "time_iqr_ms", "rss_delta_mib"])
    derived = backends_tables.tables(refused)
    assert derived["speedup"]["speedup_over_math"].isna().all()
    assert derived["growth"]["memory_growth"].isna().all()
    assert "unsupported" in "\n".join(backends.sections(refused, derived, tmp_path))
    assert claims_table(refused, CONFIG)["result"].tolist() == ["INCOMPLETE"] * 3 + CUDA_CLAIMS


def test_a_point_lost_at_8192_makes_the_growth_claims_incomplete_not_pass():
    config = experiment_config("exp016_backward_memory")
    lost = memory_rows({1024: 12.0, 2048: 17.0, 4096: 25.0, 8192: 41.0})
    lost.loc[lost["length"] == 8192, ["status", "rss_delta_mib"]] = ["oom", None]
    claims = claims_table(lost, config)
    assert claims["result"].tolist() == ["INCOMPLETE", "INCOMPLETE"]
    assert "length=8192" in claims["missing"][1]


def test_growth_is_per_setting_when_another_parameter_varies(tmp_path):
    small = memory_rows({1024: 10.0, 2048: 20.0, 4096: 40.0, 8192: 80.0}).assign(block=64)
    large = memory_rows({1024: 30.0, 2048: 60.0, 4096: 120.0, 8192: 240.0}).assign(block=256)
    both = pd.concat([small, large.assign(job=large["job"] + 100)], ignore_index=True)
    growth = backward_memory_tables.tables(both)["growth"].query("method == 'tiled'")
    assert sorted(growth["memory_growth"]) == [2.0] * 6, "each block against itself"
    text = "\n".join(backward_memory.sections(both, backward_memory_tables.tables(both), tmp_path))
    assert "block 64" in text and "block 256" in text
