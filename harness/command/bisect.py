"""python -m harness history EXPERIMENT --bisect: of each step the history found, the first
commit on its far side, as `git bisect` and asv find name one.

The two sweeps either side of a step each recorded the commit of the checkout they ran from
(git_commit). Where both did, and the first is an ancestor of the second in the git repository
that holds the experiment's code, the experiment is run at commits of the path between them,
each in a worktree of its own (git worktree add --detach) and each a sweep of the step's point
alone: the recorded command of the sweep before the step, its grid narrowed to that point,
nothing reused, into an out folder of the bisection's own (OUT/bisect/BEFORE-AFTER), so that
these sweeps are no part of the history. The run at a commit takes everything from its
worktree: the harness, its experiments and its report where the repository is a checkout of
the harness (its packages linked under their installed names, first on the path), else the
installed harness with the worktree's folders on the path (an experiment of one's own in a
repository of its own); config dirs and path entries that lie inside the repository are taken
from the worktree.

The two ends are run first, on this machine now: where they do not differ (by more than
TOLERANCE for a value above zero, at all else), the step does not show between the two commits
here and nothing is bisected. Else the path is halved until two neighbouring commits remain,
each commit run on the side of the end whose value its own is nearer (on a log scale where all
are above zero): the second of the two is the first commit on the far side. One sweep a commit,
as asv find runs one: each commit's value is printed beside the ends', so that a value that
lies near the middle, which noise may have placed, is seen as such.
"""

import math
import os
import shlex
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

from harness import store
from harness.command.again import recorded_arguments
from harness.errors import BadInput
from harness.names import AGAIN_REPLACED, key_of, split_flags

TOLERANCE = 1.10  # the gate's factor: two ends closer than it show no step
NOT_DECIDED = 3  # the exit code where a commit's run failed or gave no value
# Where a repository is a checkout of the harness: its folders and the names they install as.
INSTALLED_AS = {"harness": "harness", "experiments": "octlm_experiments",
                "analysis": "octlm_analysis"}  # fmt: skip


@dataclass(frozen=True)
class Target:
    """What a bisection measures: one metric at one point of an experiment, between the
    commits of the sweeps `before` and `after` a step."""

    experiment: str
    before: str
    after: str
    commits: tuple[str, str]
    metric: str
    point: dict
    log: bool  # the step was judged on a log scale (every value above zero)


def bisect(target: Target, out: str, code_store: str | None) -> int:
    """The first commit on the step's far side, found and printed; 0 once named or where
    nothing can be bisected (said why), NOT_DECIDED where a commit's run gave no value."""
    results = Path(out).resolve() / "results"
    manifest = store.read_manifest(store.SweepPaths(results, target.experiment, target.before))
    first, last = target.commits
    print(f"\nbisecting {target.metric} at {_point(target.point)}: commits {first[:10] or 'none'}"
          f" (sweep {target.before}) to {last[:10] or 'none'} (sweep {target.after})")  # fmt: skip
    repo, why = repository(manifest or {}, target.commits)
    if repo is None:
        print(f"not bisected: {why}")
        return 0
    path = commits_between(repo, first, last)
    if not path:
        print(f"not bisected: both sweeps ran at commit {first[:10]}; python -m harness code "
              f"{target.before} {target.after} shows what changed outside it")  # fmt: skip
        return 0
    run = Runner(target, repo, manifest, Path(out).resolve() / "bisect" /
                 f"{target.before}-{target.after}", code_store)  # fmt: skip
    ends = [run(first, "the near end"), run(last, "the far end")]
    if None in ends:
        return NOT_DECIDED
    if not differ(*ends, target.log):
        print(
            f"not bisected: the two commits give {ends[0]:.4g} and {ends[1]:.4g} here, within "
            f"x{TOLERANCE:g}: the step does not show between them on this machine now"
        )
        return 0
    commits, values = [first, *path], {0: ends[0], len(path): ends[1]}
    near, far = 0, len(path)
    while far - near > 1:
        middle = (near + far) // 2
        value = run(commits[middle], lambda v: "nearer the far end's" if nearer_last(
            v, *ends, target.log) else "nearer the near end's")  # fmt: skip
        if value is None:
            print(f"the first commit on the far side lies after {commits[near][:10]}, up to "
                  f"{commits[far][:10]}")  # fmt: skip
            return NOT_DECIDED
        values[middle] = value
        near, far = (near, middle) if nearer_last(value, *ends, target.log) else (middle, far)
    print(f"first commit on the far side: {describe(repo, commits[far])}: {target.metric} "
          f"{values[near]:.4g} before it, {values[far]:.4g} at it")  # fmt: skip
    print(f"  git -C {shlex.quote(str(repo))} show {commits[far][:10]}: its change")
    return 0


