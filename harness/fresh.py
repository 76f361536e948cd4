"""A process that runs one unit of work after another (a warm worker's points, a test's calls of
the command line) as if each ran in a fresh process: a Snapshot of this process's state, taken
before, and restored after each.

What a Snapshot restores: the working directory, the environment, sys.path, signal handlers,
logging's levels and the handlers the unit added, torch's threads, default dtype, grad mode,
deterministic flag, autocast flags and random states (Python's, NumPy's, torch's), CUDA's
peak-memory statistics and current device (its cached blocks given back), and it forgets what
the harness keeps for a command or a point (harness.lifetime). The modules the unit imported
from outside the installed packages and the harness (an experiment of experiments/ or of a
user's folder) stay, with their module-level state, as they would in one process (the basic
launcher), until one of their files changes: then they are all forgotten, and the next import
reads them again; a restore after a command forgets them always. A sweep's points import the
experiment from its snapshot of the code (harness.codestore), whose files never change: an edit
of the experiment's folder during a sweep reaches none of its points, only a module imported
from outside the folders the sweep pinned would be read anew. What needs a really new process
(peak resident memory, a first call's compile) runs in one (harness.measure.run_isolated); an
experiment whose module-level state must start anew each point runs with fresh: true
(harness.launchers.local).
"""

import gc
import logging
import os
import random
import signal
import sys
import time
from pathlib import Path

from harness import lifetime

AUTOCAST = ("cpu", "cuda")  # the devices whose autocast flag a point may leave set
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD)
HARNESS = Path(__file__).resolve().parent
INSTALLED = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}


class Snapshot:
    """This process's state now; restore() brings it back (forget: the harness's per-command
    records too, else only its per-point ones)."""

    def __init__(self):
        import numpy
        import torch

        self.cwd, self.environ, self.path = os.getcwd(), dict(os.environ), list(sys.path)
        self.modules = set(sys.modules)  # those it leaves: there before, or installed
        self.users: dict[str, tuple[str, tuple | None]] = {}  # kept: name -> (file, its stamp)
        self.since = time.time_ns()  # when the unit of work began
        self.signals = {signum: signal.getsignal(signum) for signum in SIGNALS}
        self.logging = _logging_state()
        self.random, self.numpy = random.getstate(), numpy.random.get_state()
        self.torch = (
            torch.get_num_threads(),
            torch.get_default_dtype(),
            torch.is_grad_enabled(),
            torch.are_deterministic_algorithms_enabled(),
            torch.random.get_rng_state(),
        )
        self.autocast = {kind: torch.is_autocast_enabled(kind) for kind in AUTOCAST}
        self.device = torch.cuda.current_device() if torch.cuda.is_initialized() else None

    def restore(self, *, command: bool = True) -> None:
        import numpy
        import torch

        os.chdir(self.cwd)
        os.environ.clear()
        os.environ.update(self.environ)
        sys.path[:] = self.path
        self._user_modules(forget=command)
        for signum, handler in self.signals.items():
            signal.signal(signum, handler)
        _restore_logging(self.logging)
        random.setstate(self.random)
        numpy.random.set_state(self.numpy)
        threads, dtype, grad, deterministic, rng = self.torch
        torch.set_num_threads(threads)
        torch.set_default_dtype(dtype)
        torch.set_grad_enabled(grad)
        if torch.are_deterministic_algorithms_enabled() != deterministic:  # its first call
            torch.use_deterministic_algorithms(deterministic)  # imports torch._dynamo: 1 s
        torch.random.set_rng_state(rng)
        for kind, enabled in self.autocast.items():
            torch.set_autocast_enabled(kind, enabled)
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()  # an error the point left in its context is raised here
            gc.collect()  # what the point held, given back to the GPU for the next one
            torch.cuda.empty_cache()
            torch.cuda.set_device(self.device or 0)
            for device in range(torch.cuda.device_count()):
                torch.cuda.reset_peak_memory_stats(device)
        lifetime.forget(command=command)
        self.since = time.time_ns()

    def _user_modules(self, forget: bool) -> None:
        """The modules imported since the snapshot from outside the installed packages and the
        harness (an experiment's, a user's) stay while their files are unchanged, with their
        state, as in one process; once one is edited (or with forget) they all go, and the
        next import reads their files again."""
        for name in set(sys.modules) - self.modules - set(self.users):
            origin = getattr(sys.modules[name], "__file__", None)
            if not origin or _installed(origin):
                self.modules.add(name)  # for good: it is not looked at again
                continue
            stamp = _stamp(origin)
            edited = stamp is None or stamp[0] >= self.since  # while the unit ran: maybe after
            self.users[name] = (origin, None if edited else stamp)
        kept = self.users.values()
        changed = any(stamp is None or _stamp(origin) != stamp for origin, stamp in kept)
        if forget or changed:
            for name in self.users:
                _forget(name)
            self.users.clear()


def _installed(origin: str) -> bool:
    where = Path(origin).resolve()
    return any(where.is_relative_to(root) for root in (*INSTALLED, HARNESS))


def _stamp(path: str) -> tuple[int, int] | None:
    """A file's modification time and size; None where it is gone."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


def _forget(name: str) -> None:
    """Drop a module: the next import reads its file again."""
    module = sys.modules.pop(name, None)
    if module is None:
        return
    # Its package kept (imported before) would hand the old one to `from package import name`,
    # which looks at the package's attribute before sys.modules.
    package, _, attribute = name.rpartition(".")
    if getattr(sys.modules.get(package), attribute, None) is module:
        delattr(sys.modules[package], attribute)


def _logging_state() -> dict:
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    return {
        logger: (list(logger.handlers), logger.level, logger.disabled, logger.propagate)
        for logger in loggers
        if isinstance(logger, logging.Logger)
    }


def _restore_logging(saved: dict) -> None:
    """The handlers added since closed and removed, levels and flags as they were."""
    for logger, (handlers, *_) in _logging_state().items():
        kept = saved.get(logger, ([],))[0]
        for handler in handlers:
            if handler not in kept:
                logger.removeHandler(handler)
                handler.close()
    for logger, (handlers, level, disabled, propagate) in saved.items():
        logger.handlers[:] = handlers
        if logger.level != level:  # setLevel clears every logger's cache
            logger.setLevel(level)
        logger.disabled, logger.propagate = disabled, propagate
