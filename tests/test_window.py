"""exp018_window: its rows, from a real child process each, and its report and claims, from rows
with known answers."""

import pandas as pd
import pytest
import registry
from omegaconf import OmegaConf

from harness.measuring.timing import paired_ratio
from harness.names import CONF
from harness.results.claims import claims_table
from octlm_analysis import window as report
from octlm_experiments import window
from octlm_experiments.attention import attention_mask
from octlm_experiments.derived import window as deriving
from octlm_experiments.paths import CAPABILITIES

CONFIG = OmegaConf.to_container(OmegaConf.load(CONF / "experiment" / "exp018_window.yaml"))
CLAIMS = CONFIG["experiment"]
QUICK = dict(length=256, window=64, min_repeats=2, min_time_s=0.0, num_threads=1)


@pytest.mark.parametrize("length, width", [(1, 1), (5, 8), (100, 7), (256, 256), (300, 64)])
def test_window_pairs_counts_the_visible_pairs(length, width):
    visible = attention_mask(length, length, causal=True, window=width)
    assert window.window_pairs(length, width) == int(visible.sum())


@pytest.mark.slow
@pytest.mark.parametrize("method", registry.paths())
def test_a_point_is_one_complete_row(method):
    [row] = window.run(method=method, **QUICK)
    assert row["status"] == "ok", row.get("error")
    assert row["device_used"] == "cpu" and row["threads_used"] == 1
    assert 1e-10 < row["err64"] < 1e-5
    assert row["rss_delta_mib"] > 0 and row["inputs_mib"] == 3 * 256 * 8 * 32 * 4 / 2**20
    assert row["time_ms"] > 0 and len(row["time_samples_ms"]) == row["repeats"] >= 2
    assert row["flops"] == 4 * 8 * 32 * window.window_pairs(256, 64)
    assert 0 < row["pct_of_peak"] == pytest.approx(100 * row["gflops"] / row["peak_gflops"])
    can = CAPABILITIES[method]  # flex compiles, and builds its block mask once per shape
    assert ("compile_s" in row) == can.compiles and ("mask_s" in row) == bool(can.prepare)
    # Its own time ratios: half the length, and sdpa, timed in turns with its repeats; of the
    # CPU time, on one thread.
    assert row["ratios_of"] == "CPU time, one thread"
    cpu, half = row["cpu_time_samples_ms"], row["half_length_cpu_time_samples_ms"]
    assert len(cpu) == len(half) == len(row["half_length_time_samples_ms"]) == row["repeats"]
    assert row["time_growth"] == paired_ratio(cpu, half)
    assert ("speedup_over_sdpa" in row) == ("sdpa_time_samples_ms" in row) == (method != "sdpa")
    if method != "sdpa":
        assert row["speedup_over_sdpa"] == paired_ratio(row["sdpa_cpu_time_samples_ms"], cpu)
    assert not any(c.endswith("_time_ms") for c in row), "samples beside, no timing of its own"
    assert 0 <= row["cpu_load_beside"] <= 1
    assert "beside_error" not in row


@pytest.mark.process
def test_a_half_length_without_a_whole_window_times_no_growth():
    [row] = window.run(method="tiled", **{**QUICK, "window": 200})  # half: 128 positions
    assert row["status"] == "ok" and row["speedup_over_sdpa"] > 0
    assert "time_growth" not in row and "half_length_time_samples_ms" not in row


@pytest.mark.process
def test_a_reference_out_of_memory_leaves_the_point_its_own_row():
    """Under a cap that tiled fits and sdpa's (L, L) scores do not, the point is tiled's row,
    with its growth, and says why it has no speedup."""
    [row] = window.run(method="tiled", **{**QUICK, "length": 4096}, memory_cap_mib=128)
    assert row["status"] == "ok" and row["time_ms"] > 0 and row["time_growth"] > 0
    assert "speedup_over_sdpa" not in row and "sdpa_time_samples_ms" not in row
    assert row["beside_error"].startswith("sdpa: RuntimeError: [enforce fail")
    assert "can't allocate memory" in row["beside_error"]


