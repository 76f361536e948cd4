"""The code a sweep runs, pinned as content (its `code_digest`).

At planning the harness collects the Python source its points import, in parts: the project's
(the harness and experiments packages), and the experiment's own (the top-level package of each
module its config names: run, check, derive, report; or, for a top-level module, the folder it
lies in). Each part's digest is over its files' relative paths and bytes; the sweep's is over
its parts'. Each part is kept once per digest in the code store, a per-user folder outside
outputs/ (code_store=, default ~/.cache/octlm-harness/code beside the report's key), written
whole under a hidden name and renamed into place, its files read-only. Every process that runs
a point starts from that snapshot (harness.pinning.boot hashes it first), so that an edit made while
a sweep queues or runs changes none of its rows, and every row names the code that made it.

Hashing a file is skipped while its path, size, modification time and inode are those the
stat cache (beside the parts) recorded with its hash.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.util
import json
import os
import secrets
import shutil
import stat
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from harness import files
from harness.errors import BadInput, one_line
from harness.pinning import boot

PROJECT = ("harness", "experiments")  # the project's packages: every sweep's first part
NAMED = ("run", "check", "derive", "report")  # the experiment's keys that name its modules
MAX_FILES, MAX_BYTES = 2000, 32 << 20  # a folder of more source is no experiment's
SKIPPED = {"__pycache__", "node_modules", "site-packages", "outputs"}
STAT_CACHE = "stat-cache.json"
MAX_CACHED = 50_000  # files the stat cache remembers


def default_store() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "octlm-harness" / "code"


def store_of(setting) -> Path:
    """The code store a config's code_store names (null: default_store), absolute."""
    return Path(os.path.expanduser(str(setting))).absolute() if setting else default_store()


@dataclass
class Part:
    files: dict[str, Path]  # relative path -> the file it copies
    hashes: dict[str, str] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        return boot.part_digest(self.hashes)


@dataclass
class Code:
    """A sweep's source: its parts in import order (the experiment's own first)."""

    parts: list[Part]

    @property
    def digest(self) -> str:
        return boot.code_digest([part.digest for part in self.parts])


def collect(node: dict, out: Path, store: Path) -> Code:
    """The source a sweep of the experiment `node` (its config's experiment block) imports,
    hashed; BadInput (one line) for a folder too large to be an experiment's, or one that
    cannot be read (a link loop, a file gone)."""
    skip = {Path(out).absolute().resolve()}
    own: dict[str, Path] = {}
    for top in _named_tops(node):
        if top not in PROJECT:
            own |= _top_level(top, skip)
    return _hashed([*([own] if own else []), _project()], store)


def _project() -> dict[str, Path]:
    """The project's source as this process imports it."""
    found: dict[str, Path] = {}
    for name in PROJECT:
        found |= _package(name)
    return found


def _hashed(parts: list[dict[str, Path]], store: Path) -> Code:
    cache = _StatCache(store)
    code = Code([Part(found, {rel: cache.hash(path) for rel, path in found.items()})
                 for found in parts])  # fmt: skip
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
    spec = _spec(name)
    if spec is None or not spec.submodule_search_locations:
        return {}
    folder = Path(list(spec.submodule_search_locations)[0])
    return {f"{name}/{rel}": path for rel, path in _sources(folder, skip).items()}


def _top_level(name: str, skip: set[Path]) -> dict[str, Path]:
    """A top-level package's source, or a top-level module's folder's (its neighbours are what
    it imports); just the module where that folder is Python's own or site-packages."""
    spec = _spec(name)
    if spec is not None and spec.submodule_search_locations:  # a package, or a namespace one
        return _package(name, skip)
    if spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
        return {}  # not importable: planning says so when it loads the experiment
    origin = Path(spec.origin)
    if origin.suffix != ".py":
        return {}  # an extension module: not source
    paths = sysconfig.get_paths()
    installed = {Path(paths[key]).resolve() for key in ("stdlib", "purelib", "platlib")}
    if origin.parent.resolve() in installed:
        return {origin.name: origin}
    return _sources(origin.parent, skip)


