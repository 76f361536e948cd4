"""A process that runs one unit of work after another (a warm worker's points, the points run_here
runs in one process, a test's calls of the command line) as if each ran in a fresh process: a
ProcessState, this process's state taken before, and restored after each.

What a ProcessState restores: the working directory, the environment, sys.path and the import
hooks (sys.meta_path; after a command, the packages a sweep's snapshot took over given back:
harness.pinning.boot.leave), signal handlers,
logging's levels and the handlers the unit added, torch's threads, default dtype, grad mode,
deterministic flag, autocast flags and random states (Python's, NumPy's, torch's), the other
settings that change what a computation returns or how long it takes (launchers.settings: torch's
default device, numerics flags and matmul precision, NumPy's error handling, the warnings
filters, the time zone, umask, resource limits, ...), CUDA's peak-memory statistics and current
device (its cached blocks given back), and it forgets what the harness keeps for a command or a
point (harness.lifetime; reset, between the points run_here runs, only once a user's module
goes). What it cannot put back, left() names: a function of a WATCHED
library replaced, a thread still running, a setting it could not set again; a warm worker that
hears of any ends after its point (harness.launchers.workers), and a process of many points
says so in a warning (harness.launchers.in_process.SameStart). The modules the unit imported
from outside the installed packages and the harness (an experiment of experiments/ or of a
user's folder) stay, with their module-level state, as they would in one process (the basic
launcher), until one of their files changes: then they are all forgotten, and the next import
reads them again; a restore after a command forgets them always. A sweep's points import the
experiment from its snapshot of the code (harness.pinning.codestore), whose files never change: an
edit of the experiment's folder during a sweep reaches none of its points, only a module imported
from outside the folders the sweep pinned would be read anew. What needs a really new process
(peak resident memory, a first call's compile) runs in one (harness.measuring.memory.run_isolated);
an experiment whose module-level state must start anew each point runs with fresh: true
(harness.launchers.local).
"""

import functools
import gc
import logging
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

from harness import files, lifetime, provenance
from harness.launchers.settings import set_back, settings
from harness.pinning import boot

AUTOCAST = ("cpu", "cuda")  # the devices whose autocast flag a point may leave set
# Libraries whose functions a point could replace for the points after it (a patch is never put
# back: the process that holds one is not used again).
WATCHED = ("torch", "torch.nn.functional", "torch.linalg", "torch.fft", "torch.special", "numpy",
           "numpy.linalg", "numpy.fft", "numpy.random", "math", "random", "time")  # fmt: skip
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD)
HARNESS = f"{Path(__file__).resolve().parents[1]}{os.sep}"  # this is harness/launchers/fresh.py


