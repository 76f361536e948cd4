"""The store's layout: where a sweep's and a job's files lie (SweepPaths, JobPaths) and what
their names say (job files, segments, compacted files, the manifest), the harness's own columns
and statuses, and the locks and marks that say who is writing a sweep now (a command that runs
it, a compaction, a point's process).
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from harness import files
from harness.lifetime import per_command

MANIFEST = "_sweep.json"
# The folders the harness writes under an out folder (the report's too): rows, Hydra's and
# submitit's run folders, checkpoints, the TensorBoard sink's, the report.
GENERATED = ("results", "runs", "checkpoints", "tensorboard", "report")
# The manifest's settings that commands read, and their kinds (a manifest is anyone's to edit).
MANIFEST_KINDS = {"command": str, "overrides": list, "hydra_overrides": list,
                  "config_dirs": list, "launches": list}  # fmt: skip
LOCK = "_compact.lock"  # held while a compaction or a resume rewrites a sweep's files
RUNNING_MARK = ".running"  # _job-N.running: held by the process that runs job N (hold_running)
RUN_LOCK = "_run.lock"  # held by the command that runs a sweep's points here (claim)
COMPACTED = re.compile(r"compacted-(\d+)\.parquet")
JOB = re.compile(r"job-(\d+)\.parquet")
# A job's segment: job-N.part-K, or job-N.rank-R.part-K for rank R of a point of several processes.
SEGMENT = re.compile(r"job-(\d+)\.(?:rank-(\d+)\.)?part-(\d+)\.parquet")
READ_ATTEMPTS = 50  # a read retries while compactions change the folder under it
# A point's answer: resume skips these. Other statuses (failed, killed, oom, timeout) rerun.
DONE = ("ok", "unsupported", "pruned")  # pruned: a search's trial that its pruner stopped
RUNNING = "running"  # the rows a training job lands before it ends (harness.tracking)
# The statuses an experiment's row may give; running and pruned are the harness's to write.
ROW_STATUSES = ("ok", "unsupported", "failed", "oom", "killed", "timeout")
PARTITIONS = pa.schema([("experiment", pa.string()), ("sweep", pa.string())])
SET_ASIDE = "_damaged-"  # the prefix of a damaged file moved aside: neither "." nor ".parquet"
_named: dict[Path, str] = per_command({})  # the damaged files this process has named, and why

# The harness's own columns and their types; parameters and metrics are typed by their values.
HARNESS_COLUMNS = {
    "job": pa.int64(),
    "status": pa.string(),
    "error": pa.string(),
    "config_hash": pa.string(),
    "started_at": pa.timestamp("us", tz="UTC"),
    "duration_s": pa.float64(),
    "git_commit": pa.string(),
    "git_dirty": pa.bool_(),
    "code_digest": pa.string(),  # the code the point ran (harness.pinning.codestore)
    "reused_from": pa.string(),  # SWEEP/JOB of an answer copied from there (harness.reuse)
    "command": pa.string(),
    "torch_version": pa.string(),
    "cuda_version": pa.string(),
    "cudnn_version": pa.string(),
    "driver_version": pa.string(),  # the GPU's driver, on a GPU
    "python_version": pa.string(),
    "packages_digest": pa.string(),
    "device_name": pa.string(),
    "threads": pa.int64(),
    "environment": pa.string(),  # the variables that change numerics, as JSON (provenance)
    "files_read": pa.string(),  # with reuse: what it read that its inputs do not declare (JSON)
    "declared_inputs": pa.string(),  # with reuse: each declared input's paths and digest (JSON)
    "hostname": pa.string(),
    "slurm_job_id": pa.string(),
    "slurm_array_task_id": pa.int64(),
    "slurm_node": pa.string(),
    "slurm_restarts": pa.int64(),
    "gpus": pa.string(),
    "run_dir": pa.string(),
    "rank": pa.int64(),  # of a point that runs as several processes (harness.running.distributed)
    "world_size": pa.int64(),
    "cell": pa.int64(),  # a search's trial (harness.searching.search): its cell of the grid
    "trial": pa.int64(),  #   and its number in that cell's study
}
# Names no parameter or metric may take, compared without case (DuckDB reads `Sweep` as the
# partition `sweep`): the harness's columns and the partitions. A row's `status` and `error` are
# the experiment's to set, in those spellings.
RESERVED = frozenset(name.lower() for name in [*HARNESS_COLUMNS, *PARTITIONS.names])
ROW_SETS = ("status", "error")


@dataclass(frozen=True)
class SweepPaths:
    """Where a sweep's files lie: its folder in the store `root` (ROOT/experiment=NAME/sweep=ID:
    its manifest, row files, locks and marks) and, beside the store, its run folder and its
    checkpoints'. Every function that reads or writes one sweep's files takes this."""

    root: Path
    experiment: str
    sweep: str

    def __post_init__(self):
        object.__setattr__(self, "root", Path(self.root))

    @property
    def folder(self) -> Path:
        return self.root / f"experiment={self.experiment}" / f"sweep={self.sweep}"

    @property
    def manifest(self) -> Path:
        return self.folder / MANIFEST

    @property
    def runs(self) -> Path:
        """The run folder beside the store (hydra.sweep.dir in conf/config.yaml: Hydra's job
        folders, job-N, and submitit's)."""
        return self.root.parent / "runs" / self.experiment / self.sweep

    @property
    def checkpoints(self) -> Path:
        """The checkpoints' folder: beside the store, not in it (weights are no rows)."""
        return (
            self.root.parent
            / "checkpoints"
            / f"experiment={self.experiment}"
            / f"sweep={self.sweep}"
        )

    def job(self, job: int) -> JobPaths:
        return JobPaths(self, job)


@dataclass(frozen=True)
class JobPaths:
    """Where one job of a sweep writes: its job file (its segments and running mark beside it),
    its checkpoint folder and its run folder."""

    sweep: SweepPaths
    job: int

    @property
    def file(self) -> Path:
        return self.sweep.folder / f"job-{self.job:06d}.parquet"

    @property
    def checkpoints(self) -> Path:
        return self.sweep.checkpoints / f"job-{self.job:06d}"

    @property
    def run_folder(self) -> Path:
        """Hydra's job folder (hydra.sweep.subdir in conf/config.yaml)."""
        return self.sweep.runs / f"job-{self.job}"


def segment_file(path: Path, number: int, rank: int | None = None) -> Path:
    """Segment `number` (from 1) of the job whose file is `path`; of its process `rank`, where
    the point runs as several (harness.running.distributed)."""
    ranked = "" if rank is None else f".rank-{rank:04d}"
    return Path(path).with_name(f"{Path(path).stem}{ranked}.part-{number:08d}.parquet")


def segments(path: Path) -> list[Path]:
    """The segments of the job whose file is `path`, in order: by rank (none first), number."""
    found = [
        (_segment_order(m), folder_path)
        for folder_path in Path(path).parent.glob(f"{glob.escape(Path(path).stem)}.*part-*.parquet")
        if (m := SEGMENT.fullmatch(folder_path.name))
    ]
    return [segment for _, segment in sorted(found)]


def segment_number(path: Path) -> int:
    return int(SEGMENT.fullmatch(Path(path).name)[3])


def segment_rank(path: Path) -> int | None:
    """The rank whose rows the segment holds; None for a point of one process."""
    rank = SEGMENT.fullmatch(Path(path).name)[2]
    return None if rank is None else int(rank)


def _segment_order(match: re.Match) -> tuple[int, int, int]:
    """(job, rank, number) of a segment's name, a point of one process as rank -1."""
    return int(match[1]), -1 if match[2] is None else int(match[2]), int(match[3])


def sweep_dirs(root: Path, experiment: str | None, sweep: str | None) -> list[Path]:
    named = [glob.escape(name) if name else "*" for name in (experiment, sweep)]
    pattern = f"experiment={named[0]}/sweep={named[1]}"
    return sorted(p for p in Path(root).glob(pattern) if p.is_dir())


def listing(folder: Path) -> list[str]:
    """The folder's row files: *.parquet, without hidden (temporary) and "_" files."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.endswith(".parquet") and not n.startswith((".", "_")))


def job_files(names: list[str]) -> dict[int, str]:
    return {int(m[1]): name for name in names if (m := JOB.fullmatch(name))}


def job_segments(names: list[str]) -> dict[int, list[str]]:
    """job -> the names of its segments among `names`, in order."""
    found = sorted((_segment_order(m), name) for name in names if (m := SEGMENT.fullmatch(name)))
    jobs: dict[int, list[str]] = {}
    for (job, _, _), name in found:
        jobs.setdefault(job, []).append(name)
    return jobs


def replaced_segments(names: list[str]) -> list[str]:
    """The segments of jobs that have a job file: it replaced them (the reading rule)."""
    own = job_files(names)
    return [name for job, listed in job_segments(names).items() if job in own for name in listed]


def compacted_files(names: list[str]) -> list[str]:
    """The compacted files among `names`, newest first."""
    found = [(int(m[1]), name) for name in names if (m := COMPACTED.fullmatch(name))]
    return [name for _, name in sorted(found, reverse=True)]


def next_generation(names: list[str]) -> int:
    newest = compacted_files(names)
    return int(COMPACTED.fullmatch(newest[0])[1]) + 1 if newest else 1


def in_order(name: str) -> tuple:
    """A row file's place: by job, a job's segments by rank and number (past 10^8 too), then
    the rest."""
    if m := SEGMENT.fullmatch(name):
        return (0, *_segment_order(m), name)
    if m := JOB.fullmatch(name):
        return (0, int(m[1]), -1, 0, name)
    return (1, 0, -1, 0, name)


def read_job_file(path: Path) -> tuple[pa.Table, tuple[int, int, int]]:
    """A job file's or segment's rows and identity (files.read_checked); DamagedFile where a
    file named for one job holds rows of others."""
    table, identity = files.read_checked(path)
    named = JOB.fullmatch(path.name) or SEGMENT.fullmatch(path.name)
    jobs = set(table["job"].to_pylist()) if "job" in table.column_names else set()
    if named and jobs != {int(named[1])}:
        said = f"a file of job {int(named[1])} holding rows of jobs {sorted(jobs)}"
        raise files.DamagedFile(path, said)
    return table, identity


def name_once(path: Path, reason: str) -> None:
    """Say on stderr, once per process, that a file is skipped and why."""
    if path not in _named:
        _named[path] = reason
        print(f"warning: skipping {path}: {reason}", file=sys.stderr)


class Claimed(Exception):
    """Another command runs the sweep (claim): its message says which."""


@contextmanager
def claim(sweep: SweepPaths) -> Iterator[None]:
    """Hold the sweep for this command while it runs its points: a second command that would
    run them too (two resumes) raises Claimed, naming the process that holds it. The lock goes
    with the process, however it ends."""
    path = sweep.folder / RUN_LOCK
    try:
        opened = files.lock(path, wait=False)  # a symlink there: files.Linked, written to never
    except BlockingIOError:
        holder = path.read_text().strip() or "another process"
        raise Claimed(
            f"sweep {sweep.sweep} is being run by another command ({holder}): let it end, or "
            f"stop it, then resume; see its points with: python -m harness status {sweep.sweep}"
        ) from None
    try:
        os.ftruncate(opened, 0)
        os.write(opened, f"pid {os.getpid()} on {os.uname().nodename}\n".encode())
        yield
    finally:
        files.unlock(opened)


def skipped(sweep: SweepPaths) -> dict[Path, str]:
    """The sweep's files that reads in this process skipped as damaged (and still lie there),
    with the reason."""
    folder = sweep.folder
    return {
        path: why for path, why in _named.items() if path.parent == folder and os.path.lexists(path)
    }


def run_by(sweep: SweepPaths) -> tuple[str, float] | None:
    """(who, since when) of the command that holds the sweep (claim) now, or None."""
    held = _holder(sweep.folder / RUN_LOCK)
    return (held[0] or "another process", held[1]) if held else None


@contextmanager
def sweep_lock(folder: Path) -> Iterator[None]:
    """One compaction (or resume's release) of a sweep at a time; the lock goes with the process."""
    folder.mkdir(parents=True, exist_ok=True)
    with files.hold(folder / LOCK):
        yield


def hold_running(path: Path) -> tuple[Path, int]:
    """Mark the job of file `path` as running in this process: a lock (_job-N.running, beside
    the job's file; files.lock, so never through a symlink) that this process holds until
    release_running, or its death, lets it go."""
    marker = _running_marker(path)
    return marker, files.lock(marker, wait=False)


def release_running(marker: tuple[Path, int]) -> None:
    path, opened = marker
    with contextlib.suppress(OSError):
        path.unlink()
    files.unlock(opened)


def still_running(path: Path) -> bool | None:
    """Whether a process holds the job's running mark (hold_running); None where it has none
    (the job ended)."""
    held = _holder(_running_marker(path))
    return None if held is None else held is not False


def _holder(path: Path) -> tuple[str, float] | bool | None:
    """A look at the lock on `path` that takes it, shared, for no longer than the look (never
    waiting): None where there is no lock file of the harness's (none, or a link), False where
    no process holds it, else what its holder wrote in it and when (its text, its mtime)."""
    try:
        opened = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        fcntl.flock(opened, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.read(opened, 200).decode(errors="replace").strip(), os.fstat(opened).st_mtime
    finally:
        os.close(opened)  # and with it a shared lock taken
    return False


def _running_marker(path: Path) -> Path:
    return Path(path).with_name(f"_{Path(path).stem}{RUNNING_MARK}")


def a_point_runs(folder: Path) -> bool:
    """Whether a process holds the running mark of one of the sweep's jobs."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return False
    return any(_holder(folder / n) for n in names if n.startswith("_") and n.endswith(RUNNING_MARK))
