"""python -m harness status SWEEP_ID: each point's state, from the store and the scheduler.

A point is ok, failed (with its error), killed, ... when its row has landed; pending or
running while SLURM queues or runs its task; killed when SLURM let it go without a row
(scancel, a time limit, a lost node; the log's slurmstepd line says which); and not run when
no launch of it is on record (an interrupted local sweep: resume it).
"""

import sys
from pathlib import Path

import pandas as pd
from submitit.core.utils import JobPaths

from harness import store
from harness.config import command
from harness.experiment import BadInput, shorten
from harness.job import describe
from harness.launchers import ALIVE, lost_reason, slurm_states


def status(sweep_id: str, out: str = "outputs") -> int:
    """Print the sweep's points with their states; the exit code is 0 (2 for an unknown id)."""
    results = Path(out).resolve() / "results"
    experiment = find_experiment(results, sweep_id)
    manifest = store.read_manifest(results, experiment, sweep_id)
    if manifest is None:
        raise BadInput(f"sweep {sweep_id} has no readable manifest ({store.MANIFEST}) in {results}")
    if compact_if_finished(results, experiment, sweep_id, manifest):
        print(f"sweep {sweep_id} has ended: its files are compacted into one")
    rows = store.as_planned(store.read(results, experiment, sweep_id), manifest, results)
    table = point_states(manifest, rows, results)
    print(f"sweep {sweep_id} ({experiment}): {manifest.get('command', '')}")
    print(pipe_table(table.assign(detail=table["detail"].map(shorten))))
    print(", ".join(f"{n} {state}" for state, n in table["state"].value_counts().items()))
    unfinished = ~table["state"].isin(store.DONE)
    if not unfinished.any() or table["state"].isin(["pending", "running"]).any():
        return 0
    config_dirs = [Path(folder) for folder in manifest.get("config_dirs") or []]
    arguments = [f"+experiment={experiment}", f"resume={sweep_id}"]
    print(f"finish it with: {command(arguments, config_dirs, results.parent)}")
    return 0


def compact_if_finished(results: Path, experiment: str, sweep: str, manifest: dict | None) -> bool:
    """Compact a sweep whose points have all ended (each has rows, and SLURM runs none of them)
    and that is not compacted yet, so that reading it is one file; whether it compacted now.
    A sweep with points still to come (or without a manifest) is left as it is."""
    if manifest is None or len(store.result_files(results, experiment, sweep)) <= 1:
        return False
    landed = store.jobs_with_rows(results, experiment, sweep)
    if any(point["job"] not in landed for point in manifest["points"]):
        return False
    if still_scheduled(manifest):
        return False
    try:
        _, absorbed = store.compact(results, experiment, sweep)
    except OSError as error:  # read-only, full: reading it file by file still works
        print(f"warning: could not compact sweep {sweep}: {error}", file=sys.stderr)
        return False
    return bool(absorbed)


def pipe_table(table: pd.DataFrame) -> str:
    """A table of text as a Markdown pipe table, columns padded to their widest cell: what
    to_markdown prints, without its per-cell type guessing (a second for 10,000 points)."""
    cells = [list(map(str, table.columns))] + table.astype(str).values.tolist()
    widths = [max(len(row[i]) for row in cells) for i in range(len(table.columns))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
             for row in cells]  # fmt: skip
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def find_experiment(results: Path, sweep_id: str) -> str:
    experiment = store.experiment_of(results, sweep_id)
    if experiment is None:
        raise BadInput(f"no sweep {sweep_id} in {results}")
    return experiment


def still_scheduled(manifest: dict) -> list[int]:
    """The jobs that SLURM still queues or runs, by the manifest's launches."""
    states = _scheduled(manifest)
    return [job for job, (state, _) in states.items() if state in ("pending", "running")]


