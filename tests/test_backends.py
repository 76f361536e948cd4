"""exp015_backends as a plain function: rows, statuses and check, at small lengths."""

import inspect

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from experiments import backends, checks
from experiments.attention import naive_attention

DEFAULTS = {
    name: parameter.default
    for name, parameter in inspect.signature(backends.run).parameters.items()
}
QUICK = {"device": "cpu", "num_threads": 1, "warmup": 1, "min_repeats": 3, "min_time_s": 0.0}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("backend", ["math", "flash"])
@pytest.mark.parametrize("length", [128, 256])
def test_a_cpu_point_is_one_complete_row(backend, length, dtype):
    [row] = backends.run(backend=backend, length=length, dtype=dtype, **QUICK)
    assert row["status"] == "ok", row["error"]
    assert row["device_used"] == "cpu" and row["threads_used"] == 1
    # The output is 64 to 256 KiB here and may land in pages already resident: 0 is possible.
    assert row["rss_delta_mib"] >= 0 and "cuda_peak_mib" not in row
    assert row["repeats"] == len(row["time_samples_ms"]) >= 3
    assert row["time_ms"] > 0 and row["time_iqr_ms"] >= 0
    assert row["flops"] == 2 * 1 * 8 * length**2 * 32
    assert row["gflops"] == pytest.approx(row["flops"] / row["time_ms"] / 1e6)
    assert row["pct_of_peak"] == pytest.approx(100 * row["gflops"] / row["peak_gflops"])
    assert row["default_backend"] == "flash"  # what the profiler saw CPU SDPA pick


def test_math_materializes_the_scores_and_flash_does_not():
    scores_mib = 8 * 1024 * 1024 * 4 / 2**20  # (H, L, L) float32 at L = 1,024: 32 MiB
    [math] = backends.run(backend="math", length=1024, **QUICK)
    [flash] = backends.run(backend="flash", length=1024, **QUICK)
    assert math["rss_delta_mib"] > scores_mib > flash["rss_delta_mib"]


@pytest.mark.parametrize("backend", ["efficient", "cudnn"])
def test_a_backend_the_cpu_lacks_is_unsupported_with_the_reason(backend):
    [row] = backends.run(backend=backend, length=128, **QUICK)
    assert row["status"] == "unsupported"
    assert "No viable backend" in row["error"]
    assert "time_ms" not in row


def test_running_out_of_memory_is_a_row():
    [row] = backends.run(backend="math", length=4096, memory_cap_mib=64, **QUICK)
    assert row["status"] == "oom"
    assert "allocate" in row["error"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_asked_for_without_a_gpu_fails_the_point():
    """Not "unsupported": that is an answer about a backend, and resume would skip it."""
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        backends.run(backend="flash", length=128, **{**QUICK, "device": "cuda"})


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"length": 0}, "length must be positive, got 0"),
        ({"heads": -2}, "heads must be positive"),
        ({"min_repeats": 0}, "min_repeats must be positive"),
        ({"min_time_s": -0.5}, "min_time_s must be 0 or more"),
        ({"device": "gpu"}, "device must be auto, cpu, cuda or cuda:N"),
        ({"memory_cap_mib": -1}, "memory_cap_mib must be 0 or more"),
        ({"timeout_s": 0}, "timeout_s must be positive"),
    ],
)
def test_check_rejects_out_of_domain_values_in_one_line(bad, message):
    params = {**DEFAULTS, "backend": "flash", "length": 128, **bad}
    with pytest.raises(ValueError, match=message) as error:
        checks.point(backends.check, params)
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match=message):
        backends.run(**params)  # run checks first


def test_check_accepts_the_defaults():
    checks.point(backends.check, {**DEFAULTS, "backend": "math", "length": 1})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("backend", ["math", "flash", "efficient", "cudnn"])
def test_a_cuda_point(backend):
    [row] = backends.run(backend=backend, length=1024, dtype="bfloat16", min_time_s=0.1)
    assert row["device_used"].startswith("cuda")
    assert row["status"] in ("ok", "unsupported"), row["error"]
    if row["status"] == "unsupported":
        assert row["error"]
        return
    assert row["cuda_peak_mib"] > 0 and row["cuda_reserved_mib"] > 0
    assert "rss_delta_mib" not in row
    assert row["default_backend"] in ("flash", "efficient", "cudnn", "math")
    assert row["pct_of_peak"] > 0


def test_causal_attention_flops_are_half_of_what_torch_counts():
    batch, heads, length, head_dim = 2, 4, 128, 64
    flops = backends.attention_flops(
        batch=batch, heads=heads, length=length, head_dim=head_dim, causal=True
    )
    assert flops == 2 * batch * heads * length**2 * head_dim == 16_777_216
    query = torch.randn(batch, heads, length, head_dim)
    with FlopCounterMode(display=False) as counter:
        naive_attention(query, query, query, causal=True)
    assert counter.get_total_flops() == 2 * flops  # torch ignores the causal mask
    assert (
        backends.attention_flops(
            batch=batch, heads=heads, length=length, head_dim=head_dim, causal=False
        )
        == counter.get_total_flops()
    )
