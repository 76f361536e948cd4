"""Sinks: a point's rows also reach TensorBoard (read back with TensorBoard's own reader), each
step once across a kill and a resume; a sink that fails is said once and never fails the point."""

import os
import signal

import pytest
from probes import PROBE_PATH, SUPPORT, held, wait_for
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from harness import store


def scalars(folder, tag: str) -> list[tuple[int, float]]:
    """(step, value) of a TensorBoard run's scalar, as TensorBoard reads its event files."""
    events = EventAccumulator(str(folder))
    events.Reload()
    return [(event.step, event.value) for event in events.Scalars(tag)]


@pytest.fixture
def trainer(harness):
    """The trainer probe (tests/support/probes.py) with the probes' config dir."""
    gate = harness.cwd / "gate"
    gate.mkdir()
    given = ["--config-dir", str(SUPPORT / "conf"), "+experiment=trainer", f"folder={gate}"]

    def run(*args: str, **kwargs):
        return harness(*given, *args, env={"PYTHONPATH": PROBE_PATH}, **kwargs)

    run.start = lambda *args: harness.start(*given, *args, env={"PYTHONPATH": PROBE_PATH})
    run.resume = lambda sweep: harness(
        *given[:-1], f"resume={sweep}", env={"PYTHONPATH": PROBE_PATH}
    )
    run.gate, run.harness, run.results = gate, harness, harness.results
    return run


def run_folder(harness, experiment: str, job: int = 0):
    (sweep,) = store.sweeps(harness.results, experiment)
    return harness.cwd / "outputs" / "tensorboard" / experiment / sweep / f"job-{job}"


def test_a_training_points_rows_reach_tensorboard_each_step_once_across_a_kill(trainer):
    running = trainer.start("steps=20", "hold_at=10", "checkpoint_every=4", "stream_s=0.2",
                            "sinks=tensorboard")  # fmt: skip
    wait_for(lambda: held(trainer.gate), 60, "the run to hold at step 10")
    folder = run_folder(trainer.harness, "trainer")
    wait_for(lambda: len(scalars(folder, "value")) == 10, 60, "10 steps in TensorBoard")
    os.killpg(running.pid, signal.SIGKILL)
    running.wait(timeout=60)
    (sweep,) = store.sweeps(trainer.results, "trainer")
    resumed = trainer.resume(sweep)  # continues from the checkpoint at step 8
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    steps = [(step, value) for step, value in scalars(folder, "value") if step > 0]
    assert steps == [(step, step * 10.0) for step in range(1, 21)], "each step once"


def test_any_points_rows_reach_tensorboard_at_its_end(harness):
    result = harness("+experiment=exp014_tiled", "length=64,80", "block=16", "heads=2",
                     "sinks=tensorboard")  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = store.read(harness.results).sort_values("job")
    for job in (0, 1):
        (value,) = scalars(run_folder(harness, "exp014_tiled", job), "max_abs_diff")
        assert value[1] == pytest.approx(rows["max_abs_diff"].iloc[job], rel=1e-6)


def test_a_sink_that_fails_is_said_once_and_the_point_is_ok(trainer):
    result = trainer("steps=20", "stream_rows=5", "sinks=[tensorboard,broken]")
    assert result.returncode == 0, result.stdout + result.stderr
    said = "sink broken failed to write (ConnectionError: the sink's server went away)"
    assert result.stdout.count(said) == 1, result.stdout
    assert set(store.read(trainer.results, "trainer")["status"]) == {"ok"}
    steps = [step for step, _ in scalars(run_folder(trainer.harness, "trainer"), "value")]
    assert sorted(steps) == list(range(21)), "the other sink got every row"
