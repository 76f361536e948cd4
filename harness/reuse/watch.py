"""The tripwire on what a point reads (reuse on request, harness.reuse): what it opens and lists
through Python (Python's audit hook) and the modules it imports from elsewhere, outside its
snapshot, Python's and the installed packages' folders, its own output and its declared inputs.
What it sees can only refuse a copy, never permit one: a library that reads in C, a process the
point starts, a variable read from the environment are not seen.
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import json
import os
import sys
import tempfile
import zoneinfo
from collections.abc import Iterator
from pathlib import Path

from harness import provenance
from harness.lifetime import per_command
from harness.pinning import codestore

SHOWN = 20  # undeclared files a row names
SHARED = "/dev/shm/"  # data may lie there, below the system's /dev
# What the import system opens and lists (the modules it imports are looked at as modules).
IMPORTERS = ("<frozen importlib", "<frozen zipimport",
             os.path.join(os.path.dirname(json.__file__).rpartition(os.sep)[0], "importlib", ""),
             os.path.join(os.path.dirname(os.__file__), "pkgutil.py"))  # fmt: skip

_watch: Watch | None = None  # the Watch that the audit hook feeds now, if any
# What this process read outside the roots as it imported an experiment's modules, and what
# its points read undeclared: counted for every point after (a cache may serve them).
_earlier: list[str] = per_command([])


READ, MADE = "read", "made"  # what an open does to a file: reads what it held, or makes it anew


def _hook(event: str, args: tuple) -> None:
    watch = _watch  # once: another thread may leave the watch meanwhile
    if watch is None or event not in WATCHED or isinstance(args[0], int) or _by_importer():
        return
    path = os.path.abspath(os.fsdecode(args[0] if args[0] is not None else "."))
    if event == "open":
        watch.opened.append((path, _does(path, args[1], args[2])))
    elif event == "os.mkdir":  # a folder the point makes: all in it is its own
        watch.opened.append((os.path.join(path, ""), MADE))
    else:  # a listing of a folder
        watch.opened.append((os.path.join(path, ""), READ))


WATCHED = ("open", "os.listdir", "os.scandir", "os.mkdir")


def _by_importer() -> bool:
    """Whether the hook's event comes from the import system (which the modules it imports
    are looked at for)."""
    try:
        return sys._getframe(2).f_code.co_filename.startswith(IMPORTERS)
    except ValueError:  # no Python caller
        return False


def _does(path: str, mode, flags) -> str | None:
    """What an open does: READ what the file held (for reading, truncating nothing), MADE it
    anew (truncated, created exclusively, or appended to where there was none), or neither (a
    write-only open of a file that was there)."""
    if isinstance(mode, str):
        made, reads = "w" in mode or "x" in mode, "r" in mode or "+" in mode
    else:
        made = bool(flags & os.O_TRUNC or (flags & os.O_CREAT and flags & os.O_EXCL))
        reads = (flags & os.O_ACCMODE) in (os.O_RDONLY, os.O_RDWR)
    if made or (not reads and not os.path.exists(path)):
        return MADE
    return READ if reads else None


@functools.cache
def _hooked() -> None:
    sys.addaudithook(_hook)  # for the life of the process: a hook cannot be taken away


class Watch:
    """What one point opens, lists and makes through Python as it runs (`opened`: each path,
    and what was done to it: READ, MADE or neither), and, asked undeclared(), what it read and
    the modules it imported outside `own` (folders), the roots, what it made itself and its
    declared inputs (`found`)."""

    def __init__(self, own: tuple[str, ...], found: dict[str, dict], tops=frozenset(),
                 before=frozenset()):  # fmt: skip
        self.opened: list[tuple[str, str | None]] = []
        running = codestore.running()  # its snapshot's files are pinned
        pinned = (real_folder(str(running[0])),) if running else ()
        self.own = provenance.installed() + _roots() + pinned + own
        self.made: set[str] = set()  # files and folders (ending in a separator) it made
        self.outside: dict[str, None] = {}
        self.tops, self.before, self.modules = tops, before, -1
        self.covered, self.folders = _covered(found)
        self.declared: dict[str, bool] = {}

    def __enter__(self) -> Watch:
        global _watch
        _hooked()
        self.was, _watch = _watch, self
        return self

    def __exit__(self, *exc) -> None:
        global _watch
        _watch = self.was

    def undeclared(self) -> list[str]:
        """The files read and the module files imported outside the roots, its own folders and
        its declared inputs, by this point and by this process before it."""
        taken, opened = len(self.opened), self.opened
        for path, does in opened[:taken]:
            if does == MADE:
                self.made.add(path)
            elif does == READ and not self._own(path) and not self._inside(path):
                self.outside[path] = None
        del opened[:taken]
        if len(sys.modules) != self.modules:
            self.modules = len(sys.modules)
            foreign = _foreign(self.modules, self.tops, self.before)
            self.outside |= dict.fromkeys(path for path in foreign if not self._inside(path))
        return [path for path in dict.fromkeys([*_earlier, *self.outside])
                if not self._declared(path)]  # fmt: skip

    def _own(self, path: str) -> bool:
        """Whether the point made the file, or the folder it lies in (a temporary folder)."""
        folder = os.path.join(path, "")  # a folder it made, opened as a file (rmtree does)
        return path in self.made or any(
            path.startswith(made) or folder == made for made in self.made if made[-1] == os.sep
        )

    def said(self) -> str:
        """undeclared() as JSON text, at most SHOWN of them, for a row's files_read."""
        return json.dumps(self.undeclared()[:SHOWN])

    def keep(self) -> list[str]:
        """undeclared(), counted for every later point of this process too."""
        found = self.undeclared()
        _earlier.extend(path for path in found if path not in _earlier)
        return found

    def _inside(self, path: str) -> bool:
        if path.startswith(self.own) and not path.startswith(SHARED):
            return True
        real = _resolved(path)
        return real.startswith(self.own) and not real.startswith(SHARED)

    def _declared(self, path: str) -> bool:
        if path not in self.declared:
            self.declared[path] = any(p in self.covered or p.startswith(self.folders)
                                      for p in (path, _resolved(path)))  # fmt: skip
        return self.declared[path]


