"""python -m harness history --bisect: the first commit on a step's far side, found by running
the step's point at the commits between its two sweeps', each in a git worktree, in a
repository that is a checkout of the harness (this one's files, committed anew) holding an
experiment of its own whose value doubles at one commit."""

import os
import re
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from commands import ROOT
from own import commit_all
from sweeps import write_jobs

from harness import store
from harness.command import bisect
from harness.command.again import recorded_overrides
from harness.errors import BadInput
from harness.names import split_flags

KERNEL = """import random

LEVEL = {level}


def run(*, x: int) -> list[dict]:
    return [{{"err": LEVEL * x * random.uniform(0.99, 1.01)}}]
"""
YAML = """# @package _global_
experiment:
  name: own
  run: minepkg.kernel.run
x: 1
hydra:
  sweeper:
    params:
      x: 1,2
"""


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True)  # fmt: skip
    return done.stdout.strip()


def commit(repo: Path, message: str, **files: str) -> str:
    for name, text in files.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return commit_all(repo, message)


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A git repository of this checkout's files (tracked, and untracked but not ignored)."""
    repo = tmp_path / "repo"
    listed = git(ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file() or source.is_symlink():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, repo / name, follow_symlinks=False)
    git(repo, "init", "-q")
    return repo


def write_history(results: Path, repo: Path, commits: list[str], levels: list[float]) -> list:
    """A sweep of `own` (x=1,2) at each commit of `commits`, its err `levels[n]` times x give
    or take 1%, as the harness records them: its command and config dir in the repository."""
    rng, start, ids = np.random.default_rng(5), datetime(2026, 12, 1, tzinfo=UTC), []
    for n, (at, level) in enumerate(zip(commits, levels, strict=True)):
        sweep, planned = f"20261201-{n:02d}0000-bbbb", start + timedelta(hours=n)
        points = [{"job": j, "overrides": [f"x={x}"], "params": {"x": x}}
                  for j, x in enumerate((1, 2))]  # fmt: skip
        config_dir = str(repo / "mine")
        store.write_manifest(
            results,
            {
                "experiment": "own",
                "sweep": sweep,
                "created_at": planned.isoformat(),
                "points": points,
                "config_dirs": [config_dir],
                "experiment_config": {
                    "name": "own",
                    "run": "minepkg.kernel.run",
                    "claims": [{"metric": "err", "max": 10}],
                },
                "command": f"python -m harness --config-dir {config_dir} +experiment=own x=1,2",
            },
        )
        rows = [
            {
                "job": j,
                "x": x,
                "status": "ok",
                "started_at": planned,
                "err": level * x * rng.uniform(0.99, 1.01),
                "device_name": "cpu: this one",
                "code_digest": f"code{n}",
                "git_commit": at,
            }
            for j, x in enumerate((1, 2))
        ]
        write_jobs(results, "own", sweep, rows)
        ids.append(sweep)
    return ids


@pytest.mark.process
@pytest.mark.slow
def test_bisect_names_the_first_commit_on_the_far_side(harness, checkout, tmp_path):
    """Commits: the experiment (err at level 1), an edit elsewhere, the kernel at level 2 (the
    step), another edit. Three sweeps at the first commit, three at the last: history finds
    the step in err, and --bisect runs both ends (they differ), then the commits between
    until it names the third."""
    first = commit(checkout, "harness and own experiment", **{
        "mine/experiment/own.yaml": YAML, "minepkg/__init__.py": "",
        "minepkg/kernel.py": KERNEL.format(level=1.0)})  # fmt: skip
    second = commit(checkout, "a note", **{"NOTES.md": "nothing yet\n"})
    doubled = commit(checkout, "the kernel doubles err", **{
        "minepkg/kernel.py": KERNEL.format(level=2.0)})  # fmt: skip
    last = commit(checkout, "another note", **{"NOTES.md": "still nothing\n"})
    ids = write_history(harness.results, checkout, [first] * 3 + [last] * 3, [1.0] * 3 + [2.0] * 3)

    codes, path = f"code_store={tmp_path / 'codes'}", {"PYTHONPATH": str(checkout)}
    done = harness("history", "own", "err", "--bisect", "--check", codes, env=path)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr  # a worse step: err grew
    assert f"between sweep {ids[2]}" in done.stdout and f"and sweep {ids[3]}" in done.stdout
    said = done.stdout.split("bisecting ", 1)[1]
    assert said.startswith(f"err at x=1: commits {first[:10]} (sweep {ids[2]}) to {last[:10]}")
    runs = said.splitlines()[1:5]  # the two ends, then the second commit and the third
    expected = [
        (first, "the near end", 1),
        (last, "the far end", 2),
        (second, "nearer the near end's", 1),
        (doubled, "nearer the far end's", 2),
    ]
    for line, (at, words, level) in zip(runs, expected, strict=True):
        assert line.startswith(f"commit {at[:10]} ") and line.endswith(f"), {words}"), said
        assert abs(float(re.search(r": err (\S+) \(sweep ", line).group(1)) / level - 1) < 0.02
    assert f"first commit on the far side: {doubled[:10]} the kernel doubles err" in said, said
    assert git(checkout, "worktree", "list").count("\n") == 0  # each worktree removed
    results = harness.cwd / "outputs" / "bisect" / f"{ids[2]}-{ids[3]}" / "results"
    assert store.sweeps(harness.results, "own") == ids  # none in the history
    ran = store.read(results, "own")  # each commit's one point, by that commit's harness
    assert ran.groupby("sweep")["git_commit"].first().tolist() == [first, last, second, doubled]
    assert ran["x"].tolist() == [1] * 4


