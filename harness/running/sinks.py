"""Sinks: other places a point's rows go as they land (TensorBoard, say), the store staying the
one source of truth.

A sink is a class with three methods, named by a `_target_` under the config's `sinks:` (one YAML
each in conf/sinks/, or a --config-dir's; choose them with `sinks=tensorboard` or
`sinks=[tensorboard,mine]`):
- open(point, continues_after): the point starts (point: experiment, sweep, job, params, out);
  continues_after is the last row it kept when it continues from a checkpoint (resume, a
  requeue), else None: rows logged after that replace the sink's own past that point;
- write(rows): rows that landed in the store, in order (a training point's as they land, then
  its final ones; any other point's at its end), each a flat dict as stored;
- close(): the point ended;
- read(point), where it can: what the sink holds for the point, as its own reader reads it back:
  each value once as logged, {step, name, value}, in order; the sinks' contract test
  (tests/test_sinks.py) checks every sink in conf/sinks/ through it.
A sink that fails (on open, a write or close) is said once, on the point's progress and in its
log, and left out for the rest of the point; it never fails the point.
"""

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from hydra.utils import instantiate

from harness import store
from harness.errors import with_type

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PointInfo:
    """What a sink is told of the point whose rows it receives."""

    experiment: str
    sweep: str
    job: int
    params: dict
    out: Path


class Sinks:
    """The point's sinks, each left out once it fails, said once (`say`: the progress line)."""

    def __init__(self, nodes: dict | None, point: PointInfo, say=print):
        self.say, self.sinks = say, {}
        for name, node in (nodes or {}).items():
            try:
                self.sinks[name] = instantiate(node)
            except Exception as error:
                self._failed(name, "start", error)
        self.point = point

    def open(self, continues_after: dict | None = None) -> None:
        self._each("open", self.point, continues_after)

    def write(self, rows: list[dict]) -> None:
        if rows:
            self._each("write", rows)

    def close(self) -> None:
        self._each("close")

    def send(self, rows: list[dict]) -> None:
        """A point's rows all at once (one without a tracker, at its end)."""
        self.open()
        self.write(rows)
        self.close()

    def _each(self, method: str, *args) -> None:
        for name, sink in list(self.sinks.items()):
            try:
                getattr(sink, method)(*args)
            except Exception as error:
                self._failed(name, method, error)

    def _failed(self, name: str, what: str, error: Exception) -> None:
        self.sinks.pop(name, None)
        said = f"sink {name} failed to {what} ({with_type(error)[:200]}); left out for this point"
        log.warning(said)
        self.say(said)


class TensorBoard:
    """A point's numeric columns as TensorBoard scalars, one run folder a point:
    ROOT/EXPERIMENT/SWEEP/job-N (ROOT: out/tensorboard), so that `tensorboard --logdir
    outputs/tensorboard` shows every sweep's curves. A row's `step` is its step (its position
    among the point's rows where it has none); a row with a `phase` (exp017's train, eval)
    writes its scalars under that phase: loss as train/loss and eval/loss."""

    def __init__(self, root: str | None = None):
        self.root, self.writer, self.position = root, None, 0

    def open(self, point: PointInfo, continues_after: dict | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # Continuing from a checkpoint: TensorBoard drops what this run logged past it.
        purge = None if continues_after is None else self._step(continues_after, 0) + 1
        if purge is not None:
            _after_the_newest_file(self.folder(point))
        self.writer = SummaryWriter(str(self.folder(point)), purge_step=purge)
        self.skip = set(point.params) | set(store.HARNESS_COLUMNS)

    def write(self, rows: list[dict]) -> None:
        for row in rows:
            step = self._step(row, self.position)
            self.position += 1
            phase = f"{row['phase']}/" if isinstance(row.get("phase"), str) else ""
            for name, value in row.items():
                if name in self.skip or name == "step" or isinstance(value, bool):
                    continue
                if isinstance(value, int | float):
                    self.writer.add_scalar(f"{phase}{name}", value, step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    def folder(self, point: PointInfo) -> Path:
        root = Path(self.root) if self.root else Path(point.out) / "tensorboard"
        return root / point.experiment / point.sweep / f"job-{point.job}"

    def read(self, point: PointInfo) -> list[dict]:
        """The point's scalars as TensorBoard's own reader (EventAccumulator) reads them, each
        event once, in the order logged: {step, name, value}."""
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        events = EventAccumulator(str(self.folder(point)))
        events.Reload()
        logged = [
            (event.wall_time, event.step, tag, event.value)
            for tag in events.Tags()["scalars"]
            for event in events.Scalars(tag)
        ]
        return [{"step": step, "name": tag, "value": value} for _, step, tag, value in
                sorted(logged, key=lambda event: event[0])]  # fmt: skip

    @staticmethod
    def _step(row: dict, position: int) -> int:
        step = row.get("step")
        return int(step) if isinstance(step, int | float) and step == step else position


def _after_the_newest_file(folder: Path) -> None:
    """Wait, if need be, for the second after that of the newest event file in `folder`. An
    event file's name starts with the second it was made in, and TensorBoard reads a run's files
    in the order of their names: a writer that continues a run within the second of the one it
    replaces could be read first, its purge before the rows it drops."""
    seconds = [int(path.name.split(".")[3]) for path in folder.glob("events.out.tfevents.*")
               if path.name.split(".")[3].isdigit()]  # fmt: skip
    while seconds and time.time() < max(seconds) + 1:
        time.sleep(0.05)
