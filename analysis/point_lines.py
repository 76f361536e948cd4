"""Each sweep's points in one line each, for the report page's sweep list, its picker and its
history across sweeps: a point's parameters (from the manifest), its status and error, its
provenance (start time, commit, torch, device), the time its sweep was planned (the manifest's
created_at) and the metrics of its last row (a training point's held-out evaluation), a planned
point without rows as "not run".

The lines are cached in the report folder (CACHE/EXPERIMENT/SWEEP.json), each with the sweep's
fingerprint (its files' names, sizes and modification times) and that of the code and configs
that make it (`code_version`): a sweep whose files have not changed since is not read again,
so the page of a store of thousands of finished sweeps reads one small JSON file per sweep
(octlm_analysis.report caches each sweep's section so too). The cache is JSON, never pickle, and
each
file opens with a MAC of its JSON under a key kept outside outputs/ (KEY, made once, readable by
its owner alone; one that is no key is replaced): a cache edited in the report folder (a claim
turned to PASS, markup in a section) does not verify, so it is computed again, not believed.
"""

import contextlib
import errno
import functools
import hashlib
import hmac
import importlib.util
import json
import os
import secrets
import stat
import tempfile
from importlib import metadata
from pathlib import Path

import numpy as np
import pandas as pd

from harness import files, store
from harness.errors import BadInput
from harness.measuring.columns import is_number_column
from harness.names import CONF, HERE
from harness.results import runs
from harness.searching import search

CACHE = ".cache"
PROVENANCE = ["started_at", "git_commit", "code_digest", "torch_version", "device_name"]
# When the sweep was planned (its manifest's created_at): a reused row's started_at is its first
# run's, older than the sweep that reused it.
PLANNED = "sweep_planned_at"
# The harness's columns kept.
KEPT = {"job", "status", "reused_from", "error", "cell", "trial", *PROVENANCE}
RAN = " (ran)"  # of_rows: a searched parameter's column as the rows have it, while merging
VERSION = 4  # of the caches' layout: a cache of another is recomputed
KEY = (
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    / "octlm-harness"
    / "report.key"
)


def of_experiment(root: Path, experiment: str, report_dir: Path) -> pd.DataFrame:
    """Every sweep of the experiment, a line per planned point (of_sweep), oldest sweep first;
    attrs["params"]: the parameters' names."""
    kept = [
        of_sweep(store.SweepPaths(root, experiment, sweep), report_dir)
        for sweep in store.sweeps(root, experiment)
    ]
    table = pd.DataFrame([point for one in kept for point in one["points"]])  # one construction
    for column in ("sweep", "job", "status", PLANNED, *PROVENANCE):
        if column not in table:
            table[column] = None
    for column in ("started_at", PLANNED):  # in one unit: sweep_states fills one by the other
        table[column] = pd.to_datetime(table[column], utc=True, errors="coerce").dt.as_unit("us")
    table.attrs["params"] = list(dict.fromkeys(p for one in kept for p in one["params"]))
    return table


def of_sweep(sweep: store.SweepPaths, report_dir: Path) -> dict:
    """One sweep's points ({"params": names, "points": records}), from the cache when its
    fingerprint still holds."""
    path = report_dir / CACHE / sweep.experiment / f"{sweep.sweep}.json"
    return cached(path, sweep.folder, lambda: _kept(compute(sweep)))


def keep(sweep: store.SweepPaths, report_dir: Path, points: pd.DataFrame) -> None:
    """A sweep's points computed elsewhere (a report section, from the rows it read) kept as
    `of_sweep` would keep them, so that they are not read again."""
    path = report_dir / CACHE / sweep.experiment / f"{sweep.sweep}.json"
    cached(path, sweep.folder, lambda: _kept(points), fresh=True)


def _kept(points: pd.DataFrame) -> dict:
    """A sweep's points as its cache keeps them."""
    return {"params": points.attrs.get("params", []), "points": records(points)}


def cached(path: Path, folder: Path, compute, extra=None, fresh: bool = False) -> dict:
    """compute()'s JSON-able dict, kept in `path` with the fingerprint of the sweep `folder`
    (taken before computing), the code's version and `extra`: read from there while all three
    still hold (unless `fresh`)."""
    key = {"version": VERSION, "code": code_version(), "extra": extra}
    before = fingerprint(folder)
    try:
        kept = {} if fresh else _verified(path)
        if kept.get("key") == key and kept.get("fingerprint") == before:
            return kept["value"]
    except (OSError, ValueError, KeyError, AttributeError):
        pass  # none yet, unreadable, or not ours: computed again
    value = compute()
    # Kept under the fingerprint from before: rows that landed while it read are read next time.
    body = json.dumps({"key": key, "fingerprint": before, "value": value}, separators=(",", ":"),
                      default=str).encode()  # fmt: skip
    files.write_text(path, f"{_mac(body)}\n{body.decode()}")
    return value


