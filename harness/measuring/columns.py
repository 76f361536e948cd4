"""What a column of a row means to the report: a timing, a timing's housekeeping, or neither.

harness.measuring.timing.time_call writes a timing (time_ms) and, beside it, how it was taken:
its spread (time_iqr_ms), its samples (time_samples_ms, cpu_time_samples_ms), their count
(repeats), the load of other processes beside it (cpu_load_beside), torch's threads
(threads_used), and on CUDA the GPU's clocks (gpu_sm_clock_mhz, ...). An experiment that times
several calls prefixes them (sdpa_time_ms, sdpa_repeats, sdpa_cpu_load_beside). The timing is
a metric to plot, compare and follow across sweeps; its housekeeping is drawn as error bars, used
to judge it, or not at all, never as a metric of its own. This module is that decision, once:
the columns' names are declared here and timing writes them, the report reads them.

Only the standard library at import: the report imports it and stays light.
"""

import numbers

TIME = "time_ms"  # the median call
SPREAD = "time_iqr_ms"  # the interquartile range of the samples
SAMPLES = "time_samples_ms"  # each sample, as a list
CPU_SAMPLES = "cpu_time_samples_ms"  # each sample's CPU time of the process (on the CPU)
REPEATS = "repeats"  # how many samples
METHOD = "timing_method"  # how each sample was timed, in words
LOAD = "cpu_load_beside"  # the share of a CPU timing's CPUs that other processes used
THREADS = "threads_used"  # torch's threads while it timed
STOPPED_BY = "stopped_by"  # which rule ended a CUDA timing's sampling
CLOCK = "gpu_sm_clock_mhz"  # the SM clock a CUDA timing ran at (the samples' median)
MEM_CLOCK = "gpu_mem_clock_mhz"  # the lowest memory clock seen
DEFAULT_CLOCK = "gpu_default_sm_clock_mhz"  # the GPU's default SM clock
CLOCK_LIMITS = "gpu_clock_limits"  # what held the clocks down, in words
LOW_CLOCK_SAMPLES = "clock_low_samples"  # CUDA samples set aside for a low SM clock

# The numeric columns that say how a time was taken, with or without a timing's prefix; with
# every column whose name ends in one of HOUSEKEEPING_SUFFIXES (spreads and samples).
HOUSEKEEPING = frozenset({REPEATS, LOAD, THREADS, CLOCK, MEM_CLOCK, DEFAULT_CLOCK,
                          LOW_CLOCK_SAMPLES})  # fmt: skip
SAMPLES_SUFFIX = "_samples_ms"  # a timing's samples, prefixed or not
HOUSEKEEPING_SUFFIXES = ("_iqr_ms", SAMPLES_SUFFIX)
TIMING_SUFFIXES = ("_ms", "_s")


def prefixed(prefix: str, column: str) -> str:
    """A column of the call timed under `prefix` (time_call's `beside`): sdpa_time_samples_ms;
    the column itself for the measured call (prefix "")."""
    return f"{prefix}_{column}" if prefix else column


def is_housekeeping(column: str) -> bool:
    """Whether a column says how a time was taken (HOUSEKEEPING, with or without a timing's
    prefix, or a spread or samples) rather than what was measured."""
    return column.endswith(HOUSEKEEPING_SUFFIXES) or any(
        column == name or column.endswith(f"_{name}") for name in HOUSEKEEPING
    )


def is_samples(column: str) -> bool:
    """Whether a column holds a timing's samples (time_samples_ms, sdpa_cpu_time_samples_ms): a
    row with one measured the moment it ran (harness.reuse copies it only where asked)."""
    return column.endswith(SAMPLES_SUFFIX)


def is_timing(column: str) -> bool:
    """Whether a metric column is a timing: its name ends in _ms or _s (its unit) and it is no
    timing's housekeeping. Callers pass a row's metrics, never its planned parameters: a
    parameter step_sleep_s is no timing, whatever its name says."""
    return column.endswith(TIMING_SUFFIXES) and not is_housekeeping(column)


def is_number(value: object) -> bool:
    """Whether a value is a number (Python's or numpy's) and not a boolean, which Python counts
    as an int."""
    return isinstance(value, numbers.Number) and not isinstance(value, bool)


def is_number_column(column: object) -> bool:
    """Whether a pandas column (a Series, or its dtype) holds numbers, not booleans. Imports
    pandas when called: only the report's callers, which have it, ask."""
    from pandas.api import types

    return types.is_numeric_dtype(column) and not types.is_bool_dtype(column)
