"""A training point's checkpoint: the one file in its job's checkpoint folder that save writes
(the experiment's state, with the count of rows that had landed and of the segments that hold
them; in a point of several processes, those of every rank) and that restore reads back.

Restore trusts a checkpoint only if it is this point's (its config hash, its number of
processes) and one that save wrote (its state, whole counts): another is set aside, or
refused, and the point starts over. It is loaded with torch.load(weights_only=True): tensors
and plain values only, since unpickling anything else could run code.
"""

import io
import pickle
import time
from collections.abc import Callable
from pathlib import Path

from harness import files, store
from harness.errors import StoreUnwritable

CHECKPOINT = "checkpoint.pt"


def checkpoint_dir(out: Path, experiment: str, sweep: str, job: int) -> Path:
    """The job's checkpoint folder: beside results/, not in it (weights are no rows)."""
    sweep_dir = store.sweep_dir(Path(out) / "checkpoints", experiment, sweep)
    return sweep_dir / f"job-{job:06d}"


class Checkpoints:
    """A job's checkpoint folder (`folder`), for the point of `config_hash`; `say` prints what
    happens to a checkpoint it cannot use, `unwritable` makes a failed write the error that
    stops the sweep."""

    def __init__(
        self,
        folder: Path,
        config_hash: str,
        say: Callable[[str], None],
        unwritable: Callable[[OSError], StoreUnwritable],
    ):
        self.folder, self.config_hash, self.say = Path(folder), config_hash, say
        self.unwritable = unwritable
        files.no_links(self.folder, depth=3)  # job-N, sweep=ID, experiment=NAME
        files.remove_temporaries(self.folder, older_than_s=0)  # killed runs': the job's own

    @property
    def path(self) -> Path:
        return self.folder / CHECKPOINT

    def write(self, saved: dict) -> None:
        """Replace the checkpoint with `saved` (and the point's config hash), whole or not at
        all; StoreUnwritable where the store cannot take it."""
        import torch

        buffer = io.BytesIO()  # torch.save's own write errors (a full disk) are no OSError
        torch.save({**saved, "config_hash": self.config_hash}, buffer)
        try:
            files.replace_atomically(
                self.path, lambda tmp: tmp.write_bytes(buffer.getbuffer()), False
            )
        except OSError as error:
            raise self.unwritable(error) from error

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
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
