"""The code a sweep runs, pinned as content (its `code_digest`).

At planning the harness collects the files its points import and read, in bundles: the
project's (the harness and experiments packages, but the configs), and the experiment's own
(the top-level package of each module its config names: run, check, derive, report, every
folder of it where it is a namespace package; or, for a top-level module, the folder it lies
in): every file, data included, but caches, hidden files and folders, virtual environments, the
out folder and the config dirs. Each bundle's digest is over its files' relative paths and
bytes; the sweep's is over its bundles'. Each bundle is kept once per digest in the code store,
a folder of this user's outside outputs/ (code_store=, default ~/.cache/octlm-harness/code),
that no one else may write: written whole under a hidden name, made read-only and renamed into
place. Every process that runs a point imports from that snapshot, checked by the harness that
starts it, file by file as it is imported (harness.pinning.boot), so that an edit made while a
sweep queues or runs changes none of its rows, and every row names the code that made it.

Hashing a file is skipped while its path, size, modification and change times, device and
inode are those the stat cache (in the store) recorded with its hash: an edit that sets the
modification time back still changes the change time, which no user can set.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import re
import secrets
import shutil
import socket
import stat
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness import files, provenance
from harness.errors import BadInput, os_error
from harness.pinning import boot

PROJECT = ("harness", "octlm_experiments")  # the project's packages: every sweep's last bundle
NOT_CODE = ("harness/conf",)  # of the project: its configs, which the command reads, not a point
NAMED = ("run", "check", "derive", "report")  # the experiment's keys that name its modules
MAX_FILES, MAX_BYTES = 2000, 32 << 20  # a folder of more is no experiment's
SKIPPED = {"__pycache__", "node_modules", "site-packages", "outputs"}
STAT_CACHE = "stat-cache.json"
INPUTS_CACHE = "inputs-stat-cache.json"  # reuse's declared inputs' hashes (harness.reuse)
LOCK = "store.lock"  # held shared while a sweep pins its code, alone while prune removes any
MAX_CACHED = 50_000  # files the stat cache remembers
RECENT_S = 3600  # a code pinned this recently is kept by prune (a sweep being planned now)


def default_store() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "octlm-harness" / "code"


def store_of(setting) -> Path:
    """The code store a config's code_store names (null: default_store), absolute."""
    return Path(os.path.expanduser(str(setting))).absolute() if setting else default_store()


@dataclass
class Bundle:
    files: dict[str, Path]  # relative path -> the file it copies
    hashes: dict[str, str] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        return boot.bundle_digest(self.hashes)


@dataclass
class Code:
    """A sweep's code: its bundles in import order (the experiment's own first)."""

    bundles: list[Bundle]

    @property
    def digest(self) -> str:
        return boot.code_digest([bundle.digest for bundle in self.bundles])


def collect(node: dict, out: Path, store: Path, config_dirs=()) -> Code:
    """The files a sweep of the experiment `node` (its config's experiment block) imports and
    reads, hashed; BadInput (one line) for a folder too large to be an experiment's, or one
    that cannot be read (a link loop, a file gone)."""
    skip = {Path(folder).absolute().resolve() for folder in [out, *config_dirs]}
    own: dict[str, Path] = {}
    for top in _named_tops(node):
        if top not in PROJECT:
            own |= _top_level(top, skip)
    return _hashed([*([own] if own else []), _project()], store)


def _project() -> dict[str, Path]:
    """The project's files as this process imports them, but its configs. Its packages have
    names of their own (octlm_experiments, not experiments), so that a folder of the user's own
    on the path is never taken for them."""
    found: dict[str, Path] = {}
    for name in PROJECT:
        found |= _package(name)
    return {rel: path for rel, path in found.items() if not rel.startswith(NOT_CODE)}


def _hashed(bundles: list[dict[str, Path]], store: Path) -> Code:
    cache = StatCache(store)
    try:
        code = Code([Bundle(found, {rel: cache.hash(path) for rel, path in found.items()})
                     for found in bundles])  # fmt: skip
    except OSError as error:
        raise BadInput(f"cannot read {error.filename}: {error.strerror or error}") from None
    cache.save()
    return code


