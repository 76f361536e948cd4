"""exp015_backends as a plain function: rows, statuses and check, at small lengths."""

import ctypes
import functools
import inspect
import os
import warnings

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from harness.measuring.timing import paired_ratio
from octlm_experiments import backends, checks, measuring
from octlm_experiments.attention import naive_attention, sdpa_refusal

DEFAULTS = {
    name: parameter.default
    for name, parameter in inspect.signature(backends.run).parameters.items()
}
QUICK = {"device": "cpu", "num_threads": 1, "warmup": 1, "min_repeats": 3, "min_time_s": 0.0}
# The tests that take cpu_point, on one of pytest-xdist's workers (--dist loadgroup): each
# point (a child process of its own, seconds) runs once for them all.
CPU_POINTS = pytest.mark.xdist_group("backends-cpu-points")


@pytest.fixture(scope="module")
def cpu_point():
    """A quick CPU point's row by (backend, length, dtype), each run once for the module."""

    @functools.cache
    def point(backend: str, length: int, dtype: str) -> dict:
        [row] = backends.run(backend=backend, length=length, dtype=dtype, **QUICK)
        return row

    def run(backend: str, length: int, dtype: str = "float32") -> dict:
        return point(backend, length, dtype)

    return run


# Each backend in each dtype, each without time_growth (128: a half under HALF_LENGTH_FLOOR),
# at the floor (256) or above it (1,024, the points the memory tests below compare), so that
# each of ratios_of's four cases (time_growth or not, math beside or not) is a row here.
CPU_POINT_CASES = [
    (128, "math", "float32"),
    (128, "flash", "float32"),
    (256, "flash", "bfloat16"),
    (1024, "math", "float32"),
    (1024, "math", "bfloat16"),
    (1024, "flash", "float32"),
]


@CPU_POINTS
@pytest.mark.process
@pytest.mark.parametrize("length, backend, dtype", CPU_POINT_CASES)
def test_a_cpu_point_is_one_complete_row(cpu_point, backend, length, dtype):
    row = cpu_point(backend, length, dtype)
    assert row["status"] == "ok", row["error"]
    assert row["device_used"] == "cpu" and row["threads_used"] == 1
    # The output is 64 KiB to 1 MiB here and may land in pages already resident: 0 is possible.
    assert row["rss_delta_mib"] >= 0 and "cuda_peak_mib" not in row
    assert row["repeats"] == len(row["time_samples_ms"]) >= 3
    assert row["time_ms"] > 0 and row["time_iqr_ms"] >= 0
    assert row["flops"] == 2 * 1 * 8 * length**2 * 32
    assert row["gflops"] == pytest.approx(row["flops"] / row["time_ms"] / 1e6)
    assert row["pct_of_peak"] == pytest.approx(100 * row["gflops"] / row["peak_gflops"])
    assert row["default_backend"] == "flash"  # what the profiler saw CPU SDPA pick
    # math computes half precision in float32 (torch's default), and is held to float32's peak
    assert row["compute_dtype"] == ("float32" if backend == "math" else dtype)
    assert row["timing_method"] == "perf_counter around each call" and "gpu_sm_clock_mhz" not in row
    # Its own time ratios, timed in turns with its repeats: half the length from 128 positions
    # at half on, math beside every other backend; and the share of its CPUs others used.
    assert ("time_growth" in row) == (length // 2 >= measuring.HALF_LENGTH_FLOOR)
    cpu = row["cpu_time_samples_ms"]  # one thread: the ratios are of CPU time
    if "time_growth" in row:
        assert row["time_growth"] == paired_ratio(cpu, row["half_length_cpu_time_samples_ms"])
    assert ("speedup_over_math" in row) == ("math_time_samples_ms" in row) == (backend != "math")
    if backend != "math":
        math = row["math_cpu_time_samples_ms"]
        assert len(math) >= 3 and row["speedup_over_math"] == paired_ratio(math, cpu)
    assert ("ratios_of" in row) == ("time_growth" in row or backend != "math")
    assert 0 <= row["cpu_load_beside"] <= 1


@CPU_POINTS
@pytest.mark.process
def test_math_in_half_precision_holds_float32_scores(cpu_point):
    """torch 2.13's math backend turns bfloat16 inputs into float32: its scores take float32's
    memory, not half of it (so a GPU runs out of memory where half precision would fit)."""
    single, half = (cpu_point("math", 1024, dtype) for dtype in ("float32", "bfloat16"))
    assert half["rss_delta_mib"] > 0.8 * single["rss_delta_mib"]


@CPU_POINTS
@pytest.mark.process
def test_math_materializes_the_scores_and_flash_does_not(cpu_point):
    scores_mib = 8 * 1024 * 1024 * 4 / 2**20  # (H, L, L) float32 at L = 1,024: 32 MiB
    math, flash = cpu_point("math", 1024), cpu_point("flash", 1024)
    assert math["rss_delta_mib"] > scores_mib > flash["rss_delta_mib"]


@pytest.mark.process
@pytest.mark.parametrize("backend", ["efficient", "cudnn"])
def test_a_backend_the_cpu_lacks_is_unsupported_with_the_reason(backend):
    [row] = backends.run(backend=backend, length=128, **QUICK)
    assert row["status"] == "unsupported"
    assert "No viable backend" in row["error"]
    assert "time_ms" not in row


@pytest.mark.process
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


GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@pytest.mark.process  # it measures in a child process (harness.measuring.memory)
@GPU
@pytest.mark.parametrize("backend", ["math", "flash", "efficient", "cudnn"])
def test_a_cuda_point_is_one_complete_row(backend):
    [row] = backends.run(backend=backend, length=1024, dtype="bfloat16", min_time_s=0.1)
    assert row["device_used"].startswith("cuda") and row["capability"] >= 3.5
    if row["status"] == "unsupported":  # cudnn may be; flash and efficient are held below
        assert row["error"] and "returned False" not in row["error"], "PyTorch's own reasons"
        return
    assert row["status"] == "ok", row["error"]
    assert row["cuda_peak_mib"] > 0 and "rss_delta_mib" not in row
    assert "CUDA events around each call" in row["timing_method"] and row["gpu_sm_clock_mhz"] > 0
    assert 0 < row["pct_of_peak"] < 100
    assert row["default_backend"] in ("flash", "efficient", "cudnn", "math")


@pytest.mark.gpu
@pytest.mark.process  # it measures in a child process (harness.measuring.memory)
@GPU
@pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 0),
    reason="bfloat16 kernels need sm80 or newer",
)
@pytest.mark.parametrize("backend", ["flash", "efficient"])
def test_flash_and_efficient_run_bfloat16_from_sm80(backend):
    [row] = backends.run(backend=backend, length=2048, dtype="bfloat16", min_time_s=0.1)
    assert row["status"] == "ok", row["error"]


