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
  counts a row that did not land, and its rows end on a segment's boundary.
- restores it (`restore`) when the point runs again (resume, a SLURM requeue): the segments
  past the checkpoint's go, and the rows it logs from there land after the rest, so each step
  appears once; no landed row is written again (but where the point had ended, and its job
  file replaced its segments: the checkpoint's rows are then written once, as one segment).
  A point that restores nothing starts afresh: its first landing removes its earlier rows.
- in a point of several processes (harness.distributed), learns its place (`rank`,
  `world_size`); each process lands its own rows (segments of its own, with its rank), and
  `save`, `restore`, `stopping` and `end` are collectives that every process calls alike: rank
  0 writes the checkpoint, which records each rank's rows, every rank restores its own from it,
  and rank 0 writes the job's file from every rank's segments, and the rows it returned.
- asks `stopping`: SLURM has warned that the task's time is up (or that it is preempted); the
  next `save` is its last, and requeues the task (submitit's checkpointing). One that never
  reads it runs until SLURM kills the task; resume then continues it from its last checkpoint.
"""

import contextlib
import io
import pickle
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from harness import files, store

CHECKPOINT = "checkpoint.pt"


def checkpoint_dir(out: Path, experiment: str, sweep: str, job: int) -> Path:
    """The job's checkpoint folder: beside results/, not in it (weights are no rows)."""
    sweep_dir = store.sweep_dir(Path(out) / "checkpoints", experiment, sweep)
    return sweep_dir / f"job-{job:06d}"


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
    ):
        """Rows go to the job's file `path` (its segments beside it), checkpoints to `folder`;
        `prepare` makes a row a stored one (the point's parameters, the harness's columns: the
        tracker takes those of prepare({}) once per landing), `check` refuses a logged row
        (columns it may not set), `clock` is the point's start (time.perf_counter) that its
        rows' duration_s counts from; `say` prints what happens, `shown` what a landed row says
        (its step and metrics), on a progress line; `sinks` (harness.sinks.Sinks) get the rows
        as they land; `group` (harness.distributed.Group) is the point's processes, if several;
        `observe` sees each row as it is logged (a search's pruner: it may raise to stop)."""
        self.path, self.folder, self.prepare = Path(path), Path(folder), prepare
        self.config_hash, self.check, self.clock = config_hash, check, clock
        self.every_rows, self.every_s = every_rows, every_s
        self.say, self.shown = say or (lambda text: None), shown
        self.waiting: list[dict] = []  # the rows logged since the last landing, as logged
        self.times: list[float] = []  # when each was logged (time.perf_counter)
        self.landed = 0  # how many rows the job's segments hold
        self.logged = 0  # how many rows the point has: those landed, then those waiting
        self.parts: list[Path] = []  # this run's segments (a restore's kept ones first)
        self.statuses: dict[int, str] = {}  # row number -> a logged row's own status (not ok)
        self.fresh = True  # nothing restored: the first landing removes the job's earlier rows
        self.sinks, self.sunk = sinks, False  # whether the sinks are open
        self.oldest: float | None = None  # when the oldest row not landed yet was logged
        self.group, self.observe = group, observe
        self.raised = False  # the experiment raised (in a group: which no longer meets)
        self._warned = False  # SLURM's warning came
        self.store_error: OSError | None = None  # the store could not take rows or a checkpoint
        files.no_links(self.folder, depth=3)  # job-N, sweep=ID, experiment=NAME
        files.remove_temporaries(self.folder, older_than_s=0)  # killed runs': the job's own
        # The running mark (store.hold_running) tells a dead run from a live one.
        self._marker = None if self.rank else store.hold_running(self.path)
        self._requeue: Callable[[], None] | None = None  # submitit's handler, when deferred
        self._lock = threading.Lock()  # waiting, times, oldest
        self._writing = threading.Lock()  # one write of the job's files at a time
        self._wake = threading.Event()
        self._closed = False
        self._failed: Exception | None = None  # what stopped the landing thread
        self._thread = threading.Thread(target=self._land_waiting, daemon=True)
        self._thread.start()

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
    def _rank_tag(self) -> int | None:
        """The rank its segments are named by (store.segment_file); None for one process."""
        return self.group.rank if self.group else None

    @property
    def stopping(self) -> bool:
        """SLURM has warned that the task's time is up: save, which requeues. In a group, on
        every rank once it has warned any (a collective: every rank reads it alike)."""
        return self.group.any(self._warned) if self.group else self._warned

    def log(self, row: dict) -> None:
        """Hand over one row (a flat dict of the experiment's own columns, plain values)."""
        if self._failed is not None:
            self._raise_failed_landing()
        if self.check is not None:
            self.check(row)
        store.check_values(row)  # a value Parquet cannot hold fails here, not later
        row, now = dict(row), time.perf_counter()
        with self._lock:
            self.waiting.append(row)
            self.times.append(now)
            count = len(self.waiting)
            if "status" in row and row["status"] != "ok":
                self.statuses[self.logged] = row["status"]
            self.logged += 1
            first, self.oldest = self.oldest is None, self.oldest or time.monotonic()
        if count >= self.every_rows:
            self.land()
        elif first:
            self._wake.set()
        if self.observe is not None:
            self.observe(row)

    def save(self, state: dict) -> None:
        """Checkpoint: land the rows so far, then save `state` with their count (in a group:
        rank 0 saves, with every rank's count). If SLURM has asked the task to stop, requeue it
        now (this does not return)."""
        self._raise_failed_landing()
        with self._writing:
            count, numbered = self._land(), len(self.parts)
        saved = {"state": state, "rows": count, "segments": numbered}
        if self.group:
            ranks = self.group.gather([count, numbered])
            saved = {"state": state, "ranks": ranks, "world_size": self.group.world_size}
        if not self.rank:
            self._write_checkpoint(saved)
        if self.group:
            self.group.barrier()  # every rank goes on once the checkpoint is in place
        if self.stopping and self._requeue is not None:
            self.say(f"SLURM asked this task to stop: checkpoint at {count} rows saved, requeueing")
            self._requeue_now()

    def restore(self) -> dict | None:
        """The state of the point's last checkpoint, or None (a first run, or a checkpoint that
        does not match the rows that landed: in a group, those of any rank). The job's segments
        past it go."""
        saved, kept = self._restored()
        if self.group and not self.group.all(kept is not None):
            self.parts, self.landed, self.logged, self.fresh = [], 0, 0, True
            return None
        if kept is None:
            return None
        if self.group and not self.rank:  # every rank took its rows
            self.path.unlink(missing_ok=True)
        if self.sinks is not None:  # they continue after the checkpoint's last row
            self.sinks.open(store.settled(kept.slice(kept.num_rows - 1).to_pylist())[0]
                            if kept.num_rows else None)  # fmt: skip
            self.sunk = True
        self.say(f"resumed from the checkpoint at {self.landed} rows")
        return saved["state"]

    # What the harness calls.

    def land(self) -> int:
        """Land the rows logged since the last landing as a segment; how many have landed."""
        with self._writing:
            return self._land()

    def end(self, returned: list[dict]) -> list[dict]:
        """The point has ended: land what waits, stop landing, write the job's file (its rows
        with their own status, then `returned`, the rows the function returned, as prepared),
        which replaces its segments; the sinks get `returned` and close. The rows a summary
        reads (store.telling). In a group, rank 0 writes it, from every rank's segments and its
        own `returned`; where the experiment raised, each rank's `returned` lands as its last
        segment instead, for the sweep to settle (harness.dispatch.finish)."""
        self.close()
        with self._writing:
            self._land()
            table = store.rows_to_table(returned) if returned else None
            try:
                told = self._ended(table)
            except OSError as error:
                self.store_error = error
                raise
        if self.sinks is not None:
            self._open_sinks()
            self.sinks.write(returned)
            self.sinks.close()
        return told

    def close(self) -> None:
        """Stop landing rows in the background (what waits stays unlanded: a kill's state)."""
        self._closed = True
        self._wake.set()
        self._thread.join()
        if self._marker is not None:
            store.release_running(self._marker)
            self._marker = None

    @contextlib.contextmanager
    def slurm_signals(self):
        """While the block runs, SLURM's warning signal (USR2: the time limit is near, or the
        task is preempted) sets `stopping` instead of requeueing at once; the next `save`
        requeues through submitit's own handler. Outside a submitit job, nothing changes."""
        handler = signal.getsignal(signal.SIGUSR2)
        if not callable(handler) or threading.current_thread() is not threading.main_thread():
            yield
            return

        def warned(signum, frame):  # sets a flag only: printing here could re-enter print
            self._warned = True

        self._requeue = lambda: handler(signal.SIGUSR2, None)
        signal.signal(signal.SIGUSR2, warned)
        try:
            yield
        finally:  # a point that ended after the warning has its rows: nothing to requeue
            signal.signal(signal.SIGUSR2, handler)
            self._requeue = None

    def _write_checkpoint(self, saved: dict) -> None:
        import torch

        buffer = io.BytesIO()  # torch.save's own write errors (a full disk) are no OSError
        torch.save({**saved, "config_hash": self.config_hash}, buffer)
        try:
            files.replace_atomically(
                self.folder / CHECKPOINT, lambda tmp: tmp.write_bytes(buffer.getbuffer()), False
            )
        except OSError as error:
            self.store_error = error
            raise

    def _restored(self) -> tuple[dict | None, pa.Table | None]:
        """The checkpoint, and this rank's rows cut back to it; (None, None) where there is
        none that matches this point and its rows."""
        import torch

        path = self.folder / CHECKPOINT
        if not path.exists():
            return None, None
        try:  # tensors and plain values only: unpickling anything else could run code
            saved = torch.load(path, weights_only=True)
        except pickle.UnpicklingError:
            self.say(f"refused the checkpoint {path}: it holds more than tensors and plain "
                     "values, and loading it could run code; starting over")  # fmt: skip
            return None, None
        except Exception as error:  # a damaged file: whatever reading it raises
            self.say(f"cannot read the checkpoint {path} ({type(error).__name__}): starting over")
            return None, None
        if not isinstance(saved, dict) or saved.get("config_hash") != self.config_hash:
            return None, None
        if saved.get("world_size", 1) != self.world_size:
            self.say(f"the checkpoint {path} is of {saved.get('world_size', 1)} processes, this "
                     f"run has {self.world_size}: starting over")  # fmt: skip
            return None, None
        fault = _checkpoint_fault(saved, self.rank if self.group else None)
        if fault:  # its hash is this point's, but it is no checkpoint the tracker wrote
            if not self.rank:
                aside = path.with_name(f"{CHECKPOINT}.set-aside-{time.time_ns()}")
                path.rename(aside)
                self.say(f"the checkpoint {path} {fault}: set aside as {aside.name}; starting over")
            return None, None
        count, numbered = _counts(saved, self.rank if self.group else None)  # this rank's
        with self._writing:
            return saved, self._cut(count, numbered)

    # Under self._writing.

    def _ended(self, table: pa.Table | None) -> list[dict]:
        """end's job file (or, in a group that no longer meets, this rank's last segment)."""
        if not self.group:
            return store.end_segments(self.path, self.parts, table, self.statuses)
        if not self.raised:
            try:
                return self._end_group(table)
            except RuntimeError as error:  # a process of the group is gone: this one ends alone
                said = f"a process of the point's group is gone at its end: {error}"
                table = store.rows_to_table([self.prepare({"status": "failed", "error": said})])
        return self._end_alone(table)

    def _end_group(self, table: pa.Table | None) -> list[dict]:
        """end's job file in a group: rank 0 writes it from every rank's segments, in rank
        order, and its own returned rows; the rows it tells, on every rank."""
        ranks = self.group.gather([[str(part) for part in self.parts], self.statuses, self.landed])
        told = None
        if not self.rank:
            parts, statuses, first = [], {}, 0
            for listed, own, landed in ranks:
                parts += [Path(part) for part in listed]
                statuses |= {first + number: status for number, status in own.items()}
                first += landed
            try:
                told = store.end_segments(self.path, parts, table, statuses)
            except OSError:
                self.group.first(None)
                raise
        told = self.group.first(told)
        if told is None:
            raise OSError(f"rank 0 could not write {self.path}")
        return told

    def _end_alone(self, table: pa.Table | None) -> list[dict]:
        """end of a rank whose experiment raised: its returned rows (their status kept) land as
        its last segment; the rows it tells."""
        if table is None:
            return []
        self._fresh_start()  # a run that restored nothing: its earlier rows go first
        part = store.segment_file(self.path, len(self.parts) + 1, self._rank_tag)
        store.write_file(part, table, sync=False)
        self.parts.append(part)
        return store.telling(table)

    def _own(self, paths: list[Path]) -> list[Path]:
        """The segments among `paths` that this process lands (its rank's)."""
        return [path for path in paths if store.segment_rank(path) == self._rank_tag]

    def _land(self) -> int:
        """land(), its caller holding self._writing."""
        with self._lock:
            rows, times = self.waiting, self.times
            self.waiting, self.times, self.oldest = [], [], None
        if not rows:
            return self.landed
        try:
            self._fresh_start()
            table = self._segment(rows, times)
            part = store.segment_file(self.path, len(self.parts) + 1, self._rank_tag)
            store.write_file(part, table, sync=False)
        except OSError as error:
            with self._lock:  # they land with the next rows, if the store takes them then
                self.waiting, self.times = rows + self.waiting, times + self.times
            self.store_error = error
            raise
        self.parts.append(part)
        self.landed += len(rows)
        if self.shown:
            self.say(self.shown(rows[-1]))
        if self.sinks is not None:
            self._open_sinks()
            self.sinks.write(store.settled(table.to_pylist()))
        return self.landed

    def _segment(self, rows: list[dict], times: list[float]) -> pa.Table:
        """The rows as a segment: the point's constant columns (prepare({})'s) once each."""
        seconds = None if self.clock is None else [t - self.clock for t in times]
        return store.segment_table(rows, self.prepare({}), seconds)

    def _fresh_start(self) -> None:
        """A point that restored nothing: its earlier rows (job file, segments) go, once. In a
        group, each rank's own segments; rank 0's, the job file and those no rank owns."""
        if self.fresh:
            self.fresh = False
            found = store.segments(self.path)
            if self.rank:
                gone = self._own(found)
            else:
                others = range(1, self.world_size) if self.group else ()
                gone = [self.path, *(p for p in found if store.segment_rank(p) not in others)]
            with files.uninterrupted():
                for path in gone:
                    path.unlink(missing_ok=True)

    def _cut(self, count: int, numbered: int | None) -> pa.Table | None:
        """Keep the job's first `count` rows, the checkpoint's (`numbered`: the segments that
        hold them), as its segments, and remove the rest; the kept rows, or None where they
        did not all land (start afresh)."""
        if self.path.exists():  # the point ended since: its job file holds its rows
            return self._cut_job_file(count)
        parts = self._own(store.segments(self.path))
        kept = parts[:numbered] if numbered is not None else []
        if [store.segment_number(part) for part in kept] != list(range(1, len(kept) + 1)):
            kept = []
        tables = store.trusted_tables(kept)
        if numbered is None or len(tables) != numbered or sum(map(len, tables)) != count:
            self.say(f"checkpoint at {count} rows, but not all of them landed: starting over")
            return None
        for part in reversed(parts[numbered:]):
            part.unlink(missing_ok=True)
        self.parts, self.landed, self.logged, self.fresh = kept, count, count, False
        return store.concat(tables)

    def _cut_job_file(self, count: int) -> pa.Table | None:
        """_cut, of an ended point: its first `count` rows (in a group: of this rank) as segment
        1, then its file goes (in a group: once every rank has taken its rows, restore)."""
        rows = store.job_table(self.path)
        if self.group:
            mine = rows["rank"] if "rank" in rows.column_names else pa.nulls(rows.num_rows)
            rows = rows.filter(pc.fill_null(pc.equal(mine, self.rank), False))
        if rows.num_rows < count:  # the job's rows are gone or damaged: start afresh
            self.say(f"checkpoint at {count} rows, but {rows.num_rows} landed: starting over")
            return None
        kept = rows.slice(0, count)
        with files.uninterrupted():
            for part in self._own(store.segments(self.path)):  # the job file replaced them
                part.unlink()
            parts = [store.segment_file(self.path, 1, self._rank_tag)] if count else []
            for part in parts:
                store.write_file(part, store.as_running(kept), sync=False)
            if not self.group:
                self.path.unlink(missing_ok=True)
        self.parts, self.landed, self.logged, self.fresh = parts, count, count, False
        return kept

    def _open_sinks(self) -> None:
        if not self.sunk:
            self.sinks.open(None)
            self.sunk = True

    def _raise_failed_landing(self) -> None:
        """The error that stopped the landing thread (a full disk, say), in the experiment."""
        if self._failed is not None:
            raise RuntimeError(f"rows could not land: {self._failed}") from self._failed

    def _requeue_now(self) -> None:
        """submitit's handler, once: it requeues the task and ends this process (Requeued). In
        a group, rank 0's requeues the job, and the other ranks end."""
        requeue, self._requeue = self._requeue, None
        if requeue is None:
            return
        try:
            requeue()
        except SystemExit as exit:
            raise Requeued(exit.code) from None
        if self.rank:  # submitit's handler does nothing on the other ranks: they end here
            self.close()
            raise Requeued(0)

    def _land_waiting(self) -> None:
        while not self._closed:
            with self._lock:
                oldest = self.oldest
            if oldest is None:
                self._wake.wait()
                self._wake.clear()
                continue
            left = oldest + self.every_s - time.monotonic()
            if left > 0:
                self._wake.wait(left)
                self._wake.clear()
                continue
            try:
                self.land()
            except Exception as error:  # raised in the experiment at its next log or save
                self._failed = error
                return


def _checkpoint_fault(saved: dict, rank: int | None) -> str | None:
    """What a checkpoint lacks of what save writes (its state, and the count of rows and of
    segments it covers; in a group, those of rank `rank`), in words; None where nothing."""
    if "state" not in saved:
        return "holds no state"
    mine = _counts(saved, rank)
    if not isinstance(mine, list | tuple) or len(mine) != 2:
        return "holds no row counts for this process"
    count, numbered = mine
    if not _whole(count) or not (numbered is None or _whole(numbered)):
        return f"holds row counts that are no whole numbers ({count!r:.20}, {numbered!r:.20})"
    return None


def _counts(saved: dict, rank: int | None):
    """The rows and the segments a checkpoint covers, of rank `rank` in a group (None: a point
    of one process), as saved; None where it has none for that rank."""
    if rank is None:
        return saved.get("rows"), saved.get("segments")
    ranks = saved.get("ranks")
    return ranks[rank] if isinstance(ranks, list) and len(ranks) > rank else None


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class Requeued(SystemExit):
    """The task is requeued, and this process ends: nothing may take it for the experiment's
    own exit (harness.job.measure lets it through)."""
