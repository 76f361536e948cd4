"""python -m harness history EXPERIMENT --bisect: of each step the history found, the first
commit on its far side, as `git bisect` and asv find name one.

The two sweeps either side of a step each recorded the commit of the git repository that held
their experiment's code (git_commit: the harness's checkout for its own experiments, a
researcher's repository for theirs; none for an installed package's). The repository searched
is the one that holds the experiment's code here, which must hold both commits. The commits form a
chain, each a descendant of the one before: the second's first-parent line back to where the
first came in (a branch merged between them counts as its merge, said so), and where the first
lies on a branch that line merged, that branch's line up to the merge. The step's point is run
at some of them, each in a worktree of its own (git worktree add --detach, removed after): the
recorded command of the sweep before the step, less what again replaces, narrowed to the point
(its recorded overrides), nothing reused, into an out folder of the bisection's own
(OUT/bisect/BEFORE-AFTER, each run's output in COMMIT.log there), so that these sweeps are no
part of the history. Each runs as the checkout ran at that commit: the worktree's harness,
experiments and report (linked under their installed names, first on the path, the worktree its
working folder), and config dirs and path entries that lie inside the repository (the folder the
experiment's package is imported from here too) taken from the worktree where it has them. A
commit whose run would import the experiment's package from outside its worktree (a link out of
the repository, a commit without the package) is not run, and says so.

The two ends run first, on this machine now: where they do not differ (by more than TOLERANCE
for values above zero, at all else), the step does not show between the two commits here, and
nothing is bisected. Else the line is halved until two neighbouring commits remain, each commit
counted on the side of the end whose value its own is nearer (on a log scale where all are above
zero): the second of the two is the first commit on the far side. One sweep a commit, as asv
find runs one: each commit's value is printed with its side, so that a value near the middle,
which noise may have placed, shows as such. A sweep run with changes not committed (git_dirty)
is said: its commit alone may not hold what it measured.
"""

import math
import os
import shlex
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from harness import provenance, store
from harness.command.again import recorded_overrides
from harness.errors import BadInput
from harness.names import key_of, point_words
from harness.pinning import codestore
from harness.pinning.boot import BOOT_ENV, CONF_ENV
from harness.pinning.sources import code_folder, import_root

TOLERANCE = 1.10  # the gate's factor: two ends closer than it show no step
NOT_DECIDED = 3  # the exit code where a commit's run failed or gave no value
# Where Python finds a top-level package (its first folder) or module (its file), sys.argv[1]:
# sources._run_path's question, asked in a commit's run's own environment (whose harness may be
# that commit's, without the function).
FIND = (
    "import importlib.util, sys; spec = importlib.util.find_spec(sys.argv[1]); "
    "print(spec and ([*(spec.submodule_search_locations or [])] or [spec.origin])[0] or '')"
)
# A checkout of the harness: its folders and the names they install as.
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
    print(f"\nbisecting {target.metric} at {point_words(target.point)}: commits "
          f"{first[:10] or 'none'} (sweep {target.before}) to {last[:10] or 'none'} (sweep "
          f"{target.after})")  # fmt: skip
    for sweep in dirty(results, target):
        print(f"sweep {sweep} ran with changes not committed (git_dirty): its commit alone may "
              "not hold what it measured")  # fmt: skip
    if first and first == last:
        print(f"not bisected: both sweeps ran at commit {first[:10]}; python -m harness code "
              f"{target.before} {target.after} shows what changed outside it")  # fmt: skip
        return 0
    repo, why = repository(manifest or {}, target.commits)
    if repo is None:
        print(f"not bisected: {why}")
        return 0
    line = commit_chain(repo, first, last)
    if not line:
        print(f"not bisected: commit {last[:10]} does not descend from {first[:10]}")
        return 0
    folder = Path(out).resolve() / "bisect" / f"{target.before}-{target.after}"
    try:
        run = Runner(target, repo, manifest or {}, folder, codestore.store_of(code_store))
    except BadInput as error:
        print(f"not bisected: {error}")
        return NOT_DECIDED
    ends = [run(first, "the near end"), run(last, "the far end")]
    if None in ends:
        print("not bisected: an end gave no value")
        return NOT_DECIDED
    if not differ(*ends, target.log):
        print(
            f"not bisected: the two commits give {ends[0]:.4g} and {ends[1]:.4g} here, within "
            f"x{TOLERANCE:g}: the step does not show between them on this machine now"
        )
        return 0
    commits = [first, *line]
    near, far, values = halve(commits, ends, run, target.log)
    if far - near > 1:
        print(f"not bisected further: the first commit on the far side lies after "
              f"{commits[near][:10]}, up to {commits[far][:10]}")  # fmt: skip
        return NOT_DECIDED
    print(f"first commit on the far side: {describe(repo, commits[far])}: {target.metric} "
          f"{values[near]:.4g} before it, {values[far]:.4g} at it")  # fmt: skip
    merged = merge_note(repo, commits[near], commits[far])
    if merged:
        print(f"  {merged}")
    print(f"  git -C {shlex.quote(str(repo))} show {commits[far][:10]}: its change")
    return 0


