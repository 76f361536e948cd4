"""SLURM's warning while a training point runs, and the requeue it leads to.

SLURM signals a task (USR2) shortly before its time limit, or when it is preempted; submitit's
handler for it requeues the task at once. While a point runs (Tracker.slurm_signals), the
signal only sets a flag that the experiment reads (Tracker.stopping): its next save is its last
(its rows land and its state is saved first), and requeues the task through submitit's own
handler, which ends this process (Requeued). Outside a submitit job nothing changes.
"""

import contextlib
import signal
import threading
from collections.abc import Callable


class Requeued(SystemExit):
    """The task is requeued, and this process ends: nothing may take it for the experiment's
    own exit (harness.running.job.measure lets it through)."""


class SlurmSignals:
    """Whether SLURM has warned this process (`warned`), and submitit's handler, kept to requeue
    the task at the next save."""

    def __init__(self):
        self.warned = False
        self._requeue: Callable[[], None] | None = None  # submitit's handler, when deferred

    @property
    def deferred(self) -> bool:
        """Whether submitit's handler waits for a save to requeue the task."""
        return self._requeue is not None

    @contextlib.contextmanager
    def caught(self):
        """While the block runs, SLURM's warning sets `warned` instead of requeueing at once.
        Outside a submitit job (no handler of its own), or off the main thread, nothing."""
        handler = signal.getsignal(signal.SIGUSR2)
        if not callable(handler) or threading.current_thread() is not threading.main_thread():
            yield
            return

        def warned(signum, frame):  # sets a flag only: printing here could re-enter print
            self.warned = True

        self._requeue = lambda: handler(signal.SIGUSR2, None)
        signal.signal(signal.SIGUSR2, warned)
        try:
            yield
        finally:  # a point that ended after the warning has its rows: nothing to requeue
            signal.signal(signal.SIGUSR2, handler)
            self._requeue = None

    def requeue(self, rank: int, close: Callable[[], None]) -> None:
        """submitit's handler, once: it requeues the task and ends this process (Requeued). In
        a group, rank 0's requeues the job, and the other ranks (`rank` above 0) close their
        tracker (`close`) and end."""
        requeue, self._requeue = self._requeue, None
        if requeue is None:
            return
        try:
            requeue()
        except SystemExit as exit:
            raise Requeued(exit.code) from None
        if rank:  # submitit's handler does nothing on the other ranks: they end here
            close()
            raise Requeued(0)
