"""exp015_backends: one causal SDPA forward per SDPA backend: time, peak memory, FLOP/s.

Each point runs in one fresh child process (harness.measuring.memory.run_isolated). The child makes
the inputs, runs one forward over their first WARMUP_LENGTH positions (so that one-off costs, such
as thread pools and first-use buffers, stay out of the figure; on CUDA a full warm-up call),
measures the memory of one forward over that baseline, then times warmed-up repeats in the same
process, then measures the matmul peak that pct_of_peak divides by (same process, threads and
moment: on a shared machine a peak taken elsewhere would not describe the same conditions; in
the dtype the backend computes in, compute_dtype) and, last, asks the profiler which backend
SDPA picks when left to choose.

For the same reason the ratios of times are the point's own: its repeats are timed in turns
(time_call's beside, see octlm_experiments.measuring) with the backend at half the length
(time_growth, from HALF_LENGTH_FLOOR positions at half) and, for a backend other than math,
with math at the same shape (speedup_over_math), each the median of the rounds' ratios, not
two points' medians taken in two processes at two moments.

Rows carry metrics only; the harness adds the parameters. So the device actually used is
`device_used` and the child's thread count `threads_used` (`device` is a parameter, `threads`
a harness column).
"""

import contextlib
import functools
import os
import sys
import tempfile
import warnings
from typing import Literal

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from harness.measuring.memory import default_memory_cap_mib, measure_memory
from harness.measuring.timing import gflops, peak_gflops
from octlm_experiments import checks
from octlm_experiments.attention import sdpa_refusal
from octlm_experiments.measuring import (
    half_length_inputs,
    inputs,
    isolated_row,
    own_ratios,
    timed_beside,
)

Backend = Literal["math", "flash", "efficient", "cudnn"]

SDP_BACKENDS = {
    "math": SDPBackend.MATH,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}
# Fragments of the aten op each backend dispatches to, most specific first.
KERNEL_OPS = (
    ("cudnn_attention", "cudnn"),
    ("efficient_attention", "efficient"),
    ("flash_attention", "flash"),  # CUDA's op and CPU's ..._flash_attention_for_cpu
    ("attention_math", "math"),
    ("fused_attention_overrideable", "overrideable"),
)
# Fragments of the GPU kernels a fused backend launches, as a CUDA trace names them: flash's
# flash_fwd_kernel, the memory-efficient path's CUTLASS fmha kernels, cuDNN's generated ones.
KERNEL_NAMES = {"flash": ("flash_fwd",), "efficient": ("fmha", "efficient_attention"),
                "cudnn": ("cudnn",)}  # fmt: skip
WARMUP_LENGTH = 16


def attention_flops(*, batch: int, heads: int, length: int, head_dim: int, causal: bool) -> int:
    """Forward FLOPs of attention: two matmuls of 2*L*L*D each per head, half of it when causal.

    torch.utils.flop_counter ignores causality and counts the full 4*B*H*L^2*D.
    """
    full = 4 * batch * heads * length * length * head_dim
    return full // 2 if causal else full