def _resolved(path: str) -> str:
    """A path with its links resolved, a folder's (ending in a separator) still ending in one."""
    real = os.path.realpath(path)
    return os.path.join(real, "") if path.endswith(os.sep) else real


def _covered(found: dict[str, dict]) -> tuple[set[str], tuple[str, ...]]:
    """The paths a point's declared inputs cover (each path and link it was reached through,
    and the folder it lies in, which a glob lists), and the folders below which all is."""
    paths, folders = set(), set()
    for entry in found.values():
        for chain in entry["paths"]:
            for path in chain:
                paths |= {path, os.path.join(os.path.dirname(path), "")}
            if os.path.isdir(chain[-1]):
                folders |= {os.path.join(path, "") for path in chain}
    return paths, tuple(folders)


@per_command
@functools.lru_cache(maxsize=1)
def _foreign(count: int, tops: frozenset, before: frozenset) -> tuple[str, ...]:
    """The files of the modules this process imported (`count` of them) from outside its
    snapshot (whose top-level names are `tops`) and Python's and the installed packages'
    folders, but those of the modules imported before it entered the snapshot (`before`: the
    harness's own)."""
    installed = provenance.installed()
    found = []
    for name, module in list(sys.modules.items()):
        path = module_file(module)
        top = name.partition(".")[0]
        if path and not path.startswith(installed) and name not in before and top not in tops:
            found.append(path)
    return tuple(found)


@contextlib.contextmanager
def importing() -> Iterator[None]:
    """While the block runs (an experiment's modules imported), what this process reads
    outside the roots is kept as read by every point it runs from now on (a module that reads
    its data as it is imported does so once a process)."""
    with Watch((), {}) as watch:
        yield
    taken = [path for path, does in watch.opened if does == READ and not watch._inside(path)]
    _earlier.extend(path for path in taken if path not in _earlier)


@functools.cache
def _roots() -> tuple[str, ...]:
    """The folders whose files no point's reading names besides Python's and the installed
    packages': the harness's own, the system's (but /dev/shm, where data may lie), its time
    zones and torch's compile caches."""
    harness = Path(__file__).resolve().parents[1]
    given = {str(harness), "/proc", "/sys", "/dev", *zoneinfo.TZPATH,
             os.environ.get("TORCHINDUCTOR_CACHE_DIR")
             or os.path.join(tempfile.gettempdir(), f"torchinductor_{_user()}"),
             os.environ.get("TRITON_CACHE_DIR") or os.path.expanduser("~/.triton")}  # fmt: skip
    both = {way(root) for root in given if root for way in (os.path.abspath, os.path.realpath)}
    return tuple(f"{root.rstrip(os.sep)}{os.sep}" for root in sorted(both))


@functools.lru_cache(maxsize=64)
def real_folder(folder: str) -> str:
    """A folder with its links resolved, ending in a separator (once a folder: a sweep's own
    folders are the same for all its points)."""
    return os.path.join(os.path.realpath(folder), "")


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid
        return "unknown"


def module_file(module) -> str | None:
    """A module's file; None for one that has none, or a bare name of a library's making."""
    path = getattr(module, "__file__", None)
    return path if isinstance(path, str) and os.path.isabs(path) else None