class ProcessState:
    """This process's state now; restore() brings it back (forget: the harness's per-command
    records too, else only its per-point ones). Restored after every point (a warm worker's, and
    each of those run_here runs one after another: harness.launchers.in_process), it looks first
    at what is costly to set back, and sets back only what differs."""

    def __init__(self):
        import numpy
        import torch

        self.cwd, self.environ, self.path = os.getcwd(), dict(os.environ), list(sys.path)
        self.raw = _environment()
        self.finders = list(sys.meta_path)
        self.modules = set(sys.modules)  # those it leaves: there before, or installed
        self.imported = list(sys.modules)  # the names at the last look, in their order
        self.users: dict[str, tuple[str, tuple | None]] = {}  # kept: name -> (file, its stamp)
        self.since = time.time_ns()  # when the unit of work began
        self.signals = {signum: signal.getsignal(signum) for signum in SIGNALS}
        self.logging = _logging_state()
        self.random, self.numpy = random.getstate(), _numpy_state(numpy)
        self.torch = (
            torch.get_num_threads(),
            torch.get_default_dtype(),
            torch.is_grad_enabled(),
            torch.are_deterministic_algorithms_enabled(),
            torch.random.get_rng_state(),
        )
        self.autocast = {kind: torch.is_autocast_enabled(kind) for kind in AUTOCAST}
        self.device = torch.cuda.current_device() if torch.cuda.is_initialized() else None
        self.settings = {name: get() for name, (get, _) in settings().items()}
        self.functions = _functions()
        self.threads = set(threading.enumerate())

    def restore(self, *, command: bool = True, records: bool = True) -> list[str]:
        """The state as it was taken; the names of the settings it could not set back. Without
        `records` (nor `command`), the harness's per-point records (harness.lifetime: what holds
        a user's code) are forgotten only with the user's modules (one of them edited)."""
        import numpy
        import torch

        os.chdir(self.cwd)
        if _environment() != self.raw:  # a unit that changed none: no putenv at all
            os.environ.clear()
            os.environ.update(self.environ)
        sys.path[:] = self.path
        if command:  # a sweep's snapshot entered by the command: left (the hooks as they were)
            boot.leave()
        sys.meta_path[:] = self.finders
        dropped = self._user_modules(forget=command)
        for signum, handler in self.signals.items():
            if signal.getsignal(signum) is not handler:
                signal.signal(signum, handler)
        if _logging_state() != self.logging:
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
        unset = set_back(self.settings)
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()  # an error the point left in its context is raised here
            gc.collect()  # what the point held, given back to the GPU for the next one
            torch.cuda.empty_cache()
            torch.cuda.set_device(self.device or 0)
            for device in range(torch.cuda.device_count()):
                torch.cuda.reset_peak_memory_stats(device)
        if command or records or dropped:
            lifetime.forget(command=command)
        self.since = time.time_ns()
        return unset

    def left(self) -> list[str]:
        """What the unit of work changed that restore() did not put back, each said in a few
        words: a setting it could not set again, a library function it replaced, a thread it
        left running. A process that reports any should not run another unit."""
        said = [f"{name} changed" for name, (get, _) in settings().items()
                if get() != self.settings[name]]  # fmt: skip
        return said + self._kept()

    def reset(self, records: bool = False) -> list[str]:
        """restore(command=False), then what left() would name, each setting read once (restore
        reads them all, and left() would again): between two points of one process (a warm
        worker's, or those harness.launchers.in_process.run_here runs). Without `records`
        (run_here's), the experiment's function, which looked up again would cost more than all
        the rest, is kept while its modules are (as in one process)."""
        unset = self.restore(command=False, records=records)
        return [f"{name} changed" for name in unset] + self._kept()

    def _kept(self) -> list[str]:
        """The library functions the unit replaced and the threads it left running."""
        said = [f"{name} replaced" for name in _replaced(self.functions)]
        said += [f"thread {thread.name!r} still running"
                 for thread in threading.enumerate() if thread not in self.threads]  # fmt: skip
        return said

    def _user_modules(self, forget: bool) -> bool:
        """The modules imported since the state was taken from outside the installed packages
        and the harness (an experiment's, a user's) stay while their files are unchanged, with
        their state, as in one process; once one is edited (or with forget) they all go, and
        the next import reads their files again. Whether any went."""
        imported = list(sys.modules)
        if imported != self.imported:  # else none imported nor dropped since the last look
            self._look_at_imports()
        kept = self.users.values()
        changed = any(stamp is None or _stamp(origin) != stamp for origin, stamp in kept)
        dropped = bool(self.users) and (forget or changed)
        if forget or changed:
            for name in self.users:
                _forget(name)
            self.users.clear()
            imported = list(sys.modules)
        self.imported = imported
        return dropped

    def _look_at_imports(self) -> None:
        """Each module imported since the last look: kept for good (installed, or the harness's
        own), or a user's, with its file's stamp."""
        for name in set(sys.modules) - self.modules - set(self.users):
            origin = getattr(sys.modules[name], "__file__", None)
            if not origin or _installed(origin):
                self.modules.add(name)  # for good: it is not looked at again
                continue
            stamp = _stamp(origin)
            edited = stamp is None or stamp[1] >= self.since  # while the unit ran: maybe after
            self.users[name] = (origin, None if edited else stamp)


