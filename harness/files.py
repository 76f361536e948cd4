"""One file of the harness's, written whole or not at all and read back checked.

Every file is written under a hidden temporary name and renamed into place (replace_atomically),
so a reader sees all of it or none; a writer killed mid-write leaves only the temporary, which
remove_temporaries takes away once its writer is known to be gone or an hour has passed. A row
file (write_table; or write_parts, in the memory of one part: a training job's segments merged)
carries Parquet page checksums and, in its metadata, a digest of its rows; read_checked checks
both and raises DamagedFile for a file that cannot be trusted. uninterrupted()
holds off Ctrl-C, SIGTERM and SIGHUP while a file replaces others, so that no reader sees both.
"""

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import secrets
import signal
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from harness import digests

STALE_S = 3600  # a hidden temporary file this old is a killed writer's: no write takes an hour
# Each file's metadata holds a digest of its rows, checked on read: of their values (a table of
# up to SMALL cells, a point's rows: no Parquet round trip to take it), or of the table as a
# Parquet reader returns it (a bigger one, which its values would take longer to list).
DIGEST = b"harness_rows_sha256"
VALUES_DIGEST = b"harness_values_sha256"
# Of a file written in parts (write_parts): of its row groups, each as a reader returns it alone.
GROUPS_DIGEST = b"harness_row_groups_sha256"
SMALL = 10_000
STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # what a merge finishes before obeying
# a job's file, or one of its segments (of a rank, in a point of several processes)


class DamagedFile(Exception):
    """A row file that cannot be trusted (see the module's docstring)."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


@contextmanager
def hold(path: Path, shared: bool = False) -> Iterator[None]:
    """An exclusive lock on the file `path` (made if missing; `shared`: one that others may
    share) while the block runs, waiting for another holder; it goes with the process, however
    that ends."""
    opened = lock(path, shared=shared)
    try:
        yield
    finally:
        unlock(opened)


def lock(path: Path, wait: bool = True, shared: bool = False) -> int:
    """An open file that holds an exclusive lock on `path` (made if missing; a symlink is
    refused, Linked), once another holder lets go (wait=False: BlockingIOError if one holds
    it): the kernel lets go of it when the process ends, however it ends, so a killed holder
    leaves no stale lock. unlock() ends it."""
    try:
        opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
    except OSError as error:
        if error.errno == errno.ELOOP:
            no_links(path)
        raise
    try:
        kind = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        fcntl.flock(opened, kind if wait else kind | fcntl.LOCK_NB)
    except BaseException:
        os.close(opened)
        raise
    return opened


def unlock(opened: int) -> None:
    fcntl.flock(opened, fcntl.LOCK_UN)
    os.close(opened)


class Linked(OSError, ValueError):
    """A path under outputs/ that is a symlink, where the harness would write through it: an
    OSError, so that one met while a sweep runs stops it as a store that cannot be written
    does, its points' rows kept."""


def no_links(path: Path, depth: int = 1) -> None:
    """Linked, naming it, when `path` or one of its `depth - 1` nearest parents is a symlink:
    a file under outputs/ is data, and a link there could send the harness's writes (or its
    removal of temporaries) into any folder. outputs/ itself, or a folder above, may be one."""
    place = Path(path)
    for _ in range(depth):
        if place.is_symlink():
            raise Linked(
                f"{place} is a symlink: the harness writes nothing through a link in its "
                "outputs (remove it, then run the command again)"
            )
        place = place.parent


def no_links_within(root: Path, path: Path) -> None:
    """Linked, naming it, when `path` or a folder between it and `root` is a symlink (root and
    the folders above it may be)."""
    path = Path(path)
    inside = path.is_relative_to(root)
    no_links(path, depth=len(path.relative_to(root).parts) if inside else 1)