@pytest.mark.process
def test_running_out_of_memory_is_a_row():
    [row] = window.run(method="naive", **{**QUICK, "length": 4096}, memory_cap_mib=64)
    assert row["status"] == "oom" and row["device_used"] == "cpu"


@pytest.mark.parametrize(
    "bad, message", [(dict(window=0), "window must be positive"), (dict(block=0), "block must")]
)
def test_a_window_and_blocks_are_required(bad, message):
    with pytest.raises(ValueError, match=message):
        window.run(method="tiled", **{**QUICK, **bad})


# Rows of a CPU sweep with known answers: per doubling, sdpa's time and memory x4, tiled's and
# flex's x2 (plus a constant), naive oom at 16,384. With paired, each row also has its own
# time_growth and (but sdpa) speedup_over_sdpa, as timed in turns in its process; load slows
# some points' time_ms by a factor (the load of their moment), which those leave alone.
LENGTHS = (1024, 2048, 4096, 8192, 16384)


def unloaded_ms(method: str, length: float) -> float:
    scale = length / 1024
    return 10 * scale**2 if method in ("naive", "sdpa") else 0.1 + scale


def rows(tiled_mib=None, sdpa_ms_at_16384=None, err64=5e-7, paired=False, load=None):
    lines = []
    for method in ("naive", "sdpa", "tiled", "flex"):
        for width in (64, 256):
            for length in LENGTHS:
                scale = length / 1024
                square = method in ("naive", "sdpa")
                line = {"job": len(lines), "status": "ok", "method": method, "length": length,
                        "window": width, "dtype": "float32", "device_used": "cpu", "batch": 1,
                        "heads": 8, "head_dim": 32, "inputs_mib": 3 * scale, "err64": err64,
                        "time_ms": unloaded_ms(method, length),
                        "time_iqr_ms": 0.1,
                        "rss_delta_mib": 40 * scale**2 if square else 1 + scale}  # fmt: skip
                if method == "tiled" and tiled_mib:
                    line["rss_delta_mib"] = tiled_mib(length)
                if method == "sdpa" and length == 16384 and sdpa_ms_at_16384:
                    line["time_ms"] = sdpa_ms_at_16384
                if paired:
                    line["time_growth"] = unloaded_ms(method, length) / unloaded_ms(
                        method, length / 2
                    )
                    if method != "sdpa":
                        line["speedup_over_sdpa"] = unloaded_ms("sdpa", length) / unloaded_ms(
                            method, length
                        )
                line["time_ms"] *= (load or {}).get((method, length), 1.0)
                if method == "naive" and length >= 16384:
                    measured = ("time_ms", "rss_delta_mib", "time_growth", "speedup_over_sdpa")
                    line = {k: v for k, v in line.items() if k not in measured}
                    line |= {"status": "oom", "error": "out of memory (cap 8192 MiB)"}
                lines.append(line)
    return pd.DataFrame(lines)


def test_speedup_and_growth():
    derived = deriving.tables(rows())
    speedup = derived["speedup"].set_index(["method", "window", "length"])["speedup_over_sdpa"]
    assert speedup[("tiled", 256, 16384)] == pytest.approx(10 * 256 / 16.1)
    assert speedup[("naive", 64, 16384)] != speedup[("naive", 64, 16384)], "oom: NaN"
    growth = derived["growth"].set_index(["method", "window", "length"])
    assert growth.loc[("sdpa", 64, 4096), "memory_growth"] == 4.0
    assert growth.loc[("flex", 64, 16384), "time_growth"] == pytest.approx(16.1 / 8.1)


def test_the_claims_pass_on_seed_like_rows_and_fail_when_they_should():
    assert claims_table(rows(), CLAIMS)["result"].tolist() == ["PASS"] * 5
    constant = claims_table(rows(tiled_mib=lambda length: 8.0), CLAIMS)["result"].tolist()
    assert constant == ["PASS", "FAIL", "PASS", "PASS", "PASS"]
    square = claims_table(rows(tiled_mib=lambda length: (length / 1024) ** 2), CLAIMS)
    assert square["result"].tolist()[1] == "FAIL"
    close = claims_table(rows(sdpa_ms_at_16384=100.0), CLAIMS)["result"].tolist()
    assert close[3] == "FAIL"
    assert claims_table(rows(err64=0.0), CLAIMS)["result"].tolist()[4] == "FAIL"


