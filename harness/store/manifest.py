"""A sweep's manifest (_sweep.json: its planned points and how it was made), read as data
that anyone may have edited, and the listing of experiments and sweeps.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import shutil
import time
from pathlib import Path

from harness import files
from harness.errors import BadInput
from harness.store.layout import MANIFEST, MANIFEST_KINDS, SweepPaths, name_once
from harness.store.search_settings import shape_fault


def read_manifest(sweep: SweepPaths) -> dict | None:
    """The sweep's manifest; None when it is missing or cannot be read (named on stderr)."""
    path = sweep.manifest
    try:
        manifest = files.read_json(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        reason = (str(error).splitlines() or [""])[0][:120]
        name_once(path, f"unreadable manifest ({type(error).__name__}: {reason})")
        return None
    wrong = _manifest_fault(manifest)
    if wrong:
        name_once(path, f"a damaged manifest: {wrong}")
        return None
    return manifest


def _manifest_fault(manifest) -> str | None:
    """What makes a manifest unusable (no points, a point without its job number or params, a
    job twice, a recorded setting of the wrong kind, a search that is none), or None."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("points"), list):
        return "it has no list of points"
    if not manifest["points"]:
        return "its list of points is empty"
    if not isinstance(manifest.get("experiment_config", {}), dict):
        return "its experiment_config is not a mapping"
    for key, kind in MANIFEST_KINDS.items():
        if manifest.get(key) is not None and not isinstance(manifest[key], kind):
            return f"its {key} is not a {kind.__name__}"
    searched = manifest.get("experiment_config", {}).get("search")
    if searched is not None and (fault := shape_fault(searched)):
        return f"its recorded {fault}"
    jobs = set()
    for position, point in enumerate(manifest["points"]):
        if not isinstance(point, dict):
            return f"point {position} is not a mapping"
        job = point.get("job")
        if isinstance(job, bool) or not isinstance(job, int) or job < 0 or job in jobs:
            return f"point {position} has no job number of its own (job={job!r})"
        if not isinstance(point.get("params"), dict):
            return f"point {position} (job {job}) has no params"
        if not isinstance(point.get("overrides", []), list):
            return f"point {position} (job {job}) has no list of overrides"
        jobs.add(job)
    return None


def write_manifest(root: Path, manifest: dict, new: bool = False) -> None:
    """The manifest as JSON, a line per point: readable, and written by json's C encoder
    (an indented dump is pure Python: seconds for 100,000 points). `new`: a new sweep's, whose
    folder must not exist yet (FileExistsError: the id is another sweep's)."""
    path = SweepPaths(root, manifest["experiment"], manifest["sweep"]).manifest
    header = json.dumps({k: v for k, v in manifest.items() if k != "points"}, indent=2, default=str)
    points = ",\n".join(json.dumps(point, default=str) for point in manifest["points"])
    text = f'{header[:-2]},\n  "points": [\n{points}\n]}}\n'
    if new:
        _create_sweep(path.parent, text)
    else:
        files.write_text(path, text)


def _create_sweep(folder: Path, manifest: str) -> None:
    """A new sweep's folder appears with its manifest in it, never without (a kill between
    the two would leave a sweep that cannot be resumed): both are written in a hidden folder,
    which is renamed into place. The rename fails onto a folder that holds anything, so two
    sweeps never share an id; a killed creator's hidden folder goes an hour later."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    for stale in folder.parent.glob(".sweep=*.tmp"):
        with contextlib.suppress(OSError):
            if time.time() - stale.stat().st_mtime > files.STALE_S:
                shutil.rmtree(stale)
    staging = folder.with_name(f".{folder.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    staging.mkdir()
    try:
        files.write_text(staging / MANIFEST, manifest)
        try:
            os.rename(staging, folder)
        except OSError as error:
            if error.errno in (errno.EEXIST, errno.ENOTEMPTY):
                raise FileExistsError(errno.EEXIST, "the sweep id is taken", str(folder)) from None
            raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    files.fsync_dir(folder.parent)


def sweeps(root: Path, experiment: str) -> list[str]:
    """The experiment's sweep ids, oldest first (ids start with their UTC start time)."""
    folder = Path(root) / f"experiment={experiment}"
    return sorted(p.name.removeprefix("sweep=") for p in folder.glob("sweep=*") if p.is_dir())


def newest_sweep(root: Path, experiment: str | None = None) -> str | None:
    """The newest sweep's id, of the experiment or of any; None in a store without one."""
    names = [experiment] if experiment else experiments(root)
    return max((s for name in names for s in sweeps(root, name)), default=None)


LAST = "last"  # a sweep's name for the newest, as the command line takes it
TAG = "tag:"  # tag:NAME: the newest sweep that `tag=NAME` named, as the command line takes it


def named_sweep(root: Path, sweep_id: str, experiment: str | None = None) -> str:
    """The sweep id itself; for "last" the newest sweep's (of `experiment`, if given); for
    "tag:NAME" the newest sweep tagged NAME (of `experiment`, if given). BadInput where there
    is none."""
    of = f" of {experiment}" if experiment else ""
    if sweep_id.startswith(TAG):
        tag = sweep_id.removeprefix(TAG)
        names = [experiment] if experiment else experiments(root)
        manifests = [(s, read_manifest(SweepPaths(root, name, s)) or {}) for name in names
                     for s in sweeps(root, name)]  # fmt: skip
        tagged = [s for s, manifest in manifests  # never a rerun of one (again_of: its own)
                  if manifest.get("tag") == tag and not manifest.get("again_of")]  # fmt: skip
        if not tagged:
            raise BadInput(f"no sweep{of} in {root} is tagged {tag!r} (tag={tag} names one)")
        return max(tagged)
    if sweep_id != LAST:
        return sweep_id
    newest = newest_sweep(root, experiment)
    if newest is None:
        raise BadInput(f"no sweep{of} in {root} yet, so none is the last")
    return newest


def experiments(root: Path) -> list[str]:
    return sorted(p.name.removeprefix("experiment=") for p in Path(root).glob("experiment=*"))


def experiment_of(root: Path, sweep: str) -> str | None:
    """The experiment whose sweep this id is; None when no experiment in root has it."""
    found = [e for e in experiments(root) if SweepPaths(root, e, sweep).folder.is_dir()]
    return found[0] if found else None