def point_states(manifest: dict, rows: pd.DataFrame, results: Path) -> pd.DataFrame:
    """One line per point of the manifest: job, its grid values, state, detail."""
    landed, scheduled = _landed(rows, manifest, results), _scheduled(manifest)
    packed = {job for job, task in _tasks(manifest).items() if len(task[2]) > 1}
    lines = []
    for point in manifest["points"]:
        job = point["job"]
        state, detail = scheduled.get(job, ("not run", ""))
        # A point's rows tell its state once its task ends, or once it is done within a task
        # that runs other points after it (points_per_task). A training point's rows while it
        # runs add its latest step to what SLURM says.
        if job in landed:
            row_state, row_detail = landed[job]
            if row_state == store.RUNNING and job in scheduled:
                detail = f"{detail}; {row_detail}"
            elif job in packed or not state.startswith(("pending", "running")):
                state, detail = landed[job]
        grid_values = " ".join(point["overrides"]) or "(the only point)"
        lines.append({"job": job, "point": grid_values, "state": state, "detail": detail})
    return pd.DataFrame(lines, columns=["job", "point", "state", "detail"])


def _landed(rows: pd.DataFrame, manifest: dict, results: Path) -> dict[int, tuple[str, str]]:
    """job -> (state, detail) of each job with rows: ok, or its first other row's status and
    error; for a training job still running, its latest row's numbers and their age, and for
    one whose process is gone without ending it (its running mark let go), killed."""
    if rows.empty:
        return {}
    states = dict.fromkeys(rows["job"].tolist(), ("ok", ""))
    bad = rows[rows["status"] != "ok"].drop_duplicates("job")
    errors = bad["error"] if "error" in bad else pd.Series(None, index=bad.index)
    for job, status, error in zip(bad["job"], bad["status"], errors, strict=True):
        states[job] = (status, "" if pd.isna(error) else str(error))
    params = {point["job"]: point.get("params", {}) for point in manifest["points"]}
    latest = rows[rows["status"] == store.RUNNING].drop_duplicates("job", keep="last")
    for row in latest.to_dict("records"):
        row = {k: v for k, v in row.items() if not (isinstance(v, float) and pd.isna(v))}
        said = describe(row, params.get(row["job"], {}))
        age = pd.Timestamp.now(tz="UTC") - row["started_at"] - pd.Timedelta(row["duration_s"], "s")
        said = f"{said} ({age.total_seconds():.0f} s ago)"
        path = store.job_file(results, manifest["experiment"], manifest["sweep"], row["job"])
        if store.still_running(path) is False:
            states[row["job"]] = ("killed", f"its process is gone; it last logged {said}")
        else:
            states[row["job"]] = (store.RUNNING, said)
    return states


def _tasks(manifest: dict) -> dict[int, tuple[str, str, list[int]]]:
    """job -> (SLURM task, submitit folder, the jobs of that task) by its latest launch."""
    placed = {}
    for launch in manifest.get("launches", []):
        for task, jobs in launch["slurm_tasks"].items():
            jobs = jobs if isinstance(jobs, list) else [jobs]  # older manifests: one job
            placed |= {job: (task, launch["submitit_folder"], jobs) for job in jobs}
    return placed


def _scheduled(manifest: dict) -> dict[int, tuple[str, str]]:
    """job -> (state, detail) for the points of the latest SLURM launch of each of them."""
    placed = _tasks(manifest)
    tasks = {job: task for job, (task, _, _) in placed.items()}
    folders = {job: folder for job, (_, folder, _) in placed.items()}
    if not tasks:
        return {}
    states = slurm_states({task.split("_")[0] for task in tasks.values()})
    if states is None:
        return {job: ("unknown", f"squeue failed; SLURM {task}") for job, task in tasks.items()}
    scheduled = {}
    for job, task in tasks.items():
        state = states.get(task)
        if state and state[0] in ALIVE:
            scheduled[job] = (state[0].lower(), f"SLURM {task} ({state[1]})")
        else:
            stderr = JobPaths(folders[job], job_id=task, task_id=0).stderr
            scheduled[job] = ("killed", f"{lost_reason(state, stderr)}; SLURM {task}")
    return scheduled
