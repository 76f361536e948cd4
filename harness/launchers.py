"""Submitit launchers for sweeps: SLURM job arrays, or parallel processes on this machine.

They are hydra-submitit-launcher's launchers, so each job recomposes its config and runs
through Hydra's run_job, plus what a sweep needs: submitting without waiting (wait=false),
job numbers that are the sweep's own (a resumed subset keeps them), grids larger than the
cluster's MaxArraySize as several arrays that run one after another (so array_parallelism
still caps the whole sweep), and here, a cap on the points running at once, each with a GPU
of its own where there are GPUs.
"""

import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import submitit
from hydra.core.singleton import Singleton
from hydra.core.utils import setup_globals
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher
from omegaconf import OmegaConf

from harness.experiment import with_type
from harness.inprocess import InProcess

POLL_S = 0.5
GRACE_S = 5.0  # how long a job may be gone from the queue before its result file appears
SLURM_DEFAULT_MAX_ARRAY_SIZE = 1001
# Pending reasons that no time will clear: the job asks for what its partition cannot give.
NEVER = {"PartitionConfig", "BadConstraints", "PartitionNodeLimit", "PartitionTimeLimit",
         "InvalidAccount", "InvalidQOS", "DependencyNeverSatisfied"}  # fmt: skip
NEVER_GRACE_S = 30.0  # how long such a reason may stand before the wait gives the job up
# A local point's CUDA_VISIBLE_DEVICES: its GPU, or this process's own value (UNSET: none) when
# it gets no GPU of its own; submitit's local executor would make that "", which hides them all.
GPU_ENV, UNSET = "HARNESS_POINT_GPU", "<unset>"
SWEEP_ENV = "HARNESS_SWEEP_PROCESS"  # a local point's sweep process (process_identity)
FOLLOW_S = 1.0  # how often a local point looks whether its sweep's process is still there
ALIVE = {
    "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING",
    "STAGE_OUT", "RESIZING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD",
}  # fmt: skip


class SubmititSweepLauncher(BaseSubmititLauncher):
    """A launcher whose jobs carry the sweep's job numbers and can be left to run."""

    def __call__(self, pack: list[tuple[list[str], int, dict]], singleton_state: dict) -> list:
        """In the job: its GPU, as many threads as CPUs it was given (torch's and OpenMP's, for
        the processes it starts too: points that share a machine with threads for every core
        each would make each other many times slower), then the points of its pack (their
        overrides, job numbers and planned params) one after another, as Hydra's basic
        launcher runs them here (harness.inprocess); their summaries. A store that cannot be
        written ends the pack: each point left says so (store_error), and the sweep stops."""
        _end_with_the_sweep(os.environ.pop(SWEEP_ENV, None))
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
        Singleton.set_state(singleton_state)
        setup_globals()
        if not InProcess.suits(self.config):  # Hydra's own job, a composition per point
            hydras = super().__call__
            return [returned(hydras(o, "hydra.sweep.dir", n, str(n), singleton_state))
                    for o, n, _ in pack]  # fmt: skip
        runner, summaries = InProcess(self.config, self.task_function), []
        for overrides, job, planned in pack:
            try:
                summaries.append(runner.run(overrides, job, planned))
            except OSError as error:
                said = f"harness error: the store cannot be written ({with_type(error)})"
                failed = {"status": "failed", "error": said, "store_error": True}
                return summaries + [failed] * (len(pack) - len(summaries))
        return summaries

    def job_threads(self) -> int | None:
        """The CPUs a job may use; None: leave torch's default."""
        return self.params.get("cpus_per_task")

    def executor(self) -> submitit.Executor:
        """The executor hydra-submitit-launcher would build from these parameters."""
        params = dict(self.params)
        executor = submitit.AutoExecutor(
            cluster=self._EXECUTOR,
            folder=params.pop("submitit_folder"),
            **{f"{self._EXECUTOR}_max_num_timeout": params.pop("max_num_timeout", 0)},
        )
        shared = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(
            **{k if k in shared else f"{self._EXECUTOR}_{k}": v for k, v in params.items()}
        )
        return executor

    @staticmethod
    def job_arguments(pack: list[tuple[list[str], int, dict]]) -> tuple:
        """What each job's __call__ receives: its points (overrides, job, planned point), and
        Hydra's state."""
        return [(list(o), job, planned) for o, job, planned in pack], Singleton.get_state()