def _named_tops(node: dict) -> list[str]:
    """The top-level modules of the dotted names the experiment's config gives."""
    names = []
    for key in NAMED:
        given = node.get(key)
        for name in [given] if isinstance(given, str) else given or []:
            top = str(name).split(".")[0]
            if top and top not in names:
                names.append(top)
    return names


def _spec(name: str):
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


def _package(name: str, skip: set[Path] = frozenset()) -> dict[str, Path]:
    """A package's files, from every folder of it (a namespace package may span several: the
    first holds a path that two of them have, as it is the one imported)."""
    spec = _spec(name)
    if spec is None or not spec.submodule_search_locations:
        return {}
    found: dict[str, Path] = {}
    for folder in spec.submodule_search_locations:
        for rel, path in _sources(Path(folder), skip).items():
            found.setdefault(f"{name}/{rel}", path)
    return found


def _top_level(name: str, skip: set[Path]) -> dict[str, Path]:
    """A top-level package's files, or a top-level module's folder's (its neighbours are what
    it imports and reads); just the module where that folder is Python's own or site-packages."""
    spec = _spec(name)
    if spec is not None and spec.submodule_search_locations:  # a package, or a namespace one
        return _package(name, skip)
    if spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
        return {}  # not importable: planning says so when it loads the experiment
    origin = Path(spec.origin)
    if origin.suffix != ".py":
        return {}  # an extension module: not source
    if f"{origin.parent.resolve()}{os.sep}" in provenance.installed():
        return {origin.name: origin}
    return _sources(origin.parent, skip)


def _sources(folder: Path, skip: set[Path]) -> dict[str, Path]:
    """The files below `folder` by relative path: through links to folders, without hidden
    files and folders, caches, virtual environments, the harness's out folder and the config
    dirs (`skip`; a config dir's YAML also where `folder` lies in it, as an experiment's
    top-level module may, beside its configs). BadInput for a link loop, or for more files than
    an experiment has (naming the largest)."""
    found: dict[str, Path] = {}
    sizes: list[tuple[int, str]] = []
    total = 0
    for where, folders, names in os.walk(folder, followlinks=True, onerror=_unreadable):
        here = Path(where)
        real, above = here.resolve(), here.relative_to(folder).parents
        if any((folder / parent).resolve() == real for parent in above):
            raise BadInput(f"{here} leads back into a folder above it (a link loop): the "
                           "experiment's folder must be a tree")  # fmt: skip
        folders[:] = sorted(
            name for name in folders
            if not name.startswith(".") and name not in SKIPPED
            and not (here / name / "pyvenv.cfg").exists()
            and (here / name).resolve() not in skip
        )  # fmt: skip
        configs = any(real.is_relative_to(folder) for folder in skip)  # a config dir's: its YAML
        for name in sorted(names):
            if name.startswith(".") or (configs and name.endswith((".yaml", ".yml"))):
                continue
            path = here / name
            rel = path.relative_to(folder).as_posix()
            try:
                status = path.stat()
            except OSError as error:
                raise BadInput(f"cannot read {path}: {error.strerror or error}") from None
            if not stat.S_ISREG(status.st_mode):  # a pipe, a socket: no file to keep
                continue
            size = status.st_size
            found[rel] = path
            sizes.append((size, rel))
            total += size
            if len(found) > MAX_FILES or total > MAX_BYTES:
                largest = ", ".join(
                    f"{rel} ({size / 1024:,.0f} KiB)" for size, rel in sorted(sizes)[-3:][::-1]
                )
                raise BadInput(
                    f"{folder} holds more files than an experiment's folder should (over "
                    f"{MAX_FILES:,} files or {MAX_BYTES >> 20} MiB; largest: {largest}): put the "
                    "experiment in a package of its own, its large data outside it"
                )
    return found


