"""Compaction: a finished sweep's files merged into one, a resume's jobs moved back out
of it, damaged files set aside; no row out of sight meanwhile.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.compute as pc

from harness import files
from harness.store.layout import (
    LOCK,
    SET_ASIDE,
    SweepPaths,
    a_point_runs,
    compacted_files,
    job_files,
    job_segments,
    listing,
    next_generation,
    replaced_segments,
    skipped,  # noqa: F401
    sweep_lock,
)
from harness.store.manifest import read_manifest
from harness.store.reading import (
    as_planned,
    by_job,
    has_running_rows,
    jobs_in,
    read_parts,
    split_by_job,
)
from harness.store.rows import concat, without_empty_columns, write_file


def compact(sweep: SweepPaths) -> tuple[Path | None, list[str]]:
    """Merge a sweep's files into one, compacted-N.parquet; the merged file and what it absorbed.

    The merged rows go to a hidden temporary file, fsynced and renamed into place before any
    absorbed file is removed, so no row is ever out of sight: `read` sees each row once
    throughout, and pandas, pyarrow and DuckDB see each row once again when it returns. A job
    file that a job rewrote after it was merged is kept: it is newer, and `read` prefers it.
    Temporary files that writers killed mid-write left behind (older than files.STALE_S) go too,
    and so do the segments a job file has replaced (a SIGKILL left them). A sweep with a
    training job that has not ended (rows "running"), or with a point that a process runs now
    (its running mark held: a restore writes its rows back as segments beside its job file,
    which a compaction would take for replaced ones), is left as it is: (None, []).
    """
    folder = sweep.folder
    if not folder.is_dir():
        return None, []
    with sweep_lock(folder), files.uninterrupted():
        files.remove_temporaries(folder, older_than_s=files.STALE_S)
        names = listing(folder)
        if len(names) <= 1 and compacted_files(names) == names:  # nothing, or one compacted file
            return (folder / names[0] if names else None), []
        if a_point_runs(folder):  # its files are its own until it ends (a restore rewrites them)
            return None, []
        parts, identities = read_parts(folder, names)
        foreign = _foreign_files(sweep, parts)
        parts = {name: part for name, part in parts.items() if name not in foreign}
        identities = {name: ident for name, ident in identities.items() if name not in foreign}
        if not identities or any(has_running_rows(table) for table in parts.values()):
            return None, []  # every file damaged, or a training job still going: not ended
        for name in replaced_segments(names):  # out of sight while their job file lies there
            (folder / name).unlink(missing_ok=True)
        path = folder / f"compacted-{next_generation(names):06d}.parquet"
        write_file(path, by_job(concat(list(parts.values()))))
        _remove_unchanged(folder, identities)
    return path, sorted(identities)


def _foreign_files(sweep: SweepPaths, parts: dict) -> set[str]:
    """The job files whose rows are not the sweep's planned point's (as_planned names them):
    never merged, left for resume to set aside."""
    files = job_files(list(parts))
    hashes = [
        parts[name].select(["job", "config_hash"])
        for name in files.values()
        if {"job", "config_hash"} <= set(parts[name].column_names)
    ]
    if not hashes:
        return set()
    rows = concat(hashes)
    kept = as_planned(rows, read_manifest(sweep), sweep.root)
    return {files[job] for job in set(rows["job"].to_pylist()) - set(kept["job"].to_pylist())}


def release(sweep: SweepPaths, jobs: Iterable[int]) -> list[int]:
    """Move these jobs' rows out of the sweep's compacted file into job files of their own.

    Resume calls this before it reruns them, so that a rerun replaces a job's rows the usual
    way, by replacing its job file, and the folder as it lies holds every row once. Returns
    the jobs moved.
    """
    folder = sweep.folder
    if not compacted_files(listing(folder)):  # never compacted: nothing to move, nothing to lock
        return []
    with sweep_lock(folder), files.uninterrupted():
        names = listing(folder)
        own = set(job_files(names)) | set(job_segments(names))  # their compacted rows are stale
        parts, _ = read_parts(folder, compacted_files(names))
        merged = concat(list(parts.values()))
        if not merged.num_rows:
            return []
        moving = jobs_in(merged["job"], set(jobs) - own)
        moved = split_by_job(merged.filter(moving))
        if not moved:
            return []
        for job, rows in moved.items():
            write_file(sweep.job(job).file, without_empty_columns(rows))
        kept = merged.filter(pc.invert(pc.or_(moving, jobs_in(merged["job"], own))))
        if kept.num_rows:
            write_file(folder / f"compacted-{next_generation(names):06d}.parquet", kept)
        for name in compacted_files(names):
            (folder / name).unlink(missing_ok=True)
        files.fsync_dir(folder)
    return sorted(moved)


def set_aside(sweep: SweepPaths) -> list[Path]:
    """Move the sweep's files that reads in this process skipped (skipped) out of every
    reader's way: a "_damaged-" name without the .parquet suffix, kept for a post-mortem.
    Returns where they went."""
    folder, moved = sweep.folder, []
    with sweep_lock(folder):
        for path in skipped(sweep):
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
            target = folder / f"{SET_ASIDE}{path.name}-{stamp}.bad"
            os.replace(path, target)
            moved.append(target)
        if moved:
            files.fsync_dir(folder)
    return moved


def prune(sweep: SweepPaths) -> bool:
    """Remove a sweep folder that holds nothing but temporaries older than files.STALE_S (a sweep
    whose manifest a kill cut short, planned and never started): whether it went."""
    folder = sweep.folder
    if sweep.manifest.exists() or listing(folder):
        return False
    files.remove_temporaries(folder, older_than_s=files.STALE_S)
    with contextlib.suppress(OSError):
        for path in folder.iterdir():
            if path.name != LOCK:
                return False
        (folder / LOCK).unlink(missing_ok=True)
        folder.rmdir()
        return True
    return False


def _remove_unchanged(folder: Path, identities: dict[str, tuple[int, int, int]]) -> None:
    """Remove the files that were merged, unless one was replaced since it was read."""
    for name, identity in identities.items():
        path = folder / name
        try:
            stat = path.stat()
        except FileNotFoundError:
            continue
        if (stat.st_ino, stat.st_mtime_ns, stat.st_size) == identity:
            path.unlink(missing_ok=True)
    files.fsync_dir(folder)
