"""One job of a sweep: run one point of the grid and write its rows (run_point, the one way a
point runs, whatever its launcher, given its harness.planning.plan.Job); Task is Hydra's task
function, which calls it where Hydra runs a job itself."""

import contextlib
import functools
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from harness import files, measuring, provenance, reuse, store
from harness.lifetime import per_command
from harness.measuring import columns
from harness.names import keeping
from harness.pinning import boot, codestore
from harness.planning.experiment import Experiment, config_values
from harness.planning.plan import Job
from harness.results import runs
from harness.running import distributed
from harness.running.calling import measure, row_check
from harness.running.sinks import PointInfo, Sinks
from harness.searching import search
from harness.tracking import Tracker

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Task:
    """Hydra's task function for a sweep's jobs, where Hydra runs a job itself (a launcher plugin
    of Hydra's, or its basic launcher where the loop cannot reproduce a job): it carries what
    every job of the sweep shares (the command that started it) and the records of the jobs it
    is launched for (`jobs`: Hydra hands a job only its config; a launcher sets up Hydra's
    plugin with a Task for each batch it launches). It is pickled into each job's process as it
    is."""

    command: str | None = None
    jobs: tuple[Job, ...] = ()

    def __call__(self, cfg: DictConfig) -> dict:
        values = config_values(cfg)
        job = next(job for job in self.jobs if job.job == values["job"])
        return run_point(values, HydraConfig.get().runtime.output_dir, self.command, job)


def run_point(values: dict, run_dir: str, command: str | None, job: Job) -> dict:
    """Run one job, whatever its launcher, and write its rows; a short summary of them.

    `values` is the job's config (resolved, without Hydra's node) and `job` its record: the
    point runs the parameters its sweep planned, so that a YAML edited since, or a value that
    differs each time it is read (${now:...}), changes nothing it computes. In turn: where its
    sweep asks for reuse and its launcher left that to the point, an answer another sweep holds
    is copied instead (harness.reuse); else the experiment is called, its rows written (a
    training point's as they come, through its tracker) and, where its sweep asks for reuse
    and it read nothing undeclared, its answer recorded. While it runs, a log that cannot be
    written (a full disk) is no traceback, and the process is as it was afterwards."""
    with _quiet_logging_errors():
        point = _Point(values, run_dir, job)
        if point.key is not None and not job.decided:  # its launcher left reuse to the point
            summary = reused_answer(point.paths, job.config_hash, point.params, point.key,
                                    point.setting["copies"])  # fmt: skip
            if summary.get("reused_from"):
                return summary
            if summary.get("passed_over"):
                log.info("not reused: %s", summary["passed_over"])
        prepare, sinks, tracker = point.harness_columns(command, run_dir), None, None
        if values.get("sinks") and not (point.group and point.group.rank):  # rank 0's
            sinks = Sinks(values["sinks"], point.info(), functools.partial(_say, job.job))
        if point.experiment.tracked:
            tracker = point.tracker(prepare, sinks)
        measuring.start_point()
        watch = point.watch(run_dir) if point.key is not None else None
        prepare.watch = watch
        with torch_threads(values.get("threads")):  # its rows record them (provenance)
            rows = measure(point.experiment, point.params, point.seed, tracker, watch)
            rows = [prepare(row) for row in rows]
        trial = point.trial
        if trial is not None:  # told before the rows are written: a restart takes it back
            trial.tell(rows, next((row["status"] for row in rows if row["status"] != "ok"), "ok"))
        if tracker is not None:  # its job file replaces its segments; the sinks get the rest
            rows = tracker.end(rows)
        elif point.group and point.group.rank:  # every process of the group ran it: rank 0's
            return summarize(rows, point.params)  # rows are the point's
        else:
            store.write_rows(point.paths.file, rows)
            if sinks is not None:  # a point without a tracker: its rows once they are stored
                sinks.send(rows)
        _keep_package_list(point.paths.sweep.folder)
        told = summarize(rows, point.params, last=tracker is not None)
        if tracker is not None and tracker.resumed:  # for its progress line, on every launcher
            told["resumed"] = tracker.resumed
        if watch is not None:
            told |= _record(point, rows, watch)
        return {**told, "trial": trial.label()} if trial else told


