"""Hand a sweep's points to the launcher its config names, and follow them to the end.

Through the launchers' protocol (harness.launchers.protocol) and nothing else: copy the answers
the store holds already, where the launcher can tell what its points' processes would be (an
all-answered grid submits nothing; else each point's process decides), start the other jobs,
record their placement in the manifest where there is any, return if the launcher runs on without us
and wait=false, else follow them, each point's progress line as it ends. A point that ends
without its rows (a killed task, a crash outside the experiment) gets a row from here saying
so; a job that could not write its rows stops the sweep (its OSError: a StoreUnwritable, where
its process sent it back, harness.launchers.protocol.raise_if_unwritable).
"""

import sys
import time
from datetime import UTC, datetime

from hydra.core.plugins import Plugins
from hydra.errors import HydraException
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from harness import reuse, store
from harness.errors import BadInput, shorten, with_type
from harness.launchers import protocol
from harness.launchers.hydra_internals import hydra_context, is_basic_launcher
from harness.launchers.hydra_plugin import HydraPluginLauncher
from harness.launchers.in_process import InProcess, InProcessLauncher
from harness.running.job import Task, resumed_note, reused_answer


def launch(cfg: DictConfig, sweep, launcher) -> bool:
    """Run (or, with wait=false, start) the sweep's points; whether they have all ended."""
    if not sweep.points:
        return True
    points = {point.job: point for point in sweep.points}
    progress = Progress(len(points), shown_first(sweep.experiment.config))
    reused, decided = reuse_answered(cfg, sweep, launcher.point_process(), progress)
    jobs = [p.job_of(sweep, p.job in decided) for p in sweep.points if p.job not in reused]
    if not jobs:
        return True
    try:
        placement = launcher.start(jobs)
    except ValueError as error:  # it could not start them: nothing runs
        raise BadInput(str(error)) from None
    if placement:
        record_launch(sweep, cfg.hydra.launcher._target_, launcher.detached, jobs, placement)
    if launcher.detached and not cfg.wait:
        return False
    # A launcher that runs on without us has its points queued: they run, and fail, on their own.
    same = SameFailure(0 if launcher.detached else cfg.get("fail_fast", 0), len(jobs))
    followed = launcher.follow(jobs, placement)
    try:
        for job, summary in followed:
            summary = protocol.raise_if_unwritable(summary)  # a store that cannot be written raises
            finish(sweep, points[job], summary, progress)
            if same.stops(summary):
                print(same.said(len(points) - progress.done), file=sys.stderr, flush=True)
                break
    finally:
        getattr(followed, "close", lambda: None)()  # those running stop, to run on resume
    return True


def reuse_answered(cfg: DictConfig, sweep, process, progress: "Progress") -> tuple[set, set]:
    """Where the sweep asks for reuse, the points whose answers another sweep holds, copied now
    (harness.reuse), each with its progress line, and the points looked up here: those
    the launcher's `process` (protocol.PointProcess) says what their processes would be (a
    point on a GPU: where it runs in this process). Where some answered before are not copied,
    a line says why; where some are left to their own processes, a line says so. A search's
    trials and points of several processes (process None) are never reused."""
    name, setting = sweep.experiment.name, sweep.reuse
    if process is None or not setting or sweep.code is None:
        return set(), set()
    devices = {p.job: str(p.params.get("device", "cpu")) for p in sweep.points}
    decided = {p.job for p in sweep.points if p.cell is None and process.environ is not None
               and (process.here or devices[p.job] == "cpu")}  # fmt: skip
    found = [p for p in sweep.points
             if p.cell is None and reuse.may_have(sweep.results, name, p.config_hash)]  # fmt: skip
    left = [p for p in found if p.job not in decided]
    if left:
        print(f"{len(left)} points may be answered in the store already: each point's process "
              "decides (this one cannot tell what its launcher gives it)", flush=True)  # fmt: skip
    named, reused, passed_over = tuple(sweep.experiment.config.get("environment") or ()), set(), []
    threads = cfg.get("threads") or process.threads
    for point in (p for p in found if p.job in decided):
        try:
            _, key = reuse.key(setting, point.params, devices[point.job], named, threads,
                               process.environ)  # fmt: skip
        except reuse.Refused as why:
            passed_over.append(f"job {point.job}: {why}")
            continue
        summary = reused_answer(
            sweep.paths.job(point.job),
            point.config_hash,
            point.params,
            key,
            setting["copies"],
        )
        if summary.get("reused_from"):
            finish(sweep, point, summary, progress)
            reused.add(point.job)
        elif summary.get("passed_over"):
            passed_over.append(summary["passed_over"])
    if passed_over:
        print(f"{len(passed_over)} points answered before run again: {passed_over[0]}"
              f"{' (and others)' if len(passed_over) > 1 else ''}", flush=True)  # fmt: skip
    return reused, decided


