"""How a process that runs a sweep's points runs only the code its sweep pinned
(harness.pinning.codestore): the snapshot's bundles checked whole first (every file hashed, no
file beside them, every folder and file this user's and written by no one else), then an
import hook that checks each module of a bundle as it is imported, against the hash the check
read, and compiles it from the bytes it checked (no bytecode of a snapshot is kept: a compiled
file is trusted no more than any other beside the source); the bundles' folders go first on the
import path, and a
package of theirs that this process imported before from elsewhere (the checkout that pinned
it) imports its next modules from the snapshot.

Standard library only, and run as a file of the harness that starts the process, never of the
snapshot (BOOT_ENV names it for the processes that one starts): the code that checks a snapshot
is never the code it checks.

    python HARNESS/pinning/boot.py STORE DIGEST [-u] -m MODULE [ARGS...]

runs MODULE as python -m would (a submitit job: -m submitit.core._submit FOLDER; a resume's
command line: -m harness ...). A warm worker runs this file through runpy.run_path with BOOT
set in its globals: (store, digest, "module:function", args), the function called with args.
A snapshot that is gone, does not hash to its digest or that others could have changed is one
line on stderr and exit code 3.
"""

import errno
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import runpy
import stat
import sys
from pathlib import Path

CONF_ENV = "HARNESS_CONF"  # the conf/ of the install that pinned it: a snapshot holds no YAML
BOOT_ENV = "HARNESS_BOOT"  # this file of the harness that started the first process: the checker
SCRIPT = os.path.abspath(__file__)
SHORT = 16  # hex digits of a digest
FAILED = 3  # the exit code of a process whose snapshot does not hash to its digest
_entered: list = []  # (package, its __path__ before) of the packages enter() sent to a snapshot


class Mismatch(Exception):
    """A snapshot gone, not the code its digest names, or open to others: one line."""


def file_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def bundle_digest(hashes: dict[str, str]) -> str:
    """A bundle's digest: over its files' relative paths (posix) and their bytes' hashes."""
    text = "".join(f"{path}\0{hashes[path]}\n" for path in sorted(hashes))
    return hashlib.sha256(text.encode()).hexdigest()[:SHORT]


def code_digest(bundles: list[str]) -> str:
    """A sweep's code digest: over its bundles' digests, in their order on the import path."""
    return hashlib.sha256("\n".join(bundles).encode()).hexdigest()[:SHORT]


def bundle_folder(store: Path, digest: str) -> Path:
    return Path(store) / f"bundle-{digest}"


def record_path(store: Path, digest: str) -> Path:
    return Path(store) / f"snapshot-{digest}.json"


def check_private(path: Path, what: str) -> os.stat_result:
    """`path`'s own status (never a link's target), once it is this user's and no one else may
    write it, as ssh takes a key: Mismatch (one line) otherwise."""
    return _private(os.lstat(path), path, what)


def _private(found: os.stat_result, path, what: str) -> os.stat_result:
    if stat.S_ISLNK(found.st_mode):
        raise Mismatch(f"{what} {path} is a symbolic link: the harness runs no code through one")
    if found.st_uid != os.geteuid():
        raise Mismatch(f"{what} {path} belongs to another user (uid {found.st_uid}): the harness "
                       "runs no code that others own")  # fmt: skip
    if found.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise Mismatch(
            f"{what} {path} can be written by others (mode {stat.S_IMODE(found.st_mode):04o}): "
            f"the harness runs no code that others can change (chmod go-w {path})"
        )
    return found


def bundle_hashes(folder: Path) -> dict[str, str]:
    """Every file below a bundle's folder, by relative path (posix), with its bytes' hash; each
    folder and file checked private (check_private), anything but a folder or a file refused."""
    hashes, top = {}, os.fspath(folder)
    check_private(top, "the code store's folder")  # each folder below: as its parent lists it
    for where, folders, names in os.walk(top, onerror=_raise):
        for name in folders:  # a link among them is listed here, and never walked into
            check_private(os.path.join(where, name), "the code store's folder")
        inside = os.path.relpath(where, top).replace(os.sep, "/")
        for name in names:
            path = os.path.join(where, name)
            hashes[name if inside == "." else f"{inside}/{name}"] = _private_hash(path)
    return hashes


def _private_hash(path: str) -> str:
    """A bundle's file's hash, read through no link and once it is checked private, as it is
    opened (one look: what is read is what was checked)."""
    try:
        opened = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise Mismatch(f"the code store's file {path} is a symbolic link: the harness runs "
                           "no code through one") from None  # fmt: skip
        raise
    with os.fdopen(opened, "rb") as file:
        found = _private(os.fstat(opened), path, "the code store's file")
        if not stat.S_ISREG(found.st_mode):
            raise Mismatch(f"{path} in the code store is no file: a snapshot holds files")
        return file_hash(file.read())