class _Point:
    """What run_point sets up for one job: its experiment, where its files go, its parameters
    (a search's trial's typed in), its group of processes, and where its sweep asks for reuse,
    its declared inputs hashed and its reuse key."""

    def __init__(self, values: dict, run_dir: str, job: Job):
        self.values, self.job, self.out = values, job, Path(values["out"])
        self.experiment = Experiment.load(values["experiment"])
        sweep = store.SweepPaths(self.out / "results", self.experiment.name, values["sweep_id"])
        self.paths = sweep.job(job.job)
        self.params = dict(job.params)
        _note_changes(self.params, values)
        self.trial = None
        if job.cell is not None:  # a search's trial: the parameters its study asked for, typed
            folder = sweep.folder
            self.trial = search.Trial(folder, job.search, {"cell": job.cell, "slot": job.slot},
                                      job.job, values["seed"], self.experiment.hints)  # fmt: skip
            typed = {k: self.experiment._typed(k, v) for k, v in self.trial.params.items()}
            self.params |= typed
            self.trial.fixed = self.params
        self.seed = self.params.get("seed", values["seed"])  # the planned one, where it is one
        self.group = distributed.current()
        own = self.trial is None and self.group is None and values.get("reuse")
        self.setting = job.reuse if own else None  # reuse=false given to a resume too
        self.found, self.key = _reuse_key(self.setting, self.params, self.experiment,
                                          values.get("threads"))  # fmt: skip

    def harness_columns(self, command: str | None, run_dir: str) -> "_Columns":
        extra = {"rank": self.group.rank, "world_size": self.group.world_size} if self.group else {}
        if self.trial is not None:
            extra |= {"cell": self.trial.cell, "trial": self.trial.number}
        if self.found is not None:
            extra["declared_inputs"] = json.dumps(self.found, sort_keys=True)
        first = {"job": self.job.job, "config_hash": self.job.config_hash}
        return _Columns(self.params, first, command, run_dir, extra, _named_env(self.experiment),
                        _code_commit(self.paths.sweep))  # fmt: skip

    def info(self) -> PointInfo:
        sweep = self.paths.sweep.sweep
        return PointInfo(self.experiment.name, sweep, self.job.job, self.params, self.out)

    def tracker(self, prepare: "_Columns", sinks: Sinks | None) -> Tracker:
        """A training experiment's Tracker (harness.tracking)."""
        job, hashed, trial = self.job.job, self.job.config_hash, self.trial
        return Tracker(
            self.paths.file,
            self.paths.checkpoints,
            prepare,
            config_hash=hashed if trial is None else f"{hashed}.trial-{trial.number}",
            check=row_check(self.params),
            clock=prepare.clock,
            every_rows=self.values.get("stream_rows", 1000),
            every_s=self.values.get("stream_s", 1.0),
            say=functools.partial(_say, job),
            shown=lambda row: store.first_numbers(row, self.params),
            sinks=sinks,
            group=self.group,
            observe=trial.observe if trial else None,
            keeping=keeping(self.values.get("checkpoint")),
        )

    def watch(self, run_dir: str) -> reuse.Watch:
        """The tripwire on what the point reads (harness.reuse.Watch): its own folders are
        its run folder, its checkpoints' and its sweep's rows."""
        own, paths = [], self.paths
        for folder in map(os.path.abspath, (run_dir, paths.checkpoints, paths.sweep.folder)):
            above, base = os.path.split(folder)  # the harness's own folder, of no link
            own += [os.path.join(folder, ""), os.path.join(reuse.real_folder(above), base, "")]
        pinned = boot.pinned_here()
        tops, before = (pinned.tops, pinned.before) if pinned else (frozenset(), frozenset())
        return reuse.Watch(tuple(own), self.found, tops, before)


@contextlib.contextmanager
def _quiet_logging_errors() -> Iterator[None]:
    raising, logging.raiseExceptions = logging.raiseExceptions, False
    try:
        yield
    finally:
        logging.raiseExceptions = raising


def _device(params: dict) -> str:
    return str(params.get("device", "cpu"))


def _named_env(experiment: Experiment) -> tuple[str, ...]:
    """The environment variables the experiment's YAML names (experiment.environment)."""
    return tuple(experiment.config.get("environment") or ())


def _reuse_key(setting, params: dict, experiment: Experiment, threads) -> tuple:
    """The point's declared inputs, hashed, and its key (harness.reuse.key); (None,
    None) where its sweep copies nothing, or an input cannot be read (said in its log)."""
    if not setting:
        return None, None
    try:
        return reuse.key(setting, params, _device(params), _named_env(experiment), threads)
    except reuse.Refused as why:
        log.info("not reused, and no answer recorded: %s", why)
        return None, None


def _record(point: _Point, rows: list[dict], watch: reuse.Watch) -> dict:
    """The point's answer recorded for reuse where it read nothing its experiment does not
    declare; else, the line that says what it read ({"undeclared": line})."""
    undeclared = watch.keep()  # read into a cache, say: counted for the points after too
    if undeclared:
        line = reuse.undeclared_line(point.job.job, undeclared, point.setting, point.params)
        return {"undeclared": line}
    measured = measuring.taken() or any(columns.is_samples(k) for row in rows for k in row)
    reuse.record(point.paths, rows, point.key, bool(measured), point.setting["copies"])
    return {}


