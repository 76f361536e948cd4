"""hydra/launcher=slurm: the sweep as SLURM job arrays through submitit, one GPU per task.

points_per_task points run one after another in each array task (cheap points: many per task,
rather than an interpreter start each). A grid larger than the cluster's MaxArraySize becomes
several arrays, each waiting for the one before (afterany), so array_parallelism still caps the
whole sweep. The tasks run on without this process (detached: wait=false returns once they are
submitted), and their placement (task -> its jobs, the submitit folder) is what status reads.
"""

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import submitit
from submitit.core.utils import FailedJobError, JobPaths

from harness.launchers import slurm_cli
from harness.launchers.protocol import Job, check_kinds
from harness.launchers.submitit_jobs import SubmititLauncher, outcome

POLL_S = 0.5
GRACE_S = 5.0  # how long a task may be gone from the queue before its result file appears
NEVER_GRACE_S = 30.0  # how long a NEVER reason may stand before the wait gives the task up
# SLURM may send the warning before the time limit (--signal, signal_delay_s) up to a minute
# before it is due (sbatch(1)); a task needs some seconds before submitit's handler can take it,
# and a warning before that kills the task.
EARLY_WARNING_S, TASK_START_S = 60, 10


class SlurmLauncher(SubmititLauncher):
    _EXECUTOR = "slurm"
    detached = True

    def __init__(self, points_per_task: int = 1, **params):
        for key in ("partition", "account"):
            params[key] = params.get(key) or os.environ.get(f"HARNESS_SLURM_{key.upper()}")
        self.points_per_task = points_per_task
        self.submitted: dict[str, submitit.Job] = {}
        super().__init__(**params)

    @classmethod
    def preflight(cls, settings: dict) -> None:
        """The settings' kinds, the warning's room before the time limit, SLURM on this
        machine, and a partition with a node that could run one task."""
        super().preflight(settings)
        kinds = {"array_parallelism": "positive", "points_per_task": "positive",
                 "signal_delay_s": "count"}  # fmt: skip
        check_kinds(settings, kinds)
        _check_warning(settings.get("timeout_min"), settings.get("signal_delay_s"))
        if shutil.which("sbatch") is None:
            raise ValueError("slurm needs SLURM, and sbatch is not on this machine's PATH")
        partition = settings.get("partition") or os.environ.get("HARNESS_SLURM_PARTITION")
        slurm_cli.check_fits({**settings, "partition": partition})

    def job_threads(self) -> int | None:
        return int(os.environ.get("SLURM_CPUS_PER_TASK", 0)) or super().job_threads()

    def runs_here(self) -> bool:
        """Whether every node of its partition is this machine (a cluster of one node, here):
        only then can this process tell what a task gets (sbatch hands it this environment)."""
        return slurm_cli.only_this_machine(self.params.get("partition"))

    def start(self, jobs: list[Job]) -> dict:
        """Submit the jobs, points_per_task to an array task; their placement: each task's
        jobs (in pack order) and the submitit folder."""
        executor, size = self.executor(), slurm_cli.max_array_size()
        each = self.points_per_task
        packs = [jobs[i : i + each] for i in range(0, len(jobs), each)]
        submitted: list[submitit.Job] = []
        try:
            for first in range(0, len(packs), size):
                if submitted:  # the next array starts when the previous one has ended
                    dependency = f"afterany:{submitted[-1].job_id.split('_')[0]}"
                    executor.update_parameters(slurm_dependency=dependency)
                arguments = [self.job_arguments(pack) for pack in packs[first : first + size]]
                submitted += executor.map_array(self, *zip(*arguments, strict=True))
        except (FailedJobError, OSError) as error:
            said = [line for line in str(error).splitlines() if line.strip()] or [repr(error)]
            raise ValueError(f"cannot submit to SLURM: {said[-1].strip()}") from None
        self.submitted = {handle.job_id: handle for handle in submitted}
        arrays = sorted({handle.job_id.split("_")[0] for handle in submitted})
        print(f"submitted as SLURM job {', '.join(arrays)}", flush=True)
        tasks = {h.job_id: [s.job for s in p] for h, p in zip(submitted, packs, strict=True)}
        return {
            "tasks": tasks,
            "submitit_folder": str(Path(self.params["submitit_folder"]).absolute()),
        }

    def follow(self, jobs: list[Job], placement: dict) -> Iterator[tuple[int, dict]]:
        """(job number, summary) as each task ends: when its result file exists, or when SLURM
        no longer runs or queues it (killed: scancel, a time limit, a failed node) before it
        could write one. Without accounting submitit cannot tell the second case, so this asks
        squeue (slurm_cli.Queue: one call for every array, backed off), never sacct. A task
        pending for a reason that cannot clear by itself (slurm_cli.NEVER: the partition cannot
        run it) for NEVER_GRACE_S is cancelled and ends too, with that reason."""
        folder, queue = placement["submitit_folder"], slurm_cli.Queue()
        left = {task: self.submitted.get(task) or submitit.SlurmJob(folder, task)
                for task in placement["tasks"]}  # fmt: skip
        gone_since: dict[str, float] = {}
        stuck_since: dict[str, float] = {}
        while left:
            states = queue.states(set(left))
            for task, handle in list(left.items()):
                lost = _lost(task, handle, states, gone_since, stuck_since)
                if lost is not False:
                    del left[task]
                    for position, job in enumerate(placement["tasks"][task]):
                        yield job, outcome(handle, lost, position)
            if left:
                time.sleep(POLL_S)

    @classmethod
    def states(cls, placement: dict) -> dict[int, tuple[str, str]]:
        """Each job of the placement's tasks: pending or running while SLURM queues or runs its
        task, killed when SLURM let the task go (the log's slurmstepd line says why); unknown
        when squeue cannot tell."""
        tasks, folder = placement["tasks"], placement["submitit_folder"]
        states = slurm_cli.states(set(tasks))
        found = {}
        for task, jobs in tasks.items():
            state = states.get(task) if states is not None else None
            if states is None:
                said = ("unknown", f"squeue failed; SLURM {task}")
            elif state and state[0] in slurm_cli.ALIVE:  # squeue's reason None: none given
                reason = f" ({state[1]})" if state[1] not in ("", "None") else ""
                said = (state[0].lower(), f"SLURM {task}{reason}")
            else:
                stderr = JobPaths(folder, job_id=task, task_id=0).stderr
                said = ("killed", f"{slurm_cli.lost_reason(state, stderr)}; SLURM {task}")
            found |= dict.fromkeys(jobs, said)
        return found


