"""hydra/launcher=local: points in parallel processes here, at most max_parallel at once, each
with a GPU of its own where there are GPUs: max_parallel warm workers that run the points one
after another (harness.launchers.workers). With fresh=true (or `fresh: true` in the experiment's
own experiment block), or tasks_per_node=N above 1 (each point as N processes,
harness.running.distributed, with N GPUs where there are GPUs), each point is a process of its own
(submitit's local executor), as an experiment that leaks state may need.

gpus are positions among the GPUs this process sees (as torch numbers them: cuda:0 is the first
entry of CUDA_VISIBLE_DEVICES); each point's CUDA_VISIBLE_DEVICES is that entry, an index or a
UUID, as this process's own names it. Its points end with the sweep: Ctrl-C and SIGTERM cancel
them, and one whose sweep's process is killed outright ends by itself (end_with_the_sweep).
"""

import itertools
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import cloudpickle
import submitit
from hydra.core.singleton import Singleton
from omegaconf import OmegaConf

from harness.launchers import warm, workers
from harness.launchers.protocol import Job, check_kinds
from harness.launchers.submitit_jobs import (
    GPU_ENV,
    SWEEP_ENV,
    UNSET,
    SubmititLauncher,
    outcome,
    process_identity,
    python_command,
)
from harness.running import distributed

POLL_S = 0.5


