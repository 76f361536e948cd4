"""Bad input, a store that cannot be written, and one-line messages: what the user typed or
configured is wrong (BadInput: one line on stderr, exit code 2), the store cannot take a job's
rows (StoreUnwritable: the sweep stops, exit code 1), and the helpers that make an exception one
line for a message, a table or a progress line."""

import os
import re
import sys


class BadInput(Exception):
    """Something the user typed or configured is wrong: one line, exit code 2."""


class StoreUnwritable(OSError):
    """The store cannot take what a point writes (its rows, its checkpoint: a full disk, a
    folder it may not write): no failed row, which could not land either; the sweep stops in
    one line (exit code 1), and its resume finishes it once the store can be written. The
    tracker raises it where a write fails (harness.tracking); a job's own process sends it back
    in place of the job's summary, and the sweep's process raises it
    (harness.launchers.protocol)."""

    kind = "OSError"  # the type of the store's own error, which a message names

    @classmethod
    def of(cls, error: OSError) -> "StoreUnwritable":
        """The store's own `error` as a StoreUnwritable that reads as it does: its errno, words
        and paths (os_error, str) and, as `kind`, its type."""
        if isinstance(error, cls):
            return error
        if error.filename is None:
            unwritable = cls(*error.args)
        else:  # OSError's own arguments: its args hold no paths
            unwritable = cls(error.errno, error.strerror, error.filename, None, error.filename2)
        unwritable.kind = type(error).__name__
        return unwritable


def one_line(error: BaseException) -> str:
    """An exception's message on one line, for one-line errors."""
    return " ".join(line.strip() for line in str(error).splitlines() if line.strip())


def shorten(text: str, limit: int = 160) -> str:
    """A text (an error, say) of at most `limit` characters, on one line, for a table or a
    progress line."""
    text = one_line(text) if "\n" in text else text
    return text if len(text) <= limit else text[: limit - 3] + "..."


def with_type(error: BaseException) -> str:
    """An exception as one line, its type first."""
    return f"{type(error).__name__}: {one_line(error)}"


TEMPORARY = re.compile(r"/\.([^/]+)\.\d+\.[0-9a-f]+\.tmp$")  # files.replace_atomically's


def os_error(error: OSError) -> str:
    """A filesystem error as its words and its path: "Operation not permitted: outputs/x" (the
    file a temporary name was for, harness.files.replace_atomically's .NAME.PID.HEX.tmp)."""
    said = error.strerror or re.sub(r"^\[Errno \d+\] ", "", one_line(error))
    if not error.filename:
        return said
    path = TEMPORARY.sub(r"/\1", str(error.filename))
    return f"{said}: {path}"


def reader_gone() -> int:
    """After a BrokenPipeError: stdout to /dev/null, so that exiting flushes nowhere rather than
    into a second error; the exit code of a process killed by SIGPIPE (141)."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 141