@pytest.mark.process
def test_a_commit_whose_point_fails_gives_no_value_and_says_its_error(tmp_path, capsys):
    """A repository of one's own experiment alone (no harness in it: the installed harness
    runs, the worktree on the path), its kernel raising at the commit: the run's line names
    the point's error and the run's exit code, and gives no value."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    broken = "def run(*, x: int) -> list[dict]:\n    raise RuntimeError('broken here')\n"
    at = commit(repo, "broken", **{"mine/experiment/own.yaml": YAML, "minepkg/__init__.py": "",
                                   "minepkg/kernel.py": broken})  # fmt: skip
    manifest = {"command": f"python -m harness --config-dir {repo / 'mine'} +experiment=own",
                "config_dirs": [str(repo / "mine")]}  # fmt: skip
    target = bisect.Target("own", "a", "b", (at, at), "err", {"x": 2}, True)
    run = bisect.Runner(target, repo, manifest, tmp_path / "out", tmp_path / "codes")
    assert run(at, "the near end") is None
    said = capsys.readouterr().out
    assert said.startswith(f"commit {at[:10]} broken (A Researcher, ") and "no value of err" in said
    assert "broken here" in said and "its run ended with exit code 1" in said, said
    assert git(repo, "worktree", "list").count("\n") == 0


@pytest.mark.process
def test_the_repository_searched_is_the_one_holding_the_experiments_code(tmp_path, monkeypatch):
    """A researcher's repository of their own experiment: found from where its package lies
    here, and refused, saying why, where it lacks a commit or the code lies in none."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    first = commit(repo, "own", **{"minepkg/__init__.py": "", "minepkg/kernel.py": "X = 1\n"})
    last = commit(repo, "edit", **{"minepkg/kernel.py": "X = 2\n"})
    monkeypatch.syspath_prepend(str(repo))
    manifest = {"experiment_config": {"run": "minepkg.kernel.run"}}
    assert bisect.repository(manifest, (first, last)) == (repo.resolve(), "")
    _, why = bisect.repository(manifest, (first, "f" * 40))
    assert why == f"{repo.resolve()}, which holds the experiment's code, has no commit ffffffffff"
    _, why = bisect.repository({"experiment_config": {"run": "json.loads"}}, (first, last))
    assert why.startswith("the experiment's code (") and why.endswith("that tracks it")
    _, why = bisect.repository({"experiment_config": {"run": "nopkg.run"}}, (first, last))
    assert why.startswith("the experiment's code (nopkg.run) cannot be imported here")


@pytest.mark.process
def test_a_commit_whose_code_would_come_from_outside_its_worktree_is_not_run(tmp_path, capsys):
    """A repository whose package is a link out of it: the commit's run would import the code
    it leads to, not the commit's: said, and not run."""
    repo, outside = tmp_path / "repo", tmp_path / "outside" / "minepkg"
    outside.mkdir(parents=True)
    (outside / "__init__.py").write_text("")
    (outside / "kernel.py").write_text(KERNEL.format(level=1.0))
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "minepkg").symlink_to(outside)
    at = commit(repo, "a link out", **{"mine/experiment/own.yaml": YAML})
    manifest = {"command": f"python -m harness --config-dir {repo / 'mine'} +experiment=own",
                "config_dirs": [str(repo / "mine")],
                "experiment_config": {"run": "minepkg.kernel.run"}}  # fmt: skip
    target = bisect.Target("own", "a", "b", (at, at), "err", {"x": 2}, True)
    run = bisect.Runner(target, repo, manifest, tmp_path / "out", tmp_path / "codes")
    assert run(at, "the near end") is None
    said = capsys.readouterr().out
    assert f"not run: its experiment's package (minepkg) would be imported from {outside}," in said
    assert not (tmp_path / "out" / "results").exists()  # nothing ran


