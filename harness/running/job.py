"""One job of a sweep: run one point of the grid and write its rows (run_point, the one way a
point runs, whatever its launcher); Job is Hydra's task function, which calls it."""

import contextlib
import functools
import json
import logging
import os
import random
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from harness import files, measuring, provenance, reuse, store, tracking
from harness.errors import StoreUnwritable
from harness.lifetime import per_command
from harness.names import keeping
from harness.pinning import boot, codestore
from harness.planning.experiment import Experiment, config_hash, config_values
from harness.results import runs
from harness.running import distributed
from harness.running.sinks import PointInfo, Sinks
from harness.searching import search
from harness.tracking import Tracker

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Job:
    """Hydra's task function for a sweep's jobs: what a launcher runs for each point (through
    run_point), carrying what every job of the sweep shares (the command that started it); it
    is pickled into each submitit job as it is."""

    command: str | None = None

    def __call__(self, cfg: DictConfig) -> dict:
        """A job Hydra runs itself (a launcher plugin of Hydra's): its planned point is read
        from the sweep's manifest."""
        return run_point(config_values(cfg), HydraConfig.get().runtime.output_dir, self.command)


def run_point(values: dict, run_dir: str, command: str | None, planned: dict | None = None) -> dict:
    """Run one point, whatever its launcher, and write its rows; a short summary of them.

    `values` is the job's config (resolved, without Hydra's node) and `planned` its manifest
    entry (params, config_hash; read from the manifest where the launcher has none at hand):
    the point runs the parameters its sweep planned, so that a YAML edited since, or a value
    that differs each time it is read (${now:...}), changes nothing it computes. In turn: where
    its sweep asks for reuse, an answer another sweep holds is copied instead, where its
    launcher left that to the point (harness.reuse); else the experiment is called,
    its rows written (a training point's as they come, through its tracker) and, where its
    sweep asks for reuse and it read nothing undeclared, its answer recorded. While it runs, a
    log that cannot be written (a full disk) is no traceback, and the process is as it was
    afterwards."""
    with _quiet_logging_errors():
        experiment = Experiment.load(values["experiment"])
        root, sweep, job = Path(values["out"]) / "results", values["sweep_id"], values["job"]
        planned = planned or planned_point(root, experiment.name, sweep, job) or {}
        params = planned["params"] if planned else experiment.params(values)
        _note_changes(params, values)
        hashed = planned.get("config_hash") or config_hash(experiment.name, params, values)
        trial = _trial(root, experiment, sweep, job, planned, values["seed"])
        if trial is not None:  # a search's trial: the parameters its study asked for, typed
            params = {**params, **{k: experiment._typed(k, v) for k, v in trial.params.items()}}
            trial.fixed = params
        group = distributed.current()
        setting = _reuse(values, planned) if trial is None and group is None else None
        found, key = _reuse_key(setting, params, experiment, values.get("threads"))
        if key is not None and not planned.get("decided"):  # its launcher left that to it
            summary = reused_answer(root, experiment, sweep, job, hashed, params, key,
                                    setting["copies"])  # fmt: skip
            if summary.get("reused_from"):
                return summary
            if summary.get("passed"):
                log.info("not reused: %s", summary["passed"])
        path = store.job_file(root, experiment.name, sweep, job)
        extra = {"rank": group.rank, "world_size": group.world_size} if group else {}
        extra |= {"cell": trial.cell, "trial": trial.number} if trial else {}
        if found is not None:
            extra["declared_inputs"] = json.dumps(found, sort_keys=True)
        prepare = _Columns(params, {"job": job, "config_hash": hashed}, command, run_dir, extra,
                           _named_env(experiment))  # fmt: skip
        point = PointInfo(experiment.name, sweep, job, params, Path(values["out"]))
        sending = values.get("sinks") and not (group and group.rank)  # rank 0's: the point's
        sinks = Sinks(values.get("sinks"), point, functools.partial(_say, job)) if sending else None
        tracker = _tracker(experiment, values, (sweep, job, path), prepare, params, hashed, sinks,
                           group, trial)  # fmt: skip
        measuring.start_point()
        watch = _watch(values, path, run_dir, found) if key is not None else None
        prepare.watch = watch
        with torch_threads(values.get("threads")):  # its rows record them (provenance)
            seed = params.get("seed", values["seed"])
            returned = measure(experiment, params, seed, tracker, watch)
            rows = [prepare(row) for row in returned]
        if trial is not None:  # told before the rows are written: a restart takes it back
            trial.tell(rows, next((row["status"] for row in rows if row["status"] != "ok"), "ok"))
        if tracker is not None:  # its job file replaces its segments; the sinks get the rest
            rows = tracker.end(rows)
        elif group and group.rank:  # every process of the group ran it: rank 0's rows are kept
            return summarize(rows, params)
        else:
            store.write_rows(path, rows)
            if sinks is not None:  # a point without a tracker: its rows once they are stored
                sinks.send(rows)
        _keep_package_list(store.sweep_dir(root, experiment.name, sweep))
        told = summarize(rows, params, last=tracker is not None)
        if tracker is not None and tracker.resumed:  # for its progress line, on every launcher
            told["resumed"] = tracker.resumed
        if watch is not None:
            told |= _record(root, experiment.name, sweep, job, rows, watch, key, setting, params)
        return {**told, "trial": trial.label()} if trial else told


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