class SameFailure:
    """Whether a sweep's first `after` points to end all failed with one error: the rest would
    compute only to fail alike (a typo in the experiment, a column it may not write). Armed
    while each point so far has failed as the first did, and only where points remain."""

    def __init__(self, after: int, total: int):
        self.after, self.errors = after, [] if 0 < after < total else None

    def stops(self, summary: dict) -> bool:
        if self.errors is None:
            return False
        self.errors.append(summary.get("error") if summary["status"] == "failed" else None)
        if self.errors[-1] is None or len(set(self.errors)) > 1:
            self.errors = None
            return False
        return len(self.errors) == self.after

    def said(self, left: int) -> str:
        return (
            f"error: the first {self.after} points failed with the same error, so the sweep "
            f"stopped with {left} points not run: {shorten(self.errors[0])} (fix it and resume "
            "the sweep with code=current, which runs the code as edited; or set fail_fast=0 to "
            "run every point whatever fails)"
        )


def prepare_launcher(cfg: DictConfig, command: str | None):
    """The configured launcher, its jobs' task function carrying the sweep's `command`, or one
    line saying why its settings cannot work: before anything is planned or written."""
    try:
        launcher = make_launcher(cfg, Task(command))
    except ValueError as error:
        raise BadInput(f"hydra.launcher: {error}") from None
    except (HydraException, TypeError, ImportError) as error:
        cause = error.__cause__ or error
        raise BadInput(f"hydra.launcher: {with_type(cause)}") from None
    if not cfg.wait and not launcher.detached:
        raise BadInput("wait=false needs a launcher that runs on without us: hydra/launcher=slurm")
    return launcher


def launcher_boots(launcher) -> bool:
    """Whether the launcher's points run in processes that start from the sweep's snapshot of
    its code (harness.pinning.boot), rather than in this process or processes forked from it."""
    return getattr(launcher, "boots", False)


def make_launcher(cfg: DictConfig, task_function) -> protocol.Launcher:
    """The launcher cfg.hydra.launcher names, its settings checked first (preflight): one that
    speaks the harness's protocol as it is, Hydra's basic launcher as this process's loop,
    any other Hydra launcher plugin through HydraPluginLauncher."""
    settings = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    target = settings.pop("_target_")
    kind = get_class(target)
    if hasattr(kind, "preflight"):
        kind.preflight(settings)
    context = hydra_context(cfg)
    if target.startswith(("hydra.", "hydra_plugins.")):  # Hydra's plugins, by its registry
        launcher = Plugins.instance().instantiate_launcher(
            hydra_context=context, task_function=task_function, config=cfg
        )
    else:
        launcher = instantiate(cfg.hydra.launcher)
        launcher.setup(hydra_context=context, task_function=task_function, config=cfg)
    if hasattr(launcher, "follow"):
        return launcher
    if is_basic_launcher(launcher) and InProcess.suits(cfg):
        return InProcessLauncher(cfg, task_function)
    return HydraPluginLauncher(launcher, cfg, task_function, context)


