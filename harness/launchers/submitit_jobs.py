"""What the submitit launchers (local, slurm) share: hydra-submitit-launcher's launcher (its
setup, and the checkpoint through which submitit requeues a job), the executor its parameters
describe, and what each submitit job runs: its GPU and threads set first, then its pack of
points (harness.launchers.in_process.work), each job number the sweep's own (a resumed subset keeps
them). With tasks_per_node (and nodes) above 1, each job's tasks are one point's processes
(harness.running.distributed), which meet before the point runs.
"""

import os
import signal
import sys
import threading
import time
from pathlib import Path

import submitit
from hydra.core.singleton import Singleton
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher
from omegaconf import OmegaConf
from submitit.core.utils import UncompletedJobError

from harness.errors import with_type
from harness.launchers.in_process import InProcess, work
from harness.launchers.protocol import Job, Launcher, PointProcess, check_kinds
from harness.pinning import codestore
from harness.running import distributed

# A local point's CUDA_VISIBLE_DEVICES: its GPU, or this process's own value (UNSET: none) when
# it gets no GPU of its own; submitit's local executor would make that "", which hides them all.
GPU_ENV, UNSET = "HARNESS_POINT_GPU", "<unset>"
SWEEP_ENV = "HARNESS_SWEEP_PROCESS"  # a local point's sweep process (process_identity)
FOLLOW_S = 1.0  # how often a local point looks whether its sweep's process is still there
KINDS = {"timeout_min": "positive", "tasks_per_node": "positive", "nodes": "positive",
         "cpus_per_task": "positive?", "gpus_per_node": "count?", "mem_gb": "number?",
         "max_num_timeout": "count", "group_timeout_s": "positive"}  # fmt: skip
OWN = ("group_timeout_s",)  # the harness's settings among the launcher's, not submitit's


class SubmititLauncher(BaseSubmititLauncher, Launcher):
    """A launcher whose jobs are submitit jobs running packs of the sweep's points."""

    _EXECUTOR = "abstract"
    boots = True  # its jobs' processes start from the sweep's snapshot (python_command)

    @classmethod
    def preflight(cls, settings: dict) -> None:
        check_kinds(settings, KINDS)
        tasks, gpus = settings.get("tasks_per_node", 1), settings.get("gpus_per_node")
        if gpus and gpus < tasks:  # two processes on one GPU: NCCL refuses it
            raise ValueError(
                f"tasks_per_node={tasks} with gpus_per_node={gpus}: each process needs a GPU of "
                f"its own: gpus_per_node={tasks} (or 0 to run on the CPU)"
            )
        if tasks * settings.get("nodes", 1) > 1 and settings.get("points_per_task", 1) > 1:
            raise ValueError("a point of several processes (tasks_per_node, nodes) runs alone in "
                             "its task: points_per_task must be 1")  # fmt: skip

    def __call__(self, pack: list[Job], singleton_state: dict) -> list[dict]:
        """In the job: its GPU, as many threads as CPUs it was given (torch's and OpenMP's, for
        the processes it starts too: points that share a machine with threads for every core
        each would make each other many times slower), then its pack's points one after
        another; their summaries."""
        end_with_the_sweep(os.environ.pop(SWEEP_ENV, None))
        gpu = os.environ.pop(GPU_ENV, None)
        if gpu == UNSET:  # before anything here initializes CUDA
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        elif gpu is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = gpu
        threads = self.job_threads()
        if threads:
            import torch

            os.environ["OMP_NUM_THREADS"] = str(threads)
            torch.set_num_threads(threads)
        waited = self.params.get("group_timeout_s") or distributed.TIMEOUT_S
        distributed.start(local=self._EXECUTOR == "local", timeout_s=waited)
        try:
            return work(self.config, self.task_function, pack, singleton_state)
        finally:
            distributed.end()

    def job_threads(self) -> int | None:
        """The CPUs a job may use; None: leave torch's default."""
        return self.params.get("cpus_per_task")

    def point_process(self) -> PointProcess | None:
        """A point's process: this machine's environment with its threads for OpenMP too (as
        __call__ sets them), where this process can tell (runs_here) and neither setup lines
        nor Hydra (its env_set, callbacks, chdir: in_process.InProcess.suits) change it; None
        for points of several processes."""
        if self.params.get("tasks_per_node", 1) * self.params.get("nodes", 1) > 1:
            return None
        threads = self.params.get("cpus_per_task") or self.job_threads()
        setup = self.params.get("setup")
        if not threads or setup or not InProcess.suits(self.config) or not self.runs_here():
            return PointProcess()
        return PointProcess({**os.environ, "OMP_NUM_THREADS": str(threads)}, threads)

    def runs_here(self) -> bool:
        """Whether its points run on this machine, as this process's environment has it."""
        return True

    def executor(self) -> submitit.Executor:
        """The executor hydra-submitit-launcher would build from these parameters."""
        params = {k: v for k, v in self.params.items() if k not in OWN}
        executor = submitit.AutoExecutor(
            cluster=self._EXECUTOR,
            folder=params.pop("submitit_folder"),
            **{f"{self._EXECUTOR}_max_num_timeout": params.pop("max_num_timeout", 0)},
            **{f"{self._EXECUTOR}_python": python_command()},
        )
        shared = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(
            **{k if k in shared else f"{self._EXECUTOR}_{k}": v for k, v in params.items()}
        )
        return executor

    @staticmethod
    def job_arguments(pack: list[Job]) -> tuple:
        """What each job's __call__ receives: its points and Hydra's state."""
        return list(pack), Singleton.get_state()


def python_command() -> str | None:
    """How a job's process starts: from the snapshot of the code this process runs, checked
    first (harness.pinning.boot), however long the job queues; None: as this process did."""
    code = codestore.running()
    return codestore.boot_command(*code) if code else None


def outcome(handle: submitit.Job, lost: str | None, position: int) -> dict:
    """The summary of the point at `position` in a submitit job's pack: what the job returned
    for it, or why it returned nothing."""
    if lost:
        return {"status": "killed", "error": lost}
    try:  # a point of several processes: its rank 0's summary (harness.running.distributed)
        return handle.task(0).result()[position]
    except UncompletedJobError as error:
        return {"status": "killed", "error": with_type(error)}
    except Exception as error:  # the job's process failed outside the task function
        return {"status": "failed", "error": with_type(error)}


def process_identity(pid: int) -> str | None:
    """ "PID:START": a process and its start time (in clock ticks since boot, /proc's), which
    a reused pid does not share; None when the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return f"{pid}:{stat.rpartition(')')[2].split()[19]}"


def end_with_the_sweep(identity: str | None) -> None:
    """In a point's process under the local launcher: end it, as its sweep's own process does
    on Ctrl-C, when that process is gone (SIGKILL: nothing could stop the point), so that no
    point runs on beside the resume's rerun of it."""
    if not identity:
        return
    pid = int(identity.split(":")[0])

    def follow() -> None:
        while process_identity(pid) == identity:
            time.sleep(FOLLOW_S)
        print(f"the sweep's process {pid} is gone: this point ends", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=follow, name="end-with-the-sweep", daemon=True).start()
