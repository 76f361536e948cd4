"""What a point read that its sweep did not pin, each file with the digest of its bytes: the files
it opened for reading (a data file a parameter names, a user's shapes.json; one looked for and
not there, as ABSENT), the folders it listed (a glob: the digest of their names), and the
modules it runs from elsewhere (a helper on PYTHONPATH), with what those read as they were
imported; but its snapshot (the code store), the standard library, the installed packages, the
folders the harness writes under the out folder, the system's /proc, /sys and /dev, its time
zones, torch's compile caches, the harness's own files and what the point wrote itself.
Python's audit hook sees every open made through Python (open, io.open_code, os.open) and every
listing (os.listdir, os.scandir), in every thread, but the import system's and the installed
packages' metadata's; the modules are those in sys.modules whose files lie elsewhere, but the
harness's own (imported before the process entered the sweep's snapshot). A path opened
relative to the working directory is named as it was opened, and read again relative to the
working directory of the process that checks it. What a process read for one point counts for
the points it runs after (a cache of it may serve them). A row names them (files_read) and reuse
copies an answer only while each still hashes as it did (harness.pinning.reuse).

Not seen: what a library opens in C without Python's open (pyarrow's readers, say) and what a
process the point starts reads.
"""

import contextlib
import functools
import getpass
import hashlib
import importlib
import json
import os
import site
import stat
import sys
import sysconfig
import tempfile
import zoneinfo
from _thread import get_ident
from collections.abc import Iterator

from harness.lifetime import per_command

_recording = None  # the Recording that the audit hook feeds now, if any
_paused: set[int] = set()  # the threads whose reads are the harness's own now (paused)
# What this process read as it imported an experiment's modules, and what its points read
# before: kept while the modules that may hold it are, for the command (a warm worker's too),
# and counted for every point after (a helper that reads its data as it is imported, or into a
# cache, does so once a process).
_earlier: dict[str, str] = per_command({})
_digests: dict[str, tuple[tuple, str]] = {}  # path -> (its stat stamp, its digest)
LISTED = "list"  # the mode of a listing among a Recording's `opened`
ABSENT = "absent"  # the digest of a file looked for and not there (an optional file)
# What the import system opens and lists, and the installed packages' metadata (a library's
# version looked up lists every folder on the path): not a point's reading (the modules it
# imports are, as Elsewhere finds them).
IMPORTERS = ("<frozen importlib", "<frozen zipimport",
             os.path.join(os.path.dirname(importlib.__file__), ""),
             os.path.join(os.path.dirname(os.__file__), "pkgutil.py"))  # fmt: skip
SHOWN = 100  # files a row names (the answer's record holds every one)


def _hook(event: str, args: tuple) -> None:
    if _recording is None or get_ident() in _paused:
        return
    if event == "open":
        if not _by_importer(sys._getframe(1)):
            _recording.opened.append(args)
    elif event in ("os.listdir", "os.scandir") and not _by_importer(sys._getframe(1)):
        listed = args[0] if args and args[0] is not None else "."
        _recording.opened.append((listed, LISTED, 0))


def _by_importer(frame) -> bool:
    """Whether an open's or a listing's caller (`frame`) is the import system or the packages'
    metadata."""
    return frame.f_code.co_filename.startswith(IMPORTERS)


@functools.cache
def _hooked() -> None:
    sys.addaudithook(_hook)  # for the life of the process: a hook cannot be taken away


