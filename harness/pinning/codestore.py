"""The code a sweep runs, pinned as content (its `code_digest`), kept in the code store.

At planning the harness collects the files its points import and read, in bundles, and hashes
them (harness.pinning.sources). Each bundle is kept once per digest in the code store, a folder
of this user's outside outputs/ (code_store=, default ~/.cache/octlm-harness/code), that no one
else may write: written whole under a hidden name, made read-only and renamed into place. Every
process that runs a point imports from that snapshot, checked by the harness that starts it,
file by file as it is imported (harness.pinning.boot), so that an edit made while a sweep
queues or runs changes none of its rows, and every row names the code that made it. (The
"store" alone is the Parquet store of rows, harness.store; here the code store is code_store.)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import socket
import stat
import sys
import time
from pathlib import Path

from harness import files
from harness.errors import BadInput, os_error
from harness.pinning import boot
from harness.pinning.sources import (
    INPUTS_CACHE,
    STAT_CACHE,
    Bundle,
    Code,
    StatCache,
    collect,
    hashed,
    project_files,
)

__all__ = [  # what the harness, the report and the tests use of the code store, by this module
    "INPUTS_CACHE", "RECENT_S", "STAT_CACHE", "RunFrom", "StatCache", "boot_command", "checker",
    "collect", "default_store", "enter", "harness_from", "pin", "private_store", "prune",
    "running", "running_digest", "runs_project", "store_of", "verify", "worker_target",
]  # fmt: skip

LOCK = "store.lock"  # held shared while a sweep pins its code, alone while prune removes any
RECENT_S = 3600  # a code pinned this recently is kept by prune (a sweep being planned now)


def default_store() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "octlm-harness" / "code"


def store_of(setting) -> Path:
    """The code store a config's code_store names (null: default_store), absolute."""
    return Path(os.path.expanduser(str(setting))).absolute() if setting else default_store()


def pin(node: dict, out: Path, code_store: Path, config_dirs=()) -> str:
    """The digest of the code a sweep of the experiment `node` imports and reads (collect), its
    bundles kept in the code store (each once per digest) with the record of its bundles; BadInput
    (one line) when the code store cannot be written, cannot be read, or is not private."""
    private_store(code_store)
    code = collect(node, out, code_store, config_dirs)
    try:
        with files.hold(Path(code_store) / LOCK, shared=True):
            return _keep(code, code_store)
    except OSError as error:
        raise BadInput(
            f"cannot keep the sweep's code in the code store {code_store} "
            f"({error.strerror or error}{': ' + str(error.filename) if error.filename else ''})"
            ": set code_store= to a folder you may write"
        ) from None


def _keep(code: Code, code_store: Path) -> str:
    """The code's bundles kept in the code store, each once per digest, and its record; what pins
    killed here left half-written, removed."""
    _remove_abandoned(code_store)
    for bundle in code.bundles:
        folder = boot.bundle_folder(code_store, bundle.digest)
        if folder.is_dir() and not _checked(boot.intact, folder, bundle.digest):
            _set_aside(folder)  # readable, private and not what its digest names: anew
        if not folder.is_dir():
            _write_bundle(bundle, folder)
    record = boot.record_path(code_store, code.digest)
    if not record.exists():
        files.write_json(record, {"bundles": [bundle.digest for bundle in code.bundles]})
    os.utime(record)  # pinned now: prune keeps it a while, for the sweep being planned
    return code.digest


def private_store(code_store: Path) -> None:
    """The code store, made (this user's alone) where it is missing; BadInput (one line) where
    another user owns it or others may write it (boot.check_private)."""
    try:
        Path(code_store).parent.mkdir(parents=True, exist_ok=True)
        Path(code_store).mkdir(mode=0o700, exist_ok=True)
    except OSError as error:
        raise BadInput(
            f"cannot keep the sweep's code in the code store {code_store} "
            f"({error.strerror or error}): set code_store= to a folder you may write"
        ) from None
    _checked(boot.check_private, Path(code_store), "the code store")


