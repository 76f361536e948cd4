"""A training point's checkpoints: the files in its job's checkpoint folder that save writes
(the experiment's state, with the count of rows that had landed and of the segments that hold
them; in a point of several processes, those of every rank) and that restore reads back.

Each save is a file named by its step (step-N.pt: the step of the last row logged with one;
rows-N.pt, its count of rows, where no row has a step), and checkpoint.pt is the latest, the one
restore reads (a hard link to it: no second copy on disk). What the config's `checkpoint` keeps
(Keeping): the latest `keep`, and, where `best` names a metric, the checkpoint at whose save
that metric was best (its value in the latest row holding it, `mode` min or max) as best.pt.
checkpoints.json beside them says which step best.pt is, at what value, and which are kept.

Restore trusts a checkpoint only if it is this point's (its config hash, its number of
processes) and one that save wrote (its state, whole counts): another is set aside, or
refused, and the point starts over. It is loaded with torch.load(weights_only=True): tensors
and plain values only, since unpickling anything else could run code.
"""

import errno
import io
import json
import numbers
import os
import pickle
import re
import secrets
import time
from collections.abc import Callable
from pathlib import Path

from harness import files
from harness.errors import StoreUnwritable
from harness.names import Keeping, closest
from harness.results.runs import STEP

CHECKPOINT = "checkpoint.pt"  # the latest: what restore reads
BEST = "best.pt"  # where checkpoint.best names a metric: the save at which it was best
INDEX = "checkpoints.json"  # which step best.pt is, at what value; the checkpoints kept
NUMBERED = re.compile(r"(step|rows)-\d+\.pt")
NO_LINKS = (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.EXDEV)


class Checkpoints:
    """A job's checkpoint folder (`folder`: store.JobPaths.checkpoints), for the point of
    `config_hash`; `say` prints what happens to a checkpoint it cannot use, `unwritable` makes a
    failed write the error that stops the sweep, `keeping` is what it keeps (Keeping). The
    folder is the job's own, made by the harness, where it removes files of its own names: no
    link (one above it, which a user made to keep checkpoints on another disk, is followed).
    One it cannot write is found here, at the point's start, not at its first save."""

    def __init__(
        self,
        folder: Path,
        config_hash: str,
        say: Callable[[str], None],
        unwritable: Callable[[OSError], StoreUnwritable],
        keeping: Keeping | None = None,
    ):
        self.folder, self.config_hash, self.say = Path(folder), config_hash, say
        self.unwritable, self.keeping = unwritable, keeping or Keeping()
        files.no_links(self.folder)
        self._check_writable()
        files.remove_temporaries(self.folder, older_than_s=0)  # killed runs': the job's own
        self.kept: list[str] = []  # this run's numbered checkpoints, oldest first
        self.best: dict | None = None  # best.pt's step, metric, mode and value
        self.step = self.value = None  # the latest logged row's step; the best metric's value
        self.columns: set[str] = set()  # what the rows logged hold, while none holds the metric

    @property
    def path(self) -> Path:
        return self.folder / CHECKPOINT

    def seen(self, row: dict) -> None:
        """A row logged: its step, and its value of the metric `best` names, are the latest."""
        step = row.get(STEP)
        if _whole(step):
            self.step = int(step)  # a NumPy integer too
        if self.keeping.best is not None:
            value = row.get(self.keeping.best)
            if _number(value):
                self.value = float(value)  # a NumPy number too: the checkpoint holds plain values
            elif self.value is None:
                self.columns.update(row)

    def write(self, saved: dict, rows: int) -> None:
        """Save `saved` (and the point's config hash) as the latest checkpoint, at the step of
        the last row logged (else at `rows` rows), whole or not at all; keep what `keeping`
        keeps, and remove the rest. StoreUnwritable where the store cannot take it."""
        import torch

        at = {"step": self.step, "value": self.value}
        buffer = io.BytesIO()  # torch.save's own write errors (a full disk) are no OSError
        torch.save({**saved, **at, "config_hash": self.config_hash}, buffer)
        name = f"step-{self.step}.pt" if self.step is not None else f"rows-{rows}.pt"
        try:
            files.replace_atomically(
                self.folder / name, lambda tmp: tmp.write_bytes(buffer.getbuffer()), False
            )
            _same_file(self.folder / name, self.path, buffer)
            if self._better(self.value):
                _same_file(self.folder / name, self.folder / BEST, buffer)
                self.best = {"step": self.step, "rows": rows, "metric": self.keeping.best,
                             "mode": self.keeping.mode, "value": self.value}  # fmt: skip
            self._keep(name)
        except OSError as error:
            raise self.unwritable(error) from error

    def said_unseen(self) -> None:
        """Say, once the point ends, where no row it logged held the metric `best` names."""
        if self.keeping.best is None or self.value is not None or self.best is not None:
            return
        near = closest(self.keeping.best, sorted(self.columns))
        self.say(f"checkpoint.best names {self.keeping.best}, which no row logged holds: no "
                 f"best checkpoint kept{near}")  # fmt: skip

    def _better(self, value) -> bool:
        """Whether a save at `value` of the best metric is better than best.pt's."""
        if self.keeping.best is None or value is None:
            return False
        if self.best is None:
            return True
        before = self.best["value"]
        return value < before if self.keeping.mode == "min" else value > before

    def _keep(self, name: str) -> None:
        """`name` the latest: the latest `keep` numbered checkpoints kept, and best.pt where
        there is a best (its step, in checkpoints.json); other numbered ones removed."""
        self.kept = [*[kept for kept in self.kept if kept != name], name][-self.keeping.keep :]
        if self.best is None:
            (self.folder / BEST).unlink(missing_ok=True)  # a run before this one's
        index = {"latest": name, "kept": self.kept,
                 "best": {"file": BEST, **self.best} if self.best else None}  # fmt: skip
        files.write_json(self.folder / INDEX, index)
        for path in self.folder.iterdir():
            if NUMBERED.fullmatch(path.name) and path.name not in self.kept:
                path.unlink(missing_ok=True)

    def _check_writable(self) -> None:
        """StoreUnwritable, naming the checkpoint folder, where it cannot be made or written."""
        probe = self.folder / f".writable.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            probe.touch()
            probe.unlink()
        except OSError as error:
            said = f"the checkpoint folder cannot be written ({error.strerror or error})"
            raise self.unwritable(OSError(error.errno, said, str(self.folder))) from error

    def restored(self, saved: dict) -> None:
        """A checkpoint restored: its step and value the latest, the numbered checkpoints up to
        it this run's, and best.pt its best where checkpoints.json says so."""
        self.step, self.value = saved.get("step"), saved.get("value")
        numbered = [path for path in self.folder.iterdir() if NUMBERED.fullmatch(path.name)]
        numbered.sort(key=lambda path: path.stat().st_mtime_ns)
        latest = self.path.stat()
        same = [i for i, path in enumerate(numbered) if os.path.samestat(path.stat(), latest)]
        self.kept = [path.name for path in numbered[: same[-1] + 1 if same else None]]
        best = _read_json(self.folder / INDEX).get("best")
        ours = (self.keeping.best, self.keeping.mode)
        if (
            isinstance(best, dict)
            and (best.get("metric"), best.get("mode")) == ours
            and _number(best.get("value"))
        ):
            self.best = {k: v for k, v in best.items() if k != "file"}
            self.best = self.best if (self.folder / BEST).exists() else None

    def read(self, world_size: int, rank: int | None) -> tuple[dict, int, int | None] | None:
        """The checkpoint, if it is this point's (of `world_size` processes), and the rows of
        rank `rank` it counts (None: a point of one process): their number, and that of the
        segments that hold them. None where there is none to restore, saying why."""
        saved = self._load()
        if not isinstance(saved, dict) or saved.get("config_hash") != self.config_hash:
            return None
        if saved.get("world_size", 1) != world_size:
            self.say(f"the checkpoint {self.path} is of {saved.get('world_size', 1)} processes, "
                     f"this run has {world_size}: starting over")  # fmt: skip
            return None
        fault = _fault(saved, rank)
        if fault:  # its hash is this point's, but it is no checkpoint the tracker wrote
            if not rank:
                aside = self.path.with_name(f"{CHECKPOINT}.set-aside-{time.time_ns()}")
                self.path.rename(aside)
                self.say(f"the checkpoint {self.path} {fault}: set aside as {aside.name}; "
                         "starting over")  # fmt: skip
            return None
        count, numbered = _counts(saved, rank)
        return saved, count, numbered

    def _load(self):
        """What the checkpoint file holds; None where there is none, or none it may read."""
        import torch

        if not self.path.exists():
            return None
        try:  # tensors and plain values only: unpickling anything else could run code
            return torch.load(self.path, weights_only=True)
        except pickle.UnpicklingError:
            self.say(f"refused the checkpoint {self.path}: it holds more than tensors and plain "
                     "values, and loading it could run code; starting over")  # fmt: skip
        except Exception as error:  # a damaged file: whatever reading it raises
            self.say(f"cannot read the checkpoint {self.path} ({type(error).__name__}): "
                     "starting over")  # fmt: skip
        return None


