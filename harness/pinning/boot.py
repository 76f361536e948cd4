"""How a process that runs a sweep's points starts on the code its sweep pinned
(harness.pinning.codestore): the snapshot's files hashed first, then the snapshot's folders put
before everything else on the import path, then the harness imported from there. Standard library
only, and run as a file of the snapshot (never imported from a checkout first): nothing of the
snapshot runs before its files are known to hash to the sweep's code digest.

    python SNAPSHOT/harness/pinning/boot.py STORE DIGEST [-u] -m MODULE [ARGS...]

runs MODULE as python -m would (a submitit job: -m submitit.core._submit FOLDER; a resume's
command line: -m harness ...). A warm worker runs this file through runpy.run_path with BOOT
set in its globals: (store, digest, "module:function", args), the function called with args.
A snapshot that does not hash to its digest, or is gone, is one line on stderr and exit code 3.
"""

import hashlib
import json
import os
import runpy
import sys
from pathlib import Path

ENV = "HARNESS_CODE"  # "STORE:DIGEST" of the code this process runs (codestore.running)
CONF_ENV = "HARNESS_CONF"  # the conf/ of the install that pinned it: a snapshot holds no YAML
SHORT = 16  # hex digits of a digest
FAILED = 3  # the exit code of a process whose snapshot does not hash to its digest


class Mismatch(Exception):
    """A snapshot gone, or not the code its digest names: one line."""


def file_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def part_digest(hashes: dict[str, str]) -> str:
    """A part's digest: over its files' relative paths (posix) and their bytes' hashes."""
    text = "".join(f"{path}\0{hashes[path]}\n" for path in sorted(hashes))
    return hashlib.sha256(text.encode()).hexdigest()[:SHORT]


def code_digest(parts: list[str]) -> str:
    """A sweep's code digest: over its parts' digests, in their order on the import path."""
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:SHORT]


def part_folder(store: Path, digest: str) -> Path:
    return Path(store) / f"part-{digest}"


def record_path(store: Path, digest: str) -> Path:
    return Path(store) / f"code-{digest}.json"


def source_files(folder: Path) -> dict[str, Path]:
    """A snapshot part's Python files by relative path (its __pycache__ is Python's, not its)."""
    found = {}
    for where, folders, names in os.walk(folder):
        folders[:] = [name for name in folders if name != "__pycache__"]
        for name in names:
            if name.endswith(".py"):
                path = Path(where) / name
                found[path.relative_to(folder).as_posix()] = path
    return found


def verified(store: Path, digest: str) -> list[Path]:
    """The folders of the snapshot of code `digest`, in import order, once every file of each
    hashes to it; Mismatch (one line) otherwise."""
    if not _hex(digest):
        raise Mismatch(f"{digest!r} is no code digest ({SHORT} hexadecimal digits)")
    record = record_path(store, digest)
    try:
        parts = json.loads(record.read_text())["parts"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise Mismatch(
            f"the sweep's code {digest} has no snapshot in the code store {store} "
            f"({type(error).__name__}: {error}): it was removed, or this machine does not see "
            "that folder (code_store= a folder every machine sees)"
        ) from None
    if not isinstance(parts, list) or not all(map(_hex, parts)) or code_digest(parts) != digest:
        raise Mismatch(f"the code store's record {record} does not name the parts of {digest}")
    folders = []
    for part in parts:
        folder = part_folder(store, part)
        if not intact(folder, part):
            raise Mismatch(
                f"the snapshot {folder} of the sweep's code {digest} was changed or is gone: "
                "its files no longer hash to it, so its points do not run (a new sweep pins "
                "the code as it is now)"
            )
        folders.append(folder)
    return folders


def intact(folder: Path, digest: str) -> bool:
    """Whether a part's folder holds exactly the files its digest names."""
    try:
        hashes = {rel: file_hash(p.read_bytes()) for rel, p in source_files(folder).items()}
    except OSError:
        return False
    return folder.is_dir() and part_digest(hashes) == digest


def _hex(text) -> bool:
    return isinstance(text, str) and len(text) == SHORT and set(text) <= set("0123456789abcdef")


def enter(store: Path, digest: str) -> None:
    """Verify the snapshot, then import from it first: here (sys.path) and in every process
    this one starts (PYTHONPATH; PYTHONSAFEPATH keeps a child's working directory off its
    path, where a checkout's harness would come first). Their harness, a snapshot's, reads its
    configs from the conf/ of the install that entered it first (CONF_ENV)."""
    folders = [str(folder) for folder in verified(store, digest)]
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = folders + [p for p in sys.path if p not in folders and p != here]
    before = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(folders + [p for p in before if p not in folders])
    os.environ["PYTHONSAFEPATH"] = "1"
    os.environ[ENV] = f"{store}:{digest}"
    conf = Path(here).parent / "conf"  # harness/conf: this file is harness/pinning/boot.py
    if conf.is_dir():  # this process's harness is the pinning install's, not a snapshot's
        os.environ[CONF_ENV] = str(conf.resolve())


def main(argv: list[str]) -> None:
    store, digest, *rest = argv
    try:
        enter(Path(store), digest)
    except Mismatch as error:
        print(f"harness error: {error}", file=sys.stderr, flush=True)
        sys.exit(FAILED)
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
    except Mismatch as error:
        print(f"harness error: {error}", file=sys.stderr, flush=True)
        sys.exit(FAILED)
    _module, _, _function = _target.partition(":")
    for _name in [n for n in sys.modules if n == "harness" or n.startswith("harness.")]:
        del sys.modules[_name]  # a module of the harness imported before: the snapshot's now
    getattr(__import__(_module, fromlist=[_function]), _function)(*_args)
