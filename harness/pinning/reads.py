"""What a point read that its sweep did not pin, each file with the digest of its bytes: the files
it opened for reading (a data file a parameter names, a user's shapes.json) and the modules it
runs from elsewhere (a helper on PYTHONPATH), but its snapshot (the code store), the standard
library, the installed packages, the out folder, the system's /proc, /sys and /dev, its time
zones, torch's compile caches, and the files it wrote itself. Python's audit hook sees every
open made through Python (open, io.open_code: imports too, os.open), in every thread; the
modules are those in sys.modules whose files lie elsewhere, but the harness's own (imported
before the process entered the sweep's snapshot). A row names them (files_read) and reuse
copies an answer only while each still hashes as it did (harness.pinning.reuse).

Not seen: what a library opens in C without Python's open (pyarrow's readers, say) and what a
process the point starts reads.
"""

import contextlib
import functools
import getpass
import hashlib
import json
import os
import site
import stat
import sys
import sysconfig
import tempfile
import zoneinfo
from collections.abc import Iterator

_recording = None  # the Recording of the point that runs in this process now, if any
_digests: dict[str, tuple[tuple, str]] = {}  # path -> (its stat stamp, its digest)


def _hook(event: str, args: tuple) -> None:
    if event == "open" and _recording is not None:
        _recording.opened.append(args)


@functools.cache
def _hooked() -> None:
    sys.addaudithook(_hook)  # for the life of the process: a hook cannot be taken away


class Recording:
    """What one point read, as it runs: `opened`, the audit hook's (path, mode, flags) of each
    open; files_read() says it as files and digests, skipping `skip` (folders) too, with the
    files of the modules it runs from elsewhere (Elsewhere)."""

    def __init__(self, skip: tuple[str, ...], elsewhere: "Elsewhere"):
        self.skip, self.elsewhere = _roots() + skip, elsewhere
        self.opened: list[tuple] = []
        self.read: dict[str, str] = {}  # path -> digest
        self.written: set[str] = set()
        self.taken, self.modules, self.text = 0, -1, "{}"

    def files_read(self) -> dict[str, str]:
        """Each file read so far, by its real path, with its digest."""
        self._take()
        return dict(self.read)

    def said(self) -> str:
        """files_read as JSON text (sorted), for a row's files_read column; made again only
        when something was opened or imported since it was last asked for."""
        if len(self.opened) != self.taken or len(sys.modules) != self.modules:
            self.text = json.dumps(self.files_read(), sort_keys=True)
        return self.text

    def _take(self) -> None:
        opened, self.taken = self.opened[self.taken :], len(self.opened)
        for path, mode, flags in opened:
            if isinstance(path, int):  # an open file descriptor: not a file by name
                continue
            path = os.path.abspath(os.fsdecode(os.fspath(path)))
            if _writes(mode, flags):
                self.written.add(path)
                self.read.pop(path, None)
            elif path not in self.read and path not in self.written:
                if path.startswith(self.skip) or _PYCACHE in path:
                    continue  # most are (an import's bytecode): no need to resolve its links
                real = os.path.realpath(path)
                if not real.startswith(self.skip) and _PYCACHE not in real:
                    self._add(real)
        self.modules = len(sys.modules)
        for path in self.elsewhere.files():
            if path not in self.read:
                self._add(path)

    def _add(self, path: str) -> None:
        found = digest(path)
        # None: no file there (an open that failed, a probe for an optional file: nothing was
        # read; one read and removed since is gone with what the point made); "": not a file
        # (a folder, a pipe), nothing of which was read as data.
        if found:
            self.read[path] = found


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
    the harness's own), not Python's own or the installed packages'. Looked at again only
    when sys.modules has grown or shrunk since (a point's imports), each module once."""

    def __init__(self, pinned: frozenset[str], before: frozenset[str]):
        self.pinned, self.before = pinned, before
        self.known: dict[str, tuple[object, str | None]] = {}  # name -> (module, its file)
        self.size, self.found = -1, []

    def files(self) -> list[str]:
        if len(sys.modules) != self.size:
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


@functools.lru_cache(maxsize=4)
def elsewhere(pinned: frozenset[str], before: frozenset[str]) -> Elsewhere:
    """The process's Elsewhere for a snapshot's `pinned` and `before` (one a command, mostly)."""
    return Elsewhere(pinned, before)


def digest(path: str) -> str | None:
    """The sha256 (16 hex digits) of a file's bytes, made again only once its size,
    modification or change time, device or inode differ; "" for what is not a regular file,
    None for one that cannot be read."""
    try:
        with open(path, "rb", buffering=0) as file:
            status = os.fstat(file.fileno())
            if not stat.S_ISREG(status.st_mode):
                return ""
            stamp = (status.st_size, status.st_mtime_ns, status.st_ctime_ns, status.st_dev,
                     status.st_ino)  # fmt: skip
            known = _digests.get(path)
            if known is not None and known[0] == stamp:
                return known[1]
            found = hashlib.sha256(file.read()).hexdigest()[:16]
    except OSError:
        return None
    _digests[path] = (stamp, found)
    return found


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """While the block runs, nothing is recorded (the harness's own work inside a point: a
    row's provenance reads the installed packages' metadata)."""
    global _recording
    before, _recording = _recording, None
    try:
        yield
    finally:
        _recording = before


def changed(files: dict) -> str | None:
    """The first of `files` (path -> digest, as a point recorded them) whose bytes differ now,
    or that cannot be read; None where every one hashes as it did."""
    for path, recorded in files.items():
        if recorded is None or digest(path) != recorded:
            return path
    return None


@functools.cache
def _roots() -> tuple[str, ...]:
    """The folders whose files a point's reads never name: Python's own and the installed
    packages', the system's and its time zones, and torch's compile caches; each as given and
    with its links resolved."""
    paths = sysconfig.get_paths()
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             *(paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")),
             *site.getsitepackages(), site.getusersitepackages(), "/proc", "/sys", "/dev",
             os.environ.get("TORCHINDUCTOR_CACHE_DIR")
             or os.path.join(tempfile.gettempdir(), f"torchinductor_{_user()}"),
             os.environ.get("TRITON_CACHE_DIR") or os.path.expanduser("~/.triton"),
             *zoneinfo.TZPATH}  # fmt: skip
    both = {way(root) for root in roots if root for way in (os.path.abspath, os.path.realpath)}
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
