"""python -m harness status SWEEP_ID: each point's state, from the store and the scheduler.

A point is ok, failed (with its error), killed, ... when its row has landed; pending or
running while its detached launcher (SLURM) queues or runs it, killed when the launcher let it
go without a row (scancel, a time limit, a lost node), as the launcher says; and not run when
no launch of it is on record (an interrupted local sweep: resume it).
"""

import json
import math
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa

from harness import store
from harness.errors import BadInput, shorten
from harness.searching import search
from harness.store import common_schema

HELD = ("pending", "running")  # the states of a point that a launcher still holds


def status(sweep_id: str, out: str = "outputs", experiment: str | None = None) -> int:
    """Print the sweep's points with their states; the exit code is 0 (2 for an unknown id).
    `last` names the newest sweep (of `experiment`, if given)."""
    results = Path(out).resolve() / "results"
    paths = find_sweep(results, store.named_sweep(results, sweep_id, experiment))
    sweep_id, experiment = paths.sweep, paths.experiment
    manifest = store.read_manifest(paths)
    if manifest is None:
        raise BadInput(f"sweep {sweep_id} has no readable manifest ({store.MANIFEST}) in {results}")
    mended = common_schema.mend(results)
    if mended:
        print(f"warning: {mended}", file=sys.stderr)
    if compact_if_finished(paths, manifest):
        print(f"sweep {sweep_id} has ended: its files are compacted into one")
    rows, points, running = sweep_points(results, manifest)
    print(f"sweep {sweep_id} ({experiment}): {manifest.get('command', '')}")
    print(pipe_table([{**point, "detail": shorten(point["detail"])} for point in points]))
    states = [point["state"] for point in points]
    print(", ".join(f"{n} {state}" for state, n in Counter(states).most_common()))
    for line in code_and_reuse(rows):
        print(line)
    searched = search.of_manifest(manifest)
    if searched:
        states_by_job = {point["job"]: point["state"] for point in points}
        for line in search.progress(paths.folder, searched, states_by_job):
            print(line)
    if running:
        print(f"a command runs it now ({running[0]}, since "
              f"{datetime.fromtimestamp(running[1]).strftime('%H:%M:%S')}): its points without "
              "rows are pending or running there")  # fmt: skip
        return 0
    if all(state in store.DONE for state in states) or set(states) & set(HELD):
        return 0
    from harness.planning.config import resume_command  # Hydra's quoting of the out dir

    config_dirs = [Path(folder) for folder in manifest.get("config_dirs") or []]
    settings = [*manifest.get("hydra_overrides", []), *manifest.get("overrides", [])]
    said = resume_command(experiment, sweep_id, config_dirs, results.parent, settings)
    gone = _snapshot_gone(manifest, settings)
    if gone:
        print(f"{gone}; finish it on this tree's code with: {said} code=current")
    else:
        print(f"finish it with: {said}")
    return 0


def _snapshot_gone(manifest: dict, settings: list[str]) -> str | None:
    """Why the sweep's snapshot of its code is not in the code store its resume would look in
    (its code_store= setting, else the default), or None where it is."""
    from harness.names import key_of
    from harness.pinning import codestore

    given = next((line.split("=", 1)[1] for line in settings if key_of(line) == "code_store"),
                 None)  # fmt: skip
    digest, kept = manifest.get("code_digest"), codestore.store_of(given)
    if not isinstance(digest, str):
        return "its manifest names no code"
    try:
        codestore.verify(kept, digest)
    except BadInput as error:
        return str(error)
    return None


def sweep_points(results: Path, manifest: dict) -> tuple[pa.Table, list[dict], tuple | None]:
    """A sweep's rows, each point's state as `status` says it (point_states; a point without
    rows of a sweep a command runs now: running or pending there) and that command
    (store.run_by: its process and since when), None where none runs it."""
    experiment, sweep_id = manifest["experiment"], manifest["sweep"]
    rows = store.read_table(results, experiment, sweep_id, partitions=False)
    points = point_states(manifest, store.as_planned(rows, manifest, results), results)
    paths = store.SweepPaths(results, experiment, sweep_id)
    running = store.run_by(paths)
    if running:
        _in_hand(points, paths, running[1])
    return rows, points, running


def _in_hand(points: list[dict], sweep: store.SweepPaths, since: float) -> None:
    """The points without rows of a sweep that a command runs now (a local sweep, whose points
    no scheduler tracks): running where their job's log was written since that command took
    the sweep (Hydra's job folder, runs/EXPERIMENT/SWEEP/job-N), pending otherwise."""
    for point in points:
        if point["state"] != "not run":
            continue
        try:
            log = sweep.job(point["job"]).run_folder / "harness.log"
            started = log.stat().st_mtime >= since
        except OSError:
            started = False
        point["state"] = "running" if started else "pending"