def reused_answer(job: store.JobPaths, config_hash: str, params: dict, key: dict,
                  copies: str) -> dict:  # fmt: skip
    """The summary of a point whose answer another sweep holds under its `key`
    (harness.reuse.find; `copies`: what its sweep copies), its rows copied into this
    sweep as the job's own ("reused_from" names them); where there is none to copy, {} or,
    where one on record was passed over, {"passed_over": why}."""
    found = reuse.find(job.sweep, config_hash, key, copies)
    if found.rows is None:
        return {"passed_over": found.passed_over} if found.passed_over else {}
    rows = [{**row, "job": job.job} for row in found.rows]
    store.write_rows(job.file, rows)
    return {**summarize(rows, params), "reused_from": found.source}


def _say(job: int, text: str) -> None:
    print(f"  job {job}: {text}", flush=True)


def resumed_note(summary: dict) -> str:
    """What a point's progress line adds where it continued from a checkpoint: " (resumed from
    the checkpoint at step N)"; "" otherwise."""
    return f" ({summary['resumed']})" if summary.get("resumed") else ""


class _Columns:
    """A point's rows with the harness's columns (_row): its job and config_hash, when it
    started, its command and run_dir, its provenance (taken at the first row, once the
    experiment has started: the environment variables named `named_env` among it), then
    `extra` (rank, cell, trial where it has them), each row's duration_s since the start and
    the files the point had read by then that its experiment does not declare (`watch`, where
    its sweep asks for reuse)."""

    def __init__(self, params: dict, first: dict, command, run_dir: str, extra: dict,
                 named_env: tuple[str, ...] = (), code_commit=(None, None)):  # fmt: skip
        self.params, self.first, self.extra, self.shared = params, first, extra, {}
        self.then = {"command": command, "run_dir": run_dir}
        self.named_env, self.code_commit, self.watch = named_env, code_commit, None
        self.started, self.clock = datetime.now(UTC), time.perf_counter()

    def __call__(self, row: dict) -> dict:
        if not self.shared:
            shared = provenance.provenance(
                _device(self.params), self.named_env, codestore.running_digest(), self.code_commit
            )
            self.shared = {**self.first, "started_at": self.started, **self.then, **shared,
                           **self.extra}  # fmt: skip
        duration = time.perf_counter() - self.clock
        read = self.watch.said() if self.watch is not None else None
        return _row(row, self.params, {**self.shared, "duration_s": duration, "files_read": read})


@per_command
@functools.lru_cache(maxsize=16)
def _code_commit(sweep: store.SweepPaths) -> tuple[str | None, bool | None]:
    """The commit of the repository that held the experiment's code as the sweep was planned,
    and whether it was dirty, as its manifest records them; (None, None) where it records
    none."""
    manifest = store.read_manifest(sweep) or {}
    return manifest.get("git_commit"), manifest.get("git_dirty")


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """torch's CPU threads set to `threads` while the block runs (None: the launcher's choice,
    its CPUs over the points it runs at once), then as they were."""
    if not threads:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _note_changes(params: dict, values: dict) -> None:
    """Log the parameters whose value in the job's config is not the one planned (a YAML
    edited before a resume): the planned values run."""
    changed = {k: v for k, v in params.items() if k in values and values[k] != v}
    for key, value in changed.items():
        log.warning("%s is %r in the config now; the sweep planned %r, which runs", key,
                    values[key], value)  # fmt: skip


def summarize(rows: list[dict], params: dict, last: bool = False) -> dict:
    """The status of the point's rows (the worst one) and their first row's numbers (`last`,
    or rows with a step, a training run's, copied ones too: the last row's, its final ones)."""
    statuses = [row["status"] for row in rows]
    status = next((s for s in statuses if s != "ok"), "ok")
    last = last or any(row.get(runs.STEP) is not None for row in rows)
    shown = rows[-1] if last else rows[0]
    error = next((row.get("error") for row in rows if row.get("error")), None)
    return {
        "status": status,
        "error": error,
        "metrics": store.metrics(shown, params),
        "seconds": rows[-1]["duration_s"],  # this run's, not a restored row's first run
    }


def _row(row: dict, params: dict, harness_columns: dict) -> dict:
    status = row.pop("status", "ok")
    error = row.pop("error", None)
    return {
        "job": harness_columns["job"],
        "status": status,
        **params,
        **row,
        "error": error,
        **{k: v for k, v in harness_columns.items() if k != "job"},
    }


def _keep_package_list(folder: Path) -> None:
    """Keep the full package list once per sweep, named by the digest that rows carry."""
    listing = provenance.packages()
    path = folder / f"_packages-{provenance.packages_digest()}.json"
    if not path.exists():
        files.write_json(path, {"packages": list(listing)})
