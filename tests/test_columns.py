"""harness.measuring.columns: which of a row's columns is a timing, which a timing's housekeeping,
checked on the columns time_call really writes; and what counts as a number."""

import fractions
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from harness.measuring import columns
from harness.measuring.timing import time_call

TIMING, HOUSEKEEPING, NEITHER = "timing", "housekeeping", "neither"
# Every column time_call writes (a call beside it named "half"), and what it is.
CPU_COLUMNS = {
    "time_ms": TIMING,
    "time_iqr_ms": HOUSEKEEPING,
    "repeats": HOUSEKEEPING,
    "time_samples_ms": HOUSEKEEPING,
    "cpu_time_samples_ms": HOUSEKEEPING,
    "half_time_samples_ms": HOUSEKEEPING,
    "half_cpu_time_samples_ms": HOUSEKEEPING,
    "timing_method": NEITHER,
    "threads_used": HOUSEKEEPING,
    "cpu_load_beside": HOUSEKEEPING,
}
CUDA_COLUMNS = {
    **{name: kind for name, kind in CPU_COLUMNS.items() if "cpu" not in name},
    "stopped_by": NEITHER,
    "clock_low_samples": HOUSEKEEPING,
    "half_clock_low_samples": HOUSEKEEPING,
    "gpu_sm_clock_mhz": HOUSEKEEPING,
    "gpu_mem_clock_mhz": HOUSEKEEPING,
    "gpu_default_sm_clock_mhz": HOUSEKEEPING,
    "gpu_clock_limits": NEITHER,
}


def kind(column: str) -> str:
    timing, housekeeping = columns.is_timing(column), columns.is_housekeeping(column)
    assert not (timing and housekeeping), f"{column} is both"
    return TIMING if timing else HOUSEKEEPING if housekeeping else NEITHER


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        ("cpu", CPU_COLUMNS),
        pytest.param(
            "cuda",
            CUDA_COLUMNS,
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
            ],
        ),
    ],
)
def test_every_column_time_call_writes_is_classified(device, expected):
    """A real timing's row, a call beside it: its timing is time_ms alone; every other number
    says how it was taken. A column time_call starts to write fails here until it is decided."""
    row = time_call(lambda: None, device=device, warmup=0, min_repeats=3, min_time_s=0,
                    beside={"half": lambda: None})  # fmt: skip
    assert set(row) <= set(expected), f"undecided: {sorted(set(row) - set(expected))}"
    assert {"time_ms", "repeats", "time_samples_ms", "threads_used"} <= set(row)
    assert {column: kind(column) for column in row} == {c: expected[c] for c in row}


@pytest.mark.parametrize(
    ("column", "expected"),
    [
        ("sdpa_time_ms", TIMING),  # a call timed under a prefix
        ("forward_s", TIMING),
        ("sdpa_time_iqr_ms", HOUSEKEEPING),
        ("sdpa_repeats", HOUSEKEEPING),
        ("sdpa_cpu_load_beside", HOUSEKEEPING),
        ("sdpa_threads_used", HOUSEKEEPING),
        ("sdpa_gpu_sm_clock_mhz", HOUSEKEEPING),
        ("sdpa_clock_low_samples", HOUSEKEEPING),
        ("loss", NEITHER),
        ("cuda_peak_mib", NEITHER),
        ("gflops", NEITHER),
        ("overrepeats", NEITHER),  # a name that merely ends as one does, without the prefix's _
    ],
)
def test_prefixed_and_other_metrics_are_classified_by_name(column, expected):
    assert kind(column) == expected


def test_the_declared_names_are_those_time_call_writes():
    row = time_call(lambda: None, warmup=0, min_repeats=2, min_time_s=0)
    declared = [columns.TIME, columns.SPREAD, columns.REPEATS, columns.SAMPLES,
                columns.CPU_SAMPLES, columns.METHOD, columns.THREADS]  # fmt: skip
    assert set(declared) <= set(row)
    assert columns.LOAD == "cpu_load_beside" and columns.CLOCK == "gpu_sm_clock_mhz"
    assert columns.prefixed("half", columns.SAMPLES) == "half_time_samples_ms"
    assert columns.prefixed("", columns.SAMPLES) == columns.SAMPLES


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1, True),
        (1.5, True),
        (float("nan"), True),
        (fractions.Fraction(1, 3), True),
        (np.int64(3), True),
        (np.float32(0.5), True),
        (True, False),
        (False, False),
        (np.bool_(True), False),
        ("1", False),
        (None, False),
        ([1.0], False),
    ],
)
def test_a_number_is_never_a_boolean(value, expected):
    assert columns.is_number(value) is expected


@pytest.mark.parametrize(
    ("column", "expected"),
    [
        (pd.Series([1, 2]), True),
        (pd.Series([1.5, None]), True),
        (pd.Series([1, None], dtype="Int64"), True),
        (pd.Series([True, False]), False),
        (pd.Series([True, None], dtype="boolean"), False),
        (pd.Series(["a", "b"]), False),
        (pd.Series([[1.0], [2.0]]), False),  # samples: lists
    ],
)
def test_a_column_of_numbers_is_never_one_of_booleans(column, expected):
    assert columns.is_number_column(column) is expected
    assert columns.is_number_column(column.dtype) is expected


@pytest.mark.process
def test_the_module_loads_neither_torch_nor_pandas():
    """The report imports it: it stays light."""
    code = ("import sys, harness.measuring.columns; "
            "print(sorted({'torch', 'pandas', 'numpy'} & set(sys.modules)))")  # fmt: skip
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("column", "expected"),
    [("time_samples_ms", True), ("half_cpu_time_samples_ms", True), ("time_ms", False),
     ("time_iqr_ms", False), ("samples", False)],
)  # fmt: skip
def test_a_timings_samples_are_named_so(column, expected):
    assert columns.is_samples(column) is expected
