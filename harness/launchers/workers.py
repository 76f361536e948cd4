"""Warm workers for the local launcher: a process per slot (max_parallel of them) that runs the
points it is handed one after another, the next one as soon as one ends, each from the same
state (harness.launchers.fresh): a point costs what it computes, not a new Python's start. Workers
are forked from multiprocessing's forkserver, which imports torch and the libraries once (started
while the sweep is planned), so that a worker starts in milliseconds; each imports the harness
and the experiment from the sweep's snapshot of its code, checked first (harness.pinning.boot).

A worker keeps its slot's GPU (CUDA_VISIBLE_DEVICES, set when it starts) and its CUDA context
for the whole sweep, and its threads (the launcher's job_threads). One that dies while it runs a
point (SIGKILL, the kernel's OOM killer, a segfault in a kernel) fails only that point, with a
row saying so (harness.launchers.dispatch writes it), and a new worker takes its slot; so does one
past timeout_min, which is stopped. A worker whose resident memory has grown past rss_mib after a
point is replaced before the next, and so is one whose point left what harness.launchers.fresh
cannot put back (a library function replaced, a thread still running, a limit it cannot raise
again): its log says what. Ctrl-C is the sweep's to answer: the workers ignore it and are stopped
with the sweep, and a worker whose sweep's process is gone (SIGKILL) ends itself.

Python's and the libraries' pools (concurrent.futures, loky) fail every running task when one
worker dies; here each worker is a process and a pipe of its own, so that a death is one
point's. A point runs in the worker's process: what needs a process of its own (peak resident
memory, a first call's compile) runs in one as before (harness.measuring.memory.run_isolated).
"""

import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path

import cloudpickle

from harness.errors import with_type
from harness.launchers.in_process import job_runner
from harness.launchers.protocol import Job, unwritable
from harness.launchers.warm import context
from harness.pinning import boot, codestore

CHECK_S = 1.0  # how often the timeouts are looked at while every worker computes
STOP_S = 5.0  # how long a stopped worker may take to end before SIGKILL


@dataclass
class Worker:
    process: multiprocessing.Process
    connection: Connection
    job: int | None = None  # the point it runs
    started: float = 0.0


@dataclass
class Pool:
    """The warm workers of one sweep's launch. setup: what a worker needs to run points (the
    launcher's config, task function and Hydra's state, cloudpickled); environment(slot): what
    slot's worker changes in this process's environment (None: unset); log: where workers'
    output goes."""

    setup: bytes
    slots: int
    environment: Callable[[int], dict[str, str | None]]
    log: Path
    threads: int | None
    timeout_s: float | None
    rss_mib: float | None
    sweep: str | None  # the sweep's process (process_identity), which a worker ends with
    workers: dict[int, Worker] = field(default_factory=dict)

    def run(self, jobs: list[Job]) -> Iterator[tuple[int, dict]]:
        """(job number, summary) as each job ends, at most `slots` at once."""
        waiting = list(jobs)
        try:
            while waiting or any(w.job is not None for w in self.workers.values()):
                for slot in range(self.slots):
                    if waiting and self._free(slot):
                        self._hand(slot, waiting.pop(0))
                yield from self._ended()
        finally:
            self.stop()

    def _free(self, slot: int) -> bool:
        worker = self.workers.get(slot)
        return worker is None or worker.job is None

    def _hand(self, slot: int, spec: Job) -> None:
        """Give the slot's worker the job; one that died idle (the OOM killer) is replaced."""
        worker = self.workers.get(slot)
        if worker is not None and not _sent(worker, spec):
            _stop(self.workers.pop(slot))
            worker = None
        if worker is None:
            worker = self.workers[slot] = self._start(slot)
            worker.connection.send(spec)
        worker.job, worker.started = spec.job, time.monotonic()

    def _start(self, slot: int) -> Worker:
        ours, theirs = multiprocessing.Pipe()
        environ = {**os.environ, **self.environment(slot)}
        environ = {name: value for name, value in environ.items() if value is not None}
        self.log.parent.mkdir(parents=True, exist_ok=True)
        args = (theirs, self.setup, self.sweep, self.threads, environ, str(self.log))
        target, kwargs, code = serve, {}, codestore.running()
        if code:  # the worker imports the harness from the sweep's snapshot, checked first
            target, args, kwargs = codestore.worker_target(*code, f"{__name__}:serve", args)
        process = context().Process(target=target, args=args, kwargs=kwargs,
                                    name=f"harness-worker-{slot}")  # fmt: skip
        process.start()
        theirs.close()
        return Worker(process, ours)

    def _ended(self) -> Iterator[tuple[int, dict]]:
        busy = {slot: w for slot, w in self.workers.items() if w.job is not None}
        waits = [w.connection for w in busy.values()] + [w.process.sentinel for w in busy.values()]
        wait(waits, timeout=CHECK_S)
        for slot, worker in busy.items():
            job, alive = worker.job, worker.process.is_alive()  # alive first: an answer, then
            if worker.connection.poll():  # an end, reads as the answer
                try:
                    _, summary, resident_mib, ending = worker.connection.recv()
                except (EOFError, OSError):  # it ended: its end of the pipe closed with it
                    worker.process.join(STOP_S)
                    yield job, self._lost(slot, _how_it_ended(worker.process))
                    continue
                worker.job = None
                if ending or (self.rss_mib and resident_mib > self.rss_mib):
                    self._retire(slot)
                yield job, summary
            elif not alive:
                yield job, self._lost(slot, _how_it_ended(worker.process))
            elif self.timeout_s and time.monotonic() - worker.started > self.timeout_s:
                minutes = self.timeout_s / 60
                yield job, self._lost(slot, f"ran past timeout_min={minutes:g} and was stopped")

    def _lost(self, slot: int, how: str) -> dict:
        """The summary of the point a worker held when it ended; the slot gets a new worker."""
        worker = self.workers.pop(slot)
        if worker.process.is_alive():  # past its time: it would compute on
            worker.process.kill()
        _stop(worker)
        return {"status": "killed", "error": f"its worker process {how}"}

    def _retire(self, slot: int) -> None:
        worker = self.workers.pop(slot)
        with suppress(OSError):  # it is gone already
            worker.connection.send(None)  # it ends after the point it answered
        _stop(worker)

    def stop(self) -> None:
        """End every worker: those at a point are stopped (SIGTERM, then SIGKILL)."""
        for worker in self.workers.values():
            if worker.job is None:
                with suppress(OSError):  # it is gone already
                    worker.connection.send(None)
            else:
                worker.process.terminate()
        for worker in self.workers.values():
            _stop(worker)
        self.workers.clear()