def _checked(look, *args):
    """look(*args), its Mismatch (one line) or read error as BadInput: a folder of the code store
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


def _remove_abandoned(code_store: Path) -> None:
    """The staging folders of pins that ended before they renamed theirs into place: of a
    process gone from this host and its pid namespace, or begun over RECENT_S ago. One that
    is gone meanwhile (renamed into place) is left to its pin."""
    host, now = _host(), time.time()
    for entry in os.scandir(code_store):
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


def enter(code_store: Path, digest: str) -> None:
    """This process imports from the snapshot of code `digest` from now on, each module checked
    as it is imported (harness.pinning.boot.enter); BadInput (one line) for a snapshot that is
    gone, does not hash to it, cannot be read or is not private."""
    _checked(boot.enter, code_store, digest)


def verify(code_store: Path, digest: str) -> boot.Pinned:
    """The snapshot of code `digest`, checked; BadInput (one line) where it is gone, does not
    hash to it, cannot be read or is not private."""
    return _checked(boot.verified, code_store, digest)


def running() -> tuple[Path, str] | None:
    """(code store, digest) of the code this process runs, where it entered a snapshot (its import
    hook: boot.pinned_here)."""
    pinned = boot.pinned_here()
    return (pinned.store, pinned.digest) if pinned else None


def running_digest() -> str | None:
    found = running()
    return found[1] if found else None


def runs_project(code_store: Path, digest: str) -> bool:
    """Whether this process's harness and experiments are the snapshot's: its project bundle
    (the last) hashes as the files they were imported from do."""
    try:
        bundles = json.loads(boot.record_path(code_store, digest).read_text())["bundles"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return bool(bundles) and hashed([project_files()], code_store).bundles[0].digest == bundles[-1]


class RunFrom(Exception):
    """This command must run again from the snapshot of code (code_store, digest) (a resume of a
    sweep whose harness is not this one, on a launcher that runs points in this process)."""

    def __init__(self, code_store: Path, digest: str):
        super().__init__(f"the sweep's code {digest} runs from its snapshot in {code_store}")
        self.code_store, self.digest = code_store, digest


def harness_from(code_store: Path, digest: str, arguments: list[str]) -> tuple[list[str], dict]:
    """The command line and environment that run `python -m harness ARGUMENTS` from the
    snapshot of code `digest` (checked first by this harness's boot), its harness reading this
    install's conf/ (boot.CONF_ENV: a snapshot holds no configs)."""
    from harness.names import CONF

    return ([*_boot(code_store, digest), "-m", "harness", *arguments],
            {**os.environ, boot.CONF_ENV: str(CONF)})  # fmt: skip


def boot_command(code_store: Path, digest: str) -> str:
    """The interpreter command a submitit job starts with (its `python`): this harness's boot,
    which checks the snapshot before anything of it runs. submitit appends -u -m ..."""
    import shlex

    return " ".join(shlex.quote(a) for a in _boot(code_store, digest))


def _boot(code_store: Path, digest: str) -> list[str]:
    """python HARNESS/pinning/boot.py STORE DIGEST"""
    return [sys.executable, checker(), str(code_store), digest]


def checker() -> str:
    """The boot.py that checks a snapshot before a process runs it: the one of the harness that
    entered the first snapshot in this process's line (boot.BOOT_ENV), else this harness's:
    never a snapshot's own."""
    return os.environ.get(boot.BOOT_ENV) or boot.SCRIPT


def worker_target(code_store: Path, digest: str, target: str, args: tuple) -> tuple:
    """A warm worker's Process target and arguments: this harness's boot through runpy, which
    checks the snapshot, enters it and then calls `target` ("module:function") with `args`."""
    import runpy

    init = {"BOOT": (str(code_store), digest, target, args)}
    return runpy.run_path, (checker(),), {"init_globals": init, "run_name": "__harness_boot__"}


def prune(code_store: Path, kept: set[str]) -> tuple[list[str], int]:
    """Remove from the code store every code but those in `kept` (the sweeps' a user keeps) and
    those pinned in the last RECENT_S (a sweep being planned now), every bundle that no code
    left names, the staging folders of pins that were killed, and all else in it but the stat
    cache and what was made in the last RECENT_S; the codes removed, and the bytes freed."""
    if not Path(code_store).is_dir():
        raise BadInput(f"there is no code store {code_store}: give code_store= the one to prune")
    _checked(boot.check_private, Path(code_store), "the code store")
    with files.hold(Path(code_store) / LOCK):  # no sweep pins its code meanwhile
        return _prune(code_store, kept)


def _prune(code_store: Path, kept: set[str]) -> tuple[list[str], int]:
    _remove_abandoned(code_store)
    now, named, removed = time.time(), set(), []
    for record in sorted(Path(code_store).glob("snapshot-*.json")):
        digest = record.stem.removeprefix("snapshot-")
        try:
            recent = now - record.stat().st_mtime < RECENT_S
            bundles = json.loads(record.read_text())["bundles"]
        except (OSError, ValueError, KeyError, TypeError):
            recent, bundles = False, []
        if digest in kept or recent:
            named |= {boot.bundle_folder(code_store, b).name for b in bundles if isinstance(b, str)}
            named.add(record.name)
        else:
            removed.append(digest)
    freed = 0
    for entry in os.scandir(code_store):
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