LOADED = {("tiled", 8192): 2.0, ("tiled", 16384): 20.0, ("flex", 4096): 1.5}


def test_the_claims_take_each_points_own_ratios_not_two_points_medians():
    """Load at the moments tiled ran at 8,192 and 16,384 (2x, 20x) and flex at 4,096 moves two
    points' medians out of the bounds, not the ratios each point timed in turns in its own
    process; rows of an older sweep, without those, still get the ratio of the medians."""
    across = claims_table(rows(load=LOADED), CLAIMS)["result"].tolist()
    assert across == ["FAIL", "PASS", "PASS", "FAIL", "PASS"]
    own = deriving.tables(rows(paired=True, load=LOADED))
    assert claims_table(rows(paired=True, load=LOADED), CLAIMS)["result"].tolist() == ["PASS"] * 5
    growth = own["growth"].set_index(["method", "window", "length"])
    assert growth.loc[("tiled", 64, 8192), "time_growth"] == pytest.approx(8.1 / 4.1)
    assert growth.loc[("tiled", 64, 8192), "time_growth_paired"]
    assert ("tiled", 64, 1024) not in growth.index, "the lines are the same: 512 is not planned"
    oom = growth.loc[("naive", 64, 16384)]  # no time of its own, nor across: missing
    assert pd.isna(oom["time_growth"]) and not oom["time_growth_paired"]
    speedup = own["speedup"].set_index(["method", "window", "length"])["speedup_over_sdpa"]
    assert speedup[("tiled", 256, 16384)] == pytest.approx(10 * 256 / 16.1)
    assert "sdpa" not in own["speedup"]["method"].tolist()


def test_a_row_without_its_own_growth_falls_back_and_a_point_not_run_is_missing():
    """A row that did not time its half (NaN) gets the two points' medians' ratio, marked so;
    a point not run has neither, and its claim is incomplete, not passed."""
    data = rows(paired=True)
    at = (data["method"] == "flex") & (data["window"] == 64)
    data.loc[at & (data["length"] == 4096), "time_growth"] = None
    data.loc[at & (data["length"] == 2048), ["status", "time_ms", "time_growth"]] = [
        "not run",
        None,
        None,
    ]
    growth = deriving.tables(data)["growth"].set_index(["method", "window", "length"])
    assert growth.loc[("flex", 64, 8192), "time_growth_paired"]
    fallback = growth.loc[("flex", 64, 4096)]
    assert pd.isna(fallback["time_growth"]) and not fallback["time_growth_paired"], "2,048 lost"
    claims = claims_table(data, CLAIMS)
    assert claims["result"].tolist()[0] == "INCOMPLETE"
    assert "method=flex length=2048" in claims["missing"][0]
    data.loc[at & (data["length"] == 2048), ["status", "time_ms"]] = ["ok", 2.1]
    fallback = deriving.tables(data)["growth"].set_index(["method", "window", "length"])
    assert fallback.loc[("flex", 64, 4096), "time_growth"] == pytest.approx(4.1 / 2.1)


def test_the_section_has_its_tables_plots_and_what_did_not_run(tmp_path):
    data = rows()
    parts = report.sections(data, deriving.tables(data), tmp_path)
    text = "\n\n".join(parts)
    assert "Speedup over sdpa with a mask" in text and "Growth per doubling" in text
    assert "naive, oom at length 16384 (window 64)" in text
    assert (tmp_path / "exp018_window-time.png").stat().st_size > 0
    assert (tmp_path / "exp018_window-memory.png").stat().st_size > 0


def test_a_point_not_run_leaves_its_claim_incomplete_not_na():
    """A planned point without rows has no device_used: it takes its sweep's, so the CPU
    speedup claim still selects it and says it is missing."""
    data = rows()
    lost = (data["method"] == "tiled") & (data["length"] == 16384) & (data["window"] == 256)
    data.loc[lost, ["status", "device_used", "time_ms", "rss_delta_mib", "err64"]] = [
        "not run",
        None,
        None,
        None,
        None,
    ]
    assert claims_table(data, CLAIMS)["result"].tolist()[3] == "INCOMPLETE"