def compute_dtype(backend: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype the backend computes in: math turns float16 and bfloat16 inputs into float32
    (so its memory is float32's, and its peak float32's) unless reduced-precision reductions
    are allowed (torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp, off by default)."""
    reduced = torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()
    if backend == "math" and dtype in (torch.float16, torch.bfloat16) and not reduced:
        return torch.float32
    return dtype


def check(
    *,
    length: int,
    batch: int,
    heads: int,
    head_dim: int,
    device: str,
    num_threads: int,
    warmup: int,
    min_repeats: int,
    min_time_s: float,
    memory_cap_mib: int | None,
    timeout_s: float,
) -> None:
    """Reject out-of-domain values (one line, ValueError) without doing any work."""
    checks.positive(length=length, batch=batch, heads=heads, head_dim=head_dim,
                    min_repeats=min_repeats, timeout_s=timeout_s)  # fmt: skip
    checks.not_negative(num_threads=num_threads, warmup=warmup, min_time_s=min_time_s,
                        memory_cap_mib=memory_cap_mib)  # fmt: skip
    checks.device(device, auto=True)
    if memory_cap_mib is None:
        default_memory_cap_mib()  # its environment variable, checked before any point runs


def run(
    *,
    backend: Backend,
    length: int,
    dtype: checks.Dtype = "float32",
    device: str = "auto",
    batch: int = 1,
    heads: int = 8,
    head_dim: int = 32,
    causal: bool = True,
    seed: int = 0,
    num_threads: int = 0,
    warmup: int = 1,
    min_repeats: int = 5,
    min_time_s: float = 0.5,
    memory_cap_mib: int | None = None,
    timeout_s: float = 1800.0,
) -> list[dict]:
    """One (B, H, L, D) SDPA forward forced onto `backend`: one row of time, memory and FLOP/s.

    device "auto" is CUDA when available, else the CPU; num_threads 0 keeps torch's default
    thread count, n > 0 sets it in the measuring process. A backend the device lacks is a row with
    status "unsupported" and PyTorch's reason; running out of memory (memory_cap_mib on CPU, see
    harness.measuring.memory.run_isolated) is a row with status "oom".
    """
    checks.point(check, locals())
    used = checks.usable_device(device)
    point = {
        "backend": backend,
        "length": length,
        "dtype": dtype,
        "device": str(used),
        "shape": (batch, heads, length, head_dim),
        "causal": causal,
        "seed": seed,
        "num_threads": num_threads,
        "timing": {"warmup": warmup, "min_repeats": min_repeats, "min_time_s": min_time_s},
    }
    return isolated_row(_measure, point, used, memory_cap_mib, timeout_s)


# In the child process


def _measure(*, backend, length, dtype, device, shape, causal, seed, num_threads, timing) -> dict:
    """Inputs, then one forward's memory, its timing (beside it: half the length, and math),
    the matmul peak, the default backend."""
    device, (query, key, value), row = inputs(device, shape, dtype, seed, num_threads)
    forward = functools.partial(F.scaled_dot_product_attention, query, key, value, is_causal=causal)
    with sdpa_kernel(SDP_BACKENDS[backend]):
        memory_or_refusal = _memory(forward, device, backend, causal)
        if isinstance(memory_or_refusal, str):
            return row | {"status": "unsupported", "error": memory_or_refusal}
        beside = _beside(backend, (query, key, value), causal)
        times = timed_beside(forward, beside, device, timing)
    row |= memory_or_refusal | times
    row |= own_ratios(row, "math")
    batch, heads, _, head_dim = shape
    flops = attention_flops(
        batch=batch, heads=heads, length=length, head_dim=head_dim, causal=causal
    )
    compute = compute_dtype(backend, query.dtype)
    achieved, peak = gflops(flops, row["time_ms"]), peak_gflops(device, compute, **timing)
    row |= {"flops": flops, "gflops": achieved, "peak_gflops": peak}
    row["compute_dtype"] = str(compute).removeprefix("torch.")
    row["pct_of_peak"] = 100 * achieved / peak
    row["default_backend"] = _default_backend(query, key, value, causal)
    return row


def _beside(backend: str, tensors: tuple, causal: bool) -> dict:
    """What the point times in turns with its forward (time_call's beside): `half_length`, the
    backend on the inputs' first half (half_length_inputs), and `math`, math on the same inputs,
    for every backend but math."""
    beside = {}
    half = half_length_inputs(tensors)
    if half:
        beside["half_length"] = functools.partial(
            F.scaled_dot_product_attention, *half, is_causal=causal
        )
    if backend != "math":
        beside["math"] = functools.partial(_math_forward, *tensors, causal)
    return beside


def _math_forward(query, key, value, causal: bool):
    """SDPA forced onto math, inside whatever backend the caller forced."""
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(query, key, value, is_causal=causal)


def _memory(forward, device: torch.device, backend: str, causal: bool) -> dict | str:
    """measure_memory of one forward, or PyTorch's reason why the backend cannot run it."""
    if device.type == "cuda":
        refusal = _cuda_refusal(backend, *forward.args, causal)
        if refusal:
            return refusal
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            head = (tensor[..., :WARMUP_LENGTH, :] for tensor in forward.args)  # views
            F.scaled_dot_product_attention(*head, is_causal=causal)
            return measure_memory(forward, device=device, warmup=int(device.type == "cuda"))
        except RuntimeError as error:
            refusal = sdpa_refusal(error, caught)
            if refusal is None:
                raise
            return refusal


def _cuda_refusal(backend: str, query, key, value, causal: bool) -> str | None:
    """PyTorch's reasons for refusing a fused CUDA backend for these inputs, or None."""
    can_use = getattr(torch.backends.cuda, f"can_use_{backend}_attention", None)
    if backend == "math" or can_use is None:
        return None  # math always runs; an older torch without the probe: the call will tell
    try:
        params = torch.backends.cuda.SDPAParams(query, key, value, None, 0.0, causal, False)
    except TypeError:  # torch < 2.5 has no enable_gqa argument
        params = torch.backends.cuda.SDPAParams(query, key, value, None, 0.0, causal)
    # The probe's debug reasons come as Python warnings or, from torch's C++ logger, on fd 2.
    with warnings.catch_warnings(record=True) as caught, _stderr_captured() as printed:
        warnings.simplefilter("always")
        usable = can_use(params, debug=True)
    if usable:
        return None
    reasons = [str(w.message) for w in caught] + [line.strip() for line in printed if line.strip()]
    return " | ".join(reasons) or f"torch.backends.cuda.can_use_{backend}_attention returned False"


def _default_backend(query, key, value, causal: bool) -> str:
    """The backend SDPA dispatches to when free to choose: from the profiler's op names, and
    on CUDA checked against the kernels the trace shows (default_backend)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if query.device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(activities=activities)
    with warnings.catch_warnings():  # CUDA builds warn that the profiler clears its events
        warnings.filterwarnings("ignore", "Profiler clears events", UserWarning)
        with _stderr_captured() as printed, profiler as profile:
            F.scaled_dot_product_attention(query, key, value, is_causal=causal)
            if query.device.type == "cuda":
                torch.cuda.synchronize(query.device)
    # Some torch builds' profilers print "USDT: ... profiler_start/stop": drop those.
    sys.stderr.write("".join(line for line in printed if not line.startswith("USDT:")))
    events = profile.events()
    kernels = {e.name for e in events if e.device_type == torch.autograd.DeviceType.CUDA}
    return default_backend({e.name for e in events}, kernels if len(activities) > 1 else None)


def default_backend(ops: set[str], kernels: set[str] | None) -> str:
    """The backend the aten ops name; where a trace has kernels (CUDA), checked against them:
    the fused backend's own kernels ran, and no other's (math: none fused). When they disagree,
    both are said: "flash (kernels: efficient)"."""
    backend = next((b for fragment, b in KERNEL_OPS if any(fragment in op for op in ops)), None)
    backend = backend or "unknown"
    if kernels is None:
        return backend
    launched = {
        fused
        for fused, fragments in KERNEL_NAMES.items()
        if any(fragment in kernel.lower() for kernel in kernels for fragment in fragments)
    }
    if launched == {backend} & set(KERNEL_NAMES):
        return backend
    return f"{backend} (kernels: {', '.join(sorted(launched)) or 'none fused'})"


@contextlib.contextmanager
def _stderr_captured():
    """What is written to file descriptor 2 in the block, C++ included: a list of its lines,
    filled when the block ends."""
    sys.stderr.flush()
    saved, printed = os.dup(2), []
    with tempfile.TemporaryFile(mode="w+") as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield printed
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            printed.extend(caught)
