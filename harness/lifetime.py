"""What the harness keeps for the life of its process, and how a process that runs one unit of
work after another (a test calling the command line, a warm worker's points:
harness.launchers.fresh) forgets it between two, so that the next sees the store and the
experiments' files as a new process would: a damaged file named again, a journal read anew, an
experiment's module imported afresh once its file changed. Each such cache or record is made with
per_command (kept across a worker's points, for the whole sweep) or per_point (forgotten between
points too)."""

_per_command: list = []
_per_point: list = []


def per_command(thing):
    """Register `thing` (a functools cache, or a dict or set) to be emptied between commands;
    returns it, so that it decorates a cached function or wraps a record's first value."""
    _per_command.append(thing)
    return thing


def per_point(thing):
    """As per_command, and emptied between a worker's points too (what holds a user's code)."""
    _per_point.append(thing)
    return thing


def forget(*, command: bool = True) -> None:
    """Empty the per-point caches and records, and with `command` the per-command ones."""
    for thing in [*_per_point, *(_per_command if command else [])]:
        (thing.cache_clear if hasattr(thing, "cache_clear") else thing.clear)()