class SlurmLauncher(SubmititSweepLauncher):
    """One job array per sweep (several, chained, beyond MaxArraySize); one GPU per task, and
    points_per_task points run one after another in each task (cheap points: many per task,
    rather than an interpreter start each)."""

    _EXECUTOR = "slurm"

    def __init__(self, points_per_task: int = 1, **params):
        for key in ("partition", "account"):
            params[key] = self.default(params, key)
        self.points_per_task = points_per_task
        super().__init__(**params)

    @staticmethod
    def default(params: dict, key: str) -> str | None:
        """partition or account: as set, else from $HARNESS_SLURM_PARTITION or _ACCOUNT."""
        return params.get(key) or os.environ.get(f"HARNESS_SLURM_{key.upper()}")

    def job_threads(self) -> int | None:
        return int(os.environ.get("SLURM_CPUS_PER_TASK", 0)) or super().job_threads()

    def submit(self, pairs: list[tuple[list[str], int, dict]]) -> dict[int, tuple]:
        """Submit the points (their overrides, job numbers, planned points), points_per_task to
        an array task; each job's task (a submitit job) and its position in that task's pack."""
        executor, size = self.executor(), max_array_size()
        each = self.points_per_task
        packs = [pairs[i : i + each] for i in range(0, len(pairs), each)]
        submitted: list[submitit.Job] = []
        for start in range(0, len(packs), size):
            if submitted:  # the next array starts when the previous one has ended
                dependency = f"afterany:{submitted[-1].job_id.split('_')[0]}"
                executor.update_parameters(slurm_dependency=dependency)
            arguments = [self.job_arguments(pack) for pack in packs[start : start + size]]
            submitted += executor.map_array(self, *zip(*arguments, strict=True))
        return {
            job: (handle, position)
            for handle, pack in zip(submitted, packs, strict=True)
            for position, (_, job, _) in enumerate(pack)
        }


