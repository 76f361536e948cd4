"""The digests a row file of the harness's carries of its rows (harness.files): of its values, of
the table as a Parquet reader returns it, or of its row groups, each as a reader returns it."""

import functools
import hashlib

import pyarrow as pa
import pyarrow.parquet as pq


class Hashing:
    """A file-like sink that only hashes what is written to it."""

    def __init__(self, digest):
        self.digest, self.closed = digest, False

    def write(self, data) -> int:
        self.digest.update(data)
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def groups_digest(parquet: pq.ParquetFile) -> tuple[pa.Table, str]:
    """A file's rows, and the digest of its row groups as write_parts takes it."""
    digest = hashlib.sha256()
    groups = []
    schema = parquet.schema_arrow.remove_metadata()
    with pa.ipc.new_stream(Hashing(digest), schema) as stream:
        for number in range(parquet.num_row_groups):
            group = parquet.read_row_group(number, use_threads=False).replace_schema_metadata(None)
            stream.write_table(group)
            groups.append(group)
    return pa.concat_tables(groups) if groups else schema.empty_table(), digest.hexdigest()


def table_digest(table: pa.Table) -> str:
    """A digest of a table as a Parquet reader returns it (types and values, as Arrow IPC).

    Taken of the table read back (as_read), never of the table as built: a reader lays out
    buffers its own way (a validity buffer where no value is null, its own values under a
    null, a slice's parent's bits), and the IPC bytes carry all of that."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return hashlib.sha256(sink.getvalue()).hexdigest()


def values_digest(table: pa.Table) -> str:
    """A digest of a table's column names, types and values, whatever the buffers' layout:
    the same for the table as built and as any Parquet reader returns it. Times are listed as
    the integers they are stored as, not as the datetime objects a pyarrow release makes."""
    listed = [
        (
            field.name,
            type_name(field.type),
            field.nullable,
            (column.cast(pa.int64()) if pa.types.is_timestamp(field.type) else column).to_pylist(),
        )
        for field, column in zip(table.schema, table.columns, strict=True)
    ]
    return hashlib.sha256(repr(listed).encode()).hexdigest()


@functools.cache
def type_name(type_: pa.DataType) -> str:
    """A type as text, without the names of list items (Parquet names them its own way)."""
    if pa.types.is_list(type_) or pa.types.is_large_list(type_):
        item = type_.value_field
        return f"{type_.__class__.__name__}<{type_name(item.type)}, {item.nullable}>"
    if pa.types.is_struct(type_):
        fields = [type_.field(i) for i in range(type_.num_fields)]
        inner = ", ".join(f"{f.name}: {type_name(f.type)}, {f.nullable}" for f in fields)
        return f"struct<{inner}>"
    return str(type_)


def as_read(table: pa.Table, **options) -> pa.Table:
    """The table as it will read back from Parquet (its buffers laid out as a reader lays them,
    list fields named as Parquet names them): what table_digest is taken of when writing."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **options)
    return pq.ParquetFile(pa.BufferReader(sink.getvalue())).read(use_threads=False)
