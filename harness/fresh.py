"""A process that runs one unit of work after another (a warm worker's points, a test's calls of
the command line) as if each ran in a fresh process: a Snapshot of this process's state, taken
before, and restored after each.

What a Snapshot restores: the working directory, the environment, sys.path, signal handlers,
logging's levels and the handlers the unit added, torch's threads, default dtype, grad mode,
deterministic flag, autocast flags and random states (Python's, NumPy's, torch's), CUDA's
peak-memory statistics and current device, and it forgets what the harness keeps for a command
or a point (harness.lifetime). The modules the unit imported from outside the installed
packages and the harness (an experiment of experiments/ or of a user's folder) are forgotten,
so that a file edited meanwhile is the new one next time, as in a new process. What needs a
really new process (peak resident memory, a first call's compile) runs in one
(harness.measure.run_isolated).
"""

import logging
import os
import random
import signal
import sys
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
        self.modules = set(sys.modules)
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
        _forget_modules(set(sys.modules) - self.modules)
        for signum, handler in self.signals.items():
            signal.signal(signum, handler)
        _restore_logging(self.logging)
        random.setstate(self.random)
        numpy.random.set_state(self.numpy)
        threads, dtype, grad, deterministic, rng = self.torch
        torch.set_num_threads(threads)
        torch.set_default_dtype(dtype)
        torch.set_grad_enabled(grad)
        torch.use_deterministic_algorithms(deterministic)
        torch.random.set_rng_state(rng)
        for kind, enabled in self.autocast.items():
            torch.set_autocast_enabled(kind, enabled)
        if torch.cuda.is_initialized():
            torch.cuda.set_device(self.device or 0)
            for device in range(torch.cuda.device_count()):
                torch.cuda.reset_peak_memory_stats(device)
        lifetime.forget(command=command)


def _forget_modules(new: set[str]) -> None:
    """Drop the modules imported since, from outside the installed packages and the harness:
    the next import reads their files again."""
    for name in new:
        module = sys.modules.get(name)
        origin = getattr(module, "__file__", None)
        if not origin:
            continue
        where = Path(origin).resolve()
        if any(where.is_relative_to(root) for root in (*INSTALLED, HARNESS)):
            continue
        del sys.modules[name]
        # Its package kept (imported before) would hand the old one to `from package import
        # name`, which looks at the package's attribute before sys.modules.
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
        logger.setLevel(level)
        logger.disabled, logger.propagate = disabled, propagate