def compact_if_finished(sweep: store.SweepPaths, manifest: dict | None) -> bool:
    """Compact a sweep whose points have all ended (each has rows, and SLURM runs none of them)
    and that is not compacted yet, so that reading it is one file; whether it compacted now.
    A sweep with points still to come (or without a manifest) is left as it is."""
    if manifest is None or len(store.result_files(sweep.root, sweep.experiment, sweep.sweep)) <= 1:
        return False
    landed = store.jobs_with_rows(sweep)
    if any(point["job"] not in landed for point in manifest["points"]):
        return False
    if still_scheduled(manifest):
        return False
    try:
        _, absorbed = store.compact(sweep)
    except OSError as error:  # read-only, full: reading it file by file still works
        print(f"warning: could not compact sweep {sweep.sweep}: {error}", file=sys.stderr)
        return False
    return bool(absorbed)


def pipe_table(lines: list[dict]) -> str:
    """Lines of text (dicts with the same keys) as a Markdown pipe table, columns padded to
    their widest cell."""
    cells = [list(lines[0]), *(list(map(str, line.values())) for line in lines)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    padded = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
              for row in cells]  # fmt: skip
    padded.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(padded)


def find_sweep(results: Path, sweep_id: str) -> store.SweepPaths:
    """Where the sweep of this id lies, in whichever experiment has it; BadInput where none
    has."""
    experiment = store.experiment_of(results, sweep_id)
    if experiment is None:
        raise BadInput(f"no sweep {sweep_id} in {results}")
    return store.SweepPaths(results, experiment, sweep_id)


def still_scheduled(manifest: dict) -> list[int]:
    """The jobs that a detached launcher (SLURM) still queues or runs, by the manifest's
    launches."""
    states = scheduled(manifest)
    return [job for job, (state, _) in states.items() if state in HELD]


def point_states(manifest: dict, rows: pa.Table, results: Path) -> list[dict]:
    """One line per point of the manifest: job, its grid values, state, detail.

    A point's rows tell its state once they say how it ended, whatever its launcher says (a
    task that runs other points after it, points_per_task). While its rows say running, the
    launcher's state comes first, with the latest step; without a launcher that holds it, a
    point whose process let its running mark go is killed. A point without rows behind another
    in its running task (points_per_task) is pending."""
    landed, placed = _landed(rows, manifest), scheduled(manifest)
    sweep = store.SweepPaths(results, manifest["experiment"], manifest["sweep"])
    behind = _behind(manifest, landed)
    searched = search.of_manifest(manifest)
    drawn = _drawn(rows, list(searched["params"])) if searched else {}
    lines = []
    for point in manifest["points"]:
        job = point["job"]
        state, detail = placed.get(job, ("not run", ""))
        if job in landed:
            row_state, row_detail = landed[job]
            if row_state == store.RUNNING and state in HELD:
                detail = f"{detail}; {row_detail}"
            elif row_state == store.RUNNING and store.still_running(sweep.job(job).file) is False:
                state, detail = "killed", f"its process is gone; it last logged {row_detail}"
            else:
                state, detail = row_state, row_detail
        elif state == "running" and job in behind:  # its task runs a point before it
            state, detail = "pending", f"after job {behind[job]} in {detail}"
        named = [*point.get("overrides", []), *drawn.get(job, [])]
        grid_values = " ".join(named) or "(the only point)"
        lines.append({"job": job, "point": grid_values, "state": state, "detail": detail})
    return lines


def _behind(manifest: dict, landed: dict[int, tuple[str, str]]) -> dict[int, int]:
    """job -> the job it waits for in its task: a task's points (points_per_task) run one after
    another in its pack's order, so of those without an ending row only the first runs while
    the task does. By the latest launch of each job."""
    behind: dict[int, int] = {}
    for launch in manifest.get("launches") or []:
        tasks = _recorded(launch)[2].get("tasks")
        for jobs in tasks.values() if isinstance(tasks, dict) else []:
            jobs = [job for job in jobs if isinstance(job, int)] if isinstance(jobs, list) else []
            for job in jobs:
                behind.pop(job, None)
            left = [job for job in jobs if landed.get(job, (store.RUNNING,))[0] == store.RUNNING]
            behind |= {job: left[0] for job in left[1:]}
    return behind


def _drawn(rows: pa.Table, names: list[str]) -> dict[int, list[str]]:
    """job -> ["trial 3", "lr=0.00647", "warmup=50"]: each search trial's number and the values
    its study drew (from its first row that has them), as a progress line prints them."""
    drawn = {}
    columns = [store.values(rows, name) for name in ["job", "trial", *names]]
    for job, trial, *values in zip(*columns, strict=True):
        if job in drawn or all(value is None for value in values):
            continue
        given = {
            name: value for name, value in zip(names, values, strict=True) if value is not None
        }
        drawn[job] = [*([f"trial {trial}"] if trial is not None else []), search.values_said(given)]
    return drawn


