"""Hand a sweep's points to the launcher its config names, and follow them to the end.

With Hydra's basic launcher (the default) the harness runs the points itself, one after
another in this process (harness.inprocess); Hydra's other launchers get one job at a time;
either way each point shows a progress line as it ends. The submitit launchers
(harness.launchers: local, slurm) get all the points at once, SLURM points_per_task to an
array task; with wait=false the sweep returns once they are submitted. A point that ends
without writing its rows (a killed task, a crash outside the experiment) gets a row from
here, saying so.
"""

import shutil
import time
from datetime import UTC, datetime
from pathlib import Path

from hydra.core.plugins import Plugins
from hydra.errors import HydraException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from submitit.core.utils import FailedJobError, UncompletedJobError

from harness import store
from harness.config import override
from harness.experiment import BadInput, shorten, with_type
from harness.hydra_internals import hydra_context, is_basic_launcher
from harness.inprocess import InProcess
from harness.job import Job
from harness.launchers import (
    SlurmLauncher,
    SubmititSweepLauncher,
    check_fits,
    check_settings,
    returned,
    wait,
)


def launch(cfg: DictConfig, sweep, launcher) -> bool:
    """Run (or, with wait=false, submit) the sweep's points; whether they have all ended."""
    if not sweep.points:
        return True
    points = {point.job: point for point in sweep.points}
    overrides = [job_overrides(sweep, point) for point in sweep.points]
    progress = Progress(len(points))
    if is_basic_launcher(launcher) and InProcess.suits(cfg):
        runner = InProcess(cfg, launcher.task_function)
        for point, job_overrides_ in zip(sweep.points, overrides, strict=True):
            finish(sweep, point, runner.run(job_overrides_, point.job, point.planned()), progress)
        return True
    if not isinstance(launcher, SubmititSweepLauncher):
        for point, job_overrides_ in zip(sweep.points, overrides, strict=True):
            (result,) = launcher.launch([job_overrides_], initial_job_idx=point.job)
            finish(sweep, point, returned(result), progress)
        return True
    triples = [(o, p.job, p.planned()) for o, p in zip(overrides, sweep.points, strict=True)]
    if isinstance(launcher, SlurmLauncher):
        try:
            placed = launcher.submit(triples)
        except (FailedJobError, OSError) as error:
            said = [line for line in str(error).splitlines() if line.strip()] or [repr(error)]
            raise BadInput(f"cannot submit to SLURM: {said[-1].strip()}") from None
        record_launch(sweep, launcher, placed)
        arrays = sorted({handle.job_id.split("_")[0] for handle, _ in placed.values()})
        print(f"submitted as SLURM job {', '.join(arrays)}", flush=True)
        if not cfg.wait:
            return False
        ended = wait({job: handle for job, (handle, _) in placed.items()})
    else:
        placed = {job: (None, 0) for job in points}  # a process per point here
        ended = launcher.run(triples)
    for job, handle, lost in ended:
        finish(sweep, points[job], outcome(handle, lost, placed[job][1]), progress)
    return True


def prepare_launcher(cfg: DictConfig, command: str | None):
    """The configured launcher, its jobs' task function carrying the sweep's `command`, or one
    line saying why its settings cannot work: before anything is planned or written. What it
    can do is its type's: only the harness's SlurmLauncher runs on without us (wait=false) and
    needs SLURM here."""
    settings = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    try:
        check_settings(settings)
        launcher = instantiate_launcher(cfg, Job(command))
    except ValueError as error:
        raise BadInput(f"hydra.launcher: {error}") from None
    except (HydraException, TypeError) as error:
        cause = error.__cause__ or error
        raise BadInput(f"hydra.launcher: {with_type(cause)}") from None
    slurm = isinstance(launcher, SlurmLauncher)
    if not cfg.wait and not slurm:
        raise BadInput("wait=false needs a launcher that runs on without us: hydra/launcher=slurm")
    if slurm:
        if shutil.which("sbatch") is None:
            raise BadInput("hydra/launcher=slurm needs SLURM: sbatch is not on this machine's PATH")
        try:  # a request that no node of the partition could ever run
            check_fits(launcher.params)
        except ValueError as error:
            raise BadInput(f"hydra.launcher: {error}") from None
    return launcher


def instantiate_launcher(cfg: DictConfig, job: Job):
    """The launcher cfg.hydra.launcher names: Hydra's plugins through Hydra's plugin registry,
    the harness's own (harness.launchers, outside Hydra's plugin namespace) directly."""
    context = hydra_context(cfg)
    if cfg.hydra.launcher._target_.startswith(("hydra.", "hydra_plugins.")):
        return Plugins.instance().instantiate_launcher(
            hydra_context=context, task_function=job, config=cfg
        )
    launcher = instantiate(cfg.hydra.launcher)
    launcher.setup(hydra_context=context, task_function=job, config=cfg)
    return launcher


