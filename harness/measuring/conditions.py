"""The conditions a timing ran under, which harness.measuring.timing writes beside it: how busy
the machine's CPUs were with other processes (CpuLoad, cpu_load_beside) and, on CUDA, the clocks
the GPU ran at and what held them down (GpuClocks, gpu_sm_clock_mhz and the rest, through NVML).
Two timings taken hours apart can only be compared knowing these: a slower machine is not slower
code."""

import functools
import operator
import os
import re
import statistics
import time
from collections.abc import Mapping
from typing import Any

import torch

from harness.measuring.columns import CLOCK, CLOCK_LIMITS, DEFAULT_CLOCK, MEM_CLOCK

LOW_CLOCK_SHARE = 0.75  # a CUDA sample read below this share of the default SM clock is set aside


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


class GpuClocks:
    """The clocks a GPU ran at while calls were timed on it, read through NVML (nvidia-ml-py)
    while the calls ran: the median SM clock of the samples kept (a sample set aside takes its
    reading with it: set_aside), the GPU's default SM clock, the lowest memory clock seen, and
    every reason NVML gave for holding the clocks down (power or thermal caps, slowdowns,
    application clock settings), idleness aside. Reads nothing, finds no clock low, and gives
    no columns, where NVML or the device cannot be reached (no driver, a MIG slice,
    nvidia-ml-py not installed)."""

    def __init__(self, device: torch.device) -> None:
        self.sm, self.memory, self.reasons = [], [], 0
        self.nvml, self.handle, self.default_sm = None, None, None
        try:
            import pynvml

            pynvml.nvmlInit()
            uuid = torch.cuda.get_device_properties(device).uuid
            self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
            self.default_sm = default_sm_clock(pynvml, self.handle)
        except Exception:  # no NVML here: the timing stands without the clocks
            pass

    def read(self) -> None:
        if self.handle is None:
            return
        nvml = self.nvml
        try:
            self.sm.append(nvml.nvmlDeviceGetClockInfo(self.handle, nvml.NVML_CLOCK_SM))
            self.memory.append(nvml.nvmlDeviceGetClockInfo(self.handle, nvml.NVML_CLOCK_MEM))
            self.reasons |= nvml.nvmlDeviceGetCurrentClocksEventReasons(self.handle)
        except nvml.NVMLError:  # a query this GPU does not support: no clocks from it
            self.handle = None

    def low(self) -> bool:
        """Whether the last SM clock read is below LOW_CLOCK_SHARE of the default."""
        if self.handle is None or self.default_sm is None or not self.sm:
            return False
        return self.sm[-1] < LOW_CLOCK_SHARE * self.default_sm

    def set_aside(self) -> None:
        """The last SM clock read is of a sample set aside: not counted in the median."""
        self.sm.pop()

    def columns(self) -> dict[str, Any]:
        if self.handle is None or not self.sm:
            return {}
        columns = {
            CLOCK: statistics.median(self.sm),
            MEM_CLOCK: min(self.memory),
            CLOCK_LIMITS: clock_limits(self.reasons, _nvml_reasons(self.nvml)),
        }
        if self.default_sm is not None:
            columns[DEFAULT_CLOCK] = self.default_sm
        return columns


def default_sm_clock(nvml, handle) -> int | None:
    """The SM clock a GPU runs at by default (MHz): its default applications clock, or where
    NVML does not give that, its maximum; None where neither can be read."""
    try:
        return nvml.nvmlDeviceGetDefaultApplicationsClock(handle, nvml.NVML_CLOCK_SM)
    except nvml.NVMLError:
        pass
    try:
        return nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM)
    except nvml.NVMLError:
        return None


def _nvml_reasons(nvml) -> dict[int, str]:
    """NVML's clock event reasons by bit, named as the library names them (SwPowerCap:
    sw_power_cap; of two names for one bit, the first)."""
    prefix = "nvmlClocksEventReason"
    named: dict[int, str] = {}
    for attribute in sorted(dir(nvml)):
        reason = attribute.removeprefix(prefix)
        if attribute.startswith(prefix) and reason not in ("All", "None"):
            words = re.findall(r"[A-Z][a-z]*", reason)
            named.setdefault(getattr(nvml, attribute), "_".join(w.lower() for w in words))
    return named


def clock_limits(reasons: int, names: Mapping[int, str]) -> str:
    """The reasons set in the bit mask `reasons` by name ("sw_power_cap, hw_slowdown"), but
    gpu_idle (a GPU waiting between calls is not held down), or "none"; bits that no name has
    as their hex value."""
    said = [name for bit, name in sorted(names.items()) if reasons & bit and name != "gpu_idle"]
    unknown = reasons & ~functools.reduce(operator.or_, names, 0)
    said += [f"{unknown:#x}"] if unknown else []
    return ", ".join(said) or "none"