def _unreadable(error: OSError) -> None:
    raise BadInput(f"cannot read {error.filename}: {error.strerror or error}")


class StatCache:
    """path -> (its stamp (files.stamp), sha256) of the files hashed before, kept in the code
    store: a file whose stamp is the one recorded is not read again."""

    def __init__(self, store: Path, name: str = STAT_CACHE):
        self.path, self.changed, self.used = Path(store) / name, False, set()
        try:
            self.known = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.known = {}
        if not isinstance(self.known, dict):
            self.known = {}

    def hash(self, path: Path) -> str:
        """The sha256 of a regular file's bytes (an OSError where it cannot be read)."""
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as file:
            stamp = [*files.stamp(os.fstat(file.fileno()))]
            known = self.known.get(str(path))
            self.used.add(str(path))
            if isinstance(known, list) and known[:-1] == stamp:
                return known[-1]
            digest = hashlib.file_digest(file, "sha256").hexdigest()
        self.known[str(path)] = [*stamp, digest]
        self.changed = True
        return digest

    def save(self) -> None:
        if not self.changed or not self.path.parent.is_dir():  # no store: none is made for it
            return
        if len(self.known) > MAX_CACHED:  # files hashed long ago, most of them gone: forgotten
            self.known = {path: self.known[path] for path in self.used}
        with contextlib.suppress(OSError):  # a cache: the next sweep hashes again
            files.write_text(self.path, json.dumps(self.known))


def pin(node: dict, out: Path, store: Path, config_dirs=()) -> str:
    """The digest of the code a sweep of the experiment `node` imports and reads (collect), its
    bundles kept in the store (each once per digest) with the record of its bundles; BadInput
    (one line) when the store cannot be written, cannot be read, or is not private."""
    private_store(store)
    code = collect(node, out, store, config_dirs)
    try:
        with files.hold(Path(store) / LOCK, shared=True):
            return _keep(code, store)
    except OSError as error:
        raise BadInput(
            f"cannot keep the sweep's code in the code store {store} ({error.strerror or error}"
            f"{': ' + str(error.filename) if error.filename else ''}): set code_store= to a "
            "folder you may write"
        ) from None


def _keep(code: Code, store: Path) -> str:
    """The code's bundles kept in the store, each once per digest, and its record; what pins
    killed here left half-written, removed."""
    _remove_abandoned(store)
    for bundle in code.bundles:
        folder = boot.bundle_folder(store, bundle.digest)
        if folder.is_dir() and not _checked(boot.intact, folder, bundle.digest):
            _set_aside(folder)  # readable, private and not what its digest names: anew
        if not folder.is_dir():
            _write_bundle(bundle, folder)
    record = boot.record_path(store, code.digest)
    if not record.exists():
        files.write_json(record, {"bundles": [bundle.digest for bundle in code.bundles]})
    os.utime(record)  # pinned now: prune keeps it a while, for the sweep being planned
    return code.digest


def private_store(store: Path) -> None:
    """The code store, made (this user's alone) where it is missing; BadInput (one line) where
    another user owns it or others may write it (boot.check_private)."""
    try:
        Path(store).parent.mkdir(parents=True, exist_ok=True)
        Path(store).mkdir(mode=0o700, exist_ok=True)
    except OSError as error:
        raise BadInput(
            f"cannot keep the sweep's code in the code store {store} ({error.strerror or error})"
            ": set code_store= to a folder you may write"
        ) from None
    _checked(boot.check_private, Path(store), "the code store")


def _checked(look, *args):
    """look(*args), its Mismatch (one line) or read error as BadInput: a folder of the store
    that cannot be read is never taken for one that changed."""
    try:
        return look(*args)
    except boot.Mismatch as error:
        raise BadInput(str(error)) from None
    except OSError as error:
        raise BadInput(f"cannot read the code store: {os_error(error)}") from None