def _sources(folder: Path, skip: set[Path]) -> dict[str, Path]:
    """The .py files below `folder` by relative path: through links to folders, without
    hidden folders, caches, virtual environments or the harness's out folder. BadInput for a
    link loop, or for more source than an experiment has (naming the largest files)."""
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
        for name in sorted(names):
            if not name.endswith(".py"):
                continue
            path = here / name
            rel = path.relative_to(folder).as_posix()
            try:
                size = path.stat().st_size
            except OSError as error:
                raise BadInput(f"cannot read {path}: {error.strerror or error}") from None
            found[rel] = path
            sizes.append((size, rel))
            total += size
            if len(found) > MAX_FILES or total > MAX_BYTES:
                largest = ", ".join(
                    f"{rel} ({size / 1024:,.0f} KiB)" for size, rel in sorted(sizes)[-3:][::-1]
                )
                raise BadInput(
                    f"{folder} holds more Python source than an experiment's folder should (over "
                    f"{MAX_FILES:,} files or {MAX_BYTES >> 20} MiB; largest: {largest}): put the "
                    "experiment in a package of its own"
                )
    return found


def _unreadable(error: OSError) -> None:
    raise BadInput(f"cannot read {error.filename}: {error.strerror or error}")


class _StatCache:
    """path -> (size, mtime_ns, inode, sha256) of the files hashed before, kept in the store."""

    def __init__(self, store: Path):
        self.path, self.changed, self.used = Path(store) / STAT_CACHE, False, set()
        try:
            self.known = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.known = {}
        if not isinstance(self.known, dict):
            self.known = {}

    def hash(self, path: Path) -> str:
        try:
            with open(path, "rb") as file:
                status = os.fstat(file.fileno())
                stamp = [status.st_size, status.st_mtime_ns, status.st_ino]
                known = self.known.get(str(path))
                self.used.add(str(path))
                if isinstance(known, list) and known[:3] == stamp and len(known) == 4:
                    return known[3]
                digest = boot.file_hash(file.read())
        except OSError as error:
            raise BadInput(f"cannot read {path}: {error.strerror or error}") from None
        self.known[str(path)] = [*stamp, digest]
        self.changed = True
        return digest

    def save(self) -> None:
        if not self.changed:
            return
        if len(self.known) > MAX_CACHED:  # files hashed long ago, most of them gone: forgotten
            self.known = {path: self.known[path] for path in self.used}
        with contextlib.suppress(OSError):  # a cache: the next sweep hashes again
            files.write_text(self.path, json.dumps(self.known))


def pin(node: dict, out: Path, store: Path) -> str:
    """The digest of the code a sweep of the experiment `node` imports (collect), its parts
    kept in the store (each once per digest) with the record of its parts; BadInput (one line)
    when the store cannot be written."""
    code = collect(node, out, store)
    try:
        for part in code.parts:
            folder = boot.part_folder(store, part.digest)
            if folder.is_dir() and not boot.intact(folder, part.digest):
                _set_aside(folder)  # edited or half removed: kept anew from the tree
            if not folder.is_dir():
                _write_part(part, folder)
        record = boot.record_path(store, code.digest)
        if not record.exists():
            files.write_json(record, {"parts": [part.digest for part in code.parts]})
    except OSError as error:
        raise BadInput(
            f"cannot keep the sweep's code in the code store {store} ({error.strerror or error}"
            f"{': ' + str(error.filename) if error.filename else ''}): set code_store= to a "
            "folder you may write"
        ) from None
    return code.digest


def _set_aside(folder: Path) -> None:
    aside = folder.with_name(f".damaged-{folder.name}.{secrets.token_hex(4)}")
    with contextlib.suppress(FileNotFoundError):  # another sweep set it aside meanwhile
        os.rename(folder, aside)
    shutil.rmtree(aside, ignore_errors=True)