def _raise(error: OSError) -> None:
    raise error


def intact(folder: Path, digest: str) -> bool:
    """Whether a bundle's folder holds exactly the files its digest names; Mismatch where it is
    not private, an OSError where it cannot be read (never a reason to think it changed)."""
    return bundle_digest(bundle_hashes(folder)) == digest


class Pinned:
    """The snapshot a process runs: its folders in import order, the hash of every file of
    theirs by its real path, and the modules the process had imported before it entered it
    (the harness's own, which no point's reads count)."""

    def __init__(self, store: Path, digest: str, folders: list[Path], hashes: dict[str, str]):
        self.store, self.digest, self.folders, self.hashes = store, digest, folders, hashes
        self.before: frozenset[str] = frozenset()
        # The top-level modules and packages its bundles hold.
        self.tops = frozenset(entry.removesuffix(".py") for f in folders for entry in os.listdir(f))


def verified(store: Path, digest: str) -> Pinned:
    """The snapshot of code `digest`, once the store and every folder and file of its bundles
    are private (check_private) and each bundle hashes to its digest; Mismatch (one line)
    otherwise, an OSError where a file cannot be read."""
    if not _hex(digest):
        raise Mismatch(f"{digest!r} is no code digest ({SHORT} hexadecimal digits)")
    store = Path(os.path.abspath(store))
    record = record_path(store, digest)
    try:
        check_private(store, "the code store")
        check_private(record, "the code store's record")
        bundles = json.loads(record.read_text())["bundles"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise Mismatch(
            f"the sweep's code {digest} has no snapshot in the code store {store} "
            f"({type(error).__name__}: {error}): it was removed, or this machine does not see "
            "that folder (code_store= a folder every machine sees)"
        ) from None
    if (
        not isinstance(bundles, list)
        or not all(map(_hex, bundles))
        or code_digest(bundles) != digest
    ):
        raise Mismatch(f"the code store's record {record} does not name the bundles of {digest}")
    folders, hashes = [], {}
    for bundle in bundles:
        folder = bundle_folder(store, bundle)
        try:
            found = bundle_hashes(folder)
        except FileNotFoundError:
            found = None
        if found is None or bundle_digest(found) != bundle:
            raise Mismatch(
                f"the snapshot {folder} of the sweep's code {digest} was changed or is gone: "
                "its files no longer hash to it, so its points do not run (a new sweep pins "
                "the code as it is now)"
            )
        real = os.path.realpath(folder)
        hashes |= {os.path.join(real, rel): value for rel, value in found.items()}
        folders.append(folder)
    return Pinned(store, digest, folders, hashes)


def _hex(text) -> bool:
    return isinstance(text, str) and len(text) == SHORT and set(text) <= set("0123456789abcdef")


class PinnedFinder:
    """The import hook: a module found in a bundle's folder is loaded only as a file of the
    snapshot, checked against its hash when it is imported (PinnedLoader); a file there that
    the snapshot does not hold (bytecode, an extension module put beside a source) is refused.
    Every other module is found as the path finder finds it, once."""

    def __init__(self, pinned: Pinned):
        self.pinned = pinned
        self.roots = tuple(os.path.realpath(f) + os.sep for f in pinned.folders)
        self.real: dict[str, str] = {}  # a module's folder -> that folder, its links resolved

    def find_spec(self, name, path=None, target=None):
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or not spec.has_location or not spec.origin:
            return spec  # not found, or a namespace package (its modules are found one by one)
        folder, file = os.path.split(spec.origin)
        if folder not in self.real:  # once a folder: a bundle holds no link to resolve
            self.real[folder] = os.path.realpath(folder)
        origin = os.path.join(self.real[folder], file)
        if not origin.startswith(self.roots):
            return spec
        expected = self.pinned.hashes.get(origin)
        if expected is None:
            raise ImportError(f"{spec.origin} is not a file of the sweep's code "
                              f"{self.pinned.digest}: it is not run", name=name)  # fmt: skip
        if not origin.endswith(".py"):  # a file of the bundle's own (an extension module)
            _check(origin, expected, name)
            return spec
        loader = PinnedLoader(name, spec.origin, expected)
        locations = spec.submodule_search_locations
        return importlib.util.spec_from_file_location(
            name, spec.origin, loader=loader, submodule_search_locations=locations
        )

    def invalidate_caches(self) -> None:
        pass


class PinnedLoader(importlib.machinery.SourceFileLoader):
    """A bundle's module: its bytes read once, checked against the snapshot's hash, and
    compiled from them."""

    def __init__(self, name: str, path: str, expected: str):
        super().__init__(name, path)
        self.expected = expected

    def get_code(self, fullname):
        source = self.get_data(self.path)
        if file_hash(source) != self.expected:
            raise ImportError(_changed(self.path), name=fullname)
        return self.source_to_code(source, self.path)


def _check(path: str, expected: str, name: str) -> None:
    with open(path, "rb") as file:
        if file_hash(file.read()) != expected:
            raise ImportError(_changed(path), name=name)


def _changed(path: str) -> str:
    return (f"{path} no longer hashes as the sweep pinned it (changed since its snapshot was "
            "checked): it is not run")  # fmt: skip


def enter(store: Path, digest: str) -> None:
    """Check the snapshot, then import from it first, each of its modules checked as it is
    imported (PinnedFinder): here, where its folders go first on sys.path, a package of its
    bundles imported before from elsewhere imports its next modules from them; and in every
    process this one starts (PYTHONPATH; PYTHONSAFEPATH keeps a child's working directory off
    its path, where a checkout's harness would come first; PYTHONDONTWRITEBYTECODE keeps its
    bytecode out of the bundles). Their harness, a snapshot's, reads its configs from the
    conf/ of the install that entered it first (CONF_ENV) and starts its processes with this
    file (BOOT_ENV)."""
    pinned = verified(store, digest)
    pinned.before = frozenset(sys.modules)
    finder = PinnedFinder(pinned)
    leave()
    at = next((i for i, f in enumerate(sys.meta_path) if f is importlib.machinery.PathFinder),
              len(sys.meta_path))  # fmt: skip
    sys.meta_path.insert(at, finder)
    folders = [str(folder) for folder in pinned.folders]
    here = os.path.dirname(SCRIPT)
    sys.path[:] = folders + [p for p in sys.path if p not in folders and p != here]
    _send_packages(pinned)
    before = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(folders + [p for p in before if p not in folders])
    os.environ["PYTHONSAFEPATH"] = os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    os.environ.setdefault(BOOT_ENV, SCRIPT)
    conf = Path(here).parent / "conf"  # harness/conf: this file is harness/pinning/boot.py
    if conf.is_dir():  # this process's harness is the pinning install's, not a snapshot's
        os.environ[CONF_ENV] = str(conf.resolve())


def _send_packages(pinned: Pinned) -> None:
    """Each package of the snapshot's modules that this process imported before from elsewhere
    (the harness that pinned it) finds its next modules in the bundles' folders."""
    tops = pinned.tops
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__path__", None)
        if path is None or name.partition(".")[0] not in tops:
            continue
        rel = name.replace(".", os.sep)
        inside = [str(f / rel) for f in pinned.folders if (f / rel).is_dir()]
        if inside and list(path) != inside:
            _entered.append((module, path))
            module.__path__ = inside


def leave() -> None:
    """Undo enter() in this process: the import hook gone, the packages it sent to a snapshot
    back where they were (sys.path and the environment are the caller's to put back)."""
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != PinnedFinder.__name__]
    while _entered:
        module, path = _entered.pop()
        module.__path__ = path


