"""Reuse: a point whose answer the store holds already is copied, not computed again.

An answer is reusable when every row of it is ok and it was computed for the same config_hash,
by the same code (code_digest) on the same kind of machine (device_name, torch_version,
cuda_version, packages_digest: never the host or SLURM's ids). Its rows become the new point's
own job's rows, with `reused_from` naming the sweep and job they came from ("SWEEP/JOB") and
their original started_at, duration and host, so that every reader, claim and report sees a
complete sweep. Failed, killed and not-run points, a search's trials and points of several
processes are never reused.

Candidates are found without reading the store: each answer that may be reused is recorded
beside its experiment's manifests, one small file per answer under _answers/CONFIG_HASH/, and
the record is only a hint: the rows it names are read and checked before they are copied.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from pathlib import Path

from harness import files, store
from harness.lifetime import per_command
from harness.names import NAME
from harness.pinning import provenance

ANSWERS = "_answers"
KIND = ("device_name", "torch_version", "cuda_version", "packages_digest")  # a kind of machine


def machine(device: str) -> dict:
    """This process's kind of machine for a point on `device`."""
    import torch

    return {
        "device_name": provenance.device_name(device),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "packages_digest": provenance.packages_digest(provenance.packages()),
    }


def _folder(root: Path, experiment: str, config_hash: str) -> Path:
    return Path(root) / f"experiment={experiment}" / ANSWERS / config_hash


def record(root: Path, experiment: str, sweep: str, job: int, rows: list[dict]) -> None:
    """Note a point's answer as reusable: rows all ok, of code the process ran from a snapshot."""
    first = rows[0] if rows else {}
    if not first.get("code_digest") or any(row.get("status") != "ok" for row in rows):
        return
    entry = {"sweep": sweep, "job": job, "code_digest": first["code_digest"],
             **{key: first.get(key) for key in KIND}}  # fmt: skip
    folder = _folder(root, experiment, first["config_hash"])
    # A hint, written in place: neither renamed into place nor forced to disk (the point's
    # cost). Met half-written (find reads it as nothing), or lost to a crash, it only means
    # the point is computed again.
    with contextlib.suppress(OSError):
        files.no_links(folder, depth=2)  # _answers/CONFIG_HASH: files.Linked, an OSError
        files.write_in_place(folder / f"{sweep}.{job}.json", json.dumps(entry))


def find(root: Path, experiment: str, config_hash: str, code: str, kind: dict, sweep: str):
    """(rows, "SWEEP/JOB") of the newest reusable answer for this config, code and kind of
    machine in another sweep; None when there is none."""
    if config_hash not in _answered(Path(root), experiment):
        return None
    folder = _folder(root, experiment, config_hash)
    try:
        names = sorted(os.listdir(folder), reverse=True)  # sweep ids sort by time
    except OSError:
        return None
    for name in names:
        try:
            entry = files.read_json(folder / name)
        except (OSError, ValueError):
            continue
        if not isinstance(entry, dict) or entry.get("sweep") == sweep:
            continue
        wanted = {"code_digest": code, **kind}
        if any(entry.get(key) != value for key, value in wanted.items()):
            continue
        rows = _answer(root, experiment, str(entry["sweep"]), entry.get("job"), config_hash)
        if rows and all(
            row.get("status") == "ok" and all(row.get(k) == v for k, v in wanted.items())
            for row in rows
        ):
            return rows, f"{entry['sweep']}/{entry['job']}"
    return None


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
    """What a sweep's rows (a table or a frame) say of their code and reuse, as lines for its
    summary and status: how many points were reused and from which sweeps, and the codes its
    points ran when there is more than one."""
    jobs = store.values(rows, "job")
    sources, codes = {}, {}
    for job, source, code in zip(jobs, store.values(rows, "reused_from"),
                                 store.values(rows, "code_digest"), strict=True):  # fmt: skip
        if isinstance(source, str):
            sources.setdefault(job, source.rpartition("/")[0])
        if isinstance(code, str):
            codes.setdefault(code, set()).add(job)
    lines = []
    if sources:
        from_ = sorted(set(sources.values()))
        lines.append(f"{len(sources)} points reused (not run again) from sweep"
                     f"{'s' if len(from_) > 1 else ''} {', '.join(from_)}")  # fmt: skip
    if len(codes) > 1:
        each = ", ".join(f"{code} ({len(jobs)} points)" for code, jobs in sorted(codes.items()))
        lines.append(f"its points ran {len(codes)} different codes: {each}")
    return lines
