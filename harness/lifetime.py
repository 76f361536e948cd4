"""What the harness keeps for the life of its process, and how a process that runs one command
after another (a test calling the command line, a warm worker) forgets it between two: each such
cache or record is made with per_command, and forget() empties them all, so that the next
command sees the store and the experiments' files as a new process would (a damaged file named
again, a journal read anew, an experiment's module imported afresh)."""

_kept: list = []


def per_command(thing):
    """Register `thing` (a functools cache, or a dict or set) to be emptied by forget(); returns
    it, so that it decorates a cached function or wraps a record's first value."""
    _kept.append(thing)
    return thing


def forget() -> None:
    """Empty every cache and record made with per_command."""
    for thing in _kept:
        (thing.cache_clear if hasattr(thing, "cache_clear") else thing.clear)()
