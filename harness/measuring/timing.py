"""Time and achieved FLOP/s: generic, for any experiment (what counts an attention's FLOPs lives
with the experiments); memory and the isolated runner are harness.measuring.memory's.

Time is what other load on the machine moves most, so a figure that divides one time by another
is measured within one process, in turns: time_call's `beside` times other calls in rounds with
the measured one (a sample of each per round) and paired_ratio takes the median of the
rounds' ratios, so that both sides of each ratio saw the same moment. Times that can only be
compared across processes (two sweeps, run hours apart) say how busy the machine was: a CPU
timing's cpu_load_beside is the share of the process's CPUs that other processes used while
it ran (from /proc/stat), so that a comparison can tell a slower machine from slower code.

A GPU's speed moves with its clock, which power and heat hold down: on CUDA a sample taken while
the SM clock read below LOW_CLOCK_SHARE of the GPU's default is set aside and taken again after a
pause, and sampling past the minimum goes on until the samples have settled (Settling), within a
time budget, so that a timing is of the GPU at speed and says how it ended.

The load and the clocks are read by harness.measuring.conditions (CpuLoad, GpuClocks, with
LOW_CLOCK_SHARE); the columns' names, and which of them are a timing's housekeeping, are
harness.measuring.columns'.
"""

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from harness.measuring import took
from harness.measuring.columns import (
    CPU_SAMPLES,
    LOAD,
    LOW_CLOCK_SAMPLES,
    METHOD,
    REPEATS,
    SAMPLES,
    SPREAD,
    STOPPED_BY,
    THREADS,
    TIME,
    prefixed,
)
from harness.measuring.conditions import CpuLoad, GpuClocks
from harness.measuring.memory import MIB

FLUSH_FALLBACK_BYTES = 256 * MIB  # when the device does not say its L2's size
CUDA_METHOD = "CUDA events around each call, L2 flushed before it (triton's do_bench)"
CPU_METHOD = "perf_counter around each call"
LOW_CLOCK_PAUSE_S = 0.05  # the pause after a sample set aside, for the GPU's clock to come back up
SETTLED_SPREAD = 0.02  # CUDA samples have settled: IQR at most this share of their median, or
SETTLED_SHIFT = 0.005  # their median moved less than this share since their count was half