def halve(commits: list[str], ends: list[float], run, log: bool) -> tuple[int, int, dict]:
    """The search between the ends (commits[0], commits[-1], their values `ends`): the
    commit between them run (`run(commit, side)`: its value or None) and counted on the side
    of the end its value is nearer, until two neighbours remain or a run gives no value; the
    last near and far commits' places, and each value by place."""
    values = {0: ends[0], len(commits) - 1: ends[1]}
    near, far = 0, len(commits) - 1
    while far - near > 1:
        middle = (near + far) // 2
        value = run(commits[middle], lambda v: "nearer the far end's" if nearer_last(
            v, *ends, log) else "nearer the near end's")  # fmt: skip
        if value is None:
            break
        values[middle] = value
        near, far = (near, middle) if nearer_last(value, *ends, log) else (middle, far)
    return near, far, values


def dirty(results: Path, target: Target) -> list[str]:
    """Of the two sweeps, those whose manifests say they were planned from a checkout with
    changes not committed (git_dirty)."""
    return [sweep for sweep in (target.before, target.after)
            if (store.read_manifest(store.SweepPaths(results, target.experiment, sweep))
                or {}).get("git_dirty")]  # fmt: skip


def repository(manifest: dict, commits: tuple[str, str]) -> tuple[Path | None, str]:
    """The git repository that holds the experiment's code (found here, as the sweeps found
    it) and both commits; else None and why not."""
    if not all(commits):
        return None, ("a sweep recorded no commit (its experiment's code lay in no git "
                      "repository, as an installed package's does)")  # fmt: skip
    run = str((manifest.get("experiment_config") or {}).get("run") or "")
    code = code_folder({"run": run})
    if code is None:
        return None, (f"the experiment's code ({run or 'not named'}) cannot be imported here: "
                      "set PYTHONPATH as its sweeps had it")  # fmt: skip
    repo = provenance.work_tree(code)
    if repo is None:
        return None, f"the experiment's code ({code}) lies in no git repository that tracks it"
    for commit in commits:
        if git(repo, "cat-file", "-e", f"{commit}^{{commit}}") is None:
            return None, f"{repo}, which holds the experiment's code, has no commit {commit[:10]}"
    return repo, ""


def commit_chain(repo: Path, first: str, last: str) -> list[str]:
    """The commits after `first` up to `last`, oldest first, each a descendant of the one
    before it: `last`'s first-parent line back to the commit that brought `first` in (its
    first parent, or a merge that merged it: a merge stands for the branch it brought), and
    where that is a merge, the same from `first` up to the merged parent that descends from
    it; [] where `last` does not descend from `first`."""
    base = git(repo, "rev-parse", f"{first}^{{commit}}")
    descendants = set((git(repo, "rev-list", "--ancestry-path", f"{first}..{last}") or "").split())
    line = (git(repo, "rev-list", "--first-parent", "--reverse", f"{first}..{last}") or "").split()
    line = [commit for commit in line if commit in descendants]
    if not base or not line:
        return []
    parents = (git(repo, "rev-list", "--parents", "-n", "1", line[0]) or "").split()[1:]
    if base in parents:
        return line
    merged = [parent for parent in parents[1:] if parent in descendants]
    return commit_chain(repo, first, merged[0]) + line if merged else []