def _set_aside(folder: Path) -> None:
    aside = folder.with_name(f".damaged-{folder.name}.{secrets.token_hex(4)}")
    with contextlib.suppress(FileNotFoundError):  # another sweep set it aside meanwhile
        os.rename(folder, aside)
    _remove(aside)


def _remove(folder: Path) -> None:
    """A bundle's folder removed, its read-only folders made writable first."""
    for where, _, _ in os.walk(folder):
        with contextlib.suppress(OSError):
            os.chmod(where, stat.S_IRWXU)
    shutil.rmtree(folder, ignore_errors=True)


READ_ONLY = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH
READ_ONLY_FOLDER = READ_ONLY | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH


# A bundle being written: .bundle-DIGEST.HOST.PID.TOKEN.tmp
STAGING = re.compile(r"\.bundle-[0-9a-f]+\.(?P<host>.+)\.(?P<pid>[0-9]+)\.[0-9a-f]+\.tmp")


def _remove_abandoned(store: Path) -> None:
    """The staging folders of pins that ended before they renamed theirs into place: of a
    process gone from this host and its pid namespace, or begun over RECENT_S ago. One that
    is gone meanwhile (renamed into place) is left to its pin."""
    host, now = _host(), time.time()
    for entry in os.scandir(store):
        found = STAGING.fullmatch(entry.name)
        if found is None or not entry.is_dir(follow_symlinks=False):
            continue
        gone = found["host"] == host and not _alive(int(found["pid"]))
        with contextlib.suppress(FileNotFoundError):
            if gone or now - entry.stat(follow_symlinks=False).st_mtime > RECENT_S:
                _remove(Path(entry.path))


def _host() -> str:
    """This host and its pid namespace (containers may share a name, not their pids)."""
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        namespace = 0
    return f"{socket.gethostname()}-{namespace}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        pass
    return True