def time_call(
    fn: Callable[[], object],
    *,
    device: str | torch.device = "cpu",
    warmup: int = 1,
    min_repeats: int = 5,
    min_time_s: float = 0.5,
    max_repeats: int = 1000,
    max_time_s: float = 2.0,
    beside: Mapping[str, Callable[[], object]] | None = None,
) -> dict[str, Any]:
    """Warm up, then time calls of fn, a sample each, until min_repeats and min_time_s are
    both reached (at most max_repeats); on CUDA on past them until the samples have settled.

    Returns time_ms (the median call), time_iqr_ms, repeats (samples), time_samples_ms (each
    call's time), timing_method (in words) and threads_used (torch's threads while it timed;
    the row's own `threads` is the harness's). On the CPU each call is timed with
    perf_counter. On CUDA, as triton.testing.do_bench does: before each call a buffer twice
    the size of the GPU's L2 is written (evicting the inputs), then the call runs between its
    own pair of CUDA events, so that every call starts from a cold cache and the GPU, busy
    with the flush while the call is queued, does not time its launch. A kernel shorter than
    the events' resolution (about a microsecond) is timed at that resolution. Each CUDA timing
    also says what the GPU ran at (GpuClocks, through NVML where nvidia-ml-py can reach the
    device): gpu_sm_clock_mhz, the median SM clock read during the samples kept (it was the
    lowest seen, which one slow moment decided), gpu_default_sm_clock_mhz, the GPU's default
    SM clock, gpu_mem_clock_mhz, the lowest memory clock seen, and gpu_clock_limits, the
    reasons other than idleness that held the clocks down (`none`, or e.g. `sw_power_cap,
    hw_thermal_slowdown`), so that timings of two nodes can be compared.

    On CUDA a sample whose SM clock read below LOW_CLOCK_SHARE of the default is set aside:
    not among the samples, counted in clock_low_samples (NAME_clock_low_samples for a call
    beside), and followed by a pause of LOW_CLOCK_PAUSE_S before the call is sampled again.
    Only within max_time_s of the first sample: a GPU held low longer is timed as it runs,
    and gpu_sm_clock_mhz below LOW_CLOCK_SHARE of gpu_default_sm_clock_mhz says so. Without
    NVML nothing is set aside. Past the minimum, fn is sampled on until a rule of Settling
    holds or max_repeats is reached; stopped_by names which: "spread", "settled", "budget"
    (max_time_s since the first sample) or "repeats". The CPU keeps to the minimum.

    beside: other calls, by name, timed in turns with fn in this process (each warmed up as fn
    is; a round is one sample of fn, then one of each in order), so that a ratio of their times
    (paired_ratio) divides samples taken moments apart, under the same load. Each is sampled
    as if alone, until min_repeats and min_time_s of its own (sample_rounds): fn has as many
    samples as without them, and a slow one costs min_repeats calls. Their columns are
    their samples only, NAME_time_samples_ms (and on the CPU NAME_cpu_time_samples_ms): what a
    ratio needs, and no median that a comparison would take for one of the point's timings.

    On the CPU, also cpu_time_samples_ms: each call's CPU time of this process
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
    took("time")
    calls = {"": fn, **beside}
    for call in calls.values():
        for _ in range(warmup):
            call()
    threads = {THREADS: torch.get_num_threads()}
    if device.type == "cuda":
        timed = _cuda_time_call(calls, device, min_repeats, min_time_s, max_repeats, max_time_s)
        return timed | threads
    cpu_ms = {name: [] for name in calls}
    samplers = {name: _cpu_sampler(call, cpu_ms[name]) for name, call in calls.items()}
    load = CpuLoad()
    samples = sample_rounds(samplers, min_repeats, min_time_s, max_repeats)
    result = {**summarize_ms(samples[""]), METHOD: CPU_METHOD, **threads}
    if (share := load.share()) is not None:
        result[LOAD] = share
    cpu_columns = {prefixed(name, CPU_SAMPLES): taken for name, taken in cpu_ms.items()}
    return result | _beside(samples) | cpu_columns


def _cuda_time_call(
    calls: Mapping[str, Callable[[], object]],
    device: torch.device,
    min_repeats: int,
    min_time_s: float,
    max_repeats: int,
    max_time_s: float,
) -> dict[str, Any]:
    """time_call's samples on CUDA (calls: fn by the name "", then those beside it) and the
    columns that say how they were taken: each sample at speed (_at_speed), fn's sampled on
    until they have settled (Settling)."""
    gpu, clocks, settling = CudaTimer(device), GpuClocks(device), Settling(max_time_s)
    set_aside: dict[str, list[float]] = {name: [] for name in calls}
    samplers = {
        name: _at_speed(gpu.sampler(call, clocks.read), clocks, settling.spent, set_aside[name])
        for name, call in calls.items()
    }
    samples = sample_rounds(samplers, min_repeats, min_time_s, max_repeats, settling.enough)
    low = {prefixed(name, LOW_CLOCK_SAMPLES): len(aside) for name, aside in set_aside.items()}
    result = {**summarize_ms(samples[""]), METHOD: CUDA_METHOD}
    result |= {STOPPED_BY: settling.stopped_by, **clocks.columns()}
    return result | low | _beside(samples)


def _beside(samples: dict[str, list[float]]) -> dict[str, list[float]]:
    """NAME_time_samples_ms of each call timed beside fn (fn's own are its time_samples_ms)."""
    return {prefixed(name, SAMPLES): taken for name, taken in samples.items() if name}


def sample_rounds(
    samplers: Mapping[str, Callable[[], float]],
    min_repeats: int,
    min_time_s: float,
    max_repeats: int = 1000,
    enough: Callable[[list[float]], bool] | None = None,
) -> dict[str, list[float]]:
    """Rounds of one sample of each call in turn (sampler() times one call and returns its
    ms): each is sampled from the first round on until it has min_repeats samples and
    min_time_s of calls of its own, as if timed alone, so its sample i is round i's and a slow
    one costs no more than that; rounds go on while one wants samples, at most max_repeats of
    them. Where `enough` is given, the first call is sampled on past that minimum until
    enough(its samples) (CUDA's Settling). Returns each call's samples by name."""
    took("time")
    samples: dict[str, list[float]] = {name: [] for name in samplers}
    first = next(iter(samplers), None)

    def wanted(name: str) -> bool:
        taken = samples[name]
        if len(taken) < min_repeats or sum(taken) < min_time_s * 1000:
            return True
        return name == first and enough is not None and not enough(taken)

    rounds = 0
    while rounds < max_repeats and any(wanted(name) for name in samplers):
        rounds += 1
        for name in [name for name in samplers if wanted(name)]:
            samples[name].append(samplers[name]())
    return samples


def paired_ratio(numerators: list[float], denominators: list[float]) -> float:
    """The median of numerators[i] / denominators[i] over the rounds both were timed in (the
    first samples of each: sample_rounds): a ratio of two calls timed in turns (time_call's
    beside), each pair moments apart, so that a change in the machine's speed from one round
    to the next moves both sides of each pair alike."""
    pairs = list(zip(numerators, denominators, strict=False))
    if not pairs:
        raise ValueError("a paired ratio needs a sample of each")
    return statistics.median(n / d for n, d in pairs)


def flush_bytes(l2_bytes: int) -> int:
    """The buffer written before each timed CUDA call: twice the L2 cache (a write allocates in L2,
    so this leaves none of the inputs there), FLUSH_FALLBACK_BYTES when the size is unknown."""
    return 2 * l2_bytes if l2_bytes > 0 else FLUSH_FALLBACK_BYTES


def summarize_ms(samples: list[float]) -> dict[str, Any]:
    """Median, interquartile range and count of timings in milliseconds, and the timings."""
    quartiles = statistics.quantiles(samples, n=4, method="inclusive") if len(samples) > 1 else []
    return {
        TIME: statistics.median(samples),
        SPREAD: quartiles[2] - quartiles[0] if quartiles else 0.0,
        REPEATS: len(samples),
        SAMPLES: list(samples),
    }


def _cpu_sampler(fn: Callable[[], object], cpu_ms: list[float]) -> Callable[[], float]:
    """sample(): one call of fn, its wall ms; its CPU ms (this process's, process_time)
    appended to cpu_ms."""

    def sample() -> float:
        start, cpu = time.perf_counter(), time.process_time()
        fn()
        cpu_ms.append((time.process_time() - cpu) * 1000)
        return (time.perf_counter() - start) * 1000

    return sample


class CudaTimer:
    """What timing a CUDA call takes of its device: the buffer whose writing flushes the L2,
    and a pair of events on the device's current stream. The tests stand a recording double
    in for it to check the order: flush, start, call, end, then wait for the end."""

    def __init__(self, device: torch.device) -> None:
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
        self.buffer = torch.empty(flush_bytes(l2), dtype=torch.int8, device=device)
        self.stream = torch.cuda.current_stream(device)
        self.start, self.end = (torch.cuda.Event(enable_timing=True) for _ in range(2))

    def flush(self) -> None:
        self.buffer.zero_()

    def sampler(self, fn: Callable[[], object], between: Callable[[], None]) -> Callable[[], float]:
        """sample(): the L2 flushed, then one call of fn between the events, its ms; `between`
        is called once the call is queued, before waiting for it (while the GPU works)."""

        def sample() -> float:
            self.flush()
            self.start.record(self.stream)
            fn()
            self.end.record(self.stream)
            between()
            self.end.synchronize()
            return self.start.elapsed_time(self.end)

        return sample


class Settling:
    """When fn's CUDA samples have had enough, past min_repeats and min_time_s (enough(), for
    sample_rounds): where their interquartile range is at most SETTLED_SPREAD of their median
    ("spread"), where the count has just doubled (a power of two) and their median moved less
    than SETTLED_SHIFT since it was half ("settled": more samples would not move it), or where
    max_time_s has passed since sampling began ("budget"), checked in that order after each
    sample. stopped_by names the rule that held, "repeats" while none has (max_repeats then
    ends the sampling). The budget counts the minimum's time too."""

    def __init__(self, max_time_s: float) -> None:
        self.deadline, self.stopped_by = time.perf_counter() + max_time_s, "repeats"

    def spent(self) -> bool:
        return time.perf_counter() >= self.deadline

    def enough(self, samples: list[float]) -> bool:
        summary, count = summarize_ms(samples), len(samples)
        median, half = summary[TIME], count // 2
        doubled = count > 1 and count & (count - 1) == 0
        if summary[SPREAD] <= SETTLED_SPREAD * median:
            self.stopped_by = "spread"
        elif doubled and abs(median - statistics.median(samples[:half])) < SETTLED_SHIFT * median:
            self.stopped_by = "settled"
        elif self.spent():
            self.stopped_by = "budget"
        return self.stopped_by != "repeats"


def _at_speed(
    sample: Callable[[], float],
    clocks: "GpuClocks",
    spent: Callable[[], bool],
    set_aside: list[float],
) -> Callable[[], float]:
    """take(): sample() until one ran at speed. A sample during which the SM clock read low
    (clocks.low()) goes to set_aside, and the GPU has LOW_CLOCK_PAUSE_S to come back up before
    the call is sampled again; once spent(), a sample is kept whatever its clock, so that a GPU
    stuck at a low clock is still timed."""

    def take() -> float:
        taken = sample()
        while clocks.low() and not spent():
            clocks.set_aside()
            set_aside.append(taken)
            time.sleep(LOW_CLOCK_PAUSE_S)
            taken = sample()
        return taken

    return take


# FLOP/s


def gflops(flops: float, time_ms: float) -> float:
    """Achieved GFLOP/s."""
    return flops / (time_ms * 1e-3) / 1e9


_PEAKS: dict[tuple[str, str, int, int | None], float] = {}  # (device, dtype, threads, size)
PEAK_CALL_MS = 50.0  # a CPU peak's matmul grows until one call lasts this long (or 2,048 wide)


def peak_gflops(
    device: str | torch.device, dtype: torch.dtype, *, size: int | None = None, **timing
) -> float:
    """Measured GFLOP/s of a square matmul in dtype on device, cached per process.

    Measured, not looked up: `size` squared matrices into a preallocated result, timed with
    time_call at this process's thread count (`timing`: its warmup, min_repeats and
    min_time_s, as the call it is the peak of was timed; by default two warm-ups and
    time_call's own); its median per-call time, the statistic attention's time_ms is too, so
    pct_of_peak compares like with like. By default 8,192 on
    CUDA; on the CPU the width doubles from 256 until one call lasts PEAK_CALL_MS, at most 2,048
    (float32's 2,048 lasts about that long on two cores; a dtype the CPU emulates, bfloat16
    without AVX512-BF16, would take seconds a call there and reaches its peak much smaller).
    """
    device = torch.device(device)
    key = (str(device), str(dtype), torch.get_num_threads(), size)
    if key not in _PEAKS:
        size = size or (8192 if device.type == "cuda" else _cpu_peak_size(dtype))
        a, b, c = (torch.randn(size, size, device=device).to(dtype) for _ in range(3))
        timed = time_call(lambda: torch.mm(a, b, out=c), device=device, **{"warmup": 2, **timing})
        _PEAKS[key] = gflops(2 * size**3, timed[TIME])
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
