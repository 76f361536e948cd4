"""Reuse: a point whose answer the store holds already is copied, not computed again, where a
fresh run would give the same rows.

The key: the point's config_hash (its parameters and the rest of the resolved config it sees:
the `run` target, the seed; harness.planning.experiment.config_hash), the code it ran
(code_digest), the kind of machine (KIND: the device's name, the versions of torch, CUDA,
cuDNN, the GPU's driver and Python, the installed packages, the count of torch's threads it ran
with, and the environment variables that change numerics; never the host or SLURM's ids), and
every file the point read from outside its snapshot, the standard library and the installed
packages, each with its digest (harness.pinning.reads), checked again before a copy. Rows
copied become the new point's own job's rows, with `reused_from` naming the sweep and job they
came from ("SWEEP/JOB") and their original started_at, duration and host, so that every reader,
claim and report sees a complete sweep. Failed, killed and not-run points, a search's trials
and points of several processes are never reused.

Only answers: a point that timed calls or measured memory (harness.measuring), or whose rows
hold timing samples (*_samples_ms), measures the moment, and is copied only where its sweep
says reuse=true (an experiment's YAML, or the command line); with the default (reuse: null)
such a point runs again, and with reuse=false nothing is recorded or copied.

Candidates are found without reading the store: each answer that may be reused is recorded
beside its experiment's manifests, one small file per answer under _answers/CONFIG_HASH/, and
the record is only a hint: the rows it names are read and checked before they are copied.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from harness import files, store
from harness.lifetime import per_command
from harness.names import NAME
from harness.pinning import provenance, reads

ANSWERS = "_answers"
KIND = ("device_name", "torch_version", "cuda_version", "cudnn_version", "driver_version",
        "python_version", "packages_digest", "threads", "environment")  # fmt: skip
SHOWN = 3  # files read that a sweep's summary names
HINT_BYTES = 64 << 20  # a hint is a few hundred bytes, or names the files its point read


def kind(device: str, named_env=(), threads: int | None = None, environ=None) -> dict:
    """The kind of machine a point on `device` gets (KIND): this process's, with torch's
    `threads` (None: this process's now) and the environment `environ` (None: this one's)."""
    import torch

    return {**provenance.machine(device), "threads": threads or torch.get_num_threads(),
            "environment": provenance.environment(named_env, environ)}  # fmt: skip


def measures(taken: tuple[str, ...], rows: list[dict]) -> bool:
    """Whether a point measured the moment: it timed calls or measured memory (`taken`, from
    harness.measuring), or its rows hold timing samples."""
    return bool(taken) or any(key.endswith("_samples_ms") for row in rows for key in row)


def _folder(root: Path, experiment: str, config_hash: str) -> Path:
    return Path(root) / f"experiment={experiment}" / ANSWERS / config_hash


def record(root: Path, experiment: str, sweep: str, job: int, rows: list[dict],
           read: dict, measured: bool, setting: bool | None) -> None:  # fmt: skip
    """Note a point's answer as reusable, with the files it `read` and their digests: rows all
    ok, of code the process ran from a snapshot, and a sweep that reuses (`setting`: its
    reuse, which a point that measured the moment needs true)."""
    first = rows[0] if rows else {}
    if setting is False or (measured and setting is not True):
        return
    if not first.get("code_digest") or any(row.get("status") != "ok" for row in rows):
        return
    entry = {"sweep": sweep, "job": job, "code_digest": first["code_digest"],
             **{key: first.get(key) for key in KIND}, "files_read": read,
             "measured": measured}  # fmt: skip
    folder = _folder(root, experiment, first["config_hash"])
    # A hint, written in place: neither renamed into place nor forced to disk (the point's
    # cost). Met half-written (find reads it as nothing), or lost to a crash, it only means
    # the point is computed again.
    with contextlib.suppress(OSError):
        files.no_links(folder, depth=2)  # _answers/CONFIG_HASH: files.Linked, an OSError
        files.write_in_place(folder / f"{sweep}.{job}.json", json.dumps(entry))


def may_have(root: Path, experiment: str, config_hash: str) -> bool:
    """Whether an answer to this config is on record (one listing a command)."""
    return config_hash in _answered(Path(root), experiment)


@dataclass(frozen=True)
class Found:
    """What a lookup found: an answer's rows and where they came from ("SWEEP/JOB"); or, where
    it copies none, why the newest answer on record for the config was passed over."""

    rows: list[dict] | None = None
    source: str | None = None
    passed: str | None = None


def find(root: Path, experiment: str, config_hash: str, code: str, kind: dict, sweep: str,
         setting: bool | None) -> Found:  # fmt: skip
    """The newest reusable answer for this config, code and kind of machine in another sweep,
    whose files read still hash as they did; none (and why not, where one is on record) where
    there is none, or `setting`, the sweep's reuse, is false."""
    if setting is False or not may_have(root, experiment, config_hash):
        return Found()
    folder = _folder(root, experiment, config_hash)
    try:
        names = sorted(os.listdir(folder), reverse=True)  # sweep ids sort by time
    except OSError:
        return Found()
    wanted, passed = {"code_digest": code, **kind}, None
    for name in names:
        entry = _hint(folder / name)
        if entry is None or entry.get("sweep") == sweep:
            continue
        source = f"{entry.get('sweep')}/{entry.get('job')}"
        why = _passed(entry, wanted, setting)
        if why is None:
            rows = _answer(root, experiment, str(entry["sweep"]), entry.get("job"), config_hash)
            if rows and all(
                row.get("status") == "ok" and all(row.get(k) == v for k, v in wanted.items())
                for row in rows
            ):
                return Found(rows, source)
            why = "its rows are gone or not what its record says"
        passed = passed or f"{source} {why}"
    return Found(passed=passed)


