"""Rows while a point runs, and checkpoints: what a training experiment gets as `tracker`.

An experiment function with a parameter named `tracker` is handed a Tracker by the harness (the
config sets no value for it; called as a plain function, it gets None and returns its rows as
any experiment does). Through it the experiment:

- hands over rows as it goes (`log`: a cheap check that Parquet can hold each value, and the
  row kept as it is). They land at least every `every_rows` rows and every `every_s` seconds
  (a thread lands the rows that wait that long while the experiment computes), each landing
  one new segment of the job (store: job-N.part-K.parquet, written whole or not at all, with
  the checksums and digest of any row file) holding only the rows logged since the one before,
  with the point's constant columns added once per segment: a landing costs the same at the
  first row and at the millionth, and the tracker holds only the rows not landed yet. Until
  the point ends they carry status "running", so that a point whose job died is not finished
  (resume reruns it), while the rows it landed stay readable. When it ends (`end`), its rows,
  each with its own status, and those the function returns are written once as the job's
  file, which replaces its segments (store's reading rule: a job file, else its segments).
- saves its state (`save`): the rows so far land first, then the state, their count and the
  number of segments that hold them go to the job's checkpoint folder, so a checkpoint never
  counts a row that did not land, and its rows end on a segment's boundary. Each save is a
  file of its step there; what the config's `checkpoint` keeps of them (the latest `keep`, the
  one where the metric `best` was best) is tracking.checkpoints'.
- restores it (`restore`) when the point runs again (resume, a SLURM requeue): the segments
  past the checkpoint's go, and the rows it logs from there land after the rest, so each step
  appears once; no landed row is written again (but where the point had ended, and its job
  file replaced its segments: the checkpoint's rows are then written once, as one segment).
  A point that restores nothing starts afresh: its first landing removes its earlier rows.
  It says "resumed from the checkpoint at step N" (in its log, and as `resumed` for its
  progress line: harness.running.job).
- in a point of several processes (harness.running.distributed), learns its place (`rank`,
  `world_size`); each process lands its own rows (segments of its own, with its rank), and
  `save`, `restore`, `stopping` and `end` are collectives that every process calls alike: rank
  0 writes the checkpoint, which records each rank's rows, every rank restores its own from it,
  and rank 0 writes the job's file from every rank's segments, and the rows it returned.
- asks `stopping`: SLURM has warned that the task's time is up (or that it is preempted); the
  next `save` is its last, and requeues the task (submitit's checkpointing). One that never
  reads it runs until SLURM kills the task; resume then continues it from its last checkpoint.

The Tracker is what the experiment sees; each of its jobs is a module of its own:
tracking.landing (the rows that wait, and their segments), tracking.checkpoints (the checkpoint
file), tracking.requeue (SLURM's warning, and the requeue), tracking.collectives (what a
point's processes do together at a checkpoint and at the end), tracking.feed (the sinks). A
write the store cannot take raises StoreUnwritable (harness.errors): the sweep stops.
"""

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from harness import store
from harness.errors import StoreUnwritable
from harness.names import Keeping
from harness.tracking import collectives
from harness.tracking.checkpoints import (
    BEST,
    CHECKPOINT,
    INDEX,
    Checkpoints,
    at,
)
from harness.tracking.feed import Feed
from harness.tracking.landing import Landing
from harness.tracking.requeue import Requeued, SlurmSignals

__all__ = ["BEST", "CHECKPOINT", "INDEX", "Requeued", "Tracker"]