def test_a_sweep_planned_from_a_dirty_checkout_is_named(tmp_path, capsys):
    """The manifests' git_dirty: the sweep after the step was planned with changes not
    committed, and is named; nothing is bisected between two sweeps of one commit."""
    for sweep, dirty in (("a", False), ("b", True)):
        store.write_manifest(tmp_path / "results", {"experiment": "own", "sweep": sweep,
                                                    "points": [{"job": 0, "params": {}}],
                                                    "git_dirty": dirty})  # fmt: skip
    target = bisect.Target("own", "a", "b", ("abc", "abc"), "err", {}, True)
    assert bisect.bisect(target, str(tmp_path), None) == 0
    said = capsys.readouterr().out
    assert "sweep b ran with changes not committed (git_dirty)" in said
    assert "sweep a ran" not in said and "not bisected: both sweeps ran at commit abc" in said


def test_nothing_is_bisected_where_a_sweep_recorded_no_commit(tmp_path, capsys):
    """Sweeps of an installed harness record no commit: said, not bisected, exit 0."""
    target = bisect.Target("own", "a", "b", ("", "abc"), "err", {}, True)
    assert bisect.bisect(target, str(tmp_path), None) == 0
    assert "not bisected: a sweep recorded no commit" in capsys.readouterr().out


def test_a_commits_run_takes_its_folders_and_the_harness_from_its_worktree(tmp_path, monkeypatch):
    """The recorded command less what again replaces, narrowed to the step's point (its
    recorded overrides); a config dir and a path entry inside the repository taken from the
    worktree where it has them (an ignored one, such as a venv, as it is), one outside as it
    is, and the folder the experiment's package is imported from here (an editable install's);
    the harness's packages linked from the worktree, a checkout of the harness."""
    repo, tree, elsewhere = tmp_path / "repo", tmp_path / "t" / "tree", tmp_path / "conf"
    for folder in (repo / "mine", repo / "src", repo / ".venv", elsewhere, tree / "mine",
                   tree / "src", tree / "harness", repo / "lib" / "edpkg",
                   tree / "lib"):  # fmt: skip
        folder.mkdir(parents=True)
    (tree / "harness" / "__init__.py").write_text("")
    (repo / "lib" / "edpkg" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(repo / "lib"))  # as an editable install puts it on the path
    manifest = {
        "experiment_config": {"run": "edpkg.kernel.run"},
        "command": f"python -m harness --config-dir {repo / 'mine'} +experiment=own "
        "x=1,2 y=3 reuse=true out=o code=abc",
        "config_dirs": [str(repo / "mine"), str(elsewhere)],
        "points": [{"job": n, "overrides": [f"x={n + 1}"], "params": {"x": n + 1}}
                   for n in range(2)],
    }  # fmt: skip
    target = bisect.Target("own", "a", "b", ("c1", "c2"), "err", {"x": 2}, True)
    runner = bisect.Runner(target, repo, manifest, tmp_path / "out", tmp_path / "codes")
    path = [repo / "src", repo / ".venv", elsewhere]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(map(str, path)))
    command, environment = runner.command(tree)
    assert command[3:] == [
        "--config-dir",
        str(tree / "mine"),
        "--config-dir",
        str(elsewhere),
        "+experiment=own",
        "y=3",
        "x=2",
        "reuse=false",
        f"out={tmp_path / 'out'}",
        f"code_store={tmp_path / 'codes'}",
    ]
    links = tree.parent / "installed"
    assert environment["PYTHONPATH"].split(os.pathsep) == [
        str(links),
        str(tree),
        str(tree / "src"),
        str(repo / ".venv"),
        str(elsewhere),
        str(tree / "lib"),
    ]
    assert [p.name for p in links.iterdir()] == ["harness"]  # what the worktree holds
    assert (links / "harness").resolve() == tree / "harness"


def test_halving_runs_the_middle_commits_until_two_neighbours_remain():
    """Nine commits, the step at the sixth: three runs between the ends name it; a run that
    gives no value ends the search between the last two commits placed."""
    commits = [f"c{n}" for n in range(9)]
    ran = []

    def run(commit, side):
        ran.append(commit)
        return None if commit == broken else 2.0 if int(commit[1:]) >= 5 else 1.0

    broken = None
    near, far, values = bisect.halve(commits, [1.0, 2.0], run, log=True)
    assert (near, far, ran) == (4, 5, ["c4", "c6", "c5"])
    assert values == {0: 1.0, 8: 2.0, 4: 1.0, 6: 2.0, 5: 2.0}
    ran, broken = [], "c6"
    assert bisect.halve(commits, [1.0, 2.0], run, log=True)[:2] == (4, 8)
    assert bisect.halve(commits[:2], [1.0, 2.0], run, log=True)[:2] == (0, 1)  # none between


