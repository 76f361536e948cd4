"""python -m harness again SWEEP [SWEEP ...] [times=3]: each sweep run again, as a new sweep of
its own command on its own code (its snapshot, hashed first: harness.pinning.boot) with nothing
reused, one after another in turns, until each has `times` sweeps: the processes apart that a
timing gate judges by, run interleaved so that a drift of the machine reaches both sides alike.
Its command runs from this folder, its config dirs as the sweep recorded them.

Of two sweeps of one experiment, A and B, it is the gate: once each side has `times`, it
compares them in this process (octlm_analysis: compare, then the gate's judge, as python -m
harness report compare A1,... B1,... --fail-on-regression `factor` does) and, while a timing is
not decided, runs one more of A and one more of B and compares again, until every timing is
decided, a side has `most` sweeps, or `budget_s` seconds have passed. Each comparison is one
look of at most most - times + 1, each judged at 5% over them (--looks), so that stopping once
decided keeps the gate's rate of false alarms.

Each rerun is a process of its own, on the sweep's pinned code; the sweep it made is found in
the store, not in what it printed: the one sweep of its experiment that was not there before it
ran and whose manifest names the original (again_of).
"""

import math
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from harness import store
from harness.command.status import find_sweep, pinned_sweep
from harness.errors import BadInput
from harness.names import AGAIN_REPLACED, key_of, split_flags
from harness.pinning import codestore

RECORDED = ["python", "-m", "harness"]  # how a manifest's command begins (harness.command.sweep)


def again(ids: list[str], out: str, code_store: str | None, times: int = 3, most: int = 8,
          factor: float = 1.10, budget_s: float = 3600) -> int:  # fmt: skip
    """Run each sweep again in turns until each has `times` sweeps; of two sweeps of one
    experiment, then gate them (the module's rule). Returns the last comparison's exit code (0
    passed, 1 failed, 3 not decided), 0 where there is no gate, or a rerun's failing code."""
    check_settings(times, most, factor, budget_s)
    started = time.monotonic()
    results, kept = Path(out).resolve() / "results", codestore.store_of(code_store)
    runs = [rerun_of(results, sweep_id, out, kept) for sweep_id in ids]
    named = [run.sweeps[0] for run in runs]
    if len(set(named)) < len(named):
        twice = sorted({sweep for sweep in named if named.count(sweep) > 1})
        raise BadInput(f"sweep {', '.join(twice)} is named twice: name each sweep once")
    for turn in range(1, times):
        for run in runs:
            if not run.again(f"again {turn} of {times - 1}"):
                return run.failed
    if len(runs) != 2 or runs[0].experiment != runs[1].experiment:
        joined = " ".join(",".join(run.sweeps) for run in runs)
        print(f"compare them with: python -m harness report compare {joined} "
              f"--fail-on-regression {factor:g}")  # fmt: skip
        return 0
    return gate(runs, out, Settings(times, most, factor, started + budget_s, budget_s))


def check_settings(times: int, most: int, factor: float, budget_s: float) -> None:
    """BadInput unless times is 2 or more, most at least times, factor a number above 1 and
    budget_s a number of seconds, 0 or more."""
    if times < 2:
        raise BadInput(f"times is how many sweeps of each, 2 or more: got times={times}")
    if most < times:
        raise BadInput(f"most={most} is fewer than times={times}")
    if not (math.isfinite(factor) and factor > 1):
        raise BadInput(f"factor is a number above 1, got {factor}")
    if not (math.isfinite(budget_s) and budget_s >= 0):
        raise BadInput(f"budget_s is a number of seconds, 0 or more: got {budget_s}")


@dataclass(frozen=True)
class Settings:
    """What a gate of `again` runs by: its settings, and when its budget ends (monotonic)."""

    times: int
    most: int
    factor: float
    deadline: float
    budget_s: float

    @property
    def looks(self) -> int:
        """How many comparisons at most: one at `times` a side, then one after each more."""
        return self.most - self.times + 1


def gate(runs: list["Rerun"], out: str, settings: Settings) -> int:
    """The two runs' sweeps compared and judged in this process (a look), and while a timing is
    not decided one more sweep of each, up to `looks` looks or the deadline; the last comparison
    printed and written in the report folder (as the report's compare writes it), and its exit
    code: the gate's, or 1 where the sides share no point or one's rows are damaged."""
    from octlm_analysis.compare import in_common, nothing_in_common
    from octlm_analysis.comparison import render, write
    from octlm_analysis.gate import FAILED, NOT_DECIDED, SAID, judge

    looks = settings.looks
    for look in range(1, looks + 1):
        comparison = compared(runs)
        if comparison is None:
            return FAILED
        judged = judge(comparison, settings.factor, looks)
        shared, left = in_common(comparison), time.monotonic() < settings.deadline
        if judged.decided or not shared or look == looks or not left:
            break
        print(f"look {look} of {looks}: not decided at {len(runs[0].sweeps)} processes a "
              "side; one more of each", flush=True)  # fmt: skip
        for run in runs:
            if not run.again(f"process {len(run.sweeps) + 1} of at most {settings.most}"):
                return run.failed
    path, text = write(Path(out) / "report", comparison, render(comparison, judged))
    print(text, end="")
    print(f"comparison: {path}")
    code = judged.code if shared else FAILED
    if not shared:
        print(f"error: {nothing_in_common(comparison)}", file=sys.stderr)
    why = ("" if code != NOT_DECIDED else f" (budget_s={settings.budget_s:g} spent)" if not left
           else f" (most={settings.most} reached)")  # fmt: skip
    print(f"gate {SAID[code]} at {len(runs[0].sweeps)} processes a side, look {look} of "
          f"{looks}{why}: {comparison_command(runs, out, settings.factor, looks)}")  # fmt: skip
    return code