def check_devices(points: list, launcher) -> None:
    """A point asking for CUDA (device=cuda, cuda:N) where its launcher runs it here, on a
    machine without CUDA or without that GPU, is bad input: one line before anything runs (a
    detached launcher's machines have GPUs of their own)."""
    if launcher.detached:
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


def finish(sweep, point, summary: dict, progress: "Progress") -> None:
    """Make sure the point has a row that says how it ended (a killed job wrote none, or only
    the "running" rows a training job landed as it went), then print its progress line."""
    paths = sweep.paths.job(point.job)
    ended = {
        "job": point.job,
        "status": summary["status"],
        **point.params,
        "error": summary.get("error"),
        "config_hash": point.config_hash,
        **({"cell": point.cell} if point.cell is not None else {}),  # a trial counts in its cell
    }
    if not store.has_rows(paths):
        store.write_rows(paths.file, [ended])
    elif summary["status"] not in store.DONE:
        replaced = store.segments(paths.file)  # read before the rows: only those read go
        landed = store.job_rows(paths.file)
        if any(row["status"] == store.RUNNING for row in landed):
            store.write_rows(paths.file, [*store.settled(landed), ended], replacing=replaced)
    progress.update(point, summary)


def record_launch(sweep, target: str, detached: bool, jobs: list, placement: dict) -> None:
    """Note in the manifest which launcher has which jobs, and where it placed them (its
    placement, JSON), for status, resume and compact to ask it (protocol.Launcher.states)."""
    manifest = store.read_manifest(sweep.paths)
    at = datetime.now(UTC).isoformat(timespec="seconds")
    launch = {"at": at, "launcher": target, "detached": detached,
              "jobs": [spec.job for spec in jobs], "placement": placement}  # fmt: skip
    manifest.setdefault("launches", []).append(launch)
    store.write_manifest(sweep.results, manifest)


def shown_first(config: dict) -> list[str]:
    """The metrics a point's progress line shows first: its table's values, then its claims'."""
    table = config.get("table")
    named = [table.get("values")] if isinstance(table, dict) else []
    named += [c.get("metric") for c in config.get("claims") or [] if isinstance(c, dict)]
    return [name for name in dict.fromkeys(named) if isinstance(name, str)]


class Progress:
    """One line per finished point, with an estimate of the time left: its first three numbers,
    those of `first` (shown_first) before the rest."""

    def __init__(self, total: int, first: list[str] = ()):
        self.total, self.done, self.started = total, 0, time.perf_counter()
        self.first, self.undeclared = list(first), False

    def update(self, point, summary: dict) -> None:
        self.done += 1
        elapsed = time.perf_counter() - self.started
        left = elapsed / self.done * (self.total - self.done)
        numbers = summary.get("metrics") or {}
        order = dict.fromkeys([*(m for m in self.first if m in numbers), *numbers])
        metrics = [(k, numbers[k]) for k in order][:3]
        detail = " ".join(f"{k}={v:.3g}" for k, v in metrics)
        if summary["status"] != "ok":
            detail = shorten(summary.get("error") or "")
        elif summary.get("reused_from"):
            detail = f"reused from {summary['reused_from']} {detail}"
        detail = f"{detail}{resumed_note(summary)}".strip()
        width = len(str(self.total))
        named = " ".join([*point.overrides, *([summary["trial"]] if summary.get("trial") else [])])
        line = f"[{self.done:>{width}}/{self.total}] job {point.job} {named}:"
        line = f"{line} {summary['status']} {detail}".rstrip()
        print(f"{line}  ({elapsed:.1f} s, ~{left:.0f} s left)", flush=True)
        if summary.get("undeclared") and not self.undeclared:  # once a sweep: status has all
            print(summary["undeclared"], flush=True)
            self.undeclared = True
