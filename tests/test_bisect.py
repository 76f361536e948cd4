"""python -m harness history --bisect: the first commit on a step's far side, found by running
the step's point at the commits between its two sweeps', each in a git worktree, in a
repository that is a checkout of the harness (this one's files, committed anew) holding an
experiment of its own whose value doubles at one commit."""

import re
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from commands import ROOT
from sweeps import write_jobs

from harness import store
from harness.command import bisect

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
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=A Researcher", "-c", "user.email=r@example.org", "commit", "-qm",
        message)  # fmt: skip
    return git(repo, "rev-parse", "HEAD")


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
    """A sweep of `own` (x=1,2) a commit of `commits`, its err at x=2 twice `levels[n]` give
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
                "experiment_config": {"name": "own", "run": "minepkg.kernel.run"},
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

    done = harness("history", "own", "err", "--bisect", f"code_store={tmp_path / 'codes'}",
                   env={"PYTHONPATH": str(checkout)})  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
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
    made = store.sweeps(harness.cwd / "outputs" / "bisect" / f"{ids[2]}-{ids[3]}" / "results",
                        "own")  # fmt: skip
    assert len(made) == 4 and store.sweeps(harness.results, "own") == ids  # none in the history


def test_nothing_is_bisected_where_a_sweep_recorded_no_commit(tmp_path, capsys):
    """Sweeps of an installed harness record no commit: said, not bisected, exit 0."""
    target = bisect.Target("own", "a", "b", ("", "abc"), "err", {}, True)
    assert bisect.bisect(target, str(tmp_path), None) == 0
    assert "not bisected: a sweep recorded no commit" in capsys.readouterr().out


def test_a_commits_run_takes_its_folders_and_the_harness_from_its_worktree(tmp_path, monkeypatch):
    """The recorded command narrowed to the step's point, with what again replaces left out; a
    config dir and a path entry inside the repository taken from the worktree, one outside as
    it is; the harness's packages linked from the worktree where it is a checkout of it."""
    repo, tree, elsewhere = tmp_path / "repo", tmp_path / "t" / "tree", tmp_path / "conf"
    for folder in (repo / "mine", elsewhere):
        folder.mkdir(parents=True)
    manifest = {
        "command": f"python -m harness --config-dir {repo / 'mine'} +experiment=own "
        "x=1,2 y=3 reuse=true out=o",
        "config_dirs": [str(repo / "mine"), str(elsewhere)],
    }
    target = bisect.Target("own", "a", "b", ("c1", "c2"), "err", {"x": 2}, True)
    runner = bisect.Runner(target, repo, manifest, tmp_path / "out", None)
    monkeypatch.setenv("PYTHONPATH", f"{repo / 'src'}:{elsewhere}")
    (tree / "harness").mkdir(parents=True)
    (tree / "harness" / "__init__.py").write_text("")
    command, environment = runner.command(tree)
    assert command[3:] == ["--config-dir", str(tree / "mine"), "--config-dir", str(elsewhere),
                           "+experiment=own", "y=3", "x=2", "reuse=false",
                           f"out={tmp_path / 'out'}"]  # fmt: skip
    links = tree.parent / "installed"
    assert environment["PYTHONPATH"].split(":") == [str(links), str(tree), str(tree / "src"),
                                                    str(elsewhere)]  # fmt: skip
    assert [p.name for p in links.iterdir()] == ["harness"]  # what the worktree holds
    assert (links / "harness").resolve() == tree / "harness"


@pytest.mark.parametrize("value, nearer", [(1.0, False), (1.3, False), (1.5, True), (2.2, True)])
def test_a_commits_value_is_placed_by_the_end_it_lies_nearer_on_a_log_scale(value, nearer):
    assert bisect.nearer_last(value, 1.0, 2.0, log=True) == nearer
    assert bisect.differ(1.0, 1.05, log=True) is False and bisect.differ(1.0, 1.2, log=True)
    assert bisect.differ(0.0, 0.0, log=False) is False and bisect.differ(0.0, 1e-9, log=False)