def no_links_below(folder: Path, skip: Iterable[str] = ()) -> None:
    """Linked, naming the first, when a file or folder below `folder` is a symlink (a report
    folder the harness writes into: a link there would take its writes elsewhere); nothing
    for a folder that is not there. Folders named in `skip` are not looked into (submitit's,
    which links its own files)."""
    below = [Path(folder)]
    while below:
        try:
            with os.scandir(below.pop()) as listed:
                entries = sorted(listed, key=lambda entry: entry.name)
        except (FileNotFoundError, NotADirectoryError):  # none yet (or gone since): nothing
            continue  # written through it (a file on its way is the writer's to say)
        for entry in entries:  # the listing says what each is: no stat of its own
            if entry.is_symlink():
                no_links(Path(entry.path))
            if entry.is_dir(follow_symlinks=False) and entry.name not in skip:
                below.append(Path(entry.path))


def write_table(path: Path, table: pa.Table, sync: bool = True) -> None:
    """Write rows with Parquet page checksums and a digest of the rows in the file's metadata."""
    small = table.num_rows * table.num_columns <= SMALL  # a point's rows: no dictionaries
    if small:
        table = table.replace_schema_metadata({VALUES_DIGEST: digests.values_digest(table)})
    else:
        table = table.replace_schema_metadata(
            {DIGEST: digests.table_digest(digests.as_read(table))}
        )

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            pq.write_table(table, f, write_page_checksum=True, use_dictionary=not small)

    replace_atomically(path, write, sync)


def write_parts(path: Path, parts: Callable[[], Iterable[pa.Table]], schema: pa.Schema,
                sync: bool = True) -> None:  # fmt: skip
    """Write rows given in parts of one schema (a part a row group) in the memory of a part:
    page checksums, and a digest of the row groups as a reader returns each. `parts` gives the
    same parts each time it is called: once for the digest, once for the file."""
    digest, options = hashlib.sha256(), {"use_dictionary": True, "write_page_checksum": True}
    # Parquet's names of list items:
    read_as = digests.as_read(schema.empty_table(), **options).schema
    with pa.ipc.new_stream(digests.Hashing(digest), read_as) as stream:
        for part in parts():
            stream.write_table(digests.as_read(part, **options))
    schema = schema.with_metadata({GROUPS_DIGEST: digest.hexdigest()})

    def write(tmp: Path) -> None:
        with pq.ParquetWriter(tmp, schema, **options) as out:
            for part in parts():
                out.write_table(part.replace_schema_metadata(schema.metadata))

    replace_atomically(path, write, sync)


def read_checked(path: Path) -> tuple[pa.Table, tuple[int, int, int]]:
    """A file's rows and identity (inode, mtime, size) from one open: what was read is what
    the identity names, even if the file is replaced a moment later. DamagedFile when the rows
    cannot be trusted (see the module's docstring)."""
    try:
        with open(path, "rb") as f:
            data, stat = f.read(), os.fstat(f.fileno())
    except FileNotFoundError:
        if path.is_symlink():
            raise DamagedFile(path, "a symbolic link to nothing") from None
        raise  # gone since the listing: a compaction took it
    except OSError as error:  # a folder, a socket, another user's file
        said = f"cannot be read ({type(error).__name__}: {error.strerror})"
        raise DamagedFile(path, said) from None
    try:
        parquet = pq.ParquetFile(pa.BufferReader(data), page_checksum_verification=True)
        metadata = parquet.schema_arrow.metadata or {}
        if GROUPS_DIGEST in metadata:
            kind, (table, digest) = GROUPS_DIGEST, digests.groups_digest(parquet)
            intact = metadata[kind] == digest.encode()
        else:
            table = parquet.read(use_threads=False).replace_schema_metadata(None)
            taken = {VALUES_DIGEST: digests.values_digest, DIGEST: digests.table_digest}
            kind = next((key for key in taken if key in metadata), None)
            intact = kind is not None and metadata[kind] == taken[kind](table).encode()
    except Exception as error:  # whatever a damaged file makes the reader raise
        raise DamagedFile(path, f"unreadable ({type(error).__name__}: {error})") from None
    if kind is None:
        raise DamagedFile(path, "it carries no digest of its rows: not written by the harness")
    if not intact:
        raise DamagedFile(path, "its rows differ from those written (digest mismatch)")
    return table, (stat.st_ino, stat.st_mtime_ns, stat.st_size)