class LocalLauncher(SubmititSweepLauncher):
    """Points in parallel processes here: at most max_parallel at once, each with its own GPU.

    gpus are positions among the GPUs this process sees (as torch numbers them: cuda:0 is the
    first entry of CUDA_VISIBLE_DEVICES); each point's CUDA_VISIBLE_DEVICES is that entry, an
    index or a UUID, as this process's own names it."""

    _EXECUTOR = "local"

    def __init__(self, max_parallel: int = 2, gpus: Sequence[int] | None = None, **params):
        if max_parallel < 1:
            raise ValueError(f"max_parallel must be at least 1, got {max_parallel}")
        visible = visible_gpus()
        self.gpus = visible if gpus is None else [visible[position] for position in gpus]
        self.max_parallel = min(max_parallel, len(self.gpus)) if self.gpus else max_parallel
        super().__init__(**params)

    def job_threads(self) -> int:
        """cpus_per_task, else this machine's CPUs shared by the points that run at once."""
        return super().job_threads() or max(1, len(os.sched_getaffinity(0)) // self.max_parallel)

    def executor(self) -> submitit.LocalExecutor:
        """submitit's local executor itself: its visible_gpus is not an AutoExecutor parameter."""
        params = dict(self.params)
        executor = submitit.LocalExecutor(
            folder=params.pop("submitit_folder"), max_num_timeout=params.pop("max_num_timeout", 0)
        )
        local = ("timeout_min", "gpus_per_node", "tasks_per_node", "stderr_to_stdout", "setup")
        executor.update_parameters(**{k: v for k, v in params.items() if k in local and v})
        return executor

    def run(self, points: list[tuple[list[str], int, dict]]) -> Iterator[tuple]:
        """Run the points (their overrides, job numbers, planned points); yield (job number,
        submitit job, None) as each one ends. If the sweep stops (Ctrl-C, SIGTERM), the points
        still running are cancelled with it; if its process dies (SIGKILL), they end too."""
        executor, free, waiting = self.executor(), list(self.gpus), list(points)
        running: dict[int, tuple[submitit.Job, int | None]] = {}
        try:
            while waiting or running:
                while waiting and len(running) < self.max_parallel:
                    point = waiting.pop(0)
                    gpu = free.pop(0) if self.gpus else None
                    own = os.environ.get("CUDA_VISIBLE_DEVICES", UNSET)
                    with (
                        _output_to(self.controller_log()),
                        _environment(GPU_ENV, gpu or own),
                        _environment(SWEEP_ENV, process_identity(os.getpid())),
                    ):
                        handle = executor.submit(self, *self.job_arguments([point]))
                    running[point[1]] = handle, gpu
                done = [job for job, (handle, _) in running.items() if handle.done()]
                for job in done:
                    handle, gpu = running.pop(job)
                    if gpu is not None:
                        free.append(gpu)
                    yield job, handle, None
                if not done:
                    time.sleep(POLL_S)
        finally:
            for handle, _ in running.values():
                handle.cancel(check=False)  # its controller stops the point's process

    def controller_log(self) -> Path:
        """Where submitit's local controllers write (their own tracebacks on Ctrl-C among it),
        beside the jobs' logs rather than on the sweep's terminal."""
        return Path(self.params["submitit_folder"]).parent / "controllers.log"


def process_identity(pid: int) -> str | None:
    """ "PID:START": a process and its start time (in clock ticks since boot, /proc's), which
    a reused pid does not share; None when the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return f"{pid}:{stat.rpartition(')')[2].split()[19]}"


def _end_with_the_sweep(identity: str | None) -> None:
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


@contextmanager
def _environment(name: str, value: str) -> Iterator[None]:
    """os.environ[name] = value while the block starts processes, which inherit it; submitit's
    own visible_gpus takes integers only, and UUIDs are not."""
    os.environ[name] = value
    try:
        yield
    finally:
        del os.environ[name]


@contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """File descriptors 1 and 2 of this process, and so of the processes it starts meanwhile,
    go to `path` (appended)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(path, "a") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in zip((1, 2), saved, strict=True):
                os.dup2(copy, fd)
                os.close(copy)


# What each launcher setting may be: a positive integer, a count (0 or more), a positive number,
# each also null where the preset allows it.
POSITIVE_INT = ("max_parallel", "array_parallelism", "tasks_per_node", "nodes", "timeout_min",
                "points_per_task")  # fmt: skip
COUNT = ("signal_delay_s", "max_num_timeout")
OPTIONAL_POSITIVE_INT = ("cpus_per_task",)
OPTIONAL_COUNT = ("gpus_per_node",)
OPTIONAL_POSITIVE = ("mem_gb",)
# SLURM may send the warning before the time limit (--signal, signal_delay_s) up to a minute
# before it is due (sbatch(1)); a task needs some seconds before submitit's handler can take it,
# and a warning before that kills the task.
EARLY_WARNING_S, TASK_START_S = 60, 10


def check_settings(settings: dict) -> None:
    """One ValueError line for a launcher setting that cannot work (hydra.launcher.KEY=VALUE),
    before anything is planned or submitted."""
    for key, value in settings.items():
        if value is None and key in OPTIONAL_POSITIVE_INT + OPTIONAL_COUNT + OPTIONAL_POSITIVE:
            continue
        whole = isinstance(value, int) and not isinstance(value, bool)
        number = whole or isinstance(value, float)
        if key in POSITIVE_INT + OPTIONAL_POSITIVE_INT and not (whole and value >= 1):
            raise ValueError(f"{key} must be a whole number of 1 or more, got {value!r}")
        if key in COUNT + OPTIONAL_COUNT and not (whole and value >= 0):
            raise ValueError(f"{key} must be a whole number of 0 or more, got {value!r}")
        if key in OPTIONAL_POSITIVE and not (number and value > 0):
            raise ValueError(f"{key} must be a number above 0, got {value!r}")
    limit, delay = settings.get("timeout_min"), settings.get("signal_delay_s")
    if limit is not None and delay is not None:  # SLURM's warning before its time limit
        room = limit * 60 - EARLY_WARNING_S - TASK_START_S
        if delay > room:
            fix = f"signal_delay_s at most {room}" if room >= 0 else "a timeout_min of 2 or more"
            raise ValueError(
                f"signal_delay_s={delay} with timeout_min={limit}: SLURM may send its warning up "
                f"to {EARLY_WARNING_S} s before it is due, before a task can take it; use {fix}"
            )
    gpus = settings.get("gpus")
    if gpus is not None:
        shown = visible_gpus()
        if not all(isinstance(g, int) and not isinstance(g, bool) for g in gpus):
            raise ValueError(f"gpus must be GPU indices, got {gpus!r}")
        unknown = [g for g in gpus if not 0 <= g < len(shown)]
        if unknown or len(set(gpus)) != len(gpus):
            said = ", ".join(f"{i} ({gpu})" for i, gpu in enumerate(shown)) or "none"
            raise ValueError(f"gpus {gpus} are not distinct GPUs of the ones visible here: {said}")


def returned(result) -> dict:
    """A Hydra JobReturn as a point summary; an exception in it is the harness's."""
    try:
        return result.return_value
    except Exception as error:
        return {"status": "failed", "error": f"harness error: {with_type(error)}"}


def wait(handles: dict[int, submitit.Job]) -> Iterator[tuple[int, submitit.Job, str | None]]:
    """(job number, submitit job, why it was lost or None) for each SLURM job as it ends.

    A job has ended when its result file exists, or when SLURM no longer runs or queues it:
    killed (scancel, time limit, a failed node) before it could write one. Without accounting,
    submitit cannot tell the second case, so this asks squeue (and never calls sacct).
    A job pending for a reason that cannot clear by itself (NEVER: the partition cannot run
    it) for NEVER_GRACE_S is cancelled and ends too, with that reason.
    """
    left, gone_since, stuck_since = dict(handles), {}, {}
    while left:
        states = slurm_states({handle.job_id.split("_")[0] for handle in left.values()})
        for job, handle in list(left.items()):
            if handle.paths.result_pickle.exists():
                yield job, left.pop(job), None
                continue
            state = states.get(handle.job_id) if states is not None else ("UNKNOWN", "")
            if state is not None and state[0] == "PENDING" and state[1] in NEVER:
                if time.monotonic() - stuck_since.setdefault(job, time.monotonic()) > NEVER_GRACE_S:
                    subprocess.run(["scancel", handle.job_id], capture_output=True, timeout=60)
                    yield job, left.pop(job), f"SLURM would never start it: pending ({state[1]})"
            elif state is not None and state[0] in ALIVE | {"UNKNOWN"}:
                gone_since.pop(job, None)
                stuck_since.pop(job, None)
            elif time.monotonic() - gone_since.setdefault(job, time.monotonic()) > GRACE_S:
                yield job, left.pop(job), lost_reason(state, handle.paths.stderr)
        if left:
            time.sleep(POLL_S)


def check_fits(settings: dict) -> None:
    """ValueError naming the setting when no node of the partition could ever run one task:
    more CPUs, memory or GPUs than any node has (as sinfo reports them). Silent when sinfo
    cannot tell."""
    nodes = partition_nodes(settings.get("partition"))
    if not nodes:
        return
    tasks = settings.get("tasks_per_node") or 1
    asks = {
        "cpus_per_task": ((settings.get("cpus_per_task") or 1) * tasks, "CPUs"),
        "mem_gb": ((settings.get("mem_gb") or 0) * 1024, "MB of memory"),
        "gpus_per_node": (settings.get("gpus_per_node") or 0, "GPUs"),
    }
    for key, (wanted, what) in asks.items():
        most = max(node[what] for node in nodes)
        if wanted > most:
            name = settings.get("partition") or "the default partition"
            raise ValueError(
                f"{key}={settings[key]} asks for {wanted:,.0f} {what} a task, and no node of "
                f"{name} has more than {most:,}: lower hydra.launcher.{key}"
            )


def partition_nodes(partition: str | None) -> list[dict]:
    """The CPUs, memory (MB) and GPUs of each node of the partition (or of the default one),
    from sinfo; [] if sinfo cannot run; ValueError if it runs but no cluster answers."""
    command = ["sinfo", "-h", "-N", "-o", "%P|%c|%m|%G"]
    try:
        listed = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if listed.returncode != 0:  # installed, but no cluster answers: sbatch would fail too
        said = [line for line in listed.stderr.splitlines() if line.strip()] or ["no reason"]
        raise ValueError(f"SLURM does not answer here (sinfo: {said[-1].strip()})")
    nodes = []
    for line in listed.stdout.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 4 or not all(f.rstrip("+").isdigit() for f in fields[1:3]):
            continue  # not a node line
        name, cpus, memory, gres = fields
        if (partition is None and name.endswith("*")) or name.rstrip("*") == partition:
            nodes.append({"CPUs": int(cpus.rstrip("+")), "MB of memory": int(memory.rstrip("+")),
                          "GPUs": gpu_count(gres)})  # fmt: skip
    return nodes


def gpu_count(gres: str) -> int:
    """The GPUs in sinfo's %G: gpu:2, gpu:a100:4(S:0-1), several comma-separated, or (null)."""
    total = 0
    for item in gres.split(","):
        fields = re.sub(r"\(.*?\)", "", item).split(":")
        if fields[0] == "gpu" and fields[-1].isdigit():
            total += int(fields[-1])
    return total


def slurm_states(arrays: set[str]) -> dict[str, tuple[str, str]] | None:
    """{"12_3": ("RUNNING", "None"), ...} for every task squeue still knows; None if it failed.

    Ended jobs stay listed (state COMPLETED, CANCELLED, TIMEOUT, ...) for MinJobAge seconds,
    then vanish; squeue calls an id it no longer knows invalid.
    """
    states: dict[str, tuple[str, str]] = {}
    for array in sorted(arrays):
        try:
            result = subprocess.run(
                ["squeue", "-h", "-r", "-t", "all", "-j", array, "-o", "%i|%T|%r"],
                capture_output=True,
                text=True,
                timeout=60,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        if result.returncode != 0 and "Invalid job id" not in result.stderr:
            return None
        for line in result.stdout.splitlines():
            task, state, reason = line.strip().split("|", 2)
            states[task] = (state, reason)
    return states


def lost_reason(state: tuple[str, str] | None, stderr_log) -> str:
    """Why a job ended without a result: SLURM's state and the log's slurmstepd line."""
    said = f"SLURM {state[0].lower()} ({state[1]})" if state else "gone from SLURM's queue"
    try:
        lines = stderr_log.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    notes = [line.strip() for line in lines if "***" in line or "slurmstepd" in line]
    return said + (f": {notes[-1]}" if notes else "")


def visible_gpus() -> list[str]:
    """The GPUs this process may use, in torch's order (entry i is cuda:i), each named as a
    child's CUDA_VISIBLE_DEVICES must name it: CUDA_VISIBLE_DEVICES's own entries (indices,
    GPU-... or MIG-... UUIDs) where it is set, else nvidia-smi's indices; without CUDA here.

    As CUDA reads the variable, the list ends at an empty or negative entry ("-1": none)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        entries = [entry.strip() for entry in listed.split(",")]
        return list(itertools.takewhile(lambda e: e and not e.startswith("-"), entries))
    if shutil.which("nvidia-smi") is None:
        return []
    result = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return [str(i) for i in range(len(re.findall(r"^GPU \d+", result.stdout, re.MULTILINE)))]


def max_array_size() -> int:
    """The cluster's MaxArraySize: how many tasks one array may have (its indices start at 0)."""
    try:
        config = subprocess.run(
            ["scontrol", "show", "config"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return SLURM_DEFAULT_MAX_ARRAY_SIZE
    found = re.search(r"^MaxArraySize\s*=\s*(\d+)", config, re.MULTILINE)
    return int(found.group(1)) if found else SLURM_DEFAULT_MAX_ARRAY_SIZE
