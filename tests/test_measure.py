"""harness.measuring.memory, harness.measuring.timing and harness.measuring.conditions: the
isolated runner's statuses, its memory figure, timing, the load and clocks beside it, FLOPs.

The children run stdlib and torch functions only, so they unpickle whatever pytest's import mode.
"""

import functools
import itertools
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable

import pytest
import torch
import torch.nn.functional as F
from torch.utils import benchmark

from harness import store
from harness.measuring import conditions, memory
from harness.measuring import timing as clock

ALLOCATION_MIB = 256

# The same measurement in a new interpreter, by a different route: no clear_refs, just VmHWM
# after the allocation minus VmRSS before it (VmHWM starts afresh at exec; ru_maxrss would not:
# it carries this pytest process's peak into the child across vfork + exec).
FRESH_INTERPRETER = """
import torch
def kib(field):
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(field + ":"))
before = kib("VmRSS")
tensor = torch.ones({mib} * 1024 * 1024 // 4)
print((kib("VmHWM") - before) / 1024)
"""


@pytest.mark.process
def test_rss_delta_of_a_known_allocation_matches_a_fresh_interpreter():
    allocate = functools.partial(torch.ones, ALLOCATION_MIB * memory.MIB // 4)  # float32
    outcome = memory.run_isolated(memory.measure_memory, (allocate,), {"device": "cpu"})
    assert outcome.status == "ok", outcome.error
    isolated = outcome.value["rss_delta_mib"]
    code = FRESH_INTERPRETER.format(mib=ALLOCATION_MIB)
    fresh = float(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout
    )
    assert isolated == pytest.approx(fresh, rel=0.05)
    assert isolated == pytest.approx(ALLOCATION_MIB, rel=0.05)


@pytest.mark.process
def test_the_peak_is_the_calls_own_not_an_earlier_one_of_the_process():
    """The high-water mark is reset before the call: an earlier, larger peak of this process
    (here 256 MiB, freed again) neither counts nor stops the measurement. In a child of its own,
    whose pages no earlier test has touched."""
    outcome = memory.run_isolated(_small_after_a_larger_peak)
    assert outcome.status == "ok", outcome.error
    assert outcome.value == pytest.approx(16, abs=4)


def _small_after_a_larger_peak() -> float:
    earlier = torch.ones(ALLOCATION_MIB * memory.MIB // 4)
    del earlier  # a large block: returned to the system at once
    small = functools.partial(torch.ones, 16 * memory.MIB // 4)
    return memory.measure_memory(small, device="cpu")["rss_delta_mib"]


@pytest.mark.process
def test_result_comes_back():
    assert memory.run_isolated(divmod, (17, 5)) == memory.Outcome("ok", (3, 2))


@pytest.mark.process
def test_a_child_that_raises_is_failed_with_its_error():
    outcome = memory.run_isolated(int, ("not a number",))
    assert outcome.status == "failed"
    assert outcome.error.startswith("ValueError: invalid literal for int()")


@pytest.mark.process
def test_a_result_that_cannot_be_sent_back_is_failed():
    outcome = memory.run_isolated(threading.Lock)  # a lock does not pickle
    assert outcome.status == "failed"
    assert outcome.error.startswith("the result could not be sent back")


@pytest.mark.process
def test_a_child_killed_by_a_signal_is_killed():
    outcome = memory.run_isolated(signal.raise_signal, (signal.SIGKILL,))
    assert outcome == memory.Outcome("killed", error="killed by SIGKILL")


@pytest.mark.process
def test_a_child_over_the_memory_cap_is_oom():
    outcome = memory.run_isolated(torch.ones, (1024 * memory.MIB // 4,), memory_cap_mib=256)
    assert outcome.status == "oom"
    assert "allocate" in outcome.error


@pytest.mark.process
def test_a_child_past_its_timeout_is_stopped():
    outcome = memory.run_isolated(time.sleep, (60,), timeout_s=0.5)
    assert outcome == memory.Outcome("timeout", error="timed out after 0.5 s")


def _cuda_cannot_start():
    raise RuntimeError("CUDA error: out of memory")  # what CUDA says when its context cannot map


@pytest.mark.process
def test_cuda_that_cannot_start_under_the_cap_is_no_oom():
    """A CUDA context needs far more address space than it uses: under the CPU's cap it fails
    to start, which is not the point running out of memory (resume would rerun an oom)."""
    outcome = memory.run_isolated(_cuda_cannot_start, memory_cap_mib=1024)
    assert outcome.status == "failed"
    assert "under a cap of 1024 MiB: give CUDA work 0" in outcome.error
    assert memory.run_isolated(_cuda_cannot_start, memory_cap_mib=0).status == "oom"


def test_memory_cap_from_the_environment(monkeypatch):
    monkeypatch.delenv(memory.MEMORY_CAP_ENV, raising=False)
    assert memory.default_memory_cap_mib() == memory.DEFAULT_MEMORY_CAP_MIB
    monkeypatch.setenv(memory.MEMORY_CAP_ENV, "512")
    assert memory.default_memory_cap_mib() == 512
    monkeypatch.setenv(memory.MEMORY_CAP_ENV, "lots")
    with pytest.raises(ValueError, match=memory.MEMORY_CAP_ENV):
        memory.default_memory_cap_mib()


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.serial
def test_time_call_agrees_with_torch_benchmark_timer(one_thread):
    # Other processes come and go on a shared machine, so the two timers take turns, one short
    # call each, 200 times: both see the same load, and a short call is rarely preempted (a
    # block of them nearly always is, so Timer's blocked_autorange would measure something
    # else). out= keeps the allocator (which may page-fault a fresh result, or not) out of it.
    a, b, c = torch.randn(384, 384), torch.randn(384, 384), torch.empty(384, 384)
    timer = benchmark.Timer(stmt="torch.mm(a, b, out=c)", globals=locals(), num_threads=1)
    ours, theirs = [], []
    for turn in range(200):
        if turn % 2:
            theirs.append(timer.timeit(number=1).median * 1000)
        timing = clock.time_call(lambda: torch.mm(a, b, out=c), min_repeats=1, min_time_s=0)
        ours.append(timing["time_ms"])
        if not turn % 2:
            theirs.append(timer.timeit(number=1).median * 1000)
    assert statistics.median(ours) == pytest.approx(statistics.median(theirs), rel=0.10)


def test_time_call_reports_its_samples_and_threads(one_thread):
    result = clock.time_call(lambda: None, warmup=0, min_repeats=7, min_time_s=0)
    assert result["repeats"] == len(result["time_samples_ms"]) == 7
    assert result["threads_used"] == 1 and result["timing_method"] == clock.CPU_METHOD
    assert not set(result) & store.RESERVED, "nothing a row may not carry"


def test_a_cpu_timing_says_how_busy_the_machine_was(one_thread):
    result = clock.time_call(lambda: torch.ones(1000).sum(), min_repeats=6, min_time_s=0)
    assert 0 <= result["cpu_load_beside"] <= 1
    assert result["repeats"] == len(result["time_samples_ms"]) == 6


@pytest.mark.serial
def test_cpu_load_counts_other_processes_on_this_processs_cpus_not_its_own():
    """Pinned to one CPU: while a process spinning there has it, the share others used is
    most of it; while this process itself spins, it is not counted as another's (another
    test worker may share the CPU: then others have about half of it)."""
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})
    try:
        load = conditions.CpuLoad()
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # inherits it
        try:
            time.sleep(1.0)
        finally:
            spinner.kill()
            spinner.wait()
        beside_a_spinner = load.share()
        assert beside_a_spinner > 0.5
        load, end = conditions.CpuLoad(), time.perf_counter() + 1.0
        while time.perf_counter() < end:
            pass
        assert load.share() < beside_a_spinner - 0.25
    finally:
        os.sched_setaffinity(0, cpus)


def test_a_cpu_timing_keeps_its_columns_and_its_minimum(one_thread):
    """The CUDA timing's stop rule and clock columns are CUDA's only: on the CPU the minimum
    ends the sampling (however short max_time_s) and the columns are those they always were."""
    result = clock.time_call(lambda: None, min_repeats=7, min_time_s=0, max_time_s=0)
    assert result["repeats"] == 7
    assert set(result) - {"cpu_load_beside"} == {
        "time_ms", "time_iqr_ms", "repeats", "time_samples_ms", "timing_method",
        "threads_used", "cpu_time_samples_ms",
    }  # fmt: skip


def test_calls_beside_are_timed_in_turns_and_named(one_thread):
    calls = []
    result = clock.time_call(
        lambda: calls.append("fn"),
        beside={"half": lambda: calls.append("half"), "reference": lambda: calls.append("ref")},
        warmup=1,
        min_repeats=4,
        min_time_s=0,
    )
    assert calls == ["fn", "half", "ref"] + ["fn", "half", "ref"] * 4, "warm-ups, then rounds"
    for name in ("", "half_", "reference_"):
        assert len(result[f"{name}time_samples_ms"]) == len(result[f"{name}cpu_time_samples_ms"])
        assert len(result[f"{name}time_samples_ms"]) == 4
    assert result["time_ms"] == statistics.median(result["time_samples_ms"])
    assert result["repeats"] == 4
    kinds = ("time", "cpu_time")
    beside = {f"{name}_{kind}_samples_ms" for name in ("half", "reference") for kind in kinds}
    assert {c for c in result if c.startswith(("half_", "reference_"))} == beside, "samples only"
    with pytest.raises(ValueError, match="needs a name"):
        clock.time_call(lambda: None, beside={"": lambda: None})


def test_a_paired_ratio_cancels_a_change_of_speed_between_rounds():
    """Two calls timed in turns (a round each at one speed of the machine: 1x, then 3x slower,
    ...): the median of the rounds' ratios is the calls' own ratio, whatever the speeds."""
    speeds = iter([1, 1, 3, 3, 1.5, 1.5, 2, 2, 1, 1])

    def costing(cost_ms: float):
        return lambda: cost_ms * next(speeds)

    samples = clock.sample_rounds({"long": costing(8.0), "short": costing(2.0)}, 5, 0)
    assert clock.paired_ratio(samples["long"], samples["short"]) == 4.0
    with pytest.raises(ValueError, match="needs a sample of each"):
        clock.paired_ratio([], [1.0])


def test_a_slow_call_beside_costs_its_minimum_repeats_and_fn_keeps_its_own():
    """fn (1 ms) wants min_time_s, 10 ms: 10 samples, as alone; the reference beside it
    (100 ms) stops at min_repeats, 3; their ratio pairs the 3 rounds both were timed in."""
    timed = []

    def costing(name: str, cost_ms: float):
        return lambda: timed.append(name) or cost_ms

    samplers = {"fn": costing("fn", 1.0), "reference": costing("reference", 100.0)}
    samples = clock.sample_rounds(samplers, 3, 0.01)
    assert samples == {"fn": [1.0] * 10, "reference": [100.0] * 3}
    assert timed == ["fn", "reference"] * 3 + ["fn"] * 7
    assert clock.paired_ratio(samples["reference"], samples["fn"]) == 100.0
    assert clock.sample_rounds({"fn": samplers["fn"]}, 3, 0.01) == {"fn": samples["fn"]}


def test_the_flush_buffer_is_twice_the_l2():
    assert clock.flush_bytes(50 * memory.MIB) == 100 * memory.MIB  # an H100's 50 MiB
    assert clock.flush_bytes(0) == clock.FLUSH_FALLBACK_BYTES


class RecordingTimer(clock.CudaTimer):
    """CudaTimer with its device calls as entries of a log (no GPU here): an event's time is
    the stand-in clock's (`now`) when it is recorded."""

    log: list[str] = []
    now = [0.0]

    def __init__(self, device) -> None:
        log, now = self.log, self.now

        class Event:
            def __init__(self, name):
                self.name, self.at = name, None

            def record(self, stream):
                log.append(self.name)
                self.at = now[0]

            def synchronize(self):
                log.append("wait")

            def elapsed_time(self, end):
                return end.at - self.at

        self.buffer = type("Buffer", (), {"zero_": lambda _: log.append("flush")})()
        self.stream, self.start, self.end = None, Event("start"), Event("end")


class RecordingClocks(conditions.GpuClocks):
    """GpuClocks with NVML stood in for (no GPU here): each read is an entry of the timer's
    log, its SM clock the next of `script`, then `steady` once the script has run out, with
    `default` the GPU's default SM clock."""

    script: list[int] = []
    steady, default = 1980, 1980

    def __init__(self, device) -> None:
        import pynvml

        self.sm, self.memory, self.reasons = [], [], 0
        self.nvml, self.handle, self.default_sm = pynvml, "a GPU", self.default
        self.reads = iter(self.script)

    def read(self) -> None:
        RecordingTimer.log.append("clocks")
        self.sm.append(next(self.reads, self.steady))
        self.memory.append(2619)


class StandInTime:
    """The time a CUDA timing reads: perf_counter is the stand-in clock's `now` (in seconds),
    and sleep is a pause in the log that moves `now` on, so that no test waits."""

    @staticmethod
    def perf_counter() -> float:
        return RecordingTimer.now[0] / 1000

    @staticmethod
    def sleep(seconds: float) -> None:
        RecordingTimer.log.append("pause")
        RecordingTimer.now[0] += seconds * 1000


@pytest.fixture
def stand_ins(monkeypatch):
    """The CUDA timing's device, NVML and time stood in for: the log and the clock (ms)."""
    RecordingTimer.log, RecordingTimer.now = [], [0.0]
    monkeypatch.setattr(clock, "CudaTimer", RecordingTimer)
    monkeypatch.setattr(clock, "GpuClocks", RecordingClocks)
    monkeypatch.setattr(clock, "time", StandInTime)
    return RecordingTimer.log, RecordingTimer.now


def lasting(name: str, durations: Iterable[float]) -> Callable[[], None]:
    """A stand-in call: an entry of the log, lasting the next of durations (ms) on the
    stand-in clock."""
    durations = iter(durations)

    def call():
        RecordingTimer.log.append(f"call {name}")
        RecordingTimer.now[0] += next(durations)

    return call


def one_sample(name: str) -> list[str]:
    return ["flush", "start", f"call {name}", "end", "clocks", "wait"]


def test_a_cuda_timing_flushes_the_l2_before_each_call_and_times_it_alone(stand_ins):
    """time_call on CUDA, its device stood in for by a log: each sample is the L2 flushed,
    then one call between its own pair of events, the clocks read while it runs, then the
    wait for its end (as triton's do_bench), for fn and the call beside it in turns."""
    log, now = stand_ins

    def call(name):
        return lambda: log.append(f"call {name}") or now.__setitem__(0, now[0] + 0.25)

    result = clock.time_call(
        call("fn"), device="cuda", beside={"half": call("half")}, warmup=2, min_repeats=3,
        min_time_s=0,
    )  # fmt: skip
    assert log[:4] == ["call fn", "call fn", "call half", "call half"], "the warm-ups first"
    one = ["flush", "start", "call {}", "end", "clocks", "wait"]
    rounds = [entry.format(name) for name in ("fn", "half") for entry in one]
    assert log[4:] == rounds * 3, "then rounds of one flushed, timed call of each"
    assert result["time_samples_ms"] == result["half_time_samples_ms"] == [0.25] * 3
    assert result["time_ms"] == 0.25 and result["timing_method"] == clock.CUDA_METHOD
    assert result["gpu_sm_clock_mhz"] == 1980 and "cpu_time_samples_ms" not in result
    assert result["stopped_by"] == "spread", "identical samples: no more than the minimum"
    assert result["clock_low_samples"] == result["half_clock_low_samples"] == 0


def test_a_sample_at_a_low_clock_is_set_aside_after_a_pause(stand_ins, monkeypatch):
    """The first sample of fn and of the call beside it read the SM clock below 75% of the
    default (1,000 of 1,980 MHz) and last 9 ms, the rest 1 ms: each low one is followed by a
    pause and taken again, is none of the samples, and is counted; the clock is the median
    of the kept samples' reads, not the lowest."""
    log, _ = stand_ins
    monkeypatch.setattr(RecordingClocks, "script", [1000, 1900, 1000, 1800])
    result = clock.time_call(
        lasting("fn", itertools.chain([9.0], itertools.repeat(1.0))), device="cuda",
        beside={"half": lasting("half", itertools.chain([9.0], itertools.repeat(0.5)))},
        warmup=0, min_repeats=3, min_time_s=0,
    )  # fmt: skip
    fn, half = one_sample("fn"), one_sample("half")
    assert log == fn + ["pause"] + fn + half + ["pause"] + half + (fn + half) * 2
    assert result["time_samples_ms"] == [1.0] * 3 and result["half_time_samples_ms"] == [0.5] * 3
    assert result["clock_low_samples"] == result["half_clock_low_samples"] == 1
    assert result["gpu_sm_clock_mhz"] == 1980, "the median of 1900, 1800 and four of 1980"
    assert result["gpu_default_sm_clock_mhz"] == 1980 and result["stopped_by"] == "spread"


@pytest.mark.parametrize(
    ("durations", "max_repeats", "stopped_by", "repeats"),
    [
        (itertools.cycle([1.0, 1.01, 0.99]), 1000, "spread", 5),  # tight: the minimum
        (itertools.cycle([1.0, 1.5]), 1000, "settled", 8),  # the same median at 4 and 8
        ((10.0 * k for k in itertools.count(1)), 1000, "budget", 20),  # 2.1 s at the 20th
        ((10.0 * k for k in itertools.count(1)), 6, "repeats", 6),
    ],
)
def test_cuda_sampling_goes_on_until_it_has_settled(
    stand_ins, durations, max_repeats, stopped_by, repeats
):
    """Past the minimum (5 samples), fn is sampled until its samples' IQR is at most 2% of
    their median, or their median has not moved since the count was half, or the budget (2 s
    on the stand-in clock) is spent, or max_repeats is reached; stopped_by says which."""
    result = clock.time_call(
        lasting("fn", durations), device="cuda", warmup=0, min_repeats=5, min_time_s=0,
        max_repeats=max_repeats,
    )  # fmt: skip
    assert (result["stopped_by"], result["repeats"]) == (stopped_by, repeats)


def test_a_gpu_stuck_at_a_low_clock_is_still_timed_and_says_so(stand_ins, monkeypatch):
    """Every read at 1,000 of 1,980 MHz: samples are set aside, each with its pause, until the
    budget is spent; then the low samples are kept, and the row's median clock is low."""
    log, now = stand_ins
    monkeypatch.setattr(RecordingClocks, "steady", 1000)
    result = clock.time_call(
        lasting("fn", itertools.repeat(1.0)), device="cuda", warmup=0, min_repeats=3,
        min_time_s=0,
    )  # fmt: skip
    assert result["time_samples_ms"] == [1.0] * 3
    assert result["clock_low_samples"] == log.count("pause") > 0
    assert now[0] >= 2000, "set aside until the budget was spent"
    low = conditions.LOW_CLOCK_SHARE * result["gpu_default_sm_clock_mhz"]
    assert result["gpu_sm_clock_mhz"] < low


def test_the_default_sm_clock_is_the_maximum_where_nvml_has_no_default():
    import pynvml

    class Nvml:
        NVMLError, NVML_CLOCK_SM = pynvml.NVMLError, pynvml.NVML_CLOCK_SM

        def nvmlDeviceGetDefaultApplicationsClock(self, handle, kind):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

        def nvmlDeviceGetMaxClockInfo(self, handle, kind):
            return 1980 if kind == pynvml.NVML_CLOCK_SM else 0

    assert conditions.default_sm_clock(Nvml(), "a GPU") == 1980


def test_clock_limits_are_named_as_nvml_names_them_and_idleness_is_none():
    import pynvml

    names = conditions._nvml_reasons(pynvml)
    power, slow = pynvml.nvmlClocksEventReasonSwPowerCap, pynvml.nvmlClocksEventReasonHwSlowdown
    idle = pynvml.nvmlClocksEventReasonGpuIdle
    assert conditions.clock_limits(power | slow | idle, names) == "sw_power_cap, hw_slowdown"
    assert conditions.clock_limits(idle, names) == conditions.clock_limits(0, names) == "none"
    assert conditions.clock_limits(1 << 40, names) == "0x10000000000"


def test_without_nvml_a_timing_has_no_clock_columns():
    clocks = conditions.GpuClocks(torch.device("cuda"))  # no GPU here: NVML cannot be reached
    clocks.read()
    assert clocks.columns() == {} and not clocks.low(), "nothing set aside without NVML"


def test_summary_of_known_samples():
    summary = clock.summarize_ms([5.0, 1.0, 4.0, 2.0, 3.0])
    assert (summary["time_ms"], summary["time_iqr_ms"], summary["repeats"]) == (3.0, 2.0, 5)


def test_gflops_and_a_measured_cached_peak():
    assert clock.gflops(3e9, 1500.0) == pytest.approx(2.0)
    peak = clock.peak_gflops("cpu", torch.float32, size=512)
    assert peak > 0
    assert clock.peak_gflops("cpu", torch.float32, size=512) == peak  # cached


@pytest.mark.gpu
@pytest.mark.process  # it measures in a child process (harness.measuring.memory)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_peak_of_a_known_allocation():
    allocate = functools.partial(torch.ones, ALLOCATION_MIB * memory.MIB // 4, device="cuda")
    outcome = memory.run_isolated(
        memory.measure_memory, (allocate,), {"device": "cuda"}, memory_cap_mib=0
    )
    assert outcome.status == "ok", outcome.error
    assert "rss_delta_mib" not in outcome.value
    assert outcome.value["cuda_peak_mib"] == pytest.approx(ALLOCATION_MIB, rel=0.01)
    assert outcome.value["cuda_reserved_mib"] >= outcome.value["cuda_peak_mib"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_timing_agrees_with_torch_benchmark_timer():
    """At a mid-size shape (flash-size inputs of 8 MiB each, a kernel of some 100 us), where
    neither launch overhead nor the L2 decides: the batched, flushed median within 10% of
    torch.utils.benchmark's blocked_autorange median, in alternating turns."""
    query = torch.randn(1, 8, 4096, 64, device="cuda", dtype=torch.bfloat16)
    forward = functools.partial(F.scaled_dot_product_attention, query, query, query, is_causal=True)
    timer = benchmark.Timer("forward()", globals={"forward": forward})
    ours, theirs = [], []
    for _ in range(3):
        ours.append(clock.time_call(forward, device="cuda", min_time_s=0.3)["time_ms"])
        theirs.append(timer.blocked_autorange(min_run_time=0.3).median * 1000)
    assert statistics.median(ours) == pytest.approx(statistics.median(theirs), rel=0.10)
    timing = clock.time_call(forward, device="cuda", min_time_s=0.1)
    assert timing["timing_method"] == clock.CUDA_METHOD
    assert timing["gpu_sm_clock_mhz"] > 0 and timing["gpu_mem_clock_mhz"] > 0
    assert isinstance(timing["gpu_clock_limits"], str)
    assert clock.peak_gflops("cuda", torch.bfloat16) > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_real_cuda_timing_says_its_clocks_and_why_it_stopped():
    """On a real GPU: samples at a low clock are counted, the stop rule is named, and the
    median SM clock of the samples kept is at least LOW_CLOCK_SHARE of the default."""
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    timing = clock.time_call(lambda: a @ a, device="cuda", min_time_s=0.1)
    assert timing["clock_low_samples"] >= 0
    assert timing["stopped_by"] in ("spread", "settled", "budget", "repeats")
    if "gpu_default_sm_clock_mhz" in timing:  # NVML reached the device
        floor = conditions.LOW_CLOCK_SHARE * timing["gpu_default_sm_clock_mhz"]
        assert timing["gpu_sm_clock_mhz"] >= floor