class Recording:
    """What one point read, as it runs: `opened`, the audit hook's (path, mode, flags) of each
    open and listing; files_read() says it as files and digests, skipping `skip` (folders)
    too, with the modules it runs from elsewhere (`elsewhere`, where given) and what the
    experiment's modules read as they were imported."""

    def __init__(self, skip: tuple[str, ...], elsewhere: "Elsewhere"):
        self.skip, self.elsewhere, self.own = _roots() + skip, elsewhere, elsewhere.own
        self.opened: list[tuple] = []
        self.read: dict[str, str] = {}  # path -> digest
        self.written: set[str] = set()
        self.modules, self.text = -1, "{}"

    def files_read(self) -> dict[str, str]:
        """Each file read so far (in this process before too, _earlier), by its path (real, or
        relative as it was opened), with its digest (ABSENT: looked for, not there); and each
        folder listed (its path and a separator), with its names'."""
        self._take()
        return {**_earlier, **self.read}

    def keep(self) -> dict[str, str]:
        """What this point read (files_read), counted for every later point of this process
        (_earlier); returned."""
        read = self.files_read()
        _earlier.update(read)
        return read

    def said(self) -> str:
        """files_read as JSON text (sorted; at most SHOWN of them, and how many there are), for
        a row's files_read column; made again only when something was opened, listed or
        imported since it was last asked for."""
        if self.opened or len(sys.modules) != self.modules:
            read = self.files_read()
            shown = dict(sorted(read.items())[:SHOWN])
            if len(read) > SHOWN:
                shown["(in all)"] = f"{len(read)} files; the answer's record names each"
            self.text = json.dumps(shown, sort_keys=True)
        return self.text

    def _take(self) -> None:
        taken, entries = len(self.opened), set(sys.path)
        for path, mode, flags in self.opened[:taken]:
            if isinstance(path, int):  # an open file descriptor: not a file by name
                continue
            given = os.fsdecode(os.fspath(path))
            if mode != LISTED and given in entries:  # the import path probed (as a zip file)
                continue
            path = os.path.abspath(given)
            named = given if not os.path.isabs(given) else None
            if mode == LISTED:
                self._add(path.rstrip(os.sep) + os.sep, named and named.rstrip(os.sep) + os.sep)
            elif _writes(mode, flags):
                self.written.add(path)
                self.read.pop(named or path, None)
            elif path not in self.written:
                self._add(path, named)
        del self.opened[:taken]  # what the hook appended meanwhile stays
        self.modules = len(sys.modules)
        for path in self.elsewhere.files():
            if path not in self.read:
                self._add(path)

    def _add(self, path: str, named: str | None = None) -> None:
        if path.startswith(self.skip) or _PYCACHE in path or path in self.own:
            return  # most are (an import's bytecode): no need to resolve the path's links
        real = os.path.realpath(path) + (os.sep if path.endswith(os.sep) else "")
        if real.startswith(self.skip) or _PYCACHE in real or (named or real) in self.read:
            return
        with paused():  # the digest's own opens and listings
            found = digest(real)
        # "": no file (a pipe, a folder opened), nothing of which was read as data; None: one
        # that cannot be read now (the point's to have made unreadable: left out).
        if found:
            self.read[named or real] = found


_PYCACHE = f"{os.sep}__pycache__{os.sep}"


def _writes(mode, flags) -> bool:
    if isinstance(mode, str):
        return any(letter in mode for letter in "wax+")
    return isinstance(flags, int) and bool(
        flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND)
    )


class Elsewhere:
    """The files of the modules this process runs from elsewhere: not its snapshot's (their
    top-level name is one of `pinned`), not imported before it entered the snapshot (`before`:
    the harness's own, whose files `own` holds as they were imported), not Python's own or the
    installed packages'. Looked at again only when sys.modules has grown or shrunk since (a
    point's imports), each module once."""

    def __init__(self, pinned: frozenset[str] | None, before: frozenset[str]):
        self.pinned, self.before = pinned, before  # pinned None: no module is looked at
        self.known: dict[str, tuple[object, str | None]] = {}  # name -> (module, its file)
        self.size, self.found = -1, []
        modules = [sys.modules.get(name) for name in before]
        self.own = frozenset(getattr(m, "__file__", None) or "" for m in modules) - {""}

    def files(self) -> list[str]:
        if self.pinned is not None and len(sys.modules) != self.size:
            known, self.size = self.known, len(sys.modules)
            self.known = {}
            for name, module in list(sys.modules.items()):
                was = known.get(name)
                file = was[1] if was and was[0] is module else self._file(name, module)
                self.known[name] = (module, file)
            self.found = [file for _, file in self.known.values() if file is not None]
        return self.found

    def _file(self, name: str, module) -> str | None:
        spec = getattr(module, "__spec__", None)
        top = (getattr(spec, "name", None) or name).partition(".")[0]
        path = getattr(module, "__file__", None)  # one of a library's making may give a bare name
        if name in self.before or top in self.pinned or not isinstance(path, str):
            return None
        if not os.path.isabs(path):
            return None
        if path.endswith((".pyc", ".pyo")) and os.path.exists(path[:-1]):  # its source runs
            path = path[:-1]
        if path.startswith(_roots()):  # most are: no need to resolve its links
            return None
        real = os.path.realpath(path)
        return None if real.startswith(_roots()) or _PYCACHE in real else real


@per_command
@functools.lru_cache(maxsize=4)
def elsewhere(pinned: frozenset[str], before: frozenset[str]) -> Elsewhere:
    """The process's Elsewhere for a snapshot's `pinned` and `before` (one a command, mostly)."""
    return Elsewhere(pinned, before)