def job_overrides(sweep, point) -> list[str]:
    """A job's overrides: the sweep's own, the point's grid values, then the harness's (out
    quoted for Hydra: a folder's name may hold spaces, "=" or brackets)."""
    return [
        *sweep.overrides,
        *point.overrides,
        override("out", str(sweep.results.parent)),
        f"sweep_id={sweep.id}",
        f"job={point.job}",
    ]


def check_devices(points: list, launcher) -> None:
    """A point asking for CUDA (device=cuda, cuda:N) where its launcher runs it here, on a
    machine without CUDA or without that GPU, is bad input: one line before anything runs
    (a SLURM node has GPUs of its own)."""
    if isinstance(launcher, SlurmLauncher):
        return
    asked = {str(p.params.get("device")) for p in points}
    asked = sorted(device for device in asked if device.partition(":")[0] == "cuda")
    if not asked:
        return
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    indices = {device: device.partition(":")[2] for device in asked}
    beyond = [d for d, i in indices.items() if (int(i) if i.isdigit() else 0) >= count]
    if beyond:
        has = f"{count} CUDA GPU{'s' if count != 1 else ''}" if count else "no CUDA GPU"
        raise BadInput(
            f"device={beyond[0]}, but this machine has {has} (torch.cuda): use device=cpu "
            "(or auto), or a launcher that runs it where there is one (hydra/launcher=slurm)"
        )


def outcome(handle, lost: str | None, position: int) -> dict:
    """The summary of the point at `position` in a submitit job's pack: what the job returned
    for it, or why it returned nothing."""
    if lost:
        return {"status": "killed", "error": lost}
    try:
        return handle.result()[position]
    except UncompletedJobError as error:
        return {"status": "killed", "error": with_type(error)}
    except Exception as error:  # the job's process failed outside the task function
        return {"status": "failed", "error": with_type(error)}


def finish(sweep, point, summary: dict, progress: "Progress") -> None:
    """Make sure the point has a row that says how it ended (a killed job wrote none, or only
    the "running" rows a training job landed as it went), then print its progress line."""
    path = store.job_file(sweep.results, sweep.experiment.name, sweep.id, point.job)
    if summary.get("store_error"):  # the job could not write its rows: neither can we
        raise OSError(summary["error"])
    ended = {
        "job": point.job,
        "status": summary["status"],
        **point.params,
        "error": summary.get("error"),
        "config_hash": point.config_hash,
    }
    if not store.has_rows(sweep.results, sweep.experiment.name, sweep.id, point.job):
        store.write_rows(path, [ended])
    elif summary["status"] not in store.DONE:
        landed = store.job_rows(path)
        if any(row["status"] == store.RUNNING for row in landed):
            store.write_rows(path, [*store.settled(landed), ended])
    progress.update(point, summary)


def record_launch(sweep, launcher, placed: dict) -> None:
    """Note in the manifest which SLURM job (array task) runs which points, for status."""
    manifest = store.read_manifest(sweep.results, sweep.experiment.name, sweep.id)
    tasks: dict[str, list[int]] = {}
    for job, (handle, _) in placed.items():
        tasks.setdefault(handle.job_id, []).append(job)
    manifest.setdefault("launches", []).append(
        {
            "at": datetime.now(UTC).isoformat(timespec="seconds"),
            "slurm_tasks": tasks,
            "submitit_folder": str(Path(launcher.params["submitit_folder"]).absolute()),
        }
    )
    store.write_manifest(sweep.results, manifest)


class Progress:
    """One line per finished point, with an estimate of the time left."""

    def __init__(self, total: int):
        self.total, self.done, self.started = total, 0, time.perf_counter()

    def update(self, point, summary: dict) -> None:
        self.done += 1
        elapsed = time.perf_counter() - self.started
        left = elapsed / self.done * (self.total - self.done)
        metrics = list((summary.get("metrics") or {}).items())[:3]
        detail = " ".join(f"{k}={v:.3g}" for k, v in metrics)
        if summary["status"] != "ok":
            detail = shorten(summary.get("error") or "")
        width = len(str(self.total))
        line = f"[{self.done:>{width}}/{self.total}] job {point.job} {' '.join(point.overrides)}:"
        line = f"{line} {summary['status']} {detail}".rstrip()
        print(f"{line}  ({elapsed:.1f} s, ~{left:.0f} s left)", flush=True)
