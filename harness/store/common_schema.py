"""The store's common schema: ROOT/columns, a Parquet file of no rows whose schema holds every
column of every row file under ROOT, kept current as files are written.

A plain folder reader takes its schema from one file: pyarrow's dataset discovery (and so
`pandas.read_parquet(ROOT)` and `pyarrow.parquet.read_table(ROOT)`) reads the first file in
path order, and drops the columns only later files have. "columns" sorts before every
experiment=NAME folder, so it is that first file, and the others are read in its schema (a
column of ints in one file and floats in another as floats; one no promotion unifies, an int
and a str, as text, as harness.store reads it). It has no ".parquet" suffix, so that DuckDB's
glob over **/*.parquet, whose Hive partitioning needs every file in the partition folders, does
not list it. Its columns only grow: one that no file has any more stays, all null. A store
written before it existed gets it from the footers of all its files, at the first write.

Each writer adds its table's columns under a lock (ROOT/_columns.lock) and remembers what the
file holds, so that a process reads it again only when it writes a column it has not seen.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from harness import files
from harness.lifetime import per_command
from harness.store.layout import HARNESS_COLUMNS, PARTITIONS  # partitions: in folders' names

NAME = "columns"
LOCK = "_columns.lock"
_held: dict[Path, dict[str, pa.DataType]] = per_command({})  # per root: what the file holds


def keep(root: Path, schema: pa.Schema) -> None:
    """Add `schema`'s columns to ROOT/columns where it lacks them (or holds them as another
    type, which both promote to)."""
    root = Path(root)
    # Every column the harness may write, whether or not this table has it (reused_from where
    # nothing was reused): a folder reader's frame has each of them on any store.
    given = {
        **HARNESS_COLUMNS,
        **{f.name: f.type for f in schema if f.name not in PARTITIONS.names},
    }
    if _holds(_held.get(root, {}), given):
        return
    root.mkdir(parents=True, exist_ok=True)
    with files.hold(root / LOCK):
        held = read(root) or _footers(root)
        merged = _merged(held, given)
        if merged != held:
            _write(root, merged)
        _held[root] = merged


def mend(root: Path) -> str | None:
    """Where ROOT/columns is there but cannot be read (emptied, cut short, damaged), on which
    pandas' and pyarrow's folder readers raise: rebuilt from the row files' footers. A line
    saying what was found and done; None where there was nothing to mend."""
    root, path = Path(root), Path(root) / NAME
    if path.is_symlink() or not path.is_file():
        return None
    try:
        pq.read_schema(path)
        return None
    except Exception as error:  # whatever a damaged footer raises
        why = "empty" if path.stat().st_size == 0 else f"{type(error).__name__}: {error}"
    said = f"the store's columns file {path} could not be read ({why})"
    try:
        with files.hold(root / LOCK):
            _write(root, _footers(root))
    except OSError as error:
        return f"{said}, and cannot be rebuilt here ({error.strerror or error})"
    _held.pop(root, None)
    return f"{said}: rebuilt from the row files"


def _write(root: Path, columns: dict[str, pa.DataType]) -> None:
    """ROOT/columns anew, holding `columns` (the caller holds the lock)."""
    table = pa.schema(list(columns.items())).empty_table()
    files.replace_atomically(root / NAME, lambda tmp: pq.write_table(table, tmp), sync=False)


def read(root: Path) -> dict[str, pa.DataType]:
    """The columns ROOT/columns holds and their types; none where it is missing, damaged or not
    a plain file (a symlink is not followed)."""
    path = Path(root) / NAME
    if path.is_symlink() or not path.is_file():
        return {}
    try:
        return {f.name: f.type for f in pq.read_schema(path)}
    except Exception:  # whatever a damaged footer raises: the file is rebuilt from the writes
        return {}


def _footers(root: Path) -> dict[str, pa.DataType]:
    """The columns of every row file under ROOT, read from their footers (damaged ones left out)."""
    held: dict[str, pa.DataType] = {}
    for path in sorted(root.glob("experiment=*/sweep=*/*.parquet")):
        try:
            schema = pq.read_schema(path)
        except Exception:  # a damaged file, which every reader skips
            continue
        held = _merged(held, {f.name: f.type for f in schema if f.name not in PARTITIONS.names})
    return held


def _holds(held: dict[str, pa.DataType], given: dict[str, pa.DataType]) -> bool:
    """Whether `held` has each column of `given`, of its type (one all null in `given` fits any)."""
    return all(
        name in held and (kind == held[name] or pa.types.is_null(kind))
        for name, kind in given.items()
    )


def _merged(held: dict[str, pa.DataType], given: dict[str, pa.DataType]) -> dict:
    """The columns of both, a column of two types as the one both promote to, else as text."""
    merged = dict(held)
    for name, kind in given.items():
        if name not in merged or pa.types.is_null(merged[name]):
            merged[name] = kind
        elif kind != merged[name] and not pa.types.is_null(kind):
            merged[name] = _promoted(merged[name], kind)
    return merged


def _promoted(held: pa.DataType, kind: pa.DataType) -> pa.DataType:
    try:
        schemas = [pa.schema([("c", held)]), pa.schema([("c", kind)])]
        return pa.unify_schemas(schemas, promote_options="permissive").field("c").type
    except (pa.ArrowTypeError, pa.ArrowInvalid):
        return pa.string()