def _tracker(experiment, values, where, prepare, params, hashed, sinks, group, trial):
    """A training experiment's Tracker (harness.tracking); None for any other."""
    if not experiment.tracked:
        return None
    sweep, job, path = where
    return Tracker(
        path,
        tracking.checkpoint_dir(values["out"], experiment.name, sweep, job),
        prepare,
        config_hash=hashed if trial is None else f"{hashed}.trial-{trial.number}",
        check=_row_check(params),
        clock=prepare.clock,
        every_rows=values.get("stream_rows", 1000),
        every_s=values.get("stream_s", 1.0),
        say=functools.partial(_say, job),
        shown=lambda row: store.first_numbers(row, params),
        sinks=sinks,
        group=group,
        observe=trial.observe if trial else None,
        keeping=keeping(values.get("checkpoint")),
    )


def _reuse(values: dict, planned: dict) -> dict | None:
    """The sweep's reuse, planned with the point (harness.reuse.setting); None where it
    copies nothing (reuse=false given to a resume too)."""
    return planned.get("reuse") if values.get("reuse") else None


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


def _watch(values: dict, path: Path, run_dir: str, found: dict) -> reuse.Watch:
    """The tripwire on what the point reads (harness.reuse.Watch): its own folders are
    its run folder, its checkpoints' and its sweep's rows."""
    sweep, job, out = values["sweep_id"], values["job"], values["out"]
    checkpoints = tracking.checkpoint_dir(out, values["experiment"]["name"], sweep, job)
    own = []
    for folder in map(os.path.abspath, (run_dir, checkpoints, path.parent)):
        above, name = os.path.split(folder)  # the harness's own folder, of no link: its sweep's
        own += [os.path.join(folder, ""), os.path.join(reuse.real_folder(above), name, "")]
    pinned = boot.pinned_here()
    tops, before = (pinned.tops, pinned.before) if pinned else (frozenset(), frozenset())
    return reuse.Watch(tuple(own), found, tops, before)


def _record(root, experiment: str, sweep: str, job: int, rows, watch, key, setting, params):
    """The point's answer recorded for reuse where it read nothing its experiment does not
    declare; else, the line that says what it read ({"undeclared": line})."""
    undeclared = watch.keep()  # read into a cache, say: counted for the points after too
    if undeclared:
        return {"undeclared": reuse.undeclared_line(job, undeclared, setting, params)}
    measured = measuring.taken() or any(k.endswith("_samples_ms") for row in rows for k in row)
    reuse.record(root, experiment, sweep, job, rows, key, bool(measured), setting["copies"])
    return {}


def reused_answer(root: Path, experiment: Experiment, sweep: str, job: int, config_hash: str,
                  params: dict, key: dict, copies: str) -> dict:  # fmt: skip
    """The summary of a point whose answer another sweep holds under its `key`
    (harness.reuse.find; `copies`: what its sweep copies), its rows copied into this
    sweep as the job's own ("reused_from" names them); where there is none to copy, {} or,
    where one on record was passed over, {"passed": why}."""
    found = reuse.find(root, experiment.name, config_hash, key, sweep, copies)
    if found.rows is None:
        return {"passed": found.passed} if found.passed else {}
    rows = [{**row, "job": job} for row in found.rows]
    store.write_rows(store.job_file(root, experiment.name, sweep, job), rows)
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
                 named_env: tuple[str, ...] = ()):  # fmt: skip
        self.params, self.first, self.extra, self.shared = params, first, extra, {}
        self.then = {"command": command, "run_dir": run_dir}
        self.named_env, self.watch = named_env, None
        self.started, self.clock = datetime.now(UTC), time.perf_counter()

    def __call__(self, row: dict) -> dict:
        if not self.shared:
            shared = provenance.provenance(
                _device(self.params), self.named_env, codestore.running_digest()
            )
            self.shared = {**self.first, "started_at": self.started, **self.then, **shared,
                           **self.extra}  # fmt: skip
        duration = time.perf_counter() - self.clock
        read = self.watch.said() if self.watch is not None else None
        return _row(row, self.params, {**self.shared, "duration_s": duration, "files_read": read})


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


