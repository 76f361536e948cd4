"""Reuse on request: a point answered before is copied only where its sweep asks (reuse=true on
the command line; `reuse: true` in the experiment's YAML, which states that its rows follow from
its config, its code, its declared inputs and the machine) and the store holds an answer under
the same key: its config_hash, code_digest, kind of machine (KIND, with the installed packages
and what Python runs beside them: harness.provenance), declared inputs' digests (inputs()), and
the stamps of the module files it imported from the installed packages (imported()). A record
(_answers/CONFIG_HASH/SWEEP.JOB.json) is a hint: the key is taken again and the rows read and
checked before a copy (find(), the one decision). A measurement (harness.measuring, or a
timing's samples: harness.measuring.columns.is_samples) is copied only where the command line
asks (copies "all").

What a point is seen to read can only refuse a copy (Watch): an opted-in point that read through
Python, or imported a module from, anywhere but its snapshot, Python's and the installed
packages' folders, its own output and its declared inputs records no answer, and the sweep says
what to declare. A library that reads in C, a process it starts, a variable read from the
environment: none is seen; the experiment's YAML states what its rows follow from.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
import re
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from harness import files, provenance, store
from harness.lifetime import per_command
from harness.names import NAME
from harness.pinning import codestore
from harness.reuse.watch import Watch, importing, module_file, real_folder  # noqa: F401

ANSWERS = "_answers"
MODULES = "_modules"  # _answers/_modules/DIGEST.json: the module files a key's stamps are of
KIND = ("device_name", "torch_version", "cuda_version", "cudnn_version", "driver_version",
        "python_version", "packages_digest", "threads", "environment")  # fmt: skip
HINT_BYTES = 64 << 20  # a hint is a few hundred bytes; anything larger is no hint
DIGEST = re.compile(r"[0-9a-f]{16}")


class Refused(Exception):
    """Why a point's answer can be neither copied nor recorded, in one line."""


def setting(copies: str, inputs: list[tuple[str, str]], folder: Path) -> dict:
    """A sweep's reuse, as planned: what it copies ("answers", or "all": measurements too), its
    declared inputs (each as written, and the parameter it names or the absolute glob it
    reads), and the experiment's config folder (where a new entry's glob would be relative to)."""
    return {"copies": copies, "inputs": [list(entry) for entry in inputs], "folder": str(folder)}


# The key -----------------------------------------------------------------------------------


def key(setting: dict, params: dict, device: str, named_env=(), threads=None,
        environ=None) -> tuple[dict, dict]:  # fmt: skip
    """A point's declared inputs, hashed (inputs()), and its key besides its config_hash: its
    code, the kind of machine a point on `device` gets with torch's `threads` and the
    environment `environ` (None: this process's), and its inputs' digests; Refused where its
    code is no snapshot or an input cannot be read."""
    found = inputs(setting, params)
    code = codestore.running_digest()
    if code is None:
        raise Refused("this process does not run its sweep's snapshot of the code")
    import torch

    kind = {**provenance.machine(device), "threads": threads or torch.get_num_threads(),
            "environment": provenance.environment(named_env, environ)}  # fmt: skip
    digests = {written: entry["digest"] for written, entry in found.items()}
    return found, {"code_digest": code, **kind, "inputs": digests}


def inputs(setting: dict, params: dict) -> dict[str, dict]:
    """Each declared input as written -> its paths (each with the links it was reached through,
    its final target last) and the digest of their bytes; Refused for one that cannot be read."""
    found = {}
    for written, named in setting.get("inputs") or []:
        if os.path.isabs(named):  # a glob
            paths = sorted(glob.glob(named, recursive=True))
        else:
            value = params.get(named)
            paths = value if isinstance(value, list) else [] if value is None else [value]
            if not all(isinstance(path, str | os.PathLike) for path in paths):
                raise Refused(f"the input {written} is {value!r}, no path")
        found[written] = _hashed(written, [os.path.abspath(path) for path in paths])
    return found


def _hashed(written: str, paths: list[str]) -> dict:
    cache, each, chains = _stat_cache(), [], []
    for path in paths:
        chain = _chain(path)
        try:
            each.append(f"{path}\0{_content(chain[-1], cache)}")
        except OSError as error:
            raise Refused(f"the input {written}: cannot read {error.filename or path} "
                          f"({error.strerror or error})") from None  # fmt: skip
        chains.append(chain)
    cache.save()
    digest = hashlib.sha256("\n".join(each).encode()).hexdigest()[:16]
    return {"digest": digest, "paths": chains}


def _chain(path: str) -> list[str]:
    """The path, and each link it leads through to its final target (the last)."""
    chain = [path]
    while os.path.islink(chain[-1]) and len(chain) <= 40:
        chain.append(os.path.join(os.path.dirname(chain[-1]), os.readlink(chain[-1])))
    return [*chain[:-1], os.path.realpath(chain[-1])] if len(chain) > 1 else chain


