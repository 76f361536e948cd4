"""Bad input and one-line messages: what the user typed or configured is wrong (BadInput: one
line on stderr, exit code 2), and the helpers that make an exception one line for a message, a
table or a progress line."""

import os
import re
import sys


class BadInput(Exception):
    """Something the user typed or configured is wrong: one line, exit code 2."""


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