def planned_point(root: Path, experiment: str, sweep: str, job: int) -> dict | None:
    """The manifest's point of this job (params, config_hash); None where the manifest cannot
    tell (a job run outside a sweep: its config's values run)."""
    return _planned(root, experiment, sweep)[0].get(job)


def _planned(root: Path, experiment: str, sweep: str) -> tuple[dict[int, dict], dict | None]:
    """job -> its planned point, and the sweep's search (harness.searching.search), from its
    manifest."""
    path = store.sweep_dir(root, experiment, sweep) / store.MANIFEST
    try:
        stat = path.stat()
    except OSError:
        return {}, None
    return _read_plan(root, experiment, sweep, (stat.st_ino, stat.st_mtime_ns))


@per_command
@functools.lru_cache(maxsize=4)
def _read_plan(root: Path, experiment: str, sweep: str, version: tuple) -> tuple[dict, dict | None]:
    """_planned, read once per version of the manifest in this process (a SLURM task's pack of
    points reads it once), each point with its sweep's reuse."""
    manifest = store.read_manifest(root, experiment, sweep) or {"points": []}
    shared = {"reuse": manifest["reuse"]} if manifest.get("reuse") else {}
    points = {point["job"]: {**point, **shared} for point in manifest["points"]}
    return points, search.of_manifest(manifest)


def _trial(root: Path, experiment: Experiment, sweep: str, job: int, planned, seed: int):
    """The search's trial that this job runs (harness.searching.search.Trial), or None: a grid's
    point."""
    if not planned or planned.get("cell") is None:
        return None
    searched = _planned(root, experiment.name, sweep)[1]
    if not searched:
        raise ValueError(f"job {job} is a trial of a search that the sweep's manifest lacks")
    folder = store.sweep_dir(root, experiment.name, sweep)
    return search.Trial(folder, searched, planned, job, seed, experiment.hints)


def _note_changes(params: dict, values: dict) -> None:
    """Log the parameters whose value in the job's config is not the one planned (a YAML
    edited before a resume): the planned values run."""
    changed = {k: v for k, v in params.items() if k in values and values[k] != v}
    for key, value in changed.items():
        log.warning("%s is %r in the config now; the sweep planned %r, which runs", key,
                    values[key], value)  # fmt: skip


def measure(
    experiment: Experiment,
    params: dict,
    seed: int,
    tracker: Tracker | None = None,
    watch: contextlib.AbstractContextManager | None = None,
) -> list[dict]:
    """The experiment's rows for one point; a point that raises, or tries to end the process
    (sys.exit, os._exit), is one failed row. A training experiment gets the tracker, and may
    return no rows beyond those it logged. A store that cannot take the tracker's rows or
    checkpoints (a full disk) is no failed row: its StoreUnwritable stops the sweep. `watch`
    is entered while the experiment runs (what it reads, watched: harness.reuse)."""
    _seed_everything(seed)
    try:
        with _exits_refused(), watch or contextlib.nullcontext():
            if tracker is None:
                rows = _as_rows(experiment.run(**params))
            else:
                with tracker.slurm_signals():
                    rows = _as_rows(experiment.run(**params, tracker=tracker) or [])
        # Rank 0's rows are the point's: the other processes of a group may log and return none.
        logged = tracker.logged or tracker.rank if tracker else 0
        _check_rows(rows, params, logged=logged)
        store.check_columns(rows)  # a value Parquet cannot hold is the experiment's failed row
        return rows
    except tracking.Requeued:  # the task is requeued: this process ends
        raise
    except StoreUnwritable:  # the store cannot take the rows: the sweep stops
        raise
    except search.Pruned as stop:  # a search's pruner stopped the trial: an answer
        return [{"status": "pruned", "error": str(stop)}]
    except (Exception, SystemExit) as error:
        if tracker is not None and tracker.unwritable is not None:  # whatever the experiment
            raise tracker.unwritable from None  # made of it (a landing's RuntimeError, say)
        if tracker is not None:
            tracker.raised = True
        log.error("%s failed:\n%s", experiment.name, traceback.format_exc())
        if isinstance(error, SystemExit):  # which would end the sweep without a word
            called = error if isinstance(error, ProcessExit) else f"sys.exit({error.code!r})"
            return [{"status": "failed", "error": f"the experiment called {called}"}]
        return [{"status": "failed", "error": f"{type(error).__name__}: {error}{_beside(error)}"}]


