"""The files a sweep's points import and read, collected and hashed at planning: the bundles
whose digests make a sweep's `code_digest` (harness.pinning.codestore keeps them).

The bundles are the project's (the harness and experiments packages, but the configs), and the
experiment's own (the top-level package of each module its config names: run, check, derive,
report, every folder of it where it is a namespace package; or, for a top-level module, the
folder it lies in): every file, data included, but caches, hidden files and folders, virtual
environments, the out folder and the config dirs. Each bundle's digest is over its files'
relative paths and bytes; the sweep's is over its bundles'.

Hashing a file is skipped while its path, size, modification and change times, device and
inode are those the stat cache (in the code store) recorded with its hash: an edit that sets
the modification time back still changes the change time, which no user can set.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from harness import files, provenance
from harness.errors import BadInput
from harness.pinning import boot

PROJECT = ("harness", "octlm_experiments")  # the project's packages: every sweep's last bundle
NOT_CODE = ("harness/conf",)  # of the project: its configs, which the command reads, not a point
NAMED = ("run", "check", "derive", "report")  # the experiment's keys that name its modules
MAX_FILES, MAX_BYTES = 2000, 32 << 20  # a folder of more is no experiment's
SKIPPED = {"__pycache__", "node_modules", "site-packages", "outputs"}
STAT_CACHE = "stat-cache.json"
INPUTS_CACHE = "inputs-stat-cache.json"  # reuse's declared inputs' hashes (harness.reuse)
MAX_CACHED = 50_000  # files the stat cache remembers


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


def collect(node: dict, out: Path, code_store: Path, config_dirs=()) -> Code:
    """The files a sweep of the experiment `node` (its config's experiment block) imports and
    reads, hashed; BadInput (one line) for a folder too large to be an experiment's, or one
    that cannot be read (a link loop, a file gone)."""
    skip = {Path(folder).absolute().resolve() for folder in [out, *config_dirs]}
    own: dict[str, Path] = {}
    for top in _named_tops(node):
        if top not in PROJECT:
            own |= _top_level(top, skip)
    return hashed([*([own] if own else []), project_files()], code_store)


def code_folder(node: dict) -> Path | None:
    """The folder of the experiment's `run` module's code, its links resolved: its top-level
    package's (a namespace package's first folder), or a top-level module's own folder; None
    where it cannot be found."""
    found = _run_path(node)
    return found if found is None or found.is_dir() else found.parent


def import_root(node: dict) -> Path | None:
    """The folder the import path finds the experiment's `run` module's top-level package or
    module in, its links resolved; None where it cannot be found."""
    found = _run_path(node)
    return found.parent if found else None


def _run_path(node: dict) -> Path | None:
    """The folder of the `run` module's top-level package (a namespace package's first), or
    the top-level module's file, links resolved; None where it cannot be found."""
    spec = _spec(str(node.get("run") or "").split(".")[0])
    if spec is not None and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0]).resolve()
    if spec is not None and spec.origin and spec.has_location:
        return Path(spec.origin).resolve()
    return None


def project_files() -> dict[str, Path]:
    """The project's files as this process imports them, but its configs. Its packages have
    names of their own (octlm_experiments, not experiments), so that a folder of the user's own
    on the path is never taken for them."""
    found: dict[str, Path] = {}
    for name in PROJECT:
        found |= _package(name)
    return {rel: path for rel, path in found.items() if not rel.startswith(NOT_CODE)}


def hashed(bundles: list[dict[str, Path]], code_store: Path) -> Code:
    """The bundles' files hashed (through the code store's stat cache), as a Code; BadInput
    (one line) for a file that cannot be read."""
    cache = StatCache(code_store)
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

    def __init__(self, code_store: Path, name: str = STAT_CACHE):
        self.path, self.changed, self.used = Path(code_store) / name, False, set()
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
        if not self.changed or not self.path.parent.is_dir():  # no code store: none is made for it
            return
        if len(self.known) > MAX_CACHED:  # files hashed long ago, most of them gone: forgotten
            self.known = {path: self.known[path] for path in self.used}
        with contextlib.suppress(OSError):  # a cache: the next sweep hashes again
            files.write_text(self.path, json.dumps(self.known))
