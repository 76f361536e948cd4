"""For the tests: reach into a sweep that ended, as a user's mishap or a resume would."""

from pathlib import Path

from harness import store


def own_file(results: Path, experiment: str, sweep: str, job: int) -> Path:
    """A job's own file in a sweep that ended (and was compacted): its rows moved back out of
    the compacted file into it, as resume moves them, for a test to delete or damage."""
    store.release(results, experiment, sweep, [job])
    return store.job_file(results, experiment, sweep, job)
