"""Sinks: the contract every sink in conf/sinks/ keeps (tests/support/contracts.py lists them),
read back through the sink's own reader: a training point's rows in order as they land, any
point's at its end, what it was sent kept across a kill and nothing sent twice by the resume;
and a sink that fails is said once and never fails the point."""

import os
import signal

import contracts
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf
from probes import PROBE_PATH, SUPPORT, held, wait_for

from harness import store
from harness.names import CONF
from harness.running.sinks import PointInfo

TRAINED = [(step, step * 10.0) for step in range(1, 21)] + [(0, -1.0)]  # the trainer's rows


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


def kept(harness, sink: str, experiment: str, job: int = 0) -> list[tuple[int, float]]:
    """(step, value) of what the sink holds for the sweep's point, through its own reader;
    value: the trainer's `value`, else the point's max_abs_diff."""
    (sweep,) = store.sweeps(harness.results, experiment)
    node = OmegaConf.load(CONF / "sinks" / f"{sink}.yaml")[sink]
    point = PointInfo(experiment, sweep, job, {}, harness.cwd / "outputs")
    name = "value" if experiment == "trainer" else "max_abs_diff"
    return [(row["step"], row["value"]) for row in instantiate(node).read(point)
            if row["name"] == name]  # fmt: skip


@pytest.mark.parametrize("sink", contracts.sinks())
def test_a_sink_gets_a_training_points_rows_in_order_as_they_land(trainer, sink):
    result = trainer("steps=20", "stream_rows=5", f"sinks={sink}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert kept(trainer.harness, sink, "trainer") == TRAINED


@pytest.mark.parametrize("sink", contracts.sinks())
def test_a_sink_gets_any_points_rows_at_its_end(harness, sink):
    result = harness("+experiment=exp014_tiled", "length=64,80", "block=16", "heads=2",
                     f"sinks={sink}")  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = store.read(harness.results).sort_values("job")
    for job in (0, 1):
        ((_, value),) = kept(harness, sink, "exp014_tiled", job)
        assert value == pytest.approx(rows["max_abs_diff"].iloc[job], rel=1e-6)


@pytest.mark.process
@pytest.mark.parametrize("sink", contracts.sinks())
def test_a_sink_keeps_what_it_got_across_a_kill_and_the_resume_sends_nothing_twice(trainer, sink):
    running = trainer.start("steps=20", "hold_at=10", "checkpoint_every=4", "stream_s=0.2",
                            f"sinks={sink}")  # fmt: skip
    wait_for(lambda: held(trainer.gate), 60, "the run to hold at step 10")
    wait_for(lambda: len(kept(trainer.harness, sink, "trainer")) == 10, 60, "10 steps in the sink")
    os.killpg(running.pid, signal.SIGKILL)
    running.wait(timeout=60)
    assert kept(trainer.harness, sink, "trainer") == TRAINED[:10], "what it was sent, kept"
    (sweep,) = store.sweeps(trainer.results, "trainer")
    resumed = trainer.resume(sweep)  # continues from the checkpoint at step 8
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert kept(trainer.harness, sink, "trainer") == TRAINED, "each step once, in order"


def test_a_sink_that_fails_is_said_once_and_the_point_is_ok(trainer):
    result = trainer("steps=20", "stream_rows=5", "sinks=[tensorboard,broken]")
    assert result.returncode == 0, result.stdout + result.stderr
    said = "sink broken failed to write (ConnectionError: the sink's server went away)"
    assert result.stdout.count(said) == 1, result.stdout
    assert set(store.read(trainer.results, "trainer")["status"]) == {"ok"}
    assert sorted(step for step, _ in kept(trainer.harness, "tensorboard", "trainer")) == list(
        range(21)
    ), "the other sink got every row"