def _verified(path: Path) -> dict:
    """A cache file's JSON, if its MAC holds; ValueError if not."""
    mac, _, body = files.read_bounded(path).partition(b"\n")
    if not hmac.compare_digest(mac, _mac(body).encode()):
        raise ValueError("its MAC does not hold")
    return json.loads(body)


def _mac(body: bytes) -> str:
    return hmac.new(_secret(), body, hashlib.sha256).hexdigest()


@functools.cache
def _secret() -> bytes:
    """The key of the caches' MACs: KEY's, made at the first report (32 random bytes as hex,
    mode 0600, put in place whole so that two reports agree on one). A KEY that is no key
    (under 32 bytes, not a regular file, another user's, open to others; a link is never
    followed, a FIFO never waited on) is never used: a new one takes its place, and where it
    cannot, the report stops in one line (BadInput). Where there is none and none can be made
    (a home that cannot be written), one of this process's own: its caches hold for it alone."""
    key, flaw = _read_key()
    if key is not None:
        return key
    try:
        KEY.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=KEY.parent, delete=False) as made:
            made.write(secrets.token_hex(32))  # NamedTemporaryFile's mode is 0600
        try:
            if flaw:
                os.replace(made.name, KEY)  # the entry replaced, whatever it is: never opened
            else:
                os.link(made.name, KEY)  # fails if another report made it first: that one holds
        except FileExistsError:
            pass
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(made.name)
    except OSError as error:
        if flaw:
            said = f"{KEY} is no key for the report's caches ({flaw})"
            raise BadInput(f"{said} and no new one can be made there ({error.strerror})") from None
        return secrets.token_bytes(32)
    key, flaw = _read_key()
    if key is None:
        raise BadInput(f"{KEY} is no key for the report's caches ({flaw}): remove it")
    return key


