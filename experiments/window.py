"""exp018_window: sliding-window attention through each path: time, memory, FLOP/s, accuracy.

One causal forward with a window (a query sees at most `window` keys, itself included) through
one method:
- naive: the reference, which materializes the masked (L, L) scores;
- sdpa: SDPA with the (L, L) boolean mask of the window (its only way to take one), as the model
  calls it;
- tiled: FlashAttention's tiling, which skips the key blocks outside the window;
- flex: FlexAttention compiled, with a block mask that skips them too.
The mask's construction is part of each call where the path builds it per call (naive, sdpa);
flex's block mask is built once per shape (mask_s), like its compilation.

Each point runs in one fresh child process (harness.measuring.memory.run_isolated), as exp015's do:
the inputs, a warm-up (flex compiles there: compile_s is that call's time less a warm call's), the
memory of one call over what existed before it, the error of that call's last REFERENCE_ROWS rows
against the float64 reference, warm repeats (the memory call warmed them up: `warmup` more calls
first, default none), then the matmul peak in the same process.

The ratios the claims bound are the point's own, timed in turns with its repeats in the same
process (time_call's beside; see harness.measuring.timing): the method at half the length, for
time_growth (where that half still holds a window and measuring.HALF_LENGTH_FLOOR positions), and
for a method other than sdpa, sdpa with the mask at the same shape, for speedup_over_sdpa; each
the median of the rounds' ratios. Two points' medians, taken in two processes at two moments,
divide whatever load came and went between them.

FLOPs count the visible query-key pairs only, 4 * B * H * D per pair (QK^T and PV, a multiply and
an add each): a query at position p sees min(p + 1, window) keys.
"""

import functools
import time

import torch

from harness.measuring.memory import measure_memory
from harness.measuring.timing import gflops, peak_gflops
from octlm_experiments import backends, checks, measuring, paths
from octlm_experiments.attention import reference_attention, sdpa_attention

REFERENCE_ROWS = 128  # the output rows checked against float64: the last ones, which see most
WARMUP_LENGTH = 16


def window_pairs(length: int, window: int) -> int:
    """The visible (query, key) pairs of causal attention with a window: sum of min(p + 1, W)."""
    full = min(length, window)
    return full * (full + 1) // 2 + (length - full) * window


def check(*, method: str, window: int, block: int) -> None:
    """What exp015's check does not cover (the config runs both): the method (a registered
    attention path), a window, and its blocks."""
    paths.check_path(method, "method")
    checks.positive(window=window, block=block)


def run(
    *,
    method: str,
    length: int,
    window: int,
    dtype: checks.Dtype = "float32",
    device: str = "auto",
    batch: int = 1,
    heads: int = 8,
    head_dim: int = 32,
    block: int = 128,
    seed: int = 0,
    num_threads: int = 1,
    warmup: int = 0,
    min_repeats: int = 3,
    min_time_s: float = 0.5,
    memory_cap_mib: int | None = None,
    timeout_s: float = 1800.0,
) -> list[dict]:
    """One (B, H, L, D) windowed causal forward through `method`: one row of time, memory,
    FLOP/s and error. block is the tiled path's block size. Out of memory (memory_cap_mib on the
    CPU, as in exp015) is an "oom" row; a method that does not run on the device or in the dtype
    (its Capabilities) is an "unsupported" row saying so, and one that raises a "failed" row with
    its error."""
    checks.point(backends.check, locals())
    checks.point(check, locals())
    used = checks.usable_device(device)
    refused = paths.unsupported(method, used, dtype)
    if refused:
        return [{"status": "unsupported", "error": refused, "device_used": str(used)}]
    point = {
        "method": method,
        "window": window,
        "dtype": dtype,
        "device": str(used),
        "shape": (batch, heads, length, head_dim),
        "block": block,
        "seed": seed,
        "num_threads": num_threads,
        "timing": {"warmup": warmup, "min_repeats": min_repeats, "min_time_s": min_time_s},
    }
    return measuring.isolated_row(_measure, point, used, memory_cap_mib, timeout_s)


# In the child process


