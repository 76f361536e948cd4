"""The local launcher: points in parallel processes here, under a cap, a GPU of their own each."""

import itertools
import os

import pandas as pd
import pytest

from harness import store
from harness.launchers import LocalLauncher


@pytest.mark.slow
def test_points_run_in_parallel_under_the_cap_with_distinct_gpus(harness, most_at_once):
    result = harness(
        "+experiment=exp014_tiled", "length=2000,2001,2002,2003", "block=16", "heads=2",
        "hydra/launcher=local", "hydra.launcher.max_parallel=2", "hydra.launcher.gpus=[0,1]",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = store.read(harness.results).sort_values("started_at")
    assert len(rows) == 4 and set(rows["status"]) == {"ok"}
    assert most_at_once(rows) == 2, rows[["job", "started_at", "duration_s"]]
    assert set(rows["gpus"]) == {"0", "1"}
    assert set(rows["threads"]) == {max(1, len(os.sched_getaffinity(0)) // 2)}, "CPUs shared"
    starts = rows["started_at"].map(pd.Timestamp.timestamp)
    spans = zip(starts, starts + rows["duration_s"], rows["gpus"], strict=True)
    for (start, end, gpu), (other_start, other_end, other_gpu) in itertools.combinations(spans, 2):
        if start < other_end and other_start < end:
            assert gpu != other_gpu, "two points that ran at once shared a GPU"


def test_the_cap_is_the_gpu_count_where_there_are_gpus():
    assert LocalLauncher(max_parallel=8, gpus=[0, 1, 2], submitit_folder="x").max_parallel == 3
    assert LocalLauncher(max_parallel=3, gpus=[], submitit_folder="x").max_parallel == 3
    with pytest.raises(ValueError, match="max_parallel"):
        LocalLauncher(max_parallel=0, submitit_folder="x")