def _read_key() -> tuple[bytes | None, str | None]:
    """KEY's key, or None and what is wrong with it (None where there is no KEY)."""
    try:
        opened = os.open(KEY, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None, None
    except OSError as error:
        return None, "a symbolic link" if error.errno == errno.ELOOP else error.strerror
    try:
        status = os.fstat(opened)
        if not stat.S_ISREG(status.st_mode):
            return None, "not a regular file"
        if status.st_uid != os.getuid():
            return None, "another user's"
        if status.st_mode & 0o077:
            return None, f"open to other users (mode {stat.S_IMODE(status.st_mode):o})"
        text = os.read(opened, 4096)
    finally:
        os.close(opened)
    try:
        key = bytes.fromhex(text.decode("ascii").strip())
    except ValueError:
        return None, "not hex"
    return (key, None) if len(key) >= 32 else (None, f"{len(key)} bytes, under 32")


def records(frame: pd.DataFrame) -> list[dict]:
    """A DataFrame as JSON's records (times as ISO text, NaN as null)."""
    return json.loads(frame.to_json(orient="records", date_format="iso"))


@functools.cache
def code_version() -> str:
    """The names, sizes and modification times of the code and configs a report is made by
    (the analysis and harness packages, the experiments' derived tables, conf/) and the versions
    of the libraries it uses, as a digest: an edit or an upgrade of any recomputes."""
    here = Path(__file__).resolve().parent
    derived = Path(importlib.util.find_spec("octlm_experiments.derived").origin).parent
    folders = (here, HERE, derived, CONF)
    listed = [
        f"{path} {path.stat().st_size} {path.stat().st_mtime_ns}"
        for folder in folders
        for path in sorted(folder.rglob("*"))
        if path.suffix in (".py", ".yaml")
    ]
    listed += [f"{name} {metadata.version(name)}" for name in LIBRARIES]
    return hashlib.sha256("\n".join(listed).encode()).hexdigest()[:16]


LIBRARIES = ("pandas", "pyarrow", "numpy", "plotly", "markdown", "matplotlib", "omegaconf")


def file_version(path: Path | None) -> list | None:
    """A file's name, size and modification time (a report module of one's own), or None."""
    if path is None or not path.exists():
        return None
    stat = path.stat()
    return [str(path), stat.st_size, stat.st_mtime_ns]


def compute(sweep: store.SweepPaths) -> pd.DataFrame:
    """A sweep's points read from the store (of_rows)."""
    manifest = store.read_manifest(sweep)
    rows = store.read(sweep.root, sweep.experiment, sweep.sweep)
    return of_rows(store.as_planned(rows, manifest, sweep.root), manifest, sweep.sweep)


def of_rows(rows: pd.DataFrame, manifest: dict | None, sweep: str) -> pd.DataFrame:
    """A sweep's points from its rows (store.as_planned's): a line per planned point (or per
    job when the manifest is unreadable) with its last row's numbers (a training run's final
    ones: harness.results.runs.ordered), attrs["params"] the parameters' names."""
    params = [p.get("params", {}) | {"job": p["job"]} for p in (manifest or {}).get("points", [])]
    plan = pd.DataFrame(params)
    if rows.empty or "job" not in rows:
        last = pd.DataFrame(columns=["job"])
    else:
        last = runs.ordered(rows).drop_duplicates("job", keep="last").set_index("job")
        last["status"] = store.job_statuses(rows)
        errors = rows.dropna(subset=["error"]) if "error" in rows else rows.iloc[:0]
        last["error"] = errors.drop_duplicates("job").set_index("job").get("error")
        measured = [
            c for c in last if is_number_column(last[c]) and c not in plan and c not in KEPT
        ]
        kept = [c for c in last if c in KEPT]
        ran = [c for c in _searched(manifest) if c in plan and c in last]
        last = last[[*kept, *measured, *ran]].reset_index()
    points = plan.merge(last, on="job", how="outer", suffixes=("", RAN)) if not plan.empty else last
    for column in [c.removesuffix(RAN) for c in points if c.endswith(RAN)]:
        values = points.pop(f"{column}{RAN}")  # a trial's value, where its rows landed
        points[column] = values.where(values.notna(), points[column])
    if points.empty:
        return pd.DataFrame()
    points["status"] = points.get("status", pd.Series(index=points.index, dtype=object)).fillna(
        "not run"
    )
    points.insert(0, "sweep", sweep)
    points.insert(1, PLANNED, (manifest or {}).get("created_at"))
    points = points.sort_values("job", ignore_index=True)
    points.attrs["params"] = [c for c in plan if c != "job"]
    return points


def _searched(manifest: dict | None) -> list[str]:
    """The parameters a search's trials choose as they run (harness.searching.search): the plan
    holds their config values, the rows what each trial ran with."""
    return list((search.of_manifest(manifest) or {}).get("params") or {})


def fingerprint(folder: Path) -> list:
    """The sweep's files as [name, size, mtime_ns], sorted: what a change of its rows changes."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    said = []
    for entry in entries:
        if entry.name.endswith(".parquet") or entry.name == store.MANIFEST:
            try:
                stat = entry.stat(follow_symlinks=False)
            except FileNotFoundError:  # gone since the listing (a compaction)
                continue
            said.append([entry.name, stat.st_size, stat.st_mtime_ns])
    return said


def sweep_states(points: pd.DataFrame) -> pd.DataFrame:
    """A line per sweep: its start (when it was planned; where its manifest cannot say, its
    earliest row's), state (complete, running, killed, failed, incomplete), points, landed
    (with rows), the counts of its statuses, and its commit, torch and device. `points`:
    of_experiment()."""
    if points.empty:
        return pd.DataFrame(columns=["sweep", "started", "state", "points", "landed", "statuses"])
    by = points.groupby("sweep", sort=True)
    status = points["status"]
    counts = status.groupby(points["sweep"]).value_counts().rename("n").reset_index()
    counts["said"] = counts["n"].astype(str) + " " + counts["status"].astype(str)
    said = counts.groupby("sweep", sort=True)["said"].agg(", ".join)
    flags = pd.DataFrame({
        "done": status.isin(store.DONE), "running": status == store.RUNNING,
        "failed": ~status.isin(store.DONE) & ~status.isin(["not run", store.RUNNING]),
        "killed": status == "killed", "landed": status != "not run",
        "sweep": points["sweep"]}).groupby("sweep")  # fmt: skip
    every, anyone = flags.all(), flags.any()
    state = np.select([every["done"], anyone["running"], anyone["killed"], anyone["failed"]],
                      ["complete", "running", "killed", "failed"], "incomplete")  # fmt: skip
    first = by[["git_commit", "torch_version", "device_name"]].first()
    commit = first["git_commit"]
    started = by[PLANNED].min().fillna(by["started_at"].min())
    return pd.DataFrame({
        "sweep": every.index, "started": started.to_numpy(), "state": state,
        "points": by.size().to_numpy(), "landed": flags["landed"].sum().to_numpy(),
        "statuses": said.reindex(every.index).to_numpy(),
        "commit": commit.astype(str).str[:10].where(commit.notna()).to_numpy(),
        "torch": first["torch_version"].to_numpy(), "device": first["device_name"].to_numpy(),
    })  # fmt: skip