def _passed(entry: dict, wanted: dict, setting: bool | None) -> str | None:
    """Why an answer on record is not the one to copy (None: it may be)."""
    differs = next((key for key, value in wanted.items() if entry.get(key) != value), None)
    if differs is not None:
        return f"has {differs} {entry.get(differs)!r}, where this point has {wanted[differs]!r}"
    if entry.get("measured") and setting is not True:
        return "measured the moment (reuse=true copies it)"
    read = entry.get("files_read")
    changed = reads.changed(read) if isinstance(read, dict) else "(no record of them)"
    return None if changed is None else f"read {changed}, which has changed since"


def _hint(path: Path) -> dict | None:
    """A hint's entry, read as data: None for what is not a regular file of the harness's size
    (a pipe there would hold every sweep of the config), or not JSON of a mapping."""
    try:
        opened = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(opened, "rb") as file:
        found = os.fstat(opened)
        if not stat.S_ISREG(found.st_mode) or found.st_size > HINT_BYTES:
            return None
        try:
            entry = json.loads(file.read(HINT_BYTES))
        except (OSError, ValueError):
            return None
    return entry if isinstance(entry, dict) else None


@per_command
@functools.lru_cache(maxsize=8)
def _answered(root: Path, experiment: str) -> frozenset[str]:
    """The configs (config_hash) with an answer on record when this command first looked: one
    listing a command, not one a point. An answer recorded since by another command is a hint
    the next command sees."""
    try:
        return frozenset(os.listdir(root / f"experiment={experiment}" / ANSWERS))
    except OSError:
        return frozenset()


def _answer(root: Path, experiment: str, sweep: str, job, config_hash: str) -> list[dict]:
    """The job's rows as the store reads them (its file, else the sweep's compacted files)."""
    if isinstance(job, bool) or not isinstance(job, int) or not NAME.fullmatch(sweep):
        return []
    try:
        path = store.job_file(root, experiment, sweep, job)
        if path.exists():
            rows = store.job_rows(path)
        else:
            rows = [row for row in _sweep_rows(root, experiment, sweep) if row.get("job") == job]
    except (OSError, ValueError, LookupError, RuntimeError, files.DamagedFile):
        return []
    return [row for row in rows if row.get("config_hash") == config_hash]


@per_command
@functools.lru_cache(maxsize=2)
def _sweep_rows(root: Path, experiment: str, sweep: str) -> list[dict]:
    return store.read_table(root, experiment, sweep, partitions=False).to_pylist()


def copied(rows: list[dict], job: int, source: str) -> list[dict]:
    """The answer's rows as the new point's: its job number, and where they came from."""
    return [{**row, "job": job, "reused_from": source} for row in rows]


def said(rows) -> list[str]:
    """What a sweep's rows (a table or a frame) say of their code, reuse and reads, as lines for
    its summary and status: how many points were reused and from which sweeps, the codes its
    points ran when there is more than one, and the files they read that the sweep did not pin."""
    jobs = store.values(rows, "job")
    sources, codes, read = {}, {}, {}
    for job, source, code, files_read in zip(
        jobs, store.values(rows, "reused_from"), store.values(rows, "code_digest"),
        store.values(rows, "files_read"), strict=True,
    ):  # fmt: skip
        if isinstance(source, str):
            sources.setdefault(job, source.rpartition("/")[0])
        if isinstance(code, str):
            codes.setdefault(code, set()).add(job)
        for path in _paths(files_read):
            read.setdefault(path, set()).add(job)
    lines = []
    if sources:
        from_ = sorted(set(sources.values()))
        lines.append(f"{len(sources)} points reused (not run again) from sweep"
                     f"{'s' if len(from_) > 1 else ''} {', '.join(from_)}")  # fmt: skip
    if len(codes) > 1:
        each = ", ".join(f"{code} ({len(jobs)} points)" for code, jobs in sorted(codes.items()))
        lines.append(f"its points ran {len(codes)} different codes: {each}")
    if read:
        shown = sorted(read.items(), key=lambda item: (-len(item[1]), item[0]))
        each = ", ".join(f"{path} ({len(jobs)} points)" for path, jobs in shown[:SHOWN])
        more = f" and {len(read) - SHOWN} more" if len(read) > SHOWN else ""
        lines.append(f"its points read {len(read)} files the sweep did not pin (each with its "
                     f"digest in the rows' files_read): {each}{more}")  # fmt: skip
    return lines


def _paths(files_read) -> list[str]:
    """The files a row's files_read names as read (not those looked for and absent, nor its
    count of them all)."""
    if not isinstance(files_read, str) or files_read in ("", "{}"):
        return []
    try:
        found = json.loads(files_read)
    except ValueError:
        return []
    if not isinstance(found, dict):
        return []
    return [path for path, digest in found.items()
            if not path.startswith("(") and digest != reads.ABSENT]  # fmt: skip