def at(saved: dict, rows: int) -> str:
    """Where a checkpoint was saved, in words: "step 8" (the step of the last row it counts), or
    "8 rows" where its rows have no step (or it is of a version that did not record one)."""
    step = saved.get("step")
    return f"step {step}" if _whole(step) else f"{rows} rows"


def _same_file(source: Path, path: Path, buffer: io.BytesIO) -> None:
    """`path` made the file `source` is (a hard link: no second copy on disk), whole or not at
    all; the bytes of `buffer` written there where the file system has no hard links."""

    def make(tmp: Path) -> None:
        try:
            os.link(source, tmp)
        except OSError as error:
            if error.errno not in NO_LINKS:
                raise
            tmp.write_bytes(buffer.getbuffer())

    files.replace_atomically(path, make, False)


def _read_json(path: Path) -> dict:
    """A small JSON file the tracker wrote; {} where there is none, or none it can read."""
    try:
        read = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return read if isinstance(read, dict) else {}


def _number(value) -> bool:
    """Whether a logged value can be a best: a real number, not a bool, not NaN."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and value == value


def _fault(saved: dict, rank: int | None) -> str | None:
    """What a checkpoint lacks of what save writes (its state, and the count of rows and of
    segments it covers; in a group, those of rank `rank`), in words; None where nothing."""
    if "state" not in saved:
        return "holds no state"
    mine = _counts(saved, rank)
    if not isinstance(mine, list | tuple) or len(mine) != 2:
        return "holds no row counts for this process"
    count, numbered = mine
    if not _whole(count) or not (numbered is None or _whole(numbered)):
        return f"holds row counts that are no whole numbers ({count!r:.20}, {numbered!r:.20})"
    return None


def _counts(saved: dict, rank: int | None):
    """The rows and the segments a checkpoint covers, of rank `rank` in a group (None: a point
    of one process), as saved; None where it has none for that rank."""
    if rank is None:
        return saved.get("rows"), saved.get("segments")
    ranks = saved.get("ranks")
    return ranks[rank] if isinstance(ranks, list) and len(ranks) > rank else None


def _whole(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 0
