"""Rows while a point runs, and checkpoints: what a training experiment gets as `tracker`.

An experiment function with a parameter named `tracker` is handed a Tracker by the harness (the
config sets no value for it; called as a plain function, it gets None and returns its rows as
any experiment does). Through it the experiment:

- hands over rows as it goes (`log`). They land in the job's own file (store.write_rows: the
  whole file rewritten under a temporary name and renamed, so every reader sees a complete
  file and each row once) at least every `every_rows` rows and every `every_s` seconds: a
  thread lands the rows that wait that long while the experiment computes. Until the point
  ends they carry status "running", so that a point whose job died is not finished (resume
  reruns it), while the rows it landed stay readable. When it ends, its rows are written once
  more with their own status, followed by those the function returns.
- saves its state (`save`): the rows so far land first, then the state and their count go to
  the job's checkpoint folder, so a checkpoint never counts a row that did not land.
- restores it (`restore`) when the point runs again (resume, a SLURM requeue): the job's landed
  rows are cut back to those the checkpoint counts, and the rows it logs from there replace
  the rest, so each step appears once.
- asks `stopping`: SLURM has warned that the task's time is up (or that it is preempted); the
  next `save` is its last, and requeues the task (submitit's checkpointing). One that never
  reads it runs until SLURM kills the task; resume then continues it from its last checkpoint.
"""