def repository(manifest: dict, commits: tuple[str, str]) -> tuple[Path | None, str]:
    """The git repository that holds the experiment's code (its run's package, as this process
    finds it) and both commits; else None and why not."""
    if not all(commits):
        return None, ("a sweep recorded no commit (it ran from an installed harness, which has "
                      "none of its own)")  # fmt: skip
    package = str((manifest.get("experiment_config") or {}).get("run") or "").split(".")[0]
    found = find_spec(package) if package.isidentifier() else None
    where = found and (found.submodule_search_locations or [found.origin])
    if not where:
        return None, f"the experiment's package {package or '(none)'} is not found here"
    folder = Path(list(where)[0]).resolve()
    top = git(folder if folder.is_dir() else folder.parent, "rev-parse", "--show-toplevel")
    if top is None:
        return None, f"the experiment's code ({folder}) lies in no git repository"
    repo = Path(top)
    for commit in commits:
        if git(repo, "cat-file", "-e", f"{commit}^{{commit}}") is None:
            return None, (f"commit {commit[:10]} is not in {repo}, the repository of the "
                          "experiment's code")  # fmt: skip
    if commits[0] != commits[1] and git(repo, "merge-base", "--is-ancestor", *commits) is None:
        return None, f"commit {commits[0][:10]} is no ancestor of {commits[1][:10]}"
    return repo, ""


def commits_between(repo: Path, first: str, last: str) -> list[str]:
    """The commits after `first` up to `last` on the path between them, oldest first."""
    said = git(repo, "rev-list", "--reverse", "--ancestry-path", f"{first}..{last}")
    return (said or "").split()


def git(folder: Path, *args: str) -> str | None:
    """git's output in `folder`, stripped; None where it fails."""
    done = subprocess.run(["git", "--no-optional-locks", "-C", str(folder), *args],
                          capture_output=True, text=True)  # fmt: skip
    return done.stdout.strip() if done.returncode == 0 else None


def describe(repo: Path, commit: str) -> str:
    """The commit in a line: its short hash, its subject (cut at 60 characters), author, date."""
    said = git(repo, "log", "-1", "--abbrev=10", "--format=%h%x00%s%x00%an, %ad", "--date=short",
               commit)  # fmt: skip
    if not said:
        return commit
    short, subject, by = said.split("\0")
    return f"{short} {subject[:59] + '…' if len(subject) > 60 else subject} ({by})"


def differ(first: float, last: float, log: bool) -> bool:
    if log and first > 0 and last > 0:
        return abs(math.log(last / first)) > math.log(TOLERANCE)
    return first != last


def nearer_last(value: float, first: float, last: float, log: bool) -> bool:
    """Whether `value` lies nearer the far end's value than the near end's."""
    if log and min(value, first, last) > 0:
        value, first, last = math.log(value), math.log(first), math.log(last)
    return abs(value - last) < abs(value - first)


