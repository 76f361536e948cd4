"""A toolkit for experiments, not part of the runner: timing (time and FLOP/s, in turns with
a baseline) and memory (peak memory, and a function run in an isolated child process, forked
from a forkserver that has imported torch and this module). Experiments import it; of the
harness, only the warm workers read a process's memory with it. Imports nothing of the harness
but the root modules."""

_taken: list[str] = []  # what the point that runs now measured: "time", "memory"


def took(what: str) -> None:
    """Note that the point that runs now measured `what` ("time", "memory"): its rows measure
    the moment, and reuse copies them only where its experiment asks (harness.reuse)."""
    _taken.append(what)


def taken() -> tuple[str, ...]:
    """What the point that runs now measured so far (harness.running.job asks at its end)."""
    return tuple(dict.fromkeys(_taken))


def start_point() -> None:
    """A point begins: it has measured nothing yet."""
    _taken.clear()