def _measure(*, method, window, dtype, device, shape, block, seed, num_threads, timing) -> dict:
    """Inputs; a warm-up; one call's memory; the error of a call's last rows; warm timings; the
    matmul peak. A path that builds something per shape (Capabilities.prepare: flex's block
    mask) builds it first, timed apart (mask_s); the warm-up of a path that compiles is its
    compilation (compile_s: that call's time less a warm call's), on the whole inputs, and its
    output is kept through the memory call so that the measured call's own output counts; the
    others warm up on the first WARMUP_LENGTH positions (threads, first-use buffers: as
    exp015)."""
    device, (query, key, value), row = measuring.inputs(device, shape, dtype, seed, num_threads)
    batch, heads, length, head_dim = shape
    can = paths.CAPABILITIES[method]
    attend = functools.partial(paths.attend, method, block=block)
    forward = functools.partial(attend, query, key, value, window=window)
    with torch.no_grad():
        if can.prepare is not None:
            prepare = functools.partial(can.prepare, length, length, True, window, str(device))
            _, row["mask_s"] = _timed(prepare, device)
        if can.compiles:
            warm, first_s = _timed(forward, device)
        else:
            head = (t[..., :WARMUP_LENGTH, :] for t in (query, key, value))
            warm = attend(*head, window=window)
        kept = []  # the measured call's output, for its error: no call of its own
        row |= measure_memory(lambda: kept.append(forward()), device=device, warmup=0)
        del warm
        row["err64"] = _error_of_last_rows(query, key, value, kept.pop(), window)
        beside = _beside(method, attend, (query, key, value), window, device)
        row |= measuring.timed_beside(forward, beside, device, timing)
    row |= measuring.own_ratios(row, "sdpa")
    if can.compiles:
        row["compile_s"] = first_s - row["time_ms"] / 1000
    row["flops"] = 4 * batch * heads * head_dim * window_pairs(length, window)
    achieved, peak = (
        gflops(row["flops"], row["time_ms"]),
        peak_gflops(device, query.dtype, **timing),
    )
    row |= {"gflops": achieved, "peak_gflops": peak, "pct_of_peak": 100 * achieved / peak}
    first = ["status", "error", "device_used", "time_ms", "rss_delta_mib", "cuda_peak_mib", "err64"]
    return {key: row[key] for key in first if key in row} | row  # what a progress line shows


def _beside(method: str, attend, inputs: tuple, window: int, device: torch.device) -> dict:
    """What the point times in turns with its own forward (time_call's beside), each warmed
    up here: `half_length`, the method on the inputs' first half (one that compiles does so for
    it here), where
    that half holds a window and measuring.HALF_LENGTH_FLOOR positions; `sdpa`, sdpa with the
    mask on the same inputs, for every method but sdpa itself."""
    beside = {}
    half = measuring.half_length_inputs(inputs, floor=window)
    if half:
        beside["half_length"] = functools.partial(attend, *half, window=window)
        if paths.CAPABILITIES[method].compiles:
            beside["half_length"]()  # its compilation and block mask: out of the timings
    if method != "sdpa":
        beside["sdpa"] = functools.partial(sdpa_attention, *inputs, window=window)
        sdpa_attention(*(t[..., :WARMUP_LENGTH, :] for t in inputs), window=window)
    return beside


def _timed(fn, device: torch.device) -> tuple[object, float]:
    """fn's value and its wall time in seconds (on CUDA, until the device is done)."""
    started = time.perf_counter()
    value = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return value, time.perf_counter() - started


def _error_of_last_rows(query, key, value, output, window: int) -> float:
    """The largest error of the output's last REFERENCE_ROWS rows against reference_attention.

    Those rows see keys from `start` on, so the reference runs on the inputs from there
    (queries and keys alike): in that slice each of them sees exactly the keys it sees in the
    whole sequence, and the float64 reference holds a slice-sized square, not an (L, L) one.
    """
    length = query.shape[-2]
    rows = min(REFERENCE_ROWS, length)
    start = max(0, length - rows - window + 1)
    (reference,) = reference_attention(
        *(t[..., start:, :] for t in (query, key, value)), window=window
    )
    return (output[..., -rows:, :].double() - reference[..., -rows:, :]).abs().max().item()
