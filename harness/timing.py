"""Time and achieved FLOP/s: generic, for any experiment (what counts an attention's FLOPs lives
with the experiments); memory and the isolated runner are harness.measure's.

Time is what other load on the machine moves most, so a figure that divides one time by another
is measured within one process, in turns: time_call's `beside` times other calls in rounds with
the measured one (a sample of each per round) and paired_ratio takes the median of the
rounds' ratios, so that both sides of each ratio saw the same moment. Times that can only be
compared across processes (two sweeps, run hours apart) say how busy the machine was: a CPU
timing's cpu_load_beside is the share of the process's CPUs that other processes used while
it ran (from /proc/stat), so that a comparison can tell a slower machine from slower code.
"""

import math
import os
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from harness.measure import MIB

ESTIMATE_CALLS = 5  # back-to-back calls whose mean estimates one call before CUDA sampling
SAMPLE_MS = 1.0  # a CUDA sample's calls last at least this long together
MOST_CALLS = 1000  # per CUDA sample
FLUSH_FALLBACK_BYTES = 256 * MIB  # when the device does not say its L2's size


@dataclass(frozen=True)
class Rounds:
    """Samples taken in turns: samples[name][i] is round i's per-call time (ms) of that batch,
    calls[name] its calls per sample."""

    samples: dict[str, list[float]]
    calls: dict[str, int]


def time_call(
    fn: Callable[[], object],
    *,
    device: str | torch.device = "cpu",
    warmup: int = 1,
    min_repeats: int = 5,
    min_time_s: float = 0.5,
    max_repeats: int = 1000,
    beside: Mapping[str, Callable[[], object]] | None = None,
) -> dict[str, Any]:
    """Warm up, then time samples of fn until min_repeats and min_time_s are both reached.

    Returns time_ms (the median per-call time), time_iqr_ms, repeats (samples),
    time_samples_ms (each sample's per-call time), calls_per_sample, timing_method (in
    words) and threads. On the CPU a sample is one call, timed with perf_counter. On CUDA, to
    triton.testing.do_bench's standard: one call's time is estimated from ESTIMATE_CALLS calls
    back to back; then each sample writes a buffer twice the size of the GPU's L2 (evicting the
    inputs) and times calls_per_sample calls back to back between one pair of CUDA events,
    enough to last SAMPLE_MS, so that launch overhead and the events' resolution are amortized.

    beside: other calls, by name, timed in turns with fn in this process (each warmed up as fn
    is; a round is one sample of fn, then one of each in order), so that a ratio of their times
    (paired_ratio) divides samples taken moments apart, under the same load. Each is sampled
    as if alone, until min_repeats and min_time_s of its own (sample_rounds): fn has as many
    samples as without them, and a slow one costs min_repeats calls. Their columns are
    their samples only, NAME_time_samples_ms (and on the CPU NAME_cpu_time_samples_ms): what a
    ratio needs, and no median that a comparison would take for one of the point's timings.

    On the CPU, also cpu_time_samples_ms: each sample's CPU time of this process per call
    (process_time). With one thread it is the call's own work, which other processes on the
    machine do not add to, where they add to its wall time as they take the CPU; with more,
    threads that wait for a preempted one spin and add to it.

    On the CPU, cpu_load_beside: the share of this process's CPUs that other processes used
    during the samples (CpuLoad; absent where /proc/stat cannot be read). Other work on the
    machine slows a CPU timing by as much as the code could; this says when it was there.
    """
    device, beside = torch.device(device), dict(beside or {})
    if "" in beside:
        raise ValueError("a call beside fn needs a name: its columns' prefix")
    calls = {"": fn, **beside}
    for call in calls.values():
        for _ in range(warmup):
            call()
    batches, method, cpu_ms = _batches(calls, device)
    cpu = device.type != "cuda"
    load = CpuLoad() if cpu else None
    rounds = sample_rounds(batches, min_repeats, min_time_s, max_repeats, cpu=cpu)
    result = {
        **summarize_ms(rounds.samples[""]),
        "calls_per_sample": rounds.calls[""],
        "timing_method": method,
        "threads": torch.get_num_threads(),
    }
    if load and (share := load.share()) is not None:
        result["cpu_load_beside"] = share
    return result | _samples(rounds, cpu_ms if cpu else None)