def pinned_here():
    """The snapshot this process runs (its import hook's Pinned), or None."""
    for finder in sys.meta_path:
        if type(finder).__name__ == PinnedFinder.__name__:
            return finder.pinned
    return None


def _fail(error: BaseException) -> None:
    said = error if isinstance(error, Mismatch) else f"cannot read the snapshot: {error}"
    print(f"harness error: {said}", file=sys.stderr, flush=True)
    sys.exit(FAILED)


def main(argv: list[str]) -> None:
    store, digest, *rest = argv
    try:
        enter(Path(store), digest)
    except (Mismatch, OSError) as error:
        _fail(error)
    if rest[:1] == ["-u"]:
        rest = rest[1:]
        sys.stdout.reconfigure(write_through=True)
        sys.stderr.reconfigure(write_through=True)
    if rest[:1] != ["-m"] or len(rest) < 2:
        sys.exit(f"usage: python {__file__} STORE DIGEST [-u] -m MODULE [ARGS...]")
    sys.argv = [rest[1], *rest[2:]]
    runpy.run_module(rest[1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
elif __name__ == "__harness_boot__":  # a warm worker (harness.launchers.workers)
    _store, _digest, _target, _args = BOOT  # noqa: F821 (given by runpy.run_path)
    try:
        enter(Path(_store), _digest)
    except (Mismatch, OSError) as _error:
        _fail(_error)
    _module, _, _function = _target.partition(":")
    for _name in [n for n in sys.modules if n == "harness" or n.startswith("harness.")]:
        del sys.modules[_name]  # a module of the harness imported before: the snapshot's now
    getattr(__import__(_module, fromlist=[_function]), _function)(*_args)