def digest(path: str) -> str | None:
    """The sha256 (16 hex digits) of a file's bytes, or of a folder's names (a path ending in a
    separator), made again only once its size, modification or change time, device or inode
    differ; ABSENT where there is none, "" for what is neither a regular file nor a folder,
    None for what cannot be read. A relative path is read relative to the working directory."""
    listing = path.endswith(os.sep)
    try:
        opened = os.open(path, os.O_RDONLY | os.O_NONBLOCK | (os.O_DIRECTORY * listing))
    except FileNotFoundError:
        return ABSENT
    except OSError:
        return None
    try:
        status = os.fstat(opened)
        if not (stat.S_ISDIR if listing else stat.S_ISREG)(status.st_mode):
            return ""
        stamp = (status.st_size, status.st_mtime_ns, status.st_ctime_ns, status.st_dev,
                 status.st_ino)  # fmt: skip
        key = os.path.abspath(path) + os.sep * listing
        known = _digests.get(key)
        if known is not None and known[0] == stamp:
            return known[1]
        if listing:
            found = hashlib.sha256("\n".join(sorted(os.listdir(opened))).encode()).hexdigest()
        else:
            with os.fdopen(os.dup(opened), "rb") as file:
                found = hashlib.file_digest(file, "sha256").hexdigest()
    except OSError:
        return None
    finally:
        os.close(opened)
    _digests[key] = (stamp, found[:16])
    return found[:16]


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """While the block runs, nothing this thread reads is recorded (the harness's own work
    inside a point: a row's provenance reads the installed packages' metadata); what other
    threads read still is."""
    thread = get_ident()
    if thread in _paused:
        yield
        return
    _paused.add(thread)
    try:
        yield
    finally:
        _paused.discard(thread)


@contextlib.contextmanager
def importing(skip: tuple[str, ...] = ()) -> Iterator[None]:
    """While the block runs (an experiment's modules imported), what this process reads but
    under the folders `skip` is kept, with the digests it had then, as read by every point this
    process runs from now on (a helper that reads its data as it is imported does so once a
    process; the modules' own files are each point's Elsewhere's)."""
    global _recording
    _hooked()
    recording = Recording(skip, Elsewhere(None, frozenset(sys.modules)))  # modules: a point's
    before, _recording = _recording, recording
    try:
        yield
    finally:
        _recording = before
        recording.keep()


def changed(files: dict) -> str | None:
    """The first of `files` (path -> digest, as a point recorded them) whose bytes (a folder's
    names) differ now, or that cannot be read; None where every one hashes as it did."""
    for path, recorded in files.items():
        if recorded is None or digest(path) != recorded:
            return path
    return None


@functools.cache
def installed() -> tuple[str, ...]:
    """Python's own folders and the installed packages' (each ending in a separator, as given
    and with its links resolved)."""
    paths = sysconfig.get_paths()
    return _folders({sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                     *(paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")),
                     *site.getsitepackages(), site.getusersitepackages()})  # fmt: skip


@functools.cache
def _roots() -> tuple[str, ...]:
    """The folders whose files a point's reads never name: Python's own and the installed
    packages', the system's and its time zones, and torch's compile caches."""
    return installed() + _folders({
        "/proc", "/sys", "/dev", *zoneinfo.TZPATH,
        os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        or os.path.join(tempfile.gettempdir(), f"torchinductor_{_user()}"),
        os.environ.get("TRITON_CACHE_DIR") or os.path.expanduser("~/.triton"),
    })  # fmt: skip


def _folders(given: set) -> tuple[str, ...]:
    both = {way(root) for root in given if root for way in (os.path.abspath, os.path.realpath)}
    return tuple(sorted(root.rstrip(os.sep) + os.sep for root in both if root != os.sep))


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid
        return "unknown"


class recorded:
    """While the block runs, what this process reads is recorded (a Recording, as `as`), but
    under the folders `skip`; `pinned` and `before` as Elsewhere's."""

    def __init__(self, skip: tuple[str, ...], pinned: frozenset[str], before: frozenset[str]):
        self.recording = Recording(skip, elsewhere(pinned, before))

    def __enter__(self) -> Recording:
        global _recording
        _hooked()
        self.before, _recording = _recording, self.recording
        return self.recording

    def __exit__(self, *exc) -> None:
        global _recording
        _recording = self.before