def _environment() -> dict:
    """The environment as os.environ keeps it (its bytes, compared without decoding each value:
    a tenth of dict(os.environ)'s cost, after every point)."""
    return dict(getattr(os.environ, "_data", os.environ))


def _installed(origin: str) -> bool:
    """Whether a module's file is Python's, an installed package's or the harness's own."""
    return os.path.realpath(origin).startswith((*provenance.installed(), HARNESS))


def _stamp(path: str) -> tuple[int, ...] | None:
    """A file's stamp (harness.files.stamp); None where it is gone."""
    try:
        return files.stamp(os.stat(path))
    except OSError:
        return None


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


@functools.cache
def _numpy_state(numpy) -> tuple:
    """NumPy's global generator's state, as set_state takes it: its key a list, which set_state
    reads 15 times faster than the array get_state gives."""
    name, key, *rest = numpy.random.get_state()
    return name, key.tolist(), *rest


# Where torch keeps float32's precision (TF32 or not) per backend and operator (torch 2.9 on);
# the legacy flags (allow_tf32) are views of these, and reading them raises once they differ.
def _functions() -> dict[str, tuple[object, set, dict, list]]:
    """The functions and classes of the WATCHED libraries (those imported), and torch.Tensor's
    and torch.nn.Module's methods: by owner's name, (owner, every name it has, {name: function},
    its names and values as last found with none replaced: _contents)."""
    owners = {name: sys.modules[name] for name in WATCHED if name in sys.modules}
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        owners |= {"torch.Tensor": torch.Tensor, "torch.nn.Module": torch.nn.Module}
    return {label: (owner, set(vars(owner)),
                    {name: value for name, value in vars(owner).items() if callable(value)},
                    _contents(vars(owner)))
            for label, owner in owners.items()}  # fmt: skip


def _replaced(functions: dict[str, tuple[object, set, dict, list]]) -> list[str]:
    """The dotted names of those functions that are no longer what they were, and of functions
    added (a method defined over its base class's). A library's own replacement of its own
    function (torch._dynamo wraps torch.manual_seed when it is first imported), by code that
    lies in that library's folder, is taken as the function from then on, not named. An owner
    whose names and values are those last found has none replaced: two comparisons of lists,
    some 10 times faster than a look at each function, between two points."""
    replaced = []
    for label, (owner, names, named, seen) in functions.items():
        now = vars(owner)
        if _as_seen(now, seen):
            continue
        found = []
        for name in [n for n, value in named.items() if now.get(n) is not value]:
            if name in now and _libraries_own(label, now[name]):
                named[name] = now[name]
            else:
                found.append(f"{label}.{name}")
        found += [f"{label}.{name}" for name in now.keys() - names if callable(now[name])]
        if not found:
            seen[:] = _contents(now)
        replaced += found
    return replaced


def _contents(namespace) -> list[list]:
    """A namespace's names and values, in their order."""
    return [list(namespace), list(namespace.values())]


def _as_seen(namespace, seen: list[list]) -> bool:
    """Whether a namespace holds the names and values `seen`. An object is equal to itself
    unasked (list comparison): a value's own __eq__ is only asked where it was replaced, and
    one that answers no bool (an array's) is a change."""
    try:
        return _contents(namespace) == seen
    except Exception:  # noqa: BLE001 - whatever a replaced value's __eq__ raises
        return False


def _libraries_own(label: str, value) -> bool:
    """Whether `value` was defined in the files of the library `label` belongs to."""
    library = sys.modules.get(label.split(".")[0])
    folder = getattr(library, "__file__", None)
    code = getattr(value, "__code__", None)
    module = sys.modules.get(getattr(value, "__module__", None) or "")
    where = code.co_filename if code else getattr(module, "__file__", None)
    return bool(folder and where) and Path(where).resolve().is_relative_to(Path(folder).parent)


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
