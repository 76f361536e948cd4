"""The experiment called for one point (measure): seeded, its rows checked, whatever it raises
or however it tries to end the process made one failed row; and the checks of a row's columns
that a training point's tracker makes as each row is logged (row_check)."""

import contextlib
import logging
import os
import random
import threading
import traceback
from collections.abc import Callable
from pathlib import Path

from harness import store, tracking
from harness.errors import StoreUnwritable
from harness.pinning import codestore
from harness.planning.experiment import Experiment
from harness.searching import search
from harness.tracking import Tracker

log = logging.getLogger(__name__)


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


def _reserved(params: dict) -> frozenset[str]:
    """The columns an experiment's rows may not set, in lower case: its parameters, the
    harness's own (store.RESERVED)."""
    return store.RESERVED | {name.lower() for name in params}


def _clashes(keys, reserved: frozenset[str]) -> list[str]:
    """The keys that are a reserved column, compared without case (but status and error)."""
    return sorted({k for k in keys if k.lower() in reserved and k not in store.ROW_SETS})


def row_check(params: dict) -> Callable[[dict], None]:
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


def _seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    # torch.manual_seed also seeds each device type the build knows, queued with a stack trace
    # until that device starts (a millisecond a point); a build without any has none to seed.
    if torch.accelerator.current_accelerator() is None:  # asks the build, starts nothing
        torch.random.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)