def _sent(worker: Worker, spec: Job) -> bool:
    """Whether the worker took the job: a worker that is gone has closed its end of the pipe."""
    try:
        worker.connection.send(spec)
    except OSError:
        return False
    return True


def _stop(worker: Worker) -> None:
    worker.process.join(STOP_S)
    if worker.process.is_alive():
        worker.process.kill()
        worker.process.join()
    worker.connection.close()


def _how_it_ended(process: multiprocessing.Process) -> str:
    code = process.exitcode
    if code == boot.FAILED:
        return ("did not start: the snapshot of the sweep's code was changed or is gone, so its "
                "points do not run (a new sweep pins the code as it is now)")  # fmt: skip
    if code is not None and code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"ended with exit code {code}"


def serve(
    connection: Connection,
    setup: bytes,
    sweep: str | None,
    threads: int | None,
    environ: dict[str, str],
    log: str,
) -> None:
    """A worker: each Job received, run, and its (job, summary, resident MiB, whether this
    worker ends) sent back, this process's state restored after each (harness.launchers.fresh); None
    or a closed pipe: the end.
    It takes the sweep's environment (a forked worker has the forkserver's), and its output
    goes to `log`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the sweep's
    os.environ.clear()
    os.environ.update(environ)
    with open(log, "a") as output:
        os.dup2(output.fileno(), 1)
        os.dup2(output.fileno(), 2)
    from hydra.core.singleton import Singleton
    from hydra.core.utils import setup_globals

    from harness.launchers.fresh import ProcessState
    from harness.launchers.submitit_jobs import end_with_the_sweep
    from harness.measuring.memory import proc_status_kib

    end_with_the_sweep(sweep)
    if threads:
        import torch

        torch.set_num_threads(threads)
    config, task_function, state = cloudpickle.loads(setup)
    Singleton.set_state(state)
    setup_globals()
    run, fresh = job_runner(config, task_function), ProcessState()
    while True:
        try:
            spec = connection.recv()
        except EOFError:
            return
        if spec is None:
            return
        try:
            summary = run(spec)
        except OSError as error:  # the store cannot be written: the sweep stops
            summary = unwritable(error)
        except Exception as error:  # the harness's own, around the point: a failed row
            summary = {"status": "failed", "error": f"harness error: {with_type(error)}"}
        try:
            left = fresh.reset(records=True)
        except Exception as error:  # a state it cannot put back (a CUDA error that sticks)
            left = [with_type(error)]
        if left:
            print(f"this worker ends after job {spec.job}, which left what a worker cannot put "
                  f"back: {'; '.join(left)}", file=sys.stderr, flush=True)  # fmt: skip
        connection.send((spec.job, summary, proc_status_kib("VmRSS") / 1024, bool(left)))
        if left:  # its slot gets a new worker; a thread left running must not hold it up
            sys.stdout.flush()
            os._exit(0)