import contextlib
import fcntl
import io
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

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
        every_rows: int = 1000,
        every_s: float = 10.0,
        say: Callable[[str], None] | None = None,
        shown: Callable[[dict], str] | None = None,
        sinks=None,
    ):
        """Rows go to the job's file `path`, checkpoints to `folder`; `prepare` makes a logged
        row a stored one (the point's parameters, the harness's columns); `say` prints what
        happens, `shown` what a landed row says (its step and metrics), on a progress line;
        `sinks` (harness.sinks.Sinks) get the rows as they land."""
        self.path, self.folder, self.prepare = Path(path), Path(folder), prepare
        self.config_hash = config_hash
        self.every_rows, self.every_s = every_rows, every_s
        self.say, self.shown = say or (lambda text: None), shown
        self.rows: list[dict] = []  # every row of the point so far, as it will be written
        self.landed = 0  # how many of them are in the job's file
        self.sinks, self.sunk = sinks, None  # how many the sinks have (None: not opened yet)
        self.oldest: float | None = None  # when the oldest row not landed yet was logged
        self.stopping = False
        self.store_error: OSError | None = None  # the store could not take rows or a checkpoint
        files.remove_temporaries(self.folder, older_than_s=0)  # killed runs': the job's own
        self._marker = hold_running(self.path)  # status tells a dead run from a live one
        self._requeue: Callable[[], None] | None = None  # submitit's handler, when deferred
        self._lock = threading.Lock()  # rows and landed
        self._writing = threading.Lock()  # one write of the job's file at a time
        self._wake = threading.Event()
        self._closed = False
        self._failed: Exception | None = None  # what stopped the landing thread
        self._thread = threading.Thread(target=self._land_waiting, daemon=True)
        self._thread.start()

    # What the experiment calls.

    def log(self, row: dict) -> None:
        """Hand over one row (a flat dict of the experiment's own columns, plain values)."""
        self._raise_failed_landing()
        prepared = self.prepare(dict(row))
        store.rows_to_table([prepared])  # a value Parquet cannot hold fails here, not later
        with self._lock:
            self.rows.append(prepared)
            if self.oldest is None:
                self.oldest = time.monotonic()
            due = len(self.rows) - self.landed >= self.every_rows
        if due:
            self.land()
        else:
            self._wake.set()

    def save(self, state: dict) -> None:
        """Checkpoint: land the rows so far, then save `state` with their count. If SLURM has
        asked the task to stop, requeue it now (this does not return)."""
        import torch

        self._raise_failed_landing()
        count = self.land()
        saved = {"state": state, "rows": count, "config_hash": self.config_hash}
        buffer = io.BytesIO()  # torch.save's own write errors (a full disk) are no OSError
        torch.save(saved, buffer)
        checkpoint = self.folder / CHECKPOINT
        try:
            files.replace_atomically(
                checkpoint, lambda tmp: tmp.write_bytes(buffer.getbuffer()), False
            )
        except OSError as error:
            self.store_error = error
            raise
        if self.stopping and self._requeue is not None:
            self.say(f"SLURM asked this task to stop: checkpoint at {count} rows saved, requeueing")
            self._requeue_now()

    def restore(self) -> dict | None:
        """The state of the point's last checkpoint, or None (a first run, or a checkpoint that
        does not match the rows that landed). The landed rows are cut back to its count."""
        import torch

        path = self.folder / CHECKPOINT
        if not path.exists():
            return None
        try:  # tensors and plain values only: unpickling anything else could run code
            saved = torch.load(path, weights_only=True)
        except pickle.UnpicklingError:
            self.say(f"refused the checkpoint {path}: it holds more than tensors and plain "
                     "values, and loading it could run code; starting over")  # fmt: skip
            return None
        except Exception as error:  # a damaged file: whatever reading it raises
            self.say(f"cannot read the checkpoint {path} ({type(error).__name__}): starting over")
            return None
        if not isinstance(saved, dict) or saved.get("config_hash") != self.config_hash:
            return None
        rows = store.job_rows(self.path)
        if len(rows) < saved["rows"]:  # the job's rows are gone or damaged: start afresh
            self.say(f"checkpoint at {saved['rows']} rows, but {len(rows)} landed: starting over")
            return None
        with self._writing, self._lock:
            self.rows = store.settled(rows[: saved["rows"]])
            self.landed = -1  # rewrite the file: it holds rows past the checkpoint
            self._open_sinks(self.rows)  # they continue after the checkpoint's last row
        self.land()
        self.say(f"resumed from the checkpoint at {saved['rows']} rows")
        return saved["state"]

    # What the harness calls.

    def land(self) -> int:
        """Write every row so far to the job's file (status "running"); how many there are."""
        with self._writing:
            with self._lock:
                rows, self.oldest = list(self.rows), None
            if len(rows) != self.landed or not self.path.exists():
                try:
                    store.write_rows(self.path, [{**row, "status": store.RUNNING} for row in rows])
                except OSError as error:
                    self.store_error = error
                    raise
                with self._lock:
                    self.landed = len(rows)
                if rows and self.shown:
                    self.say(self.shown(rows[-1]))
            self._to_sinks(rows)
        return len(rows)

    def finish(self, returned: list[dict]) -> None:
        """The point has ended: the sinks get what they have not had of its rows (`returned`:
        the rows the function returned, after those it logged), and close."""
        if self.sinks is not None:
            self._to_sinks([*self.rows, *returned])
            self.sinks.close()

    def _open_sinks(self, kept: list[dict]) -> None:
        if self.sinks is not None and self.sunk is None:
            self.sinks.open(kept[-1] if kept else None)
            self.sunk = len(kept)

    def _to_sinks(self, rows: list[dict]) -> None:
        """The rows the sinks have not had yet (the store has them: it comes first)."""
        if self.sinks is not None:
            self._open_sinks([])
            self.sinks.write(rows[self.sunk :])
            self.sunk = max(self.sunk, len(rows))

    def close(self) -> list[dict]:
        """Stop landing rows in the background; the rows the experiment logged."""
        self._closed = True
        self._wake.set()
        self._thread.join()
        release_running(self._marker)
        return self.rows

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
            self.stopping = True

        self._requeue = lambda: handler(signal.SIGUSR2, None)
        signal.signal(signal.SIGUSR2, warned)
        try:
            yield
        finally:  # a point that ended after the warning has its rows: nothing to requeue
            signal.signal(signal.SIGUSR2, handler)
            self._requeue = None

    def _raise_failed_landing(self) -> None:
        """The error that stopped the landing thread (a full disk, say), in the experiment."""
        if self._failed is not None:
            raise RuntimeError(f"rows could not land: {self._failed}") from self._failed

    def _requeue_now(self) -> None:
        """submitit's handler, once: it requeues the task and ends this process."""
        requeue, self._requeue = self._requeue, None
        if requeue is not None:
            requeue()

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


def hold_running(path: Path):
    """Mark the job of file `path` as running in this process: a lock (_job-N.running, beside
    the job's file) that this process holds until release_running, or its death, lets it go."""
    marker = open(_running_marker(path), "a")  # noqa: SIM115 (held until release_running)
    fcntl.flock(marker, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return marker


def release_running(marker) -> None:
    with contextlib.suppress(OSError):
        os.unlink(marker.name)
    marker.close()


def still_running(path: Path) -> bool | None:
    """Whether a process holds the job's running mark (hold_running); None where it has none
    (the job ended, or its store predates the mark)."""
    try:
        with open(_running_marker(path), "rb") as marker:
            fcntl.flock(marker, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    return False


def _running_marker(path: Path) -> Path:
    return Path(path).with_name(f"_{Path(path).stem}.running")
