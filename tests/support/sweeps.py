"""For the tests: sweeps written as the harness leaves them, and reached into as a user's mishap
or a resume would."""

from pathlib import Path

from harness import store


def write_jobs(root: Path, experiment: str, sweep: str, rows: list[dict]) -> None:
    """Each job's rows (flat dicts with a "job") in the job's own file."""
    jobs: dict[int, list[dict]] = {}
    for row in rows:
        jobs.setdefault(row["job"], []).append(row)
    for job, own in jobs.items():
        store.write_rows(store.SweepPaths(root, experiment, sweep).job(job).file, own)


def write_plan(root: Path, experiment: str, sweep: str, params: list[dict], config: dict) -> None:
    """The sweep's manifest: a point per entry of `params` (job numbers in order), and the
    experiment's config (its claims, table, report)."""
    points = [{"job": job, "overrides": [], "params": p} for job, p in enumerate(params)]
    store.write_manifest(root, {
        "experiment": experiment, "sweep": sweep, "points": points, "experiment_config": config,
        "command": f"python -m harness +experiment={experiment}",
    })  # fmt: skip


def own_file(results: Path, experiment: str, sweep: str, job: int) -> Path:
    """A job's own file in a sweep that ended (and was compacted): its rows moved back out of
    the compacted file into it, as resume moves them, for a test to delete or damage."""
    store.release(store.SweepPaths(results, experiment, sweep), [job])
    return store.SweepPaths(results, experiment, sweep).job(job).file