def _write_bundle(bundle: Bundle, folder: Path) -> None:
    """The bundle's files, hashed as they are copied, under a hidden name made read-only (files
    and folders) and renamed into place; a file that changed since it was hashed makes the
    copy's digest differ: BadInput."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = folder.with_name(f".{folder.name}.{_host()}.{os.getpid()}.{secrets.token_hex(4)}"
                               ".tmp")  # fmt: skip
    try:
        copied = {}
        for rel, source in bundle.files.items():
            target = staging / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            data = source.read_bytes()
            target.write_bytes(data)
            os.chmod(target, READ_ONLY)
            copied[rel] = boot.file_hash(data)
        if boot.bundle_digest(copied) != bundle.digest:
            raise BadInput("the experiment's files changed while the sweep was planned: run it "
                           "again")  # fmt: skip
        for where, _, _ in sorted(os.walk(staging), reverse=True):  # the deepest first
            os.chmod(where, READ_ONLY_FOLDER)
        try:
            os.rename(staging, folder)
        except OSError:
            if not folder.is_dir():  # else another sweep kept the same bundle meanwhile
                raise
    finally:
        if staging.exists():
            _remove(staging)


def enter(store: Path, digest: str) -> None:
    """This process imports from the snapshot of code `digest` from now on, each module checked
    as it is imported (harness.pinning.boot.enter); BadInput (one line) for a snapshot that is
    gone, does not hash to it, cannot be read or is not private."""
    _checked(boot.enter, store, digest)


def verify(store: Path, digest: str) -> boot.Pinned:
    """The snapshot of code `digest`, checked; BadInput (one line) where it is gone, does not
    hash to it, cannot be read or is not private."""
    return _checked(boot.verified, store, digest)


def running() -> tuple[Path, str] | None:
    """(store, digest) of the code this process runs, where it entered a snapshot (its import
    hook: boot.pinned_here)."""
    pinned = boot.pinned_here()
    return (pinned.store, pinned.digest) if pinned else None


def running_digest() -> str | None:
    found = running()
    return found[1] if found else None


def runs_project(store: Path, digest: str) -> bool:
    """Whether this process's harness and experiments are the snapshot's: its project bundle
    (the last) hashes as the files they were imported from do."""
    try:
        bundles = json.loads(boot.record_path(store, digest).read_text())["bundles"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return bool(bundles) and _hashed([_project()], store).bundles[0].digest == bundles[-1]


class RunFrom(Exception):
    """This command must run again from the snapshot of code (store, digest) (a resume of a
    sweep whose harness is not this one, on a launcher that runs points in this process)."""

    def __init__(self, store: Path, digest: str):
        super().__init__(f"the sweep's code {digest} runs from its snapshot in {store}")
        self.store, self.digest = store, digest


def harness_from(store: Path, digest: str, arguments: list[str]) -> tuple[list[str], dict]:
    """The command line and environment that run `python -m harness ARGUMENTS` from the
    snapshot of code `digest` (checked first by this harness's boot), its harness reading this
    install's conf/ (boot.CONF_ENV: a snapshot holds no configs)."""
    from harness.names import CONF

    return ([*_boot(store, digest), "-m", "harness", *arguments],
            {**os.environ, boot.CONF_ENV: str(CONF)})  # fmt: skip


def boot_command(store: Path, digest: str) -> str:
    """The interpreter command a submitit job starts with (its `python`): this harness's boot,
    which checks the snapshot before anything of it runs. submitit appends -u -m ..."""
    import shlex

    return " ".join(shlex.quote(a) for a in _boot(store, digest))


def _boot(store: Path, digest: str) -> list[str]:
    """python HARNESS/pinning/boot.py STORE DIGEST"""
    return [sys.executable, checker(), str(store), digest]


def checker() -> str:
    """The boot.py that checks a snapshot before a process runs it: the one of the harness that
    entered the first snapshot in this process's line (boot.BOOT_ENV), else this harness's:
    never a snapshot's own."""
    return os.environ.get(boot.BOOT_ENV) or boot.SCRIPT


def worker_target(store: Path, digest: str, target: str, args: tuple) -> tuple:
    """A warm worker's Process target and arguments: this harness's boot through runpy, which
    checks the snapshot, enters it and then calls `target` ("module:function") with `args`."""
    import runpy

    init = {"BOOT": (str(store), digest, target, args)}
    return runpy.run_path, (checker(),), {"init_globals": init, "run_name": "__harness_boot__"}


def prune(store: Path, kept: set[str]) -> tuple[list[str], int]:
    """Remove from the store every code but those in `kept` (the sweeps' a user keeps) and those
    pinned in the last RECENT_S (a sweep being planned now), every bundle that no code left
    names, the staging folders of pins that were killed, and all else in it but the stat cache
    and what was made in the last RECENT_S; the codes removed, and the bytes freed."""
    if not Path(store).is_dir():
        raise BadInput(f"there is no code store {store}: give code_store= the one to prune")
    _checked(boot.check_private, Path(store), "the code store")
    with files.hold(Path(store) / LOCK):  # no sweep pins its code meanwhile
        return _prune(store, kept)


def _prune(store: Path, kept: set[str]) -> tuple[list[str], int]:
    _remove_abandoned(store)
    now, named, removed = time.time(), set(), []
    for record in sorted(Path(store).glob("snapshot-*.json")):
        digest = record.stem.removeprefix("snapshot-")
        try:
            recent = now - record.stat().st_mtime < RECENT_S
            bundles = json.loads(record.read_text())["bundles"]
        except (OSError, ValueError, KeyError, TypeError):
            recent, bundles = False, []
        if digest in kept or recent:
            named |= {boot.bundle_folder(store, b).name for b in bundles if isinstance(b, str)}
            named.add(record.name)
        else:
            removed.append(digest)
    freed = 0
    for entry in os.scandir(store):
        young = now - entry.stat(follow_symlinks=False).st_mtime < RECENT_S
        if entry.name in named or entry.name in (STAT_CACHE, INPUTS_CACHE, LOCK) or young:
            continue
        path = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            freed += sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
            _remove(path)
        else:
            freed += entry.stat(follow_symlinks=False).st_size
            path.unlink()
    return removed, freed