def _samples(rounds: Rounds, cpu_ms: dict[str, list[float]] | None) -> dict[str, list[float]]:
    """The calls' samples as time_call's columns: NAME_time_samples_ms of each call beside fn,
    and on the CPU (cpu_ms) every call's cpu_time_samples_ms (NAME_ before those beside)."""
    columns = {f"{name}_time_samples_ms": rounds.samples[name] for name in rounds.samples if name}
    for name, samples in (cpu_ms or {}).items():
        columns[f"{name}_cpu_time_samples_ms" if name else "cpu_time_samples_ms"] = samples
    return columns


def sample_rounds(
    batches: Mapping[str, Callable[[int], float]],
    min_repeats: int,
    min_time_s: float,
    max_repeats: int = 1000,
    *,
    cpu: bool = False,
) -> Rounds:
    """Rounds of one sample of each batch in turn. batch(n) runs n calls back to back and
    returns their total ms; a sample is its per-call time, n being 1 for the CPU, else
    calls_per_sample of an estimate (ESTIMATE_CALLS calls, once). Each batch
    is sampled from the first round on until it has min_repeats samples and min_time_s of
    calls of its own, as if timed alone, so its sample i is round i's and a slow one costs no
    more than that; rounds go on while a batch wants samples, at most max_repeats of them."""
    calls = {
        name: 1 if cpu else calls_per_sample(batch(ESTIMATE_CALLS) / ESTIMATE_CALLS)
        for name, batch in batches.items()
    }
    samples: dict[str, list[float]] = {name: [] for name in batches}

    def wanted(name: str) -> bool:
        taken = samples[name]
        return len(taken) < min_repeats or sum(taken) * calls[name] < min_time_s * 1000

    rounds = 0
    while rounds < max_repeats and any(wanted(name) for name in batches):
        rounds += 1
        for name in [name for name in batches if wanted(name)]:
            samples[name].append(batches[name](calls[name]) / calls[name])
    return Rounds(samples, calls)


def paired_ratio(numerators: list[float], denominators: list[float]) -> float:
    """The median of numerators[i] / denominators[i] over the rounds both were timed in (the
    first samples of each: sample_rounds): a ratio of two calls timed in turns (time_call's
    beside), each pair moments apart, so that a change in the machine's speed from one round
    to the next moves both sides of each pair alike."""
    pairs = list(zip(numerators, denominators, strict=False))
    if not pairs:
        raise ValueError("a paired ratio needs a sample of each")
    return statistics.median(n / d for n, d in pairs)


def calls_per_sample(
    estimate_ms: float, target_ms: float = SAMPLE_MS, most: int = MOST_CALLS
) -> int:
    """How many calls of about estimate_ms one sample takes to last target_ms: 1 for a call
    that long, at most `most`."""
    return max(1, min(most, math.ceil(target_ms / max(estimate_ms, 1e-9))))


def flush_bytes(l2_bytes: int) -> int:
    """The buffer written before each CUDA sample: twice the L2 cache (a write allocates in L2,
    so this leaves none of the inputs there), FLUSH_FALLBACK_BYTES when the size is unknown."""
    return 2 * l2_bytes if l2_bytes > 0 else FLUSH_FALLBACK_BYTES


def summarize_ms(samples: list[float]) -> dict[str, Any]:
    """Median, interquartile range and count of timings in milliseconds, and the timings."""
    quartiles = statistics.quantiles(samples, n=4, method="inclusive") if len(samples) > 1 else []
    return {
        "time_ms": statistics.median(samples),
        "time_iqr_ms": quartiles[2] - quartiles[0] if quartiles else 0.0,
        "repeats": len(samples),
        "time_samples_ms": list(samples),
    }


class CpuLoad:
    """The share of this process's CPUs (its affinity) that other processes use from now on:
    share() is their busy time since creation (/proc/stat: user, nice, system, irq, softirq,
    steal) less this process's own CPU time, over the wall time times the CPUs, in [0, 1]. An
    idle machine reads about 0 (within its clock ticks, 10 ms each); two processes spinning
    on two CPUs about 0.7 to 1. None where /proc/stat cannot be read."""

    def __init__(self) -> None:
        self.cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self.start = self._now()

    def share(self) -> float | None:
        now = self._now()
        if self.start is None or now is None:
            return None
        busy, own, wall = (after - before for after, before in zip(now, self.start, strict=True))
        if wall <= 0 or not self.cpus:
            return None
        return min(max((busy - own) / (wall * len(self.cpus)), 0.0), 1.0)

    def _now(self) -> tuple[float, float, float] | None:
        """(busy seconds of the CPUs, this process's CPU seconds, wall seconds), or None."""
        try:
            with open("/proc/stat") as stat:
                lines = stat.read().splitlines()
        except OSError:
            return None
        wanted, ticks = {f"cpu{cpu}" for cpu in self.cpus}, 0
        for line in lines:
            name, *fields = line.split()
            if name in wanted:  # user nice system idle iowait irq softirq steal ...
                user, nice, system, _, _, irq, softirq, steal = map(int, fields[:8])
                ticks += user + nice + system + irq + softirq + steal
        own = os.times()
        return ticks / os.sysconf("SC_CLK_TCK"), own.user + own.system, time.perf_counter()