def _beside(error: BaseException) -> str:
    """What to do where the experiment looked for a file beside its code that its sweep did not
    pin (a path in the sweep's snapshot, found from the module's own __file__); "" otherwise."""
    pinned = codestore.running()
    name = getattr(error, "filename", None)
    if not isinstance(error, FileNotFoundError) or not pinned or not isinstance(name, str):
        return ""
    inside = os.path.relpath(os.path.realpath(name), os.path.realpath(pinned[0]))
    if inside == os.pardir or inside.startswith(os.pardir + os.sep):
        return ""
    if any(part.startswith(".") for part in Path(inside).parts[1:]):  # below its bundle-DIGEST
        return (" (a hidden file beside the experiment's code: the sweep's snapshot of its code "
                "leaves hidden files and folders out; name it without the leading dot, or give "
                "its path as a parameter)")  # fmt: skip
    return (" (a path in the sweep's snapshot of its code, from its module's own path: the "
            "sweep pins the files of the experiment's package or folder only; keep the file "
            "there, or give its path as a parameter)")  # fmt: skip


def _as_rows(returned) -> list[dict]:
    """The experiment's rows, each a dict of its own; ValueError saying what to return for
    anything but an iterable of mappings (a lone dict, say)."""
    if isinstance(returned, (dict, str, bytes)) or not hasattr(returned, "__iter__"):
        raise ValueError(f"the experiment returned a {type(returned).__name__}: it returns a list "
                         "of rows, each a dict (return [row] for one)")  # fmt: skip
    rows = []
    for row in returned:
        try:
            rows.append(dict(row))
        except (TypeError, ValueError):
            raise ValueError(f"the experiment's rows hold a {type(row).__name__}: each row is a "
                             "dict of column to value") from None  # fmt: skip
    return rows


class ProcessExit(SystemExit):
    """os._exit called by an experiment, refused: it would end the sweep without a word."""


@contextlib.contextmanager
def _exits_refused():
    """While an experiment runs, os._exit called by the thread that runs it raises ProcessExit
    (a SystemExit, as sys.exit raises), so that the point is a failed row; in any other thread
    (a library's, the harness's own) and in a forked child it exits as it would."""
    real, pid, own = os._exit, os.getpid(), threading.get_ident()

    def refused(code: int) -> None:
        if os.getpid() != pid or threading.get_ident() != own:
            real(code)
        raise ProcessExit(f"os._exit({code})")

    os._exit = refused
    try:
        yield
    finally:
        os._exit = real


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


def _reserved(params: dict) -> frozenset[str]:
    """The columns an experiment's rows may not set, in lower case: its parameters, the
    harness's own (store.RESERVED)."""
    return store.RESERVED | {name.lower() for name in params}


def _clashes(keys, reserved: frozenset[str]) -> list[str]:
    """The keys that are a reserved column, compared without case (but status and error)."""
    return sorted({k for k in keys if k.lower() in reserved and k not in store.ROW_SETS})


def _row_check(params: dict) -> Callable[[dict], None]:
    """_check_rows of one logged row (a training point's first, say), at the cost of a set's
    isdisjoint of its lowered keys when it passes (a row's own status, which a reserved name
    matches, is the rare row that takes the whole check)."""
    reserved = _reserved(params)

    def check(row: dict) -> None:
        clash = not reserved.isdisjoint(map(str.lower, row))
        if clash or row.get("status", "ok") not in store.ROW_STATUSES:
            _check_rows([row], params)

    return check


def _check_rows(rows: list[dict], params: dict, logged: int = 0) -> None:
    """ValueError, saying what to do, for no rows or rows that set a parameter's or the
    harness's column (which the harness writes in every row), compared without case, or give a
    status no experiment may (running: a phantom that every resume would rerun)."""
    if not rows and not logged:
        raise ValueError("the experiment returned no rows")
    statuses = [row["status"] for row in rows if row.get("status", "ok") not in store.ROW_STATUSES]
    if statuses:
        raise ValueError(
            f"the experiment's rows give status {statuses[0]!r:.40}: a row's status is one of "
            f"{', '.join(store.ROW_STATUSES)} (or none, for ok)"
        )
    clashes = _clashes({key for row in rows for key in row}, _reserved(params))
    if not clashes:
        return
    folded = {name.lower() for name in params}
    given = [c for c in clashes if c.lower() in folded]
    own = [c for c in clashes if c.lower() not in folded]
    said = []
    if own:
        said.append(
            f"{', '.join(own)}, which the harness writes in every row (column names compared "
            f"without case): name {'it' if len(own) == 1 else 'them'} otherwise in the rows "
            f"({own[0]}_measured, say)"
        )
    if given:
        said.append(
            f"{', '.join(given)}, the point's parameter{'s' if len(given) > 1 else ''}, which "
            "every row has already: leave it out of the rows"
        )
    raise ValueError(f"the experiment's rows set {'; and '.join(said)}")


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


def _seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    # torch.manual_seed also seeds each device type the build knows, queued with a stack trace
    # until that device starts (a millisecond a point); a build without any has none to seed.
    if torch.accelerator.current_accelerator() is None:  # asks the build, starts nothing
        torch.random.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)