def compared(runs: list["Rerun"]):
    """The comparison of the two runs' sweeps, each side all of a run's (octlm_analysis); None
    where a side's rows are damaged (said on stderr). BadInput where they cannot be compared."""
    from octlm_analysis.compare import compare
    from octlm_analysis.sides import CompareError, DamagedSide, load

    folders = [Path(folder).resolve() for folder in config_dirs(runs)]
    try:
        return compare(*(load(run.results, ",".join(run.sweeps), folders) for run in runs))
    except DamagedSide as error:
        print(f"error: {error}", file=sys.stderr)
        return None
    except CompareError as error:
        raise BadInput(str(error)) from None


def comparison_command(runs: list["Rerun"], out: str, factor: float, looks: int) -> str:
    """The report's command that makes the same comparison, for the user to run again."""
    folders = [arg for folder in config_dirs(runs) for arg in ("--config-dir", folder)]
    sides = [",".join(run.sweeps) for run in runs]
    return shlex.join(["python", "-m", "harness", "report", *folders, "compare", *sides,
                       "--fail-on-regression", f"{factor:g}", "--looks", str(looks),
                       "--out", out])  # fmt: skip


def config_dirs(runs: list["Rerun"]) -> list[str]:
    """The runs' config dirs, each once, in their order."""
    return list(dict.fromkeys(folder for run in runs for folder in run.config_dirs))


def recorded_arguments(command: str) -> list[str]:
    """The arguments of a sweep's command line as its manifest records it. The manifest holds
    the command that started the sweep as one string, shlex.join(["python", "-m", "harness",
    *ARGUMENTS]) (harness.command.sweep), and nothing else records its arguments: they are read
    back here, once. BadInput where the string is not of that form."""
    try:
        words = shlex.split(command)
    except ValueError as error:
        raise BadInput(f"the recorded command {command!r} cannot be read: {error}") from None
    if words[: len(RECORDED)] != RECORDED:
        raise BadInput(f"the recorded command {command!r} is not python -m harness ARGUMENTS")
    return words[len(RECORDED) :]


def recorded_overrides(manifest: dict, replaced=()) -> list[str]:
    """The overrides of the sweep's recorded command, less those of the keys that running it
    again replaces (AGAIN_REPLACED: where it lands, reuse, its code) and of `replaced`."""
    overrides, _ = split_flags(recorded_arguments(manifest.get("command") or ""), recorded=True)
    return [a for a in overrides if key_of(a) not in {*AGAIN_REPLACED, *replaced}]


def rerun_of(results: Path, sweep_id: str, out: str, kept: Path) -> "Rerun":
    """A sweep (`last` named) to run again: its recorded command less what again replaces,
    with nothing reused, into `out`, on the code it pinned (checked in the code store `kept`),
    naming its original (again_of: a rerun's reruns are its original's)."""
    sweep_id, manifest, digest = pinned_sweep(results, sweep_id)
    codestore.verify(kept, digest)
    own = recorded_overrides(manifest)
    folders = list(manifest.get("config_dirs", []))
    original = manifest.get("again_of") or sweep_id
    given = [*(arg for folder in folders for arg in ("--config-dir", folder)), *own,
             "reuse=false", f"out={Path(out).resolve()}", f"code_store={kept}",
             f"again_of={original}"]  # fmt: skip
    command, environment = codestore.harness_from(kept, digest, given)
    experiment = find_sweep(results, sweep_id).experiment
    return Rerun(experiment, original, digest, folders, results, command, environment, [sweep_id])


@dataclass
class Rerun:
    """A sweep's command, to be run again on its own code: each run a new sweep (`sweeps`: the
    original, then each rerun); `failed`, the exit code of a run that failed."""

    experiment: str
    original: str  # the sweep its reruns name (again_of)
    digest: str
    config_dirs: list[str]
    results: Path
    command: list[str]
    environment: dict
    sweeps: list[str]
    failed: int = 0

    def again(self, said: str) -> bool:
        """One more sweep of the command, in a process of its own; False (its exit code in
        `failed`) where it failed or made no sweep."""
        print(f"{said}, sweep {self.sweeps[0]}'s command on its code {self.digest}:", flush=True)
        before = set(store.sweeps(self.results, self.experiment))
        ran = subprocess.run(self.command, env=self.environment, stdout=subprocess.PIPE, text=True)
        sys.stdout.write(ran.stdout)
        made = new_reruns(self.results, self.experiment, self.original, before)
        if ran.returncode or len(made) != 1:
            found = "" if ran.returncode else f", its sweeps again_of {self.original}: {made}"
            print(f"error: the run of sweep {self.sweeps[0]} again ended with exit code "
                  f"{ran.returncode}{found}", file=sys.stderr)  # fmt: skip
            self.failed = ran.returncode or 1
            return False
        self.sweeps.append(made[0])
        return True


def new_reruns(results: Path, experiment: str, original: str, before: set[str]) -> list[str]:
    """The experiment's sweeps that were not among `before` and whose manifests name
    `original` as what they run again (again_of): what a rerun of it made."""
    new = [store.SweepPaths(results, experiment, sweep)
           for sweep in store.sweeps(results, experiment) if sweep not in before]  # fmt: skip
    return [paths.sweep for paths in new
            if (store.read_manifest(paths) or {}).get("again_of") == original]  # fmt: skip