def _write_part(part: Part, folder: Path) -> None:
    """The part's files, hashed as they are copied, under a hidden name renamed into place;
    a file that changed since it was hashed makes the copy's digest differ: BadInput."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = folder.with_name(f".{folder.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        copied = {}
        for rel, source in part.files.items():
            target = staging / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            data = source.read_bytes()
            target.write_bytes(data)
            os.chmod(target, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
            copied[rel] = boot.file_hash(data)
        if boot.part_digest(copied) != part.digest:
            raise BadInput("the experiment's files changed while the sweep was planned: run it "
                           "again")  # fmt: skip
        try:
            os.rename(staging, folder)
        except OSError:
            if not folder.is_dir():  # else another sweep kept the same part meanwhile
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def enter(store: Path, digest: str) -> None:
    """This process imports from the snapshot of code `digest` from now on
    (harness.pinning.boot.enter); BadInput (one line) for a snapshot that is gone or does not hash
    to it."""
    with _mismatch_in_one_line():
        boot.enter(store, digest)


def verify(store: Path, digest: str) -> None:
    """BadInput (one line) where the snapshot of code `digest` is gone or does not hash to it."""
    with _mismatch_in_one_line():
        boot.verified(store, digest)


@contextlib.contextmanager
def _mismatch_in_one_line():
    try:
        yield
    except boot.Mismatch as error:
        raise BadInput(str(error)) from None


def running() -> tuple[Path, str] | None:
    """(store, digest) of the code this process runs, where it started from a snapshot."""
    given = os.environ.get(boot.ENV)
    if not given:
        return None
    store, _, digest = given.rpartition(":")
    return Path(store), digest


def running_digest() -> str | None:
    found = running()
    return found[1] if found else None


def runs_project(store: Path, digest: str) -> bool:
    """Whether this process's harness and experiments are the snapshot's: its project part
    (the last) hashes as the files they were imported from do."""
    try:
        parts = json.loads(boot.record_path(store, digest).read_text())["parts"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return bool(parts) and _hashed([_project()], store).parts[0].digest == parts[-1]


class RunFrom(Exception):
    """This command must run again from the snapshot of code (store, digest) (a resume of a
    sweep whose harness is not this one, on a launcher that runs points in this process)."""

    def __init__(self, store: Path, digest: str):
        super().__init__(f"the sweep's code {digest} runs from its snapshot in {store}")
        self.store, self.digest = store, digest


def harness_from(store: Path, digest: str, arguments: list[str]) -> tuple[list[str], dict]:
    """The command line and environment that run `python -m harness ARGUMENTS` from the
    snapshot of code `digest` (its boot hashes it first), its harness reading this install's
    conf/ (boot.CONF_ENV: a snapshot holds no configs)."""
    from harness.names import CONF

    return ([*_boot(store, digest), "-m", "harness", *arguments],
            {**os.environ, boot.CONF_ENV: str(CONF)})  # fmt: skip


def boot_command(store: Path, digest: str) -> str:
    """The interpreter command a submitit job starts with (its `python`): the snapshot's boot,
    which hashes the snapshot before anything of it runs. submitit appends -u -m ..."""
    import shlex

    return " ".join(shlex.quote(a) for a in _boot(store, digest))


def _boot(store: Path, digest: str) -> list[str]:
    """python SNAPSHOT/harness/pinning/boot.py STORE DIGEST"""
    return [sys.executable, str(_boot_script(store, digest)), str(store), digest]


def _boot_script(store: Path, digest: str) -> Path:
    """The snapshot's harness/pinning/boot.py (in its project part, the last)."""
    parts = json.loads(boot.record_path(store, digest).read_text())["parts"]
    return boot.part_folder(store, parts[-1]) / "harness" / "pinning" / "boot.py"


def worker_target(store: Path, digest: str, target: str, args: tuple) -> tuple:
    """A warm worker's Process target and arguments: the snapshot's boot through runpy, which
    hashes the snapshot and then calls `target` ("module:function") with `args`."""
    import runpy

    script = str(_boot_script(store, digest))
    init = {"BOOT": (str(store), digest, target, args)}
    return runpy.run_path, (script,), {"init_globals": init, "run_name": "__harness_boot__"}


def listing(store: Path, digest: str) -> dict[str, Path]:
    """The files of the snapshot of `digest` by relative path (the experiment's own first);
    BadInput when the store has no such snapshot."""
    found: dict[str, Path] = {}
    for folder in _folders(store, digest):
        for rel, path in boot.source_files(folder).items():
            found.setdefault(rel, path)
    return found


def _folders(store: Path, digest: str) -> list[Path]:
    try:
        return boot.verified(store, digest)
    except boot.Mismatch as error:
        raise BadInput(one_line(error)) from None


def diff(store: Path, old: str, new: str, names: tuple[str, str]) -> tuple[list[str], str]:
    """The files that differ between two snapshots, and their unified diff."""
    before, after = listing(store, old), listing(store, new)
    changed, lines = [], []
    for rel in sorted(set(before) | set(after)):
        a = before[rel].read_text(errors="replace").splitlines(True) if rel in before else []
        b = after[rel].read_text(errors="replace").splitlines(True) if rel in after else []
        if a == b:
            continue
        changed.append(rel)
        lines += difflib.unified_diff(a, b, f"{names[0]}/{rel}", f"{names[1]}/{rel}")
    return changed, "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def differing(store: Path, old: str, new: str) -> int | None:
    """How many files differ between two snapshots; None where either is not in the store."""
    try:
        before, after = listing(store, old), listing(store, new)
    except BadInput:
        return None
    old_hashes, new_hashes = ({rel: boot.file_hash(p.read_bytes()) for rel, p in found.items()}
                              for found in (before, after))  # fmt: skip
    return sum(old_hashes.get(rel) != new_hashes.get(rel) for rel in {*old_hashes, *new_hashes})
