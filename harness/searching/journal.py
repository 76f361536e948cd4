"""A sweep's studies: one Optuna study per cell of the grid (named cell-N) in the sweep's
journal (_study.journal, Optuna's journal file storage: appends under a file lock, which
processes on a shared file system can share), read back for status and the report, and the
trials a kill left running failed."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

from harness import files
from harness.errors import one_line
from harness.lifetime import per_command
from harness.names import setting
from harness.searching.space import pruner, sampler

JOURNAL = "_study.journal"


def storage(folder: Path):
    """The sweep's studies: Optuna's journal file storage in its folder, one per process (it
    reads the journal once, then only what other processes appended since); files.Linked for a
    journal that is a symlink, which would take the trials' writes elsewhere."""
    path = Path(folder).resolve() / JOURNAL
    files.no_links(path)
    return _storage(str(path))


@per_command
@functools.lru_cache(maxsize=8)
def _storage(path: str):
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    lock = _JournalLock(path)  # the lock every append takes
    _cut_partial_line(path, lock)
    return JournalStorage(JournalFileBackend(path, lock_obj=lock))


class _JournalLock:
    """The journal's lock, as Optuna's file backend takes it (acquire, release): files.lock on
    JOURNAL.flock, which the kernel lets go when its holder dies, so that a trial killed while
    it appended holds up no one. (Optuna's own symlink lock stays behind a kill, and the next
    writer waits out its grace period, 30 s, before it takes it over.)"""

    def __init__(self, journal: str):
        self.path, self.opened = Path(journal + ".flock"), None

    def acquire(self) -> bool:
        opened = files.lock(self.path)
        self.opened = opened  # set once held: one holder at a time, across threads too
        return True

    def release(self) -> None:
        opened, self.opened = self.opened, None
        if opened is not None:
            files.unlock(opened)


def _cut_partial_line(path: str, lock) -> None:
    """Cut a last line without its end off the journal: what a writer killed mid-append left
    (under the lock every append takes, so no live writer's). Optuna skips such a line, but
    the next append would join it into one line that no read could parse again."""
    journal = Path(path)
    if not _ends_cut(journal):
        return
    lock.acquire()
    try:
        if not _ends_cut(journal):
            return
        text = journal.read_bytes()
        kept = text.rfind(b"\n") + 1
        os.truncate(journal, kept)
        print(f"warning: {journal}: cut off a partial last line ({len(text) - kept} bytes) that "
              "a killed trial left", file=sys.stderr)  # fmt: skip
    finally:
        lock.release()


def _ends_cut(journal: Path) -> bool:
    """Whether the journal's last byte is not a line's end (False for none or an empty one)."""
    try:
        with open(journal, "rb") as f:
            if f.seek(0, os.SEEK_END) == 0:
                return False
            f.seek(-1, os.SEEK_END)
            return f.read(1) != b"\n"
    except FileNotFoundError:
        return False


def study(folder: Path, search: dict, cell: int):
    """The cell's study (created by the first trial that asks), with the search's sampler
    (unseeded: a trial seeds its own) and pruner."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(
        storage=storage(folder),
        study_name=f"cell-{cell}",
        direction=search["direction"],
        sampler=sampler(search, None),
        pruner=pruner(search),
        load_if_exists=True,
    )


def studies(folder: Path) -> dict[int, object]:
    """cell -> its study, of those the sweep's journal holds (none before a trial asked)."""
    import optuna

    if not (Path(folder) / JOURNAL).exists():
        return {}
    try:
        held = storage(folder)
        return {
            int(s.study_name.removeprefix("cell-")): optuna.load_study(
                study_name=s.study_name, storage=held
            )
            for s in optuna.get_all_study_summaries(held)
            if s.study_name.startswith("cell-")
        }
    except Exception as error:  # a link, a damaged or foreign line: whatever replaying raises
        print(f"warning: the sweep's trials cannot be read from {Path(folder) / JOURNAL}: "
              f"{type(error).__name__}: {one_line(error)[:200]}", file=sys.stderr)  # fmt: skip
        return {}


def fail_orphans(folder: Path, kept: set[int]) -> list[str]:
    """Fail the trials a kill left running that no point will take back: asked but killed
    before the trial recorded its job, or of a job that `kept` (the points a resume reruns,
    and those SLURM still runs) does not hold. A line per cell saying which."""
    import optuna

    said = []
    for cell, held in sorted(studies(folder).items()):
        running = held.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        orphans = [t.number for t in running if t.user_attrs.get("job") not in kept]
        for number in orphans:
            held.tell(number, state=optuna.trial.TrialState.FAIL)
        if orphans:
            listed = ", ".join(map(str, orphans))
            trials = "trial" if len(orphans) == 1 else "trials"
            said.append(f"cell {cell}: failed {trials} {listed}, which a killed run left running")
    return said


def progress(folder: Path, search: dict, points: dict[int, str] | None = None) -> list[str]:
    """A line per cell's study: its trials by state (Optuna's: running, complete, pruned,
    fail), and the best so far with its parameters. A trial its study still holds running whose
    point `points` (job -> its state, as status says) says ended otherwise (killed, failed)
    is counted as that: a kill tells the study nothing."""
    lines = []
    for cell, held in sorted(studies(folder).items()):
        trials = held.get_trials(deepcopy=False)
        states = {}
        for trial in trials:
            state = trial.state.name.lower()
            said = (points or {}).get(trial.user_attrs.get("job"))
            if state == "running" and said in ("killed", "failed", "not run"):
                state = said
            states[state] = states.get(state, 0) + 1
        counts = ", ".join(f"{n} {state}" for state, n in states.items())
        line = f"cell {cell}: {len(trials)} trials asked of {search['trials']} ({counts})"
        done = [t for t in trials if t.state.name == "COMPLETE"]
        if done:
            best = held.best_trial
            said = f"trial {best.number} ({values_said(best.params)})"
            line += f"; best {search['objective']}={best.value:.4g}, {said}"
        lines.append(line)
    return lines


def values_said(params: dict) -> str:
    """lr=0.006466 warmup=50: a trial's values as a line prints them (names.setting)."""
    return " ".join(setting(k, v) for k, v in params.items())