def test_a_recorded_commands_config_dir_is_not_looked_for_where_it_is_read(tmp_path):
    """A sweep's command as recorded, its `--config-dir` given relative to the folder it ran
    in: read from another folder, its overrides come back (the manifest's config_dirs has the
    folder whole); a command line typed here is still checked."""
    recorded = ["--config-dir", "no-such-folder", "+experiment=own", "x=1,2", "--config-dir=gone"]
    assert split_flags(recorded, recorded=True)[0] == ["+experiment=own", "x=1,2"]
    manifest = {"command": "python -m harness -cd no-such-folder +experiment=own x=1,2 out=o"}
    assert recorded_overrides(manifest, replaced=["x"]) == ["+experiment=own"]
    with pytest.raises(BadInput, match="--config-dir takes a folder, got .no-such-folder."):
        split_flags(recorded)


def test_a_point_is_run_by_its_recorded_overrides():
    manifest = {"points": [{"job": 0, "overrides": ["x=1", "name='a b'"],
                            "params": {"x": 1, "name": "a b"}},
                           {"job": 1, "overrides": ["x=2", "name='a b'"],
                            "params": {"x": 2, "name": "a b"}}]}  # fmt: skip
    assert bisect.own_point(manifest, {"x": "2"}) == ["x=2", "name='a b'"]
    assert bisect.own_point(manifest, {"x": 2.0}) == ["x=2", "name='a b'"]  # a float back
    assert bisect.own_point(manifest, {"x": 3}) == ["x=3"]  # not planned: as the history says


@pytest.mark.process
def test_a_worktree_is_removed_though_its_run_raises(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    at = commit(repo, "one", **{"minepkg/__init__.py": ""})
    with pytest.raises(KeyError), bisect.worktree(repo, at) as tree:
        assert (tree / "minepkg" / "__init__.py").exists()
        raise KeyError
    assert not tree.exists() and git(repo, "worktree", "list").count("\n") == 0
    assert bisect.commit_chain(repo, at, at) == []


@pytest.mark.process
def test_the_commits_between_are_a_chain_through_merges(tmp_path):
    """main: a, b, then m merging a branch (s1, s2) forked at a, then c; a branch x forked at a
    that merges c in (y), then z. Each list is a chain, each commit a descendant of the one
    before: from a to c, main's first-parent line (the branch stands as its merge m); from s1
    on the branch, the branch to the merge, then main; from b to z, main up to c, then the
    merge that brought c in; none from c back to a. A far commit that is a merge says what it
    brought that the near one lacked."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    a = commit(repo, "a", a="a")
    git(repo, "checkout", "-q", "-b", "side")
    s1, s2 = commit(repo, "s1", s1="1"), commit(repo, "s2", s2="2")
    git(repo, "checkout", "-q", "main")
    b = commit(repo, "b", b="b")
    merge = ["-c", "user.name=A", "-c", "user.email=a@example.org", "merge", "-q", "--no-edit"]
    git(repo, *merge, "side")
    m = git(repo, "rev-parse", "HEAD")
    c = commit(repo, "c", c="c")
    git(repo, "checkout", "-q", "-b", "other", a)
    x = commit(repo, "x", x="x")
    git(repo, *merge, "main")
    y = git(repo, "rev-parse", "HEAD")
    z = commit(repo, "z", z="z")
    assert x not in bisect.commit_chain(repo, b, z)
    assert bisect.commit_chain(repo, a, c) == [b, m, c]
    assert bisect.commit_chain(repo, s1, c) == [s2, m, c]
    assert bisect.commit_chain(repo, b, z) == [m, c, y, z]
    assert bisect.commit_chain(repo, c, a) == []
    assert f"log --oneline {s2[:10]}..{m[:10]} lists them" in bisect.merge_note(repo, s2, m)
    assert bisect.merge_note(repo, b, c) is None


@pytest.mark.parametrize("value, nearer", [(1.0, False), (1.3, False), (1.5, True), (2.2, True)])
def test_a_commits_value_is_placed_by_the_end_it_lies_nearer_on_a_log_scale(value, nearer):
    assert bisect.nearer_last(value, 1.0, 2.0, log=True) == nearer
    assert bisect.differ(1.0, 1.05, log=True) is False and bisect.differ(1.0, 1.2, log=True)
    assert bisect.differ(0.0, 0.0, log=False) is False and bisect.differ(0.0, 1e-9, log=False)