def _content(path: str, cache: codestore.StatCache) -> str:
    """A file's bytes' sha256, or a folder's: over its names and its files' bytes, below it."""
    if not os.path.isdir(path):
        return cache.hash(Path(path)) if stat.S_ISREG(os.stat(path).st_mode) else "not a file"
    lines, seen = [], set()
    for where, folders, names in os.walk(path, followlinks=True, onerror=_raise):
        real = os.path.realpath(where)
        if real in seen:  # a link back into a folder above: its names once
            folders.clear()
            continue
        seen.add(real)
        folders.sort()
        for name in sorted(names):
            inside = os.path.join(where, name)
            lines.append(f"{os.path.relpath(inside, path)}\0{_content(inside, cache)}")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _raise(error: OSError) -> None:
    raise error


@per_command
@functools.lru_cache(maxsize=1)
def _stat_cache() -> codestore.StatCache:
    running = codestore.running()
    return codestore.StatCache(running[0] if running else codestore.default_store(),
                               codestore.INPUTS_CACHE)  # fmt: skip


def imported() -> tuple[str, dict[str, list]]:
    """The files of the modules this process imported from Python's and the installed
    packages' folders (a module in a zip: the zip), each with its stamp (files.stamp), and their
    digest: a package patched or installed again in place has other stamps. Looked at again
    only once the modules are others in number."""
    return _imported(len(sys.modules), provenance.installed())


@per_command
@functools.lru_cache(maxsize=1)
def _imported(count: int, installed: tuple[str, ...]) -> tuple[str, dict[str, list]]:
    found = {}
    for module in list(sys.modules.values()):
        path = module_file(module)
        if path and path.startswith(installed) and path not in found:
            found[path] = _stamp(path)
    return _stamps_digest(found), found


def _stamps_digest(stamps: dict[str, list | None]) -> str:
    return hashlib.sha256(json.dumps(stamps, sort_keys=True).encode()).hexdigest()[:16]


def _stamp(path: str) -> list | None:
    """A module file's stamp, or its archive's (a module imported from a zip); None: gone."""
    while path and path != os.sep:
        try:
            return [*files.stamp(os.stat(path))]
        except NotADirectoryError:
            path = os.path.dirname(path)
        except OSError:
            return None
    return None


# The record and the lookup -----------------------------------------------------------------


def _folder(root: Path, experiment: str, config_hash: str) -> Path:
    return Path(root) / f"experiment={experiment}" / ANSWERS / config_hash


def record(job: store.JobPaths, rows: list[dict], key: dict, measured: bool,
           copies: str) -> None:  # fmt: skip
    """Note a point's answer as reusable, under its key and the stamps of the modules it
    imported: rows all ok, and measurements only where the sweep copies them (copies "all")."""
    if (measured and copies != "all") or not rows or any(r.get("status") != "ok" for r in rows):
        return
    modules, found = imported()
    sweep = job.sweep
    entry = {"sweep": sweep.sweep, "job": job.job, **key, "modules": modules, "measured": measured}
    folder = _folder(sweep.root, sweep.experiment, rows[0]["config_hash"])
    listed = sweep.root / f"experiment={sweep.experiment}" / ANSWERS / MODULES / f"{modules}.json"
    # Hints, written in place: met half-written, or lost to a crash, they only mean the point
    # is computed again.
    try:
        files.no_links(folder, depth=2)  # _answers/CONFIG_HASH: files.Linked, an OSError
        files.no_links(listed.parent)
        if not listed.exists():
            files.write_json(listed, found)
        files.write_in_place(folder / f"{sweep.sweep}.{job.job}.json", json.dumps(entry))
    except OSError:
        pass


@dataclass(frozen=True)
class Found:
    """What a lookup found: an answer's rows and where they came from ("SWEEP/JOB"); or, where
    it copies none, why the newest answer on record for the config was passed over."""

    rows: list[dict] | None = None
    source: str | None = None
    passed_over: str | None = None


def find(sweep: store.SweepPaths, config_hash: str, key: dict, copies: str) -> Found:
    """The one decision to copy: the newest answer on record for this config in another sweep
    of the experiment than `sweep` whose key is this point's (`key`), whose modules are as they
    were, and which is no measurement unless the sweep copies "all"; and its rows, read and
    checked. None (and why, where one is on record) otherwise."""
    root, experiment = sweep.root, sweep.experiment
    if config_hash not in _answered(Path(root), experiment):
        return Found()
    folder = _folder(root, experiment, config_hash)
    try:
        names = sorted(os.listdir(folder), reverse=True)  # sweep ids sort by time
    except OSError:
        return Found()
    passed_over = None
    for name in names:
        entry = _hint(folder / name)
        if entry is None or entry.get("sweep") == sweep.sweep:
            continue
        source = f"{entry.get('sweep')}/{entry.get('job')}"
        why = _why_not(root, experiment, entry, key, copies)
        if why is None:
            recorded = store.SweepPaths(root, experiment, str(entry.get("sweep")))
            rows = _answer(recorded, entry.get("job"), config_hash)
            if rows and all(_as_recorded(row, key) for row in rows):  # the new point's own
                return Found([{**row, "reused_from": source} for row in rows], source)
            why = "its rows are gone or not what its record says"
        passed_over = passed_over or f"{source} {why}"
    return Found(passed_over=passed_over)


