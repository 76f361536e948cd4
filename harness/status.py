"""python -m harness status SWEEP_ID: each point's state, from the store and the scheduler.

A point is ok, failed (with its error), killed, ... when its row has landed; pending or
running while SLURM queues or runs its task; killed when SLURM let it go without a row
(scancel, a time limit, a lost node; the log's slurmstepd line says which); and not run when
no launch of it is on record (an interrupted local sweep: resume it).
"""

from pathlib import Path

import pandas as pd
from submitit.core.utils import JobPaths

from harness import store
from harness.experiment import BadInput
from harness.launchers import ALIVE, lost_reason, slurm_states


def status(sweep_id: str, out: str = "outputs") -> int:
    """Print the sweep's points with their states; the exit code is 0 (2 for an unknown id)."""
    results = Path(out).resolve() / "results"
    experiment = find_experiment(results, sweep_id)
    manifest = store.read_manifest(results, experiment, sweep_id)
    if manifest is None:
        raise BadInput(f"sweep {sweep_id} has no readable manifest ({store.MANIFEST}) in {results}")
    rows = store.as_planned(store.read(results, experiment, sweep_id), manifest, results)
    table = point_states(manifest, rows)
    print(f"sweep {sweep_id} ({experiment}): {manifest.get('command', '')}")
    print(table.to_markdown(index=False))
    print(", ".join(f"{n} {state}" for state, n in table["state"].value_counts().items()))
    return 0


def find_experiment(results: Path, sweep_id: str) -> str:
    experiment = store.experiment_of(results, sweep_id)
    if experiment is None:
        raise BadInput(f"no sweep {sweep_id} in {results}")
    return experiment


def still_scheduled(manifest: dict) -> list[int]:
    """The jobs that SLURM still queues or runs, by the manifest's launches."""
    states = _scheduled(manifest)
    return [job for job, (state, _) in states.items() if state in ("pending", "running")]


def point_states(manifest: dict, rows: pd.DataFrame) -> pd.DataFrame:
    """One line per point of the manifest: job, its grid values, state, detail."""
    landed = {} if rows.empty else {job: part for job, part in rows.groupby("job")}
    scheduled = _scheduled(manifest)
    lines = []
    for point in manifest["points"]:
        job = point["job"]
        state, detail = scheduled.get(job, ("not run", ""))
        if job in landed and not state.startswith(("pending", "running")):
            state, detail = _landed(landed[job])
        grid_values = " ".join(point["overrides"]) or "(the only point)"
        lines.append({"job": job, "point": grid_values, "state": state, "detail": detail})
    return pd.DataFrame(lines, columns=["job", "point", "state", "detail"])


def _landed(rows: pd.DataFrame) -> tuple[str, str]:
    bad = rows[rows["status"] != "ok"]
    if bad.empty:
        return "ok", ""
    first = bad.iloc[0]
    return first["status"], "" if pd.isna(first.get("error")) else str(first["error"])


def _scheduled(manifest: dict) -> dict[int, tuple[str, str]]:
    """job -> (state, detail) for the points of the latest SLURM launch of each of them."""
    tasks, folders = {}, {}
    for launch in manifest.get("launches", []):
        for task, job in launch["slurm_tasks"].items():
            tasks[job] = task
            folders[job] = launch["submitit_folder"]
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
