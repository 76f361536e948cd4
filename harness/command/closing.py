"""The end of a sweep on the terminal: its table, its claims, its counts, and the commands that
follow it (status) or finish it (resume)."""

import sys

from harness import store
from harness.command.status import code_and_reuse
from harness.planning import config
from harness.planning.config import command
from harness.planning.plan import Sweep
from harness.results.claims import FAILING, claims_table, outcome
from harness.results.tables import WIDTH, absent_columns, markdown, planned, sweep_table


def report(sweep: Sweep, manifest: dict, seconds: float, check: bool = False) -> int:
    """Print the sweep's table, claims and counts; the exit code says whether any point failed
    (with `check`, the command line's check=true: or a claim FAILs, is INCOMPLETE or an ERROR)."""
    rows = store.read(sweep.results, sweep.experiment.name, sweep.id)
    rows = store.as_planned(rows, manifest, sweep.results)
    points = manifest["points"]
    statuses, total = store.job_statuses(rows), len(points)
    unfinished = total - int(statuses.isin(store.DONE).sum())
    params = list(points[0]["params"]) if points else []
    table = sweep_table(planned(rows, points), sweep.experiment.config, params)
    if table is not None:
        print(f"{table.attrs['caption']}:\n{markdown(table, width=WIDTH)}")
    absent = absent_columns(rows, sweep.experiment.config.get("table"))
    if absent:
        print(f"no table: {absent}")
    claims = claims_table(rows, sweep.experiment.config, points)
    for line in claims.itertuples():
        print(f"claim {line.result}: {line.claim} ({outcome(line)})")
    for line in code_and_reuse(rows):
        print(line)
    print(
        f"sweep {sweep.id}: {store.status_counts(statuses, total)}; in {seconds:.1f} s; "
        f"rows in {sweep.paths.folder}"
    )
    if unfinished:
        print(
            f"{unfinished} of {total} points have no answer; rerun them with: "
            f"{resume_command(sweep)}",
            file=sys.stderr,
        )
    failing = int(claims["result"].isin(FAILING).sum()) if check else 0
    if failing:
        print(f"check=true: {failing} of {len(claims)} claims do not pass", file=sys.stderr)
    return 1 if unfinished or failing else 0


def resume_command(sweep: Sweep) -> str:
    """The command that finishes the sweep (harness.planning.config.resume_command)."""
    settings = [*sweep.hydra_overrides, *sweep.overrides]
    return config.resume_command(
        sweep.experiment.name, sweep.id, sweep.config_dirs, sweep.results.parent, settings
    )


def status_command(sweep: Sweep) -> str:
    return command(["status", sweep.id], [], sweep.results.parent)
