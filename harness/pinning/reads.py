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
_modules: dict[str, str | None] = {}  # module name -> its file where it lies elsewhere, or None


def _hook(event: str, args: tuple) -> None:
    if event == "open" and _recording is not None:
        _recording.opened.append(args)


@functools.cache
def _hooked() -> None:
    sys.addaudithook(_hook)  # for the life of the process: a hook cannot be taken away


class Recording:
    """What one point read, as it runs: `opened`, the audit hook's (path, mode, flags) of each
    open; files_read() says it as files and digests, skipping `skip` (folders) too, and the
    modules of `pinned` (their top-level names: the snapshot's) or of `before` (names: those
    the process had imported before it ran a sweep's code)."""

    def __init__(self, skip: tuple[str, ...], pinned: frozenset[str], before: frozenset[str]):
        self.skip, self.pinned, self.before = _roots() + skip, pinned, before
        self.opened: list[tuple] = []
        self.read: dict[str, str | None] = {}  # path -> digest (None: it cannot be read now)
        self.written: set[str] = set()
        self.taken, self.modules, self.text = 0, -1, "{}"

    def files_read(self) -> dict[str, str | None]:
        """Each file read so far, by its absolute path, with its digest."""
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
                self._add(path)
        if len(sys.modules) != self.modules:
            self.modules = len(sys.modules)
            for name, module in list(sys.modules.items()):
                if name in self.before:
                    continue
                path = _module_file(name, module, self.pinned)
                if path is not None and path not in self.read:
                    self._add(path)

    def _add(self, path: str) -> None:
        real = os.path.realpath(path)
        if real.startswith(self.skip) or f"{os.sep}__pycache__{os.sep}" in real:
            return
        found = digest(real)
        # None: no file there (an open that failed, a probe for an optional file: nothing was
        # read; one read and removed since is gone with what the point made); "": not a file
        # (a folder, a pipe), nothing of which was read as data.
        if found:
            self.read[real] = found


def _writes(mode, flags) -> bool:
    if isinstance(mode, str):
        return any(letter in mode for letter in "wax+")
    return isinstance(flags, int) and bool(
        flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND)
    )


def _module_file(name: str, module, pinned: frozenset[str]) -> str | None:
    """The file a module runs from where that is not its snapshot's (its top-level name is
    pinned) nor Python's own (none, or built in); known once per name and process."""
    if name in _modules:
        return _modules[name]
    spec = getattr(module, "__spec__", None)
    top = (getattr(spec, "name", None) or name).partition(".")[0]
    path = getattr(module, "__file__", None)  # a module of its own making may give a bare name
    found = None if top in pinned or not isinstance(path, str) or not os.path.isabs(path) else path
    if found is not None and found.endswith((".pyc", ".pyo")):  # its source is what it runs
        source = found.removesuffix("c").removesuffix("o")
        found = source if os.path.exists(source) else found
    _modules[name] = found
    return found


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
    packages', the system's and its time zones, and torch's compile caches."""
    paths = sysconfig.get_paths()
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             *(paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")),
             *site.getsitepackages(), site.getusersitepackages(), "/proc", "/sys", "/dev",
             os.environ.get("TORCHINDUCTOR_CACHE_DIR")
             or os.path.join(tempfile.gettempdir(), f"torchinductor_{_user()}"),
             os.environ.get("TRITON_CACHE_DIR") or os.path.expanduser("~/.triton"),
             *zoneinfo.TZPATH}  # fmt: skip
    real = {os.path.realpath(root) for root in roots if root}
    return tuple(sorted(root.rstrip(os.sep) + os.sep for root in real if root != os.sep))


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid
        return "unknown"


class recorded:
    """While the block runs, what this process reads is recorded (a Recording, as `as`; its
    arguments as Recording's)."""

    def __init__(self, skip: tuple[str, ...], pinned: frozenset[str], before: frozenset[str]):
        self.recording = Recording(skip, pinned, before)

    def __enter__(self) -> Recording:
        global _recording
        _hooked()
        self.before, _recording = _recording, self.recording
        return self.recording

    def __exit__(self, *exc) -> None:
        global _recording
        _recording = self.before