def replace_atomically(path: Path, write, sync: bool = True) -> None:
    """Write a file under a temporary name and rename it into place; `sync`: on disk first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Unique across the nodes of a shared file system too, where pids repeat.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        write(tmp)
        if sync:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync:
        fsync_dir(path.parent)


def fsync_dir(folder: Path) -> None:
    directory = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def stamp(status: os.stat_result) -> tuple[int, ...]:
    """What tells that a file's bytes may have changed without reading them: its size, its
    modification and change times (an edit that sets the first back still moves the second,
    which no user can set), its device and inode (a file put in its place)."""
    return (status.st_size, status.st_mtime_ns, status.st_ctime_ns, status.st_dev,
            status.st_ino)  # fmt: skip


def write_text(path: Path, text: str) -> None:
    replace_atomically(path, lambda tmp: Path(tmp).write_text(text))


def write_json(path: Path, data: dict) -> None:
    """Write a JSON file atomically (the manifest, package lists)."""
    write_text(path, json.dumps(data, indent=2, default=str) + "\n")


def write_in_place(path: Path, text: str) -> None:
    """Write a small file in place, not atomically and not forced to disk (a hint a reader
    may meet half-written and take as nothing), never through a link at its name: a symbolic
    link (O_NOFOLLOW) is an OSError, and a file with another name (a hard link) or no regular
    file is left as it is, Linked (the folders above are the caller's to check)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    with os.fdopen(opened, "w") as f:
        found = os.fstat(opened)
        if not stat.S_ISREG(found.st_mode) or found.st_nlink != 1:
            raise Linked(f"{path} is not a file of its own: nothing is written through it")
        f.truncate(0)
        f.write(text)


JSON_BYTES = 64 << 20  # a manifest of a million points is about 50 MB
JSON_DEPTH = 32  # a manifest nests 5 deep; a config rarely more than 10


def read_json(path: Path) -> dict:
    """A JSON file of the harness's (a manifest), read as data: ValueError for one over
    JSON_BYTES or nested over JSON_DEPTH deep, before anything recurses into it."""
    try:
        value = json.loads(read_bounded(path))
    except RecursionError:
        raise ValueError(f"nested over {JSON_DEPTH} deep") from None
    if _deeper(value, JSON_DEPTH):
        raise ValueError(f"nested over {JSON_DEPTH} deep")
    return value


def read_bounded(path: Path) -> bytes:
    """A file's bytes; ValueError for one over JSON_BYTES (a file of the harness's is never
    that big: one that is was made to be)."""
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        if size > JSON_BYTES:
            raise ValueError(f"{size} bytes, over the {JSON_BYTES} such a file may have")
        return file.read(JSON_BYTES + 1)


def _deeper(value, depth: int) -> bool:
    """Whether a JSON value nests lists or mappings more than `depth` deep."""
    level, containers = 0, [value]
    while containers:
        inner = []
        for one in containers:
            if isinstance(one, dict):
                inner += [v for v in one.values() if isinstance(v, dict | list)]
            elif isinstance(one, list):
                inner += [v for v in one if isinstance(v, dict | list)]
        containers, level = inner, level + 1
        if inner and level > depth:
            return True
    return False


def remove_temporaries(
    folder: Path, older_than_s: float | None = None, of: Iterable[str] = ()
) -> None:
    """Remove the hidden temporary files (".NAME.PID.HEX.tmp") that writers killed mid-write
    left in `folder`: those older than `older_than_s`, and those of the file names `of` (whose
    writers are known to be gone), whatever their age."""
    now, names = time.time(), tuple(f".{name}." for name in of)
    for path in Path(folder).glob(".*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            old = older_than_s is not None and now - path.stat().st_mtime > older_than_s
            if old or path.name.startswith(names):
                path.unlink()


@contextmanager
def uninterrupted() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP wait until the block is done, then take effect: a merge (or
    a release) never stops between writing its file and removing what it replaces, so readers
    never see both (only SIGKILL can cut it there; the next compaction mends it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []

    def wait(number, frame):
        caught.append(number)

    previous = {stop: signal.signal(stop, wait) for stop in STOPS}
    try:
        yield
    finally:
        for stop, handler in previous.items():
            signal.signal(stop, handler)
        if caught:
            signal.raise_signal(caught[0])