def _check_warning(limit: int | None, delay: int | None) -> None:
    """SLURM's warning (signal_delay_s before the time limit) must leave a task room to start."""
    if limit is None or delay is None:
        return
    room = limit * 60 - EARLY_WARNING_S - TASK_START_S
    if delay > room:
        fix = f"signal_delay_s at most {room}" if room >= 0 else "a timeout_min of 2 or more"
        raise ValueError(
            f"signal_delay_s={delay} with timeout_min={limit}: SLURM may send its warning up to "
            f"{EARLY_WARNING_S} s before it is due, before a task can take it; use {fix}"
        )


def _lost(task: str, handle, states, gone_since: dict, stuck_since: dict):
    """False while the task may still end with its result; None once it has its result; else
    why it ended without one."""
    if handle.paths.result_pickle.exists():
        return None
    state = states.get(task) if states is not None else ("UNKNOWN", "")
    now = time.monotonic()
    if state is not None and state[0] == "PENDING" and state[1] in slurm_cli.NEVER:
        if now - stuck_since.setdefault(task, now) > NEVER_GRACE_S:
            slurm_cli.cancel(task)
            return f"SLURM would never start it: pending ({state[1]})"
        return False
    if state is not None and state[0] in slurm_cli.ALIVE | {"UNKNOWN"}:
        gone_since.pop(task, None)
        stuck_since.pop(task, None)
        return False
    if now - gone_since.setdefault(task, now) > GRACE_S:
        return slurm_cli.lost_reason(state, handle.paths.stderr)
    return False