def _batches(calls: dict[str, Callable[[], object]], device: torch.device) -> tuple:
    """Each call as a batch for the device, the timing method in words, and (CPU) where each
    batch puts its samples' CPU time per call (empty lists, by name; CUDA: {})."""
    if device.type == "cuda":
        flush = _flush_buffer(device)
        batches = {name: _cuda_batch(call, device, flush) for name, call in calls.items()}
        return batches, "CUDA events around back-to-back calls, L2 flushed", {}
    cpu_ms = {name: [] for name in calls}
    batches = {name: _cpu_batch(call, cpu_ms[name]) for name, call in calls.items()}
    return batches, "perf_counter around each call", cpu_ms


def _cpu_batch(fn: Callable[[], object], cpu_ms: list[float]) -> Callable[[int], float]:
    """batch(n): n calls of fn back to back, their wall ms; their CPU ms per call (this
    process's, process_time) appended to cpu_ms."""

    def batch(calls: int) -> float:
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(calls):
            fn()
        cpu_ms.append((time.process_time() - cpu) * 1000 / calls)
        return (time.perf_counter() - start) * 1000

    return batch


def _flush_buffer(device: torch.device) -> torch.Tensor:
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
    return torch.empty(flush_bytes(l2), dtype=torch.int8, device=device)


def _cuda_batch(
    fn: Callable[[], object], device: torch.device, flush: torch.Tensor
) -> Callable[[int], float]:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    stream = torch.cuda.current_stream(device)

    def batch(calls: int) -> float:
        flush.zero_()
        start.record(stream)
        for _ in range(calls):
            fn()
        end.record(stream)
        end.synchronize()
        return start.elapsed_time(end)

    return batch


# FLOP/s


def gflops(flops: float, time_ms: float) -> float:
    """Achieved GFLOP/s."""
    return flops / (time_ms * 1e-3) / 1e9


_PEAKS: dict[tuple[str, str, int, int | None], float] = {}  # (device, dtype, threads, size)
PEAK_CALL_MS = 50.0  # a CPU peak's matmul grows until one call lasts this long (or 2,048 wide)


def peak_gflops(
    device: str | torch.device, dtype: torch.dtype, *, size: int | None = None
) -> float:
    """Measured GFLOP/s of a square matmul in dtype on device, cached per process.

    Measured, not looked up: `size` squared matrices into a preallocated result, timed with
    time_call at this process's thread count; its median per-call time, the statistic
    attention's time_ms is too, so pct_of_peak compares like with like. By default 8,192 on
    CUDA; on the CPU the width doubles from 256 until one call lasts PEAK_CALL_MS, at most 2,048
    (float32's 2,048 lasts about that long on two cores; a dtype the CPU emulates, bfloat16
    without AVX512-BF16, would take seconds a call there and reaches its peak much smaller).
    """
    device = torch.device(device)
    key = (str(device), str(dtype), torch.get_num_threads(), size)
    if key not in _PEAKS:
        size = size or (8192 if device.type == "cuda" else _cpu_peak_size(dtype))
        a, b, c = (torch.randn(size, size, device=device).to(dtype) for _ in range(3))
        timing = time_call(lambda: torch.mm(a, b, out=c), device=device, warmup=2)
        _PEAKS[key] = gflops(2 * size**3, timing["time_ms"])
        del a, b, c
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return _PEAKS[key]


def _cpu_peak_size(dtype: torch.dtype, largest: int = 2048) -> int:
    """The CPU peak's width: 256, doubled while one matmul of it lasts under PEAK_CALL_MS."""
    size = 256
    while size < largest:
        a = torch.randn(size, size).to(dtype)
        torch.mm(a, a)  # first use: allocation and kernel choice, not counted
        started = time.perf_counter()
        torch.mm(a, a)
        if (time.perf_counter() - started) * 1000 >= PEAK_CALL_MS:
            break
        size *= 2
    return size