class Runner:
    """Runs the target's point at a commit (a call), in a worktree of its own; the value it
    measured, or None (said why) where the run failed or the point gave none."""

    def __init__(self, target: Target, repo: Path, manifest: dict, out: Path, code_store):
        self.target, self.repo, self.out = target, repo, out
        overrides, _ = split_flags(recorded_arguments(manifest.get("command") or ""))
        narrowed = {*AGAIN_REPLACED, *target.point}
        self.arguments = [a for a in overrides if key_of(a) not in narrowed]
        self.arguments += [f"{key}={value}" for key, value in target.point.items()]
        self.arguments += ["reuse=false", f"out={out}"]
        self.arguments += [f"code_store={code_store}"] if code_store else []
        self.config_dirs = list(manifest.get("config_dirs", []))

    def __call__(self, commit: str, side) -> float | None:
        """The value at `commit`, printed on a line with the commit and `side` (a text, or a
        function of the value that gives one)."""
        print(f"commit {describe(self.repo, commit)}: ", end="", flush=True)
        results = self.out / "results"
        before = set(store.sweeps(results, self.target.experiment))
        with worktree(self.repo, commit) as tree:
            command, environment = self.command(tree)
            done = subprocess.run(command, cwd=tree, env=environment, capture_output=True,
                                  text=True)  # fmt: skip
        made = [s for s in store.sweeps(results, self.target.experiment) if s not in before]
        if done.returncode or len(made) != 1:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
            print(f"its run ended with exit code {done.returncode} ({tail[0]})")
            return None
        value, why = self.value(results, made[0])
        if value is None:
            print(f"no value of {self.target.metric} (sweep {made[0]}: {why})")
        else:
            said = side(value) if callable(side) else side
            print(f"{self.target.metric} {value:.4g} (sweep {made[0]}), {said}")
        return value

    def command(self, tree: Path) -> tuple[list[str], dict]:
        """The sweep's command line and environment in the worktree `tree`: its folders in
        place of the repository's, the harness's packages from it where it holds them."""
        inside = [self.inside(Path(folder), tree) for folder in self.config_dirs]
        given = [arg for folder in inside for arg in ("--config-dir", str(folder))]
        paths = [self.inside(Path(p), tree) for p in os.environ.get("PYTHONPATH", "").split(":")
                 if p]  # fmt: skip
        links = tree.parent / "installed"
        links.mkdir(exist_ok=True)
        if (tree / "harness" / "__init__.py").exists():  # a checkout of the harness
            for folder, name in INSTALLED_AS.items():
                if (tree / folder / "__init__.py").exists() and not (links / name).exists():
                    (links / name).symlink_to(tree / folder)
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, [links, tree,
                                                                             *paths]))}  # fmt: skip
        return [sys.executable, "-m", "harness", *given, *self.arguments], environment

    def inside(self, path: Path, tree: Path) -> Path:
        """`path` in the worktree where it lies in the repository, else as it is."""
        try:
            return tree / path.resolve().relative_to(self.repo)
        except ValueError:
            return path

    def value(self, results: Path, sweep: str) -> tuple[float | None, str | None]:
        """The metric in the last ok row of the sweep's one point (the target's, as its
        parameters say); else None and why."""
        rows, metric = store.read(results, self.target.experiment, sweep), self.target.metric
        for key, value in self.target.point.items():
            rows = rows[rows[key].astype(str) == str(value)] if key in rows else rows
        ok = rows[rows["status"] == "ok"] if "status" in rows else rows.iloc[:0]
        ok = ok.dropna(subset=[metric]) if metric in ok else ok.iloc[:0]
        if ok.empty:
            errors = rows["error"].dropna() if "error" in rows else []
            return None, str(errors.iloc[-1]) if len(errors) else "no row of it ok"
        if ok["job"].nunique() > 1:
            return None, f"{ok['job'].nunique()} of its points are the step's point"
        return float(ok[metric].iloc[-1]), None


@contextmanager
def worktree(repo: Path, commit: str):
    """A worktree of `repo` at `commit` (detached), in a folder of its own, removed after."""
    with tempfile.TemporaryDirectory(prefix="bisect-") as folder:
        tree = Path(folder) / "tree"
        if git(repo, "worktree", "add", "--detach", "--quiet", str(tree), commit) is None:
            raise BadInput(f"git could not make a worktree of {repo} at {commit[:10]}")
        try:
            yield tree
        finally:
            git(repo, "worktree", "remove", "--force", str(tree))


def _point(point: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in point.items()) or "its one point"