def _landed(rows: pa.Table, manifest: dict) -> dict[int, tuple[str, str]]:
    """job -> (state, detail) of each job with rows: ok, or its first other row's status and
    error; for a training job still running, its latest row's numbers and their age."""
    if not rows.num_rows or "job" not in rows.column_names:
        return {}
    states, latest = {}, {}  # latest: the last running row of each job, by its index
    errors, reused = store.values(rows, "error"), store.values(rows, "reused_from")
    for index, (job, status, error, source) in enumerate(
        zip(store.values(rows, "job"), store.values(rows, "status"), errors, reused, strict=True)
    ):
        said = states.setdefault(job, ("ok", f"reused from {source}" if source else ""))
        if status not in ("ok", None) and said[0] == "ok":  # its first row that is not ok
            states[job] = (status, "" if error is None else str(error))
        if status == store.RUNNING:
            latest[job] = index
    params = {point["job"]: point.get("params", {}) for point in manifest["points"]}
    for job, index in latest.items():
        line = rows.slice(index, 1)
        row = {name: line[name][0].as_py() for name in line.column_names}
        row = {k: v for k, v in row.items() if not (v is None or _nan(v))}
        said = store.first_numbers(row, params.get(job, {}))
        age = datetime.now(UTC) - row["started_at"] - timedelta(seconds=row["duration_s"])
        states[job] = (store.RUNNING, f"{said} ({age.total_seconds():.0f} s ago)")
    return states


def _nan(value) -> bool:
    return isinstance(value, float) and math.isnan(value)


def scheduled(manifest: dict, config_dirs: list[Path] = ()) -> dict[int, tuple[str, str]]:
    """job -> (state, detail) of the points that detached launchers hold, as each launcher
    says (protocol.Launcher.states), by the latest launch of each. A launcher that no launcher
    config here names is not imported: its points' state is unknown."""
    found: dict[int, tuple[str, str]] = {}
    for launch in manifest.get("launches") or []:  # a detached launcher's (SLURM's)
        from harness.launchers import protocol

        target, jobs, placement = _recorded(launch)
        kind = protocol.trusted(target, config_dirs)
        if kind is None:
            said = ("unknown", f"its launcher {target} is no launcher config here")
            found |= dict.fromkeys(jobs, said)
        else:
            found |= kind.states(placement)
    return found


def _recorded(launch) -> tuple[str, list[int], dict]:
    """A launch's launcher, jobs and placement (a manifest is anyone's to edit: what is not of
    its kind is read as nothing)."""
    launch = launch if isinstance(launch, dict) else {}
    target, jobs, placement = launch.get("launcher"), launch.get("jobs"), launch.get("placement")
    jobs = [job for job in jobs if isinstance(job, int)] if isinstance(jobs, list) else []
    return str(target), jobs, placement if isinstance(placement, dict) else {}


def pinned_sweep(results: Path, sweep_id: str) -> tuple[str, dict, str]:
    """The sweep (`last` named), its manifest and the digest of the code it pinned; BadInput
    where its manifest names none."""
    sweep_id = store.named_sweep(results, sweep_id)
    manifest = store.read_manifest(find_sweep(results, sweep_id)) or {}
    digest = manifest.get("code_digest")
    if not isinstance(digest, str):
        raise BadInput(f"sweep {sweep_id}'s manifest names no code (code_digest)")
    return sweep_id, manifest, digest


def code_and_reuse(rows) -> list[str]:
    """What a sweep's rows (a table or a frame) say of their code and reuse, as lines for its
    summary and status: how many points were reused and from which sweeps, the codes its points
    ran when there is more than one, and the files they read that their inputs do not declare."""
    jobs = store.values(rows, "job")
    sources, codes, read = {}, {}, {}
    for job, source, code, files_read in zip(
        jobs, store.values(rows, "reused_from"), store.values(rows, "code_digest"),
        store.values(rows, "files_read"), strict=True,
    ):  # fmt: skip
        if isinstance(source, str):
            sources.setdefault(job, source.rpartition("/")[0])
        if isinstance(code, str):
            codes.setdefault(code, set()).add(job)
        for path in _paths(files_read):
            read.setdefault(path, set()).add(job)
    lines = []
    if sources:
        from_ = sorted(set(sources.values()))
        lines.append(f"{len(sources)} points reused (not run again) from sweep"
                     f"{'s' if len(from_) > 1 else ''} {', '.join(from_)}")  # fmt: skip
    if len(codes) > 1:
        each = ", ".join(f"{code} ({len(jobs)} points)" for code, jobs in sorted(codes.items()))
        lines.append(f"its points ran {len(codes)} different codes: {each}")
    if read:
        jobs_ = {job for each in read.values() for job in each}
        shown = sorted(read, key=lambda path: (-len(read[path]), path))
        more = f" and {len(shown) - 3} more" if len(shown) > 3 else ""
        lines.append(f"{len(jobs_)} points read files their experiment's inputs do not declare, "
                     f"so no answer of theirs is recorded for reuse: {', '.join(shown[:3])}"
                     f"{more} (experiment.inputs: [...] declares them)")  # fmt: skip
    return lines


def _paths(files_read) -> list[str]:
    """The files a row's files_read names (JSON: a list of paths)."""
    if not isinstance(files_read, str) or not files_read.startswith("["):
        return []
    try:
        found = json.loads(files_read)
    except ValueError:
        return []
    return [path for path in found if isinstance(path, str)] if isinstance(found, list) else []
