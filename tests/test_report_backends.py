"""exp015_backends in the report: derived tables, the seed's claims, plots, from known rows."""

import pandas as pd
import pytest

from analysis import backends
from analysis.report import claims_table

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
    lines.append({"job": job, **refused, "length": 1024, "dtype": "float32", "device_used": device})
    return pd.DataFrame(lines)


CONFIG = {
    "report": "analysis.backends",
    "claims": [
        {"table": "growth", "metric": "memory_growth", "min": 3.5, "max": 4.5,
         "where": "backend == 'math' and length == 8192 and device_used == 'cpu'"},
        {"table": "measurements", "metric": "memory_over_inputs", "max": 4.0,
         "where": "backend == 'flash' and length == 8192 and device_used == 'cpu'"},
        {"table": "speedup", "metric": "flash_over_math", "min": 1.0,
         "where": "length == 8192 and dtype == 'float32' and device_used == 'cpu'"},
    ],
}  # fmt: skip


def test_growth_speedup_and_memory_over_inputs():
    derived = backends.tables(rows())
    growth = derived["growth"].set_index(["backend", "length"])
    assert growth.loc[("math", 8192), "memory_growth"] == 4.0
    assert growth.loc[("flash", 2048), "memory_growth"] == 6.0 / 5.0
    assert growth.loc[("math", 2048), "time_growth"] == 4.0
    assert 1024 not in growth.index.get_level_values("length")
    speedup = derived["speedup"].set_index("length")["flash_over_math"]
    assert speedup[8192] == pytest.approx(40.0 * 64 / 300.0)
    measured = derived["measurements"].set_index(["backend", "length"])
    assert measured.loc[("flash", 8192), "memory_over_inputs"] == 12.0 / 24.0
    assert set(measured["memory_kind"]) == {"rss_delta_mib"}


def test_the_seeds_claims_pass_on_seed_like_rows_and_fail_when_they_should():
    assert claims_table(rows(), CONFIG)["result"].tolist() == ["PASS"] * 3
    slower_flash = claims_table(rows(flash_ms_at_8192=10_000.0), CONFIG)
    assert slower_flash["result"].tolist() == ["PASS", "PASS", "FAIL"]
    linear_math = claims_table(rows(math_mib={1024: 100, 2048: 200, 4096: 400, 8192: 800}), CONFIG)
    assert linear_math["result"].tolist()[0] == "FAIL"


def test_cpu_claims_do_not_apply_to_a_gpu_sweep_and_gpu_memory_keeps_its_name():
    gpu = rows(device="cuda:0")
    assert claims_table(gpu, CONFIG)["result"].tolist() == ["N/A"] * 3
    assert set(backends.measurements(gpu)["memory_kind"]) == {"cuda_peak_mib"}


def test_the_section_has_its_tables_plots_and_refusals(tmp_path):
    data = rows()
    parts = backends.sections(data, backends.tables(data), tmp_path)
    text = "\n".join(parts)
    assert "rss_delta_mib" in text and "unsupported" in text and "No viable backend" in text
    assert "flash_over_math" in text and "memory_growth" in text
    for name in ("memory", "time"):
        assert f"](exp015_backends-{name}.png)" in text
        assert (tmp_path / f"exp015_backends-{name}.png").stat().st_size > 10_000