class LocalLauncher(SubmititLauncher):
    _EXECUTOR = "local"

    def __init__(
        self,
        max_parallel: int = 2,
        gpus: Sequence[int] | None = None,
        fresh: bool = False,
        worker_rss_mib: float | None = None,
        **params,
    ):
        self.fresh, self.worker_rss_mib = fresh, worker_rss_mib
        visible = visible_gpus()
        self.gpus = visible if gpus is None else [visible[position] for position in gpus]
        self.tasks = params.get("tasks_per_node", 1)  # a point's processes, a GPU each
        fit = len(self.gpus) // self.tasks
        self.max_parallel = min(max_parallel, fit) if self.gpus else max_parallel
        super().__init__(**params)

    @classmethod
    def preflight(cls, settings: dict) -> None:
        super().preflight(settings)
        check_kinds(settings, {"max_parallel": "positive", "worker_rss_mib": "number?"})
        if not isinstance(settings.get("fresh", False), bool):
            raise ValueError(f"fresh must be true or false, got {settings['fresh']!r}")
        if settings.get("nodes", 1) != 1:
            raise ValueError(f"nodes={settings['nodes']}: the local launcher runs on this one")
        gpus, shown = settings.get("gpus"), visible_gpus()
        tasks, given = settings.get("tasks_per_node", 1), shown if gpus is None else gpus
        if given and len(given) < tasks:
            raise ValueError(f"tasks_per_node={tasks} needs a GPU for each process, and "
                             f"{len(given)} are given here (gpus)")  # fmt: skip
        if gpus is None:
            return
        if not all(isinstance(g, int) and not isinstance(g, bool) for g in gpus):
            raise ValueError(f"gpus must be GPU indices, got {gpus!r}")
        unknown = [g for g in gpus if not 0 <= g < len(shown)]
        if unknown or len(set(gpus)) != len(gpus):
            said = ", ".join(f"{i} ({gpu})" for i, gpu in enumerate(shown)) or "none"
            raise ValueError(f"gpus {gpus} are not distinct GPUs of the ones visible here: {said}")

    def job_threads(self) -> int:
        """cpus_per_task, else this machine's CPUs shared by the processes that run at once."""
        at_once = self.max_parallel * self.tasks
        return super().job_threads() or max(1, len(os.sched_getaffinity(0)) // at_once)

    def executor(self) -> submitit.LocalExecutor:
        """submitit's local executor itself: its visible_gpus is not an AutoExecutor parameter."""
        params = dict(self.params)
        executor = submitit.LocalExecutor(
            folder=params.pop("submitit_folder"),
            max_num_timeout=params.pop("max_num_timeout", 0),
            python=python_command(),
        )
        local = ("timeout_min", "gpus_per_node", "tasks_per_node", "stderr_to_stdout", "setup")
        executor.update_parameters(**{k: v for k, v in params.items() if k in local and v})
        return executor

    def setup(self, *, hydra_context, task_function, config) -> None:
        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)
        if self._warm():
            warm.warm_up()  # its imports run while the sweep is planned (once a process)

    def _warm(self) -> bool:
        """Whether points run on warm workers: not with fresh, an experiment's own fresh, a
        point of several processes, or setup lines (a shell's, before each point's process)."""
        leaks = OmegaConf.select(self.config, "experiment.fresh", default=False)
        if not isinstance(leaks, bool):
            raise ValueError(f"experiment.fresh must be true or false, got {leaks!r}")
        return not (self.fresh or leaks or self.tasks > 1 or self.params.get("setup"))

    def follow(self, jobs: list[Job], placement: dict) -> Iterator[tuple[int, dict]]:
        """Run the jobs, max_parallel at a time, each with a GPU of its own where there are;
        (job number, summary) as each ends. If the sweep stops (Ctrl-C, SIGTERM), the jobs
        still running are stopped with it."""
        if not self._warm():
            yield from self._each_a_process(jobs)
            return
        pool = workers.Pool(
            setup=cloudpickle.dumps((self.config, self.task_function, Singleton.get_state())),
            slots=self.max_parallel,
            environment=self._worker_environment,
            log=self.controller_log().with_name("workers.log"),
            threads=self.job_threads(),
            timeout_s=60 * self.params["timeout_min"] if self.params.get("timeout_min") else None,
            rss_mib=self.worker_rss_mib,
            sweep=process_identity(os.getpid()),
        )
        yield from pool.run(jobs)

    def _worker_environment(self, slot: int) -> dict[str, str | None]:
        """What slot's warm worker changes in this process's environment: its GPU (where there
        are GPUs), its threads for OpenMP too (None: unset)."""
        threads = self.job_threads()
        gpu = self.gpus[slot] if self.gpus else os.environ.get("CUDA_VISIBLE_DEVICES")
        return {"CUDA_VISIBLE_DEVICES": gpu, "OMP_NUM_THREADS": str(threads) if threads else None}

    def _each_a_process(self, jobs: list[Job]) -> Iterator[tuple[int, dict]]:
        """Each job a process of its own (submitit's local executor), cancelled if the sweep
        stops."""
        executor, free, waiting = self.executor(), list(self.gpus), list(jobs)
        running: dict[int, tuple[submitit.Job, str | None]] = {}
        try:
            while waiting or running:
                while waiting and len(running) < self.max_parallel:
                    spec = waiting.pop(0)
                    taken = [free.pop(0) for _ in range(self.tasks)] if self.gpus else []
                    gpu = ",".join(taken) or None
                    own = os.environ.get("CUDA_VISIBLE_DEVICES", UNSET)
                    with (
                        _output_to(self.controller_log()),
                        _environment(GPU_ENV, gpu or own),
                        _environment(SWEEP_ENV, process_identity(os.getpid())),
                        _environment(distributed.PORT_ENV, distributed.free_port()),
                    ):
                        running[spec.job] = executor.submit(self, *self.job_arguments([spec])), gpu
                done = [job for job, (handle, _) in running.items() if handle.done()]
                for job in done:
                    handle, gpu = running.pop(job)
                    if gpu is not None:
                        free += gpu.split(",")
                    yield job, outcome(handle, None, 0)
                if not done:
                    time.sleep(POLL_S)
        finally:
            for handle, _ in running.values():
                handle.cancel(check=False)  # its controller stops the point's process

    def controller_log(self) -> Path:
        """Where submitit's local controllers write (their own tracebacks on Ctrl-C among it),
        beside the jobs' logs rather than on the sweep's terminal."""
        return Path(self.params["submitit_folder"]).parent / "controllers.log"


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