class Tracker:
    """A training point's rows and checkpoints (see the module's docstring)."""

    def __init__(
        self,
        path: Path,
        folder: Path,
        prepare: Callable[[dict], dict],
        *,
        config_hash: str,
        check: Callable[[dict], None] | None = None,
        clock: float | None = None,
        every_rows: int = 1000,
        every_s: float = 1.0,
        say: Callable[[str], None] | None = None,
        shown: Callable[[dict], str] | None = None,
        sinks=None,
        group=None,
        observe: Callable[[dict], None] | None = None,
        keeping: Keeping | None = None,
    ):
        """Rows go to the job's file `path` (its segments beside it), checkpoints to `folder`;
        `prepare` makes a row a stored one (the point's parameters, the harness's columns: the
        tracker takes those of prepare({}) once per landing), `check` refuses a logged row
        (columns it may not set), `clock` is the point's start (time.perf_counter) that its
        rows' duration_s counts from; `say` prints what happens, `shown` what a landed row says
        (its step and metrics), on a progress line; `sinks` (harness.running.sinks.Sinks) get the
        rows as they land; `group` (harness.running.distributed.Group) is the point's processes, if
        several; `observe` sees each row as it is logged (a search's pruner: it may raise to
        stop); `keeping` is what it keeps of its checkpoints (the config's `checkpoint`). A
        checkpoint folder it cannot write is StoreUnwritable here, before the first step."""
        self.path, self.prepare, self.check = Path(path), prepare, check
        self.say, self.shown = say or (lambda text: None), shown
        self.group, self.observe = group, observe
        self.raised = False  # the experiment raised (in a group: which no longer meets)
        self.unwritable: StoreUnwritable | None = None  # what the store could not take
        self.resumed: str | None = None  # "resumed from the checkpoint at step N", where it did
        self.feed, self.signals = Feed(sinks), SlurmSignals()
        self.checkpoints = Checkpoints(folder, config_hash, self.say, self._unwritable, keeping)
        self.landing = Landing(
            self.path, prepare, clock=clock, every_rows=every_rows, every_s=every_s,
            rank=group.rank if group else None, world_size=self.world_size,
            landed=self._landed, unwritable=self._unwritable, say=self.say,
        )  # fmt: skip

    # What the experiment calls.

    @property
    def rank(self) -> int:
        """This process's rank in the point's group; 0 for a point of one process."""
        return self.group.rank if self.group else 0

    @property
    def world_size(self) -> int:
        """How many processes run the point."""
        return self.group.world_size if self.group else 1

    @property
    def stopping(self) -> bool:
        """SLURM has warned that the task's time is up: save, which requeues. In a group, on
        every rank once it has warned any (a collective: every rank reads it alike)."""
        warned = self.signals.warned
        return self.group.any(warned) if self.group else warned

    def log(self, row: dict) -> None:
        """Hand over one row (a flat dict of the experiment's own columns, plain values)."""
        self.landing.raise_failed()
        if self.check is not None:
            self.check(row)
        store.check_values(row)  # a value Parquet cannot hold fails here, not later
        row = dict(row)
        self.checkpoints.seen(row)
        self.landing.add(row)
        if self.observe is not None:
            self.observe(row)

    def save(self, state: dict) -> None:
        """Checkpoint: land the rows so far, then save `state` with their count (in a group:
        rank 0 saves, with every rank's count). If SLURM has asked the task to stop, requeue it
        now (this does not return)."""
        self.landing.raise_failed()
        count, numbered = self.landing.counted()
        saved = collectives.checkpoint(self.group, state, count, numbered)
        if not self.rank:
            self.checkpoints.write(saved, count)
        if self.group:
            self.group.barrier()  # every rank goes on once the checkpoint is in place
        if self.stopping and self.signals.deferred:
            self.say(f"SLURM asked this task to stop: checkpoint at {count} rows saved, requeueing")
            self.signals.requeue(self.rank, self.close)

    def restore(self) -> dict | None:
        """The state of the point's last checkpoint, or None (a first run, or a checkpoint that
        does not match the rows that landed: in a group, those of any rank). The job's segments
        past it go."""
        saved, kept = self._restored()
        if self.group and not self.group.all(kept is not None):
            self.landing.start_over()
            return None
        if kept is None:
            return None
        if self.group and not self.rank:  # every rank took its rows
            self.path.unlink(missing_ok=True)
        if not self.rank:
            self.checkpoints.restored(saved)
        self.feed.resume(kept)  # the sinks continue after the checkpoint's last row
        self.resumed = f"resumed from the checkpoint at {at(saved, self.landing.landed)}"
        self.say(self.resumed)
        return saved["state"]

    # What the harness calls.

    @property
    def logged(self) -> int:
        """How many rows the experiment has logged (a restored checkpoint's among them)."""
        return self.landing.logged

    def land(self) -> int:
        """Land the rows logged since the last landing as a segment; how many have landed."""
        return self.landing.land()

    def end(self, returned: list[dict]) -> list[dict]:
        """The point has ended: land what waits, stop landing, write the job's file (its rows
        with their own status, then `returned`, the rows the function returned, as prepared),
        which replaces its segments; the sinks get `returned` and close. The rows a summary
        reads (store.telling). In a group, see harness.tracking.collectives."""
        self.close()
        with self.landing.writing:
            self.landing.land_held()
            table = store.rows_to_table(returned) if returned else None
            try:
                told = collectives.end(self.landing, self.group, table, self.raised)
            except OSError as error:
                raise self._unwritable(error) from error
        self.feed.close(returned)
        if not self.rank:
            self.checkpoints.said_unseen()
        return told

    def close(self) -> None:
        """Stop landing rows in the background (what waits stays unlanded: a kill's state)."""
        self.landing.stop()

    def slurm_signals(self):
        """While the block runs, SLURM's warning signal (USR2: the time limit is near, or the
        task is preempted) sets `stopping` instead of requeueing at once; the next `save`
        requeues through submitit's own handler. Outside a submitit job, nothing changes."""
        return self.signals.caught()

    def _restored(self) -> tuple[dict | None, pa.Table | None]:
        """The checkpoint, and this rank's rows cut back to it; (None, None) where there is
        none that matches this point and its rows."""
        found = self.checkpoints.read(self.world_size, self.rank if self.group else None)
        if found is None:
            return None, None
        saved, count, numbered = found
        return saved, self.landing.cut(count, numbered)

    def _landed(self, rows: list[dict], table: pa.Table) -> None:
        """A segment has landed: its last row on the progress line, its rows to the sinks."""
        if self.shown:
            self.say(self.shown(rows[-1]))
        self.feed.landed(table)

    def _unwritable(self, error: OSError) -> StoreUnwritable:
        """The store's `error` as the StoreUnwritable that stops the sweep, kept:
        harness.running.job raises it whatever the experiment made of it (a RuntimeError of a
        landing that failed in the background, say)."""
        self.unwritable = StoreUnwritable.of(error)
        return self.unwritable
