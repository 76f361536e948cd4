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
- close(): the point ended.
A sink that fails (on open, a write or close) is said once, on the point's progress and in its
log, and left out for the rest of the point; it never fails the point.
"""

import logging
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

        root = Path(self.root) if self.root else Path(point.out) / "tensorboard"
        folder = root / point.experiment / point.sweep / f"job-{point.job}"
        # Continuing from a checkpoint: TensorBoard drops what this run logged past it.
        purge = None if continues_after is None else self._step(continues_after, 0) + 1
        self.writer = SummaryWriter(str(folder), purge_step=purge)
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

    @staticmethod
    def _step(row: dict, position: int) -> int:
        step = row.get("step")
        return int(step) if isinstance(step, int | float) and step == step else position