def merge_note(repo: Path, near: str, far: str) -> str | None:
    """Where `far` is a merge, what it brought that `near` (the commit before it in the
    search) did not have: the git log that lists those commits; else None."""
    parents = (git(repo, "rev-list", "--parents", "-n", "1", far) or "").split()[1:]
    if len(parents) < 2:
        return None
    return (
        f"a merge: the change came with the commits it brought (git -C "
        f"{shlex.quote(str(repo))} log --oneline {near[:10]}..{far[:10]} lists them)"
    )


def git(folder: Path, *args: str) -> str | None:
    """git's output in `folder`, stripped; None where it fails."""
    done = provenance.git(folder, *args)
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

    def __init__(self, target: Target, repo: Path, manifest: dict, out: Path, code_store: Path):
        self.target, self.repo, self.out = target, repo, out
        point = own_point(manifest, target.point)
        self.arguments = [
            *recorded_overrides(manifest, replaced=[key_of(o) for o in point]),
            *point,
            "reuse=false",
            f"out={out}",
            f"code_store={code_store}",
        ]
        self.config_dirs = list(manifest.get("config_dirs", []))
        config = manifest.get("experiment_config") or {}
        self.root = import_root(config)  # where its package is imported from here (a src/)
        self.top = str(config.get("run") or "").split(".")[0]  # the package's name

    def __call__(self, commit: str, side) -> float | None:
        """The value at `commit`, printed on a line with the commit and `side` (a text, or a
        function of the value that gives one)."""
        print(f"commit {describe(self.repo, commit)}: ", end="", flush=True)
        results, log = self.out / "results", self.out / f"{commit[:10]}.log"
        before = set(store.sweeps(results, self.target.experiment))
        try:
            with worktree(self.repo, commit) as tree:
                command, environment = self.command(tree)
                found = self.imported_from(tree, environment)
                if found is not None and not found.is_relative_to(tree.resolve()):
                    print(f"not run: its experiment's package ({self.top}) would be imported from "
                          f"{found}, outside its worktree (a link out of the repository, or a "
                          "commit without it)")  # fmt: skip
                    return None
                log.parent.mkdir(parents=True, exist_ok=True)
                with open(log, "w") as output:
                    done = subprocess.run(command, cwd=tree, env=environment, stdout=output,
                                          stderr=subprocess.STDOUT)  # fmt: skip
        except (BadInput, OSError) as error:
            print(f"not run: {error}")
            return None
        made = [s for s in store.sweeps(results, self.target.experiment) if s not in before]
        if len(made) != 1:
            print(f"its run ended with exit code {done.returncode}, {len(made)} sweeps made "
                  f"(its output: {log})")  # fmt: skip
            return None
        value, why = self.value(results, made[0])
        if value is None:
            print(f"no value of {self.target.metric} (sweep {made[0]}: {why}; its run ended "
                  f"with exit code {done.returncode}, its output: {log})")  # fmt: skip
        else:
            said = side(value) if callable(side) else side
            print(f"{self.target.metric} {value:.4g} (sweep {made[0]}), {said}")
        return value

    def command(self, tree: Path) -> tuple[list[str], dict]:
        """The sweep's command line and environment in the worktree `tree`: its folders in
        place of the repository's (the one the experiment's package is imported from too, which
        an editable install puts on the path), the harness's packages from it where it holds
        them."""
        inside = [self.inside(Path(folder), tree) for folder in self.config_dirs]
        given = [arg for folder in inside for arg in ("--config-dir", str(folder))]
        paths = [self.inside(Path(p), tree)
                 for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]  # fmt: skip
        if self.root and (root := self.inside(self.root, tree)) != self.root:
            paths.append(root)  # last, where the .pth of an editable install puts it
        links = tree.parent / "installed"
        links.mkdir(exist_ok=True)
        if (tree / "harness" / "__init__.py").exists():  # a checkout of the harness
            for folder, name in INSTALLED_AS.items():
                if (tree / folder / "__init__.py").exists() and not (links / name).exists():
                    (links / name).symlink_to(tree / folder)
        environment = {k: v for k, v in os.environ.items() if k not in (BOOT_ENV, CONF_ENV)}
        environment["PYTHONPATH"] = os.pathsep.join(map(str, dict.fromkeys([links, tree, *paths])))
        return [sys.executable, "-m", "harness", *given, *self.arguments], environment

    def imported_from(self, tree: Path, environment: dict) -> Path | None:
        """Where a run in the worktree `tree` with `environment` finds the experiment's package
        (its folder, or a top-level module's file), links resolved; None where no package is
        recorded or none is found (the run then says why)."""
        if not self.top.isidentifier():
            return None
        done = subprocess.run([sys.executable, "-c", FIND, self.top], cwd=tree, env=environment,
                              capture_output=True, text=True)  # fmt: skip
        found = done.stdout.strip()
        return Path(found).resolve() if done.returncode == 0 and found else None

    def inside(self, path: Path, tree: Path) -> Path:
        """`path` (resolved) in the worktree where it lies in the repository and the worktree
        has it (a folder git ignores, such as a venv, it has not), else as it is."""
        path = path.resolve()
        moved = tree / path.relative_to(self.repo) if path.is_relative_to(self.repo) else path
        return moved if moved.exists() else path

    def value(self, results: Path, sweep: str) -> tuple[float | None, str | None]:
        """The metric in the last ok row of the sweep's one point; else None and why."""
        rows, metric = store.read(results, self.target.experiment, sweep), self.target.metric
        ok = rows[rows["status"] == "ok"] if "status" in rows else rows.iloc[:0]
        ok = ok.dropna(subset=[metric]) if metric in ok else ok.iloc[:0]
        if ok.empty:
            errors = rows["error"].dropna() if "error" in rows else []
            return None, str(errors.iloc[-1]) if len(errors) else "no row of it ok"
        if ok["job"].nunique() > 1:
            return None, f"it ran {ok['job'].nunique()} points, not the step's one"
        return float(ok[metric].iloc[-1]), None