def _as_recorded(row: dict, key: dict) -> bool:
    """Whether a copied row is ok and says what its record does of its code, machine and
    declared inputs."""
    try:
        declared = json.loads(row.get("declared_inputs") or "{}")
        inputs = {written: entry["digest"] for written, entry in declared.items()}
    except (ValueError, TypeError, KeyError, AttributeError):
        return False
    machine = all(row.get(name) == value for name, value in key.items() if name != "inputs")
    return row.get("status") == "ok" and inputs == key["inputs"] and machine


def _why_not(root: Path, experiment: str, entry: dict, key: dict, copies: str) -> str | None:
    """Why an answer on record is not the one to copy (None: it may be)."""
    differs = next((k for k, value in key.items() if entry.get(k) != value), None)
    if differs == "inputs":
        was, now = entry.get("inputs") or {}, key["inputs"]
        named = next((k for k in {*was, *now} if was.get(k) != now.get(k)), "")
        return f"read its input {named} as other bytes"
    if differs is not None:
        return f"has {differs} {entry.get(differs)!r}, where this point has {key[differs]!r}"
    if entry.get("measured") and copies != "all":
        return "measured the moment (reuse=true on the command line copies it)"
    if not _modules_as_recorded(Path(root), experiment, str(entry.get("modules"))):
        return "imported a module of the installed packages that has changed since"
    return None


@per_command
@functools.lru_cache(maxsize=16)
def _modules_as_recorded(root: Path, experiment: str, modules: str) -> bool:
    """Whether the module files an answer's record lists still have the stamps it recorded."""
    if not DIGEST.fullmatch(modules):
        return False
    found = _hint(root / f"experiment={experiment}" / ANSWERS / MODULES / f"{modules}.json")
    if found is None:
        return False
    return _stamps_digest({path: _stamp(path) for path in found}) == modules


def _hint(path: Path) -> dict | None:
    """A record, read as data: None for what is not a regular file of a hint's size (a pipe
    there would hold every sweep of the config), or not JSON of a mapping."""
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
    listing a command, not one a point."""
    try:
        return frozenset(os.listdir(root / f"experiment={experiment}" / ANSWERS))
    except OSError:
        return frozenset()


def may_have(root: Path, experiment: str, config_hash: str) -> bool:
    """Whether an answer to this config is on record (one listing a command)."""
    return config_hash in _answered(Path(root), experiment)


def _answer(sweep: store.SweepPaths, job, config_hash: str) -> list[dict]:
    """The job's rows as the store reads them (its file, else the sweep's compacted files): a
    record's sweep and job, read as data."""
    if isinstance(job, bool) or not isinstance(job, int) or not NAME.fullmatch(sweep.sweep):
        return []
    try:
        path = sweep.job(job).file
        if path.exists():
            rows = store.job_rows(path)
        else:
            rows = [row for row in _sweep_rows(sweep) if row.get("job") == job]
    except (OSError, ValueError, LookupError, RuntimeError, files.DamagedFile):
        return []
    return [row for row in rows if row.get("config_hash") == config_hash]


@per_command
@functools.lru_cache(maxsize=2)
def _sweep_rows(sweep: store.SweepPaths) -> list[dict]:
    return store.read_table(sweep.root, sweep.experiment, sweep.sweep, partitions=False).to_pylist()


def advice(path: str, setting: dict, params: dict) -> str:
    """The `inputs:` entry that would declare `path`: the parameter whose value names it, else
    its path (relative to the experiment's config folder, where it lies below it)."""
    real = os.path.realpath(path)
    for name, value in params.items():
        if isinstance(value, str) and real == os.path.realpath(value):
            return name
    folder = os.path.realpath(setting.get("folder") or os.sep)
    return os.path.relpath(real, folder) if real.startswith(folder + os.sep) else real


def undeclared_line(job: int, paths: list[str], setting: dict, params: dict) -> str:
    """The one line a sweep says of a point that read what its experiment does not declare."""
    more = f" (and {len(paths) - 1} more)" if len(paths) > 1 else ""
    return (f"job {job} read {paths[0]}{more}, which its experiment's inputs do not declare: "
            f"no answer of it is recorded for reuse; declare it in the experiment's YAML "
            f"(experiment.inputs: [{advice(paths[0], setting, params)}])")  # fmt: skip