@pytest.mark.gpu
@pytest.mark.process  # it measures in a child process (harness.measuring.memory)
@GPU
def test_maths_cuda_peak_at_4096_is_its_square_tensors():
    """torch's math path (the same composite code on every device) holds at once, per head,
    the float32 scores, their softmax and a boolean (L, L) of the positions masked, plus the
    causal mask as a float32 (L, L) shared by the heads: (4 + 4 + 1) * B * H * L^2 + 4 * L^2
    bytes. The CPU measures the same 9.6 bytes a score at 2,048 and 4,096 (resident memory)."""
    [row] = backends.run(backend="math", length=4096, dtype="float32", min_time_s=0.1)
    expected = ((4 + 4 + 1) * 1 * 8 + 4) * 4096**2 / 2**20  # 1,216 MiB
    assert row["cuda_peak_mib"] == pytest.approx(expected, rel=0.10)


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


@pytest.mark.parametrize(
    "message",
    [
        "No available kernel. Aborting execution.",
        "cuDNN Frontend error: [cudnn_frontend] Error: No execution plans support the graph.",
        "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED",
    ],
)
def test_what_sdpa_raises_when_no_kernel_runs_is_a_refusal(message):
    assert sdpa_refusal(RuntimeError(message), []) == message
    assert sdpa_refusal(RuntimeError("CUDA out of memory"), []) is None


def test_stderr_captured_takes_what_cpp_code_writes_to_fd_2(capfd):
    libc = ctypes.CDLL(None)
    with backends._stderr_captured() as printed:
        os.write(2, b"from the file descriptor\n")
        libc.dprintf(2, b"from C\n")
    assert printed == ["from the file descriptor\n", "from C\n"]
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n", "fd 2 is restored"


def test_a_cuda_probes_reasons_reach_the_row(monkeypatch):
    """torch's C++ logger writes can_use_*_attention's debug reasons to fd 2, not to Python's
    warnings: they are taken from there (a probe that writes them as the C++ one does)."""

    def refusing(params, debug=False):
        os.write(2, b"Flash attention requires q, k and v on a CUDA device\n")
        warnings.warn("head_dim should be a multiple of 8", stacklevel=1)
        return False

    monkeypatch.setattr(torch.backends.cuda, "can_use_flash_attention", refusing)
    query = torch.randn(1, 2, 16, 8)
    reason = backends._cuda_refusal("flash", query, query, query, causal=True)
    assert reason == (
        "head_dim should be a multiple of 8 | Flash attention requires q, k and v on a CUDA device"
    )
    monkeypatch.setattr(torch.backends.cuda, "can_use_flash_attention", lambda p, debug: False)
    assert "can_use_flash_attention returned False" in backends._cuda_refusal(
        "flash", query, query, query, causal=True
    )


@pytest.mark.parametrize(
    "ops, kernels, said",
    [
        ({"aten::_scaled_dot_product_flash_attention_for_cpu"}, None, "flash"),
        ({"aten::_scaled_dot_product_flash_attention"},
         {"void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64>>"}, "flash"),
        ({"aten::_scaled_dot_product_efficient_attention"},
         {"fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel)"},
         "efficient"),
        ({"aten::_scaled_dot_product_attention_math"}, {"ampere_sgemm_128x64_tn", "softmax"},
         "math"),
        ({"aten::_scaled_dot_product_flash_attention"}, {"fmha_cutlassF_f16_aligned"},
         "flash (kernels: efficient)"),
        ({"aten::_scaled_dot_product_cudnn_attention"}, {"ampere_sgemm"},
         "cudnn (kernels: none fused)"),
        ({"aten::mm"}, None, "unknown"),
    ],
)  # fmt: skip
def test_the_default_backend_is_checked_against_the_kernels_that_ran(ops, kernels, said):
    assert backends.default_backend(ops, kernels) == said