def own_point(manifest: dict, point: dict) -> list[str]:
    """The overrides the sweep recorded for the point whose parameters are `point`'s (as the
    history shows them: _same), else `point` as key=value overrides."""
    for planned in manifest.get("points") or []:
        params = (planned.get("params") or {}) if isinstance(planned, dict) else {}
        if all(k in params and _same(params[k], v) for k, v in point.items()):
            return list(planned.get("overrides") or [])
    return [f"{key}={value}" for key, value in point.items()]


def _same(planned, shown) -> bool:
    """A planned parameter's value and the history's (a number may come back a float)."""
    if str(planned) == str(shown):
        return True
    try:
        return float(planned) == float(shown)
    except (TypeError, ValueError):
        return False


@contextmanager
def worktree(repo: Path, commit: str):
    """A worktree of `repo` at `commit` (detached), in a folder of its own, removed after (and
    what git keeps of it, pruned)."""
    try:
        with tempfile.TemporaryDirectory(prefix="bisect-") as folder:
            tree = Path(folder) / "tree"
            if git(repo, "worktree", "add", "--detach", "--quiet", str(tree), commit) is None:
                raise BadInput(f"git could not make a worktree of {repo} at {commit[:10]}")
            try:
                yield tree
            finally:
                git(repo, "worktree", "remove", "--force", str(tree))
    finally:
        git(repo, "worktree", "prune")
