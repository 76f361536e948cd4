"""A training point's rows on their way to the store: those logged since the last landing wait
here, and each landing writes them as one new segment of the job (store.segment_file: written
whole or not at all), with the point's constant columns added once per segment, so that a
landing costs the same at the first row and at the millionth. Rows land when `every_rows` wait,
when the oldest has waited `every_s` seconds (a thread of its own lands them while the
experiment computes), and before a checkpoint or the point's end.

Until the point ends its rows carry status "running", and the job's running mark
(store.hold_running) tells a live run from a dead one. A point that restores nothing starts
afresh: its first landing removes the job's earlier rows. One that restores a checkpoint keeps
the segments that hold the checkpoint's rows and removes the rest (cut), so that each step
appears once. In a point of several processes each rank lands its own segments (named by its
rank).
"""

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from harness import files, store
from harness.errors import StoreUnwritable


class Landing:
    """The rows of the job's file `path` (its segments beside it) that wait, and those landed.
    `prepare` makes a row a stored one (the segment takes prepare({})'s columns), `clock` is
    the point's start that duration_s counts from, `rank` the rank its segments are named by
    (None: a point of one process) of `world_size`; `landed` sees each segment as it lands (its
    rows as logged, and as stored), and `unwritable` makes a failed write the error that stops
    the sweep."""

    def __init__(
        self,
        path: Path,
        prepare: Callable[[dict], dict],
        *,
        clock: float | None,
        every_rows: int,
        every_s: float,
        rank: int | None,
        world_size: int,
        landed: Callable[[list[dict], pa.Table], None],
        unwritable: Callable[[OSError], StoreUnwritable],
        say: Callable[[str], None],
    ):
        self.path, self.prepare, self.clock = path, prepare, clock
        self.every_rows, self.every_s = every_rows, every_s
        self.rank_tag, self.rank, self.world_size = rank, rank or 0, world_size
        self.on_landed, self.unwritable, self.say = landed, unwritable, say
        self.waiting: list[dict] = []  # the rows logged since the last landing, as logged
        self.times: list[float] = []  # when each was logged (time.perf_counter)
        self.landed = 0  # how many rows the job's segments hold
        self.logged = 0  # how many rows the point has: those landed, then those waiting
        self.segments: list[Path] = []  # this run's segments (a restore's kept ones first)
        self.statuses: dict[int, str] = {}  # row number -> a logged row's own status (not ok)
        self.fresh = True  # nothing restored: the first landing removes the job's earlier rows
        self.oldest: float | None = None  # when the oldest row not landed yet was logged
        # The running mark (store.hold_running) tells a dead run from a live one.
        self._marker = None if self.rank else store.hold_running(self.path)
        self.lock = threading.Lock()  # waiting, times, oldest
        self.writing = threading.Lock()  # one write of the job's files at a time
        self._wake = threading.Event()
        self._closed = False
        self.failed: Exception | None = None  # what stopped the landing thread
        self._thread = threading.Thread(target=self._land_waiting, daemon=True)
        self._thread.start()

    def add(self, row: dict) -> None:
        """Keep a logged row (a copy) to land; land now if `every_rows` wait."""
        now = time.perf_counter()
        with self.lock:
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

    def land(self) -> int:
        """Land the rows logged since the last landing as a segment; how many have landed."""
        with self.writing:
            return self.land_held()

    def counted(self) -> tuple[int, int]:
        """Land what waits; how many rows have landed, and in how many segments (read together:
        a checkpoint's counts)."""
        with self.writing:
            return self.land_held(), len(self.segments)

    def land_held(self) -> int:
        """land(), its caller holding self.writing."""
        with self.lock:
            rows, times = self.waiting, self.times
            self.waiting, self.times, self.oldest = [], [], None
        if not rows:
            return self.landed
        try:
            self.fresh_start()
            table = self._segment(rows, times)
            segment = self.segment_file(len(self.segments) + 1)
            store.write_file(segment, table, sync=False)
        except OSError as error:
            with self.lock:  # they land with the next rows, if the store takes them then
                self.waiting, self.times = rows + self.waiting, times + self.times
            raise self.unwritable(error) from error
        self.segments.append(segment)
        self.landed += len(rows)
        self.on_landed(rows, table)
        return self.landed

    def raise_failed(self) -> None:
        """The error that stopped the landing thread (a full disk, say), in the experiment."""
        if self.failed is not None:
            raise RuntimeError(f"rows could not land: {self.failed}") from self.failed

    def stop(self) -> None:
        """Stop landing rows in the background (what waits stays unlanded: a kill's state)."""
        self._closed = True
        self._wake.set()
        self._thread.join()
        if self._marker is not None:
            store.release_running(self._marker)
            self._marker = None

    def segment_file(self, number: int) -> Path:
        """The job's segment `number`, of this rank."""
        return store.segment_file(self.path, number, self.rank_tag)

    def own(self, paths: list[Path]) -> list[Path]:
        """The segments among `paths` that this process lands (its rank's)."""
        return [path for path in paths if store.segment_rank(path) == self.rank_tag]

    def fresh_start(self) -> None:
        """A point that restored nothing: its earlier rows (job file, segments) go, once. In a
        group, each rank's own segments; rank 0's, the job file and those no rank owns."""
        if self.fresh:
            self.fresh = False
            found = store.segments(self.path)
            if self.rank:
                gone = self.own(found)
            else:
                others = range(1, self.world_size) if self.rank_tag is not None else ()
                gone = [self.path, *(p for p in found if store.segment_rank(p) not in others)]
            with files.uninterrupted():
                for path in gone:
                    path.unlink(missing_ok=True)

    def start_over(self) -> None:
        """Count no row as landed: the point starts afresh (a group whose ranks could not all
        restore)."""
        self.segments, self.landed, self.logged, self.fresh = [], 0, 0, True

    def cut(self, count: int, numbered: int | None) -> pa.Table | None:
        """Keep the job's first `count` rows, a checkpoint's (`numbered`: the segments that
        hold them), as its segments, and remove the rest; the kept rows, or None where they
        did not all land (start afresh)."""
        with self.writing:
            if self.path.exists():  # the point ended since: its job file holds its rows
                return self._cut_job_file(count)
            segments = self.own(store.segments(self.path))
            kept = segments[:numbered] if numbered is not None else []
            if [store.segment_number(segment) for segment in kept] != list(range(1, len(kept) + 1)):
                kept = []
            tables = store.trusted_tables(kept)
            if numbered is None or len(tables) != numbered or sum(map(len, tables)) != count:
                self.say(f"checkpoint at {count} rows, but not all of them landed: starting over")
                return None
            for segment in reversed(segments[numbered:]):
                segment.unlink(missing_ok=True)
            self.segments, self.landed, self.logged, self.fresh = kept, count, count, False
            return store.concat(tables)

    def _cut_job_file(self, count: int) -> pa.Table | None:
        """cut, of an ended point: its first `count` rows (in a group: of this rank) as segment
        1, then its file goes (in a group: once every rank has taken its rows, restore)."""
        rows = store.job_table(self.path)
        if self.rank_tag is not None:
            mine = rows["rank"] if "rank" in rows.column_names else pa.nulls(rows.num_rows)
            rows = rows.filter(pc.fill_null(pc.equal(mine, self.rank), False))
        if rows.num_rows < count:  # the job's rows are gone or damaged: start afresh
            self.say(f"checkpoint at {count} rows, but {rows.num_rows} landed: starting over")
            return None
        kept = rows.slice(0, count)
        with files.uninterrupted():
            for segment in self.own(store.segments(self.path)):  # the job file replaced them
                segment.unlink()
            segments = [self.segment_file(1)] if count else []
            for segment in segments:
                store.write_file(segment, store.as_running(kept), sync=False)
            if self.rank_tag is None:
                self.path.unlink(missing_ok=True)
        self.segments, self.landed, self.logged, self.fresh = segments, count, count, False
        return kept

    def _segment(self, rows: list[dict], times: list[float]) -> pa.Table:
        """The rows as a segment: the point's constant columns (prepare({})'s) once each."""
        seconds = None if self.clock is None else [t - self.clock for t in times]
        return store.segment_table(rows, self.prepare({}), seconds)

    def _land_waiting(self) -> None:
        while not self._closed:
            with self.lock:
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
                self.failed = error
                return
